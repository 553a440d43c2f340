//go:build e2e

// Package e2e runs Apiary end to end on the local management cluster
// (hack/devcluster: real kubelet, containerd, CoreDNS, MetalLB), with the Helm
// chart installed by helm built from source, as a user would. `make e2e`
// brings the cluster up, runs this suite and tears the cluster down.
package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/crane"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/apiaryhq/apiary/cli"
	"github.com/apiaryhq/apiary/datastore"
	"github.com/apiaryhq/apiary/e2e/cluster"
	"github.com/apiaryhq/apiary/internal/testenv"
	"github.com/apiaryhq/apiary/operator"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/operator/render"
)

const (
	systemNS   = "apiary-system"
	tenantsNS  = "e2e-tenants"
	release    = "apiary"
	leaseName  = "apiary-operator.apiary.dev"
	readyLimit = 5 * time.Minute
)

// env is the management cluster with Apiary installed.
type env struct {
	t          *testing.T
	ctx        context.Context
	kubeconfig string
	cfg        *rest.Config
	c          client.Client
	cs         *kubernetes.Clientset
}

func TestE2E(t *testing.T) {
	e := setup(t)
	t.Run("TenantBecomesReadyBehindLoadBalancer", e.testTenantReady)
	t.Run("TenantsAreIsolated", e.testIsolation)
	t.Run("ScaleKeepsAPIAvailable", e.testScale)
	t.Run("ControlPlanePodDeleted", e.testPodDeletion)
	t.Run("WebhookRejectsBadSpecs", e.testWebhook)
	t.Run("DeleteRemovesEverything", e.testDelete)
	t.Run("OperatorKilledMidReconcile", e.testOperatorRestart)
}

func setup(t *testing.T) *env {
	cl, err := cluster.New(cluster.Options{})
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, ctx: t.Context(), kubeconfig: cl.KubeconfigPath()}
	if _, err := os.Stat(e.kubeconfig); err != nil {
		t.Fatalf("no local management cluster (%v): run `make cluster-up` or `make e2e`", err)
	}
	if e.cfg, err = clientcmd.BuildConfigFromFlags("", e.kubeconfig); err != nil {
		t.Fatal(err)
	}
	scheme, err := operator.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	if e.c, err = client.New(e.cfg, client.Options{Scheme: scheme}); err != nil {
		t.Fatal(err)
	}
	if e.cs, err = kubernetes.NewForConfig(e.cfg); err != nil {
		t.Fatal(err)
	}
	e.installChart()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: tenantsNS}}
	if err := e.c.Create(e.ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	t.Cleanup(e.cleanup)
	return e
}

// installChart installs the chart with helm (from source), as a user does;
// the operator image is pulled from the local registry on every start so
// that a rebuilt image is used.
func (e *env) installChart() {
	e.t.Helper()
	start := time.Now()
	// The operator image in the local registry is rebuilt from this tree by
	// every `devcluster up` under the same tag: its digest in a pod
	// annotation rolls the operator when it changed.
	digest, err := crane.Digest(cluster.RegistryAddr+"/apiaryhq/apiary:"+strings.TrimSpace(chartAppVersion(e.t)), crane.Insecure)
	if err != nil {
		e.t.Fatalf("the Apiary image is not in the local registry (run `go run ./hack/devcluster up`): %v", err)
	}
	e.helm("upgrade", "--install", release, filepath.Join(testenv.RepoRoot(), "charts", "apiary"),
		"--namespace", systemNS, "--create-namespace",
		"--set", "image.pullPolicy=Always",
		"--set-string", `podAnnotations.apiary\.dev/image-digest=`+digest,
		"--set", "defaultDataStore.managed.storage.emptyDir=true",
		"--wait", "--timeout", "5m")
	e.t.Logf("helm install: %s", time.Since(start).Round(time.Millisecond))
	// helm --wait sees the operator pods ready; the webhook Service may take
	// a moment more to route to them.
	e.eventually("the webhooks answer", time.Minute, func() error {
		probe := &apiary.TenantControlPlane{ObjectMeta: metav1.ObjectMeta{Name: "probe", Namespace: "default"}}
		return e.c.Create(e.ctx, probe, client.DryRunAll)
	})
	e.eventually("DataStore default Ready", 5*time.Minute, func() error {
		var ds apiary.DataStore
		if err := e.c.Get(e.ctx, client.ObjectKey{Name: "default"}, &ds); err != nil {
			return err
		}
		return conditionIs(ds.Status.Conditions, apiary.ConditionReady, metav1.ConditionTrue, "")
	})
	e.t.Logf("chart installed and default DataStore Ready after %s", time.Since(start).Round(time.Millisecond))
}

func chartAppVersion(t *testing.T) string {
	raw, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "charts", "apiary", "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^appVersion:\s*"?([^"\n]+)"?`).FindSubmatch(raw)
	if m == nil {
		t.Fatal("no appVersion in Chart.yaml")
	}
	return string(m[1])
}

func (e *env) cleanup() {
	if os.Getenv("APIARY_E2E_KEEP") != "" {
		e.t.Log("APIARY_E2E_KEEP set: leaving tenants and the release in place")
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var list apiary.TenantControlPlaneList
	_ = e.c.List(ctx, &list, client.InNamespace(tenantsNS))
	for i := range list.Items {
		_ = e.c.Delete(ctx, &list.Items[i])
	}
	for ctx.Err() == nil {
		if err := e.c.List(ctx, &list, client.InNamespace(tenantsNS)); err != nil || len(list.Items) == 0 {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	_ = e.c.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: tenantsNS}})
}

func (e *env) helm(args ...string) string {
	e.t.Helper()
	bin, err := testenv.HelmBinary()
	if err != nil {
		e.t.Fatal(err)
	}
	cmd := exec.CommandContext(e.ctx, bin, args...)
	home := e.t.TempDir()
	cmd.Env = append(os.Environ(), "KUBECONFIG="+e.kubeconfig, "HELM_CACHE_HOME="+home, "HELM_CONFIG_HOME="+home, "HELM_DATA_HOME="+home)
	out, err := cmd.CombinedOutput()
	if err != nil {
		e.t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func (e *env) eventually(what string, timeout time.Duration, f func() error) {
	e.t.Helper()
	eventually(e.t, what, timeout, f)
}

func eventually(t *testing.T, what string, timeout time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not true after %s: %v", what, timeout, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func conditionIs(conds []metav1.Condition, typ string, status metav1.ConditionStatus, reason string) error {
	c := meta.FindStatusCondition(conds, typ)
	if c == nil {
		return fmt.Errorf("no %s condition yet", typ)
	}
	if c.Status != status || (reason != "" && c.Reason != reason) {
		return fmt.Errorf("%s is %s/%s: %s", typ, c.Status, c.Reason, c.Message)
	}
	return nil
}

func (e *env) tcp(t *testing.T, name string) *apiary.TenantControlPlane {
	t.Helper()
	var tcp apiary.TenantControlPlane
	if err := e.c.Get(e.ctx, client.ObjectKey{Namespace: tenantsNS, Name: name}, &tcp); err != nil {
		t.Fatal(err)
	}
	return &tcp
}

// createTenant creates a tenant and returns how long it took to be Ready
// (the operator's own probe through the LoadBalancer succeeded).
func (e *env) createTenant(t *testing.T, name string, mutate func(*apiary.TenantControlPlane)) time.Duration {
	t.Helper()
	tcp := &apiary.TenantControlPlane{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: tenantsNS}}
	if mutate != nil {
		mutate(tcp)
	}
	start := time.Now()
	if err := e.c.Create(e.ctx, tcp); err != nil {
		t.Fatal(err)
	}
	e.waitReady(t, name)
	return time.Since(start)
}

func (e *env) waitReady(t *testing.T, name string) {
	t.Helper()
	eventually(t, name+" Ready", readyLimit, func() error {
		var tcp apiary.TenantControlPlane
		if err := e.c.Get(e.ctx, client.ObjectKey{Namespace: tenantsNS, Name: name}, &tcp); err != nil {
			return err
		}
		return conditionIs(tcp.Status.Conditions, apiary.ConditionReady, metav1.ConditionTrue, "")
	})
}

// exportKubeconfig runs `apiary kubeconfig` against the management cluster
// and writes the tenant's admin kubeconfig to a file.
func (e *env) exportKubeconfig(t *testing.T, name string) string {
	t.Helper()
	var out, errOut bytes.Buffer
	cmd := cli.NewKubeconfigCommand(&cli.ConfigFlags{Kubeconfig: e.kubeconfig, Namespace: tenantsNS})
	cmd.SetArgs([]string{name})
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	if err := cmd.ExecuteContext(e.ctx); err != nil {
		t.Fatalf("apiary kubeconfig %s: %v: %s", name, err, errOut.String())
	}
	path := filepath.Join(t.TempDir(), name+".kubeconfig")
	if err := os.WriteFile(path, out.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func kubectl(t *testing.T, kubeconfig string, args ...string) string {
	t.Helper()
	out, err := kubectlErr(kubeconfig, args...)
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

func kubectlErr(kubeconfig string, args ...string) (string, error) {
	bin, err := testenv.KubeBinary("kubectl")
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, append([]string{"--kubeconfig", kubeconfig, "--request-timeout=10s"}, args...)...).CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

func (e *env) testTenantReady(t *testing.T) {
	took := e.createTenant(t, "alpha", nil)
	t.Logf("FIGURE tenant alpha: create → Ready (API answering through its LoadBalancer) in %s (first tenant: includes image pulls)", took.Round(time.Millisecond))
	tcp := e.tcp(t, "alpha")
	// Pods Running on the kubelet.
	var pods corev1.PodList
	if err := e.c.List(e.ctx, &pods, client.InNamespace(tenantsNS), client.MatchingLabels(render.SelectorLabels(tcp))); err != nil {
		t.Fatal(err)
	}
	running := 0
	for _, p := range pods.Items {
		if p.Status.Phase == corev1.PodRunning && p.Spec.NodeName != "" {
			running++
		}
	}
	if running != 2 {
		t.Errorf("%d control-plane pods Running, want 2", running)
	}
	// A MetalLB address on the Service, and it is the endpoint.
	var svc corev1.Service
	if err := e.c.Get(e.ctx, client.ObjectKey{Namespace: tenantsNS, Name: "alpha"}, &svc); err != nil {
		t.Fatal(err)
	}
	if len(svc.Status.LoadBalancer.Ingress) == 0 {
		t.Fatal("Service has no LoadBalancer address")
	}
	lbIP := svc.Status.LoadBalancer.Ingress[0].IP
	_, pool, _ := net.ParseCIDR(cluster.LBPoolCIDR)
	if !pool.Contains(net.ParseIP(lbIP)) {
		t.Errorf("LoadBalancer address %s is not from the MetalLB pool %s", lbIP, cluster.LBPoolCIDR)
	}
	if want := "https://" + lbIP + ":6443"; tcp.Status.Endpoint != want {
		t.Errorf("endpoint %s, want %s", tcp.Status.Endpoint, want)
	}
	// The exported kubeconfig works with kubectl through that address.
	kc := e.exportKubeconfig(t, "alpha")
	if server := kubectl(t, kc, "config", "view", "--minify", "-o", "jsonpath={.clusters[0].cluster.server}"); server != tcp.Status.Endpoint {
		t.Errorf("kubeconfig server %s, want %s", server, tcp.Status.Endpoint)
	}
	kubectl(t, kc, "create", "namespace", "alpha-ns")
	if got := kubectl(t, kc, "get", "namespace", "alpha-ns", "-o", "jsonpath={.metadata.name}"); got != "alpha-ns" {
		t.Errorf("read back namespace: %q", got)
	}
	var v struct {
		ServerVersion struct{ GitVersion string } `json:"serverVersion"`
	}
	if err := json.Unmarshal([]byte(kubectl(t, kc, "version", "-o", "json")), &v); err != nil {
		t.Fatal(err)
	}
	if v.ServerVersion.GitVersion != "v1.37.2" {
		t.Errorf("server version %q", v.ServerVersion.GitVersion)
	}
	if tcp.Status.Version != "v1.37.2" || tcp.Status.ReadyReplicas != 2 || tcp.Status.Phase != apiary.PhaseReady {
		t.Errorf("status version=%s readyReplicas=%d phase=%s", tcp.Status.Version, tcp.Status.ReadyReplicas, tcp.Status.Phase)
	}
	// The tenant's controller-manager and scheduler run: the default
	// ServiceAccount appears in the new namespace.
	eventually(t, "default ServiceAccount in the tenant", time.Minute, func() error {
		_, err := kubectlErr(kc, "get", "serviceaccount", "default", "-n", "alpha-ns")
		return err
	})
}

func namespaces(t *testing.T, kubeconfig string) []string {
	out := kubectl(t, kubeconfig, "get", "namespaces", "-o", "jsonpath={.items[*].metadata.name}")
	names := strings.Fields(out)
	sort.Strings(names)
	return names
}

func (e *env) testIsolation(t *testing.T) {
	took := e.createTenant(t, "beta", nil)
	t.Logf("FIGURE tenant beta: create → Ready in %s", took.Round(time.Millisecond))
	a, b := e.exportKubeconfig(t, "alpha"), e.exportKubeconfig(t, "beta")
	kubectl(t, b, "create", "namespace", "beta-ns")
	na, nb := namespaces(t, a), namespaces(t, b)
	if !slices.Contains(na, "alpha-ns") || slices.Contains(na, "beta-ns") {
		t.Errorf("alpha sees %v", na)
	}
	if !slices.Contains(nb, "beta-ns") || slices.Contains(nb, "alpha-ns") {
		t.Errorf("beta sees %v", nb)
	}
	// Both live on the same managed etcd, under different users.
	ta, tb := e.tcp(t, "alpha"), e.tcp(t, "beta")
	if ta.Status.DataStore.Name != "default" || tb.Status.DataStore.Name != "default" || ta.Status.DataStore.User == tb.Status.DataStore.User {
		t.Errorf("bindings %+v %+v", ta.Status.DataStore, tb.Status.DataStore)
	}
}

// poller sends GET /version to a tenant through its endpoint as a client
// would (a real request, served until a replica really stops; /readyz turns
// 500 on purpose while a replica drains) and counts failures and the
// longest outage.
type poller struct {
	url                 string
	hc                  *http.Client
	ok, failed          atomic.Int64
	mu                  sync.Mutex
	firstFail, lastGood time.Time
	longest             time.Duration
	failures            []string
}

func (e *env) newPoller(t *testing.T, name string) *poller {
	kc := e.exportKubeconfig(t, name)
	cfg, err := clientcmd.BuildConfigFromFlags("", kc)
	if err != nil {
		t.Fatal(err)
	}
	tlsCfg, err := rest.TLSConfigFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// A new connection for every request: a kept-alive connection to one
	// pod would hide what the LoadBalancer does.
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: tlsCfg, DisableKeepAlives: true}}
	return &poller{url: cfg.Host + "/version", hc: hc}
}

func (p *poller) run(ctx context.Context) {
	for ctx.Err() == nil {
		resp, err := p.hc.Get(p.url)
		now := time.Now()
		good := err == nil && resp.StatusCode == http.StatusOK
		if resp != nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		p.mu.Lock()
		if good {
			p.ok.Add(1)
			if !p.firstFail.IsZero() {
				p.longest = max(p.longest, now.Sub(p.firstFail))
				p.firstFail = time.Time{}
			}
			p.lastGood = now
		} else {
			p.failed.Add(1)
			if p.firstFail.IsZero() {
				p.firstFail = now
			}
			if len(p.failures) < 5 {
				msg := fmt.Sprint(err)
				if resp != nil {
					msg = resp.Status
				}
				p.failures = append(p.failures, now.Format("15:04:05.000")+" "+msg)
			}
		}
		p.mu.Unlock()
		time.Sleep(100 * time.Millisecond)
	}
}

func (e *env) setReplicas(t *testing.T, name string, n int32) {
	t.Helper()
	for {
		tcp := e.tcp(t, name)
		tcp.Spec.Replicas = ptr.To(n)
		err := e.c.Update(e.ctx, tcp)
		if err == nil {
			return
		}
		if !apierrors.IsConflict(err) {
			t.Fatal(err)
		}
	}
}

func (e *env) waitReplicas(t *testing.T, name string, n int32) {
	t.Helper()
	eventually(t, fmt.Sprintf("%s at %d ready replicas", name, n), 3*time.Minute, func() error {
		var dep appsv1.Deployment
		if err := e.c.Get(e.ctx, client.ObjectKey{Namespace: tenantsNS, Name: name}, &dep); err != nil {
			return err
		}
		if dep.Status.ReadyReplicas != n || dep.Status.Replicas != n || dep.Status.UpdatedReplicas != n {
			return fmt.Errorf("Deployment replicas=%d ready=%d updated=%d", dep.Status.Replicas, dep.Status.ReadyReplicas, dep.Status.UpdatedReplicas)
		}
		tcp := e.tcp(t, name)
		if tcp.Status.ReadyReplicas != n {
			return fmt.Errorf("status.readyReplicas=%d", tcp.Status.ReadyReplicas)
		}
		return nil
	})
}

func (e *env) testScale(t *testing.T) {
	p := e.newPoller(t, "alpha")
	ctx, cancel := context.WithCancel(e.ctx)
	done := make(chan struct{})
	go func() { p.run(ctx); close(done) }()
	start := time.Now()
	e.setReplicas(t, "alpha", 3)
	e.waitReplicas(t, "alpha", 3)
	up := time.Since(start)
	start = time.Now()
	e.setReplicas(t, "alpha", 1)
	e.waitReplicas(t, "alpha", 1)
	down := time.Since(start)
	time.Sleep(2 * time.Second)
	cancel()
	<-done
	t.Logf("FIGURE scale 2→3 in %s, 3→1 in %s; %d requests OK, %d failed during the scale", up.Round(time.Millisecond), down.Round(time.Millisecond), p.ok.Load(), p.failed.Load())
	if p.failed.Load() > 0 {
		t.Errorf("the API failed %d of %d requests during the scale: %v", p.failed.Load(), p.ok.Load()+p.failed.Load(), p.failures)
	}
	if p.ok.Load() < 10 {
		t.Errorf("only %d successful requests: the poll did not run", p.ok.Load())
	}
	e.setReplicas(t, "alpha", 2)
	e.waitReplicas(t, "alpha", 2)
}

func (e *env) testPodDeletion(t *testing.T) {
	// With two replicas the other one serves; with one, the API is back
	// when the replacement is ready.
	for _, replicas := range []int32{2, 1} {
		t.Run(fmt.Sprintf("%d replicas", replicas), func(t *testing.T) {
			e.setReplicas(t, "alpha", replicas)
			e.waitReplicas(t, "alpha", replicas)
			outage, replaced, failed, total := e.deleteOnePod(t, "alpha")
			t.Logf("FIGURE %d replica(s), one control-plane pod deleted: longest API outage %s (%d of %d requests failed); replacement ready after %s",
				replicas, outage.Round(time.Millisecond), failed, total, replaced.Round(time.Millisecond))
			if outage > 10*time.Second {
				t.Errorf("the API did not answer for %s after a pod was deleted (limit 10s)", outage)
			}
		})
	}
	e.setReplicas(t, "alpha", 2)
	e.waitReplicas(t, "alpha", 2)
}

// deleteOnePod deletes one control-plane pod while polling the API, and
// returns the longest outage and when a replacement was ready.
func (e *env) deleteOnePod(t *testing.T, name string) (outage, replaced time.Duration, failed, total int64) {
	sel := client.MatchingLabels(render.SelectorLabels(e.tcp(t, name)))
	want := int(ptr.Deref(e.tcp(t, name).Spec.Replicas, 2))
	// Start from exactly the wanted pods: none still terminating from an
	// earlier scale-down.
	var pods corev1.PodList
	eventually(t, "no terminating control-plane pod", time.Minute, func() error {
		if err := e.c.List(e.ctx, &pods, client.InNamespace(tenantsNS), sel); err != nil {
			return err
		}
		if len(pods.Items) != want {
			return fmt.Errorf("%d pods, want %d", len(pods.Items), want)
		}
		return nil
	})
	victim := pods.Items[0]
	p := e.newPoller(t, name)
	ctx, cancel := context.WithCancel(e.ctx)
	done := make(chan struct{})
	go func() { p.run(ctx); close(done) }()
	time.Sleep(time.Second)
	deleted := time.Now()
	if err := e.c.Delete(e.ctx, &victim); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a ready replacement pod", 2*time.Minute, func() error {
		var now corev1.PodList
		if err := e.c.List(e.ctx, &now, client.InNamespace(tenantsNS), sel); err != nil {
			return err
		}
		ready := 0
		for _, pod := range now.Items {
			if pod.UID == victim.UID || !pod.DeletionTimestamp.IsZero() {
				continue
			}
			for _, c := range pod.Status.Conditions {
				if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
					ready++
				}
			}
		}
		if ready < want {
			return fmt.Errorf("%d of %d replicas ready without the deleted pod", ready, want)
		}
		return nil
	})
	replaced = time.Since(deleted)
	time.Sleep(2 * time.Second)
	cancel()
	<-done
	p.mu.Lock()
	defer p.mu.Unlock()
	outage = p.longest
	if !p.firstFail.IsZero() {
		outage = max(outage, time.Since(p.firstFail))
	}
	if p.ok.Load() < 5 {
		t.Errorf("only %d successful requests: the poll did not run", p.ok.Load())
	}
	return outage, replaced, p.failed.Load(), p.ok.Load() + p.failed.Load()
}

func (e *env) testWebhook(t *testing.T) {
	cases := []struct {
		name        string
		mutate      func(*apiary.TenantControlPlane)
		field, rule string
	}{
		{"downgrade", func(p *apiary.TenantControlPlane) { p.Spec.Version = "v1.36.0" }, "spec.version", "downgrades are not supported"},
		{"overlapping CIDRs", func(p *apiary.TenantControlPlane) { p.Spec.Network.PodCIDR = "10.96.0.0/12" }, "spec.network", "must not overlap"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := e.tcp(t, "alpha")
			changed := before.DeepCopy()
			tc.mutate(changed)
			err := e.c.Update(e.ctx, changed)
			if err == nil || !strings.Contains(err.Error(), tc.field) || !strings.Contains(err.Error(), tc.rule) {
				t.Fatalf("update not rejected by the installed webhook with %s / %q: %v", tc.field, tc.rule, err)
			}
			if e.tcp(t, "alpha").Generation != before.Generation {
				t.Errorf("rejected update changed the spec")
			}
		})
	}
	t.Run("create with overlapping CIDRs", func(t *testing.T) {
		bad := &apiary.TenantControlPlane{ObjectMeta: metav1.ObjectMeta{Name: "bad", Namespace: tenantsNS},
			Spec: apiary.TenantControlPlaneSpec{Network: apiary.NetworkSpec{PodCIDR: "10.96.0.0/12"}}}
		err := e.c.Create(e.ctx, bad)
		if err == nil || !strings.Contains(err.Error(), "spec.network.serviceCIDR") || !strings.Contains(err.Error(), "must not overlap podCIDR 10.96.0.0/12") {
			t.Fatalf("create not rejected with the field named: %v", err)
		}
	})
}

// etcdRoot connects to the managed etcd as root through a port-forward.
func (e *env) etcdRoot(t *testing.T) *datastore.Client {
	t.Helper()
	bin, err := testenv.KubeBinary("kubectl")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(e.ctx)
	cmd := exec.CommandContext(ctx, bin, "--kubeconfig", e.kubeconfig, "-n", systemNS, "port-forward", "pod/default-etcd-0", ":2379", "--address", "127.0.0.1")
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); _ = cmd.Wait() })
	port := ""
	sc := bufio.NewScanner(stdout)
	re := regexp.MustCompile(`Forwarding from 127\.0\.0\.1:(\d+)`)
	for sc.Scan() {
		if m := re.FindStringSubmatch(sc.Text()); m != nil {
			port = m[1]
			break
		}
	}
	if port == "" {
		t.Fatal("kubectl port-forward to the etcd member did not start")
	}
	go io.Copy(io.Discard, stdout)
	var ca, root corev1.Secret
	for name, s := range map[string]*corev1.Secret{"default-etcd-ca": &ca, "default-etcd-root": &root} {
		if err := e.c.Get(e.ctx, client.ObjectKey{Namespace: systemNS, Name: name}, s); err != nil {
			t.Fatal(err)
		}
	}
	dc, err := datastore.Connect(e.ctx, datastore.Config{
		Endpoints: []string{"https://127.0.0.1:" + port},
		CACert:    ca.Data["tls.crt"], CAKey: ca.Data["tls.key"],
		ClientCert: root.Data["tls.crt"], ClientKey: root.Data["tls.key"],
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dc.Close() })
	return dc
}

func (e *env) testDelete(t *testing.T) {
	tcp := e.tcp(t, "beta")
	tenant := datastore.Tenant{User: tcp.Status.DataStore.User, Prefix: tcp.Status.DataStore.Prefix}
	dc := e.etcdRoot(t)
	keys, err := dc.CountKeys(e.ctx, tenant.Prefix+"/")
	if err != nil {
		t.Fatal(err)
	}
	if keys == 0 {
		t.Fatalf("beta has no keys under %s before deletion: the check would prove nothing", tenant.Prefix)
	}
	start := time.Now()
	if err := e.c.Delete(e.ctx, tcp); err != nil {
		t.Fatal(err)
	}
	eventually(t, "beta gone", 2*time.Minute, func() error {
		err := e.c.Get(e.ctx, client.ObjectKeyFromObject(tcp), &apiary.TenantControlPlane{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("still there: %v", err)
	})
	t.Logf("FIGURE tenant beta deleted in %s (%d etcd keys removed)", time.Since(start).Round(time.Millisecond), keys)
	eventually(t, "beta's pods gone", 2*time.Minute, func() error {
		var pods corev1.PodList
		if err := e.c.List(e.ctx, &pods, client.InNamespace(tenantsNS), client.MatchingLabels{render.LabelTenant: "beta"}); err != nil {
			return err
		}
		if len(pods.Items) > 0 {
			return fmt.Errorf("%d pods left", len(pods.Items))
		}
		return nil
	})
	var secrets corev1.SecretList
	if err := e.c.List(e.ctx, &secrets, client.InNamespace(tenantsNS), client.MatchingLabels{render.LabelTenant: "beta"}); err != nil {
		t.Fatal(err)
	}
	if len(secrets.Items) > 0 {
		t.Errorf("%d Secrets left", len(secrets.Items))
	}
	if err := e.c.Get(e.ctx, client.ObjectKey{Namespace: tenantsNS, Name: "beta"}, &corev1.Service{}); !apierrors.IsNotFound(err) {
		t.Errorf("Service left: %v", err)
	}
	left, err := dc.CountKeys(e.ctx, tenant.Prefix+"/")
	if err != nil {
		t.Fatal(err)
	}
	user, _ := dc.UserExists(e.ctx, tenant.User)
	role, _ := dc.RoleExists(e.ctx, tenant.User)
	if left != 0 || user || role {
		t.Errorf("etcd after deletion: %d keys under %s, user exists=%v, role exists=%v", left, tenant.Prefix, user, role)
	}
	// alpha is untouched.
	if n, err := dc.CountKeys(e.ctx, e.tcp(t, "alpha").Status.DataStore.Prefix+"/"); err != nil || n == 0 {
		t.Errorf("alpha's keys after beta's deletion: %d, %v", n, err)
	}
}

// leader returns the operator pod holding the leader lease.
func (e *env) leader(t *testing.T) string {
	t.Helper()
	var lease coordinationv1.Lease
	if err := e.c.Get(e.ctx, client.ObjectKey{Namespace: systemNS, Name: leaseName}, &lease); err != nil {
		t.Fatal(err)
	}
	holder := ptr.Deref(lease.Spec.HolderIdentity, "")
	pod, _, _ := strings.Cut(holder, "_")
	if pod == "" {
		t.Fatalf("no leader in lease %s", leaseName)
	}
	return pod
}

func (e *env) testOperatorRestart(t *testing.T) {
	tcp := &apiary.TenantControlPlane{ObjectMeta: metav1.ObjectMeta{Name: "gamma", Namespace: tenantsNS}}
	start := time.Now()
	if err := e.c.Create(e.ctx, tcp); err != nil {
		t.Fatal(err)
	}
	// Kill the leader while it provisions: as soon as the tenant's first
	// objects appear.
	eventually(t, "gamma provisioning started", time.Minute, func() error {
		var secrets corev1.SecretList
		if err := e.c.List(e.ctx, &secrets, client.InNamespace(tenantsNS), client.MatchingLabels{render.LabelTenant: "gamma"}); err != nil {
			return err
		}
		if len(secrets.Items) == 0 {
			return errors.New("no Secret yet")
		}
		return nil
	})
	leader := e.leader(t)
	if err := e.c.Delete(e.ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: systemNS, Name: leader}}, client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	t.Logf("killed operator leader %s %s after creating gamma", leader, time.Since(start).Round(time.Millisecond))
	e.waitReady(t, "gamma")
	t.Logf("FIGURE gamma Ready %s after creation, across an operator leader kill", time.Since(start).Round(time.Millisecond))
	if now := e.leader(t); now == leader {
		t.Errorf("the killed pod %s still holds the lease", leader)
	}
	// Nothing duplicated: one Deployment, one Service, each Secret once,
	// the pods of one ReplicaSet generation.
	var deps appsv1.DeploymentList
	var svcs corev1.ServiceList
	var secrets corev1.SecretList
	sel := client.MatchingLabels{render.LabelTenant: "gamma"}
	for _, l := range []client.ObjectList{&deps, &svcs, &secrets} {
		if err := e.c.List(e.ctx, l, client.InNamespace(tenantsNS), sel); err != nil {
			t.Fatal(err)
		}
	}
	if len(deps.Items) != 1 || len(svcs.Items) != 1 || len(secrets.Items) != len(render.AllSecretKinds) {
		t.Errorf("gamma has %d Deployments, %d Services, %d Secrets; want 1, 1, %d", len(deps.Items), len(svcs.Items), len(secrets.Items), len(render.AllSecretKinds))
	}
	var rss appsv1.ReplicaSetList
	if err := e.c.List(e.ctx, &rss, client.InNamespace(tenantsNS), client.MatchingLabels(render.SelectorLabels(e.tcp(t, "gamma")))); err != nil {
		t.Fatal(err)
	}
	if len(rss.Items) != 1 {
		t.Errorf("gamma's Deployment rolled %d ReplicaSets: its pod template changed during the restart", len(rss.Items))
	}
	kc := e.exportKubeconfig(t, "gamma")
	kubectl(t, kc, "get", "namespaces")
}
