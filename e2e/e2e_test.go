//go:build e2e

// Package e2e runs Apiary end to end on the local management cluster
// (hack/devcluster: real kubelet, containerd, CoreDNS, MetalLB), with the Helm
// chart installed by helm built from source, as a user would. `make e2e`
// brings the cluster up, runs this suite and tears the cluster down.
package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/apiaryhq/apiary/datastore"
	"github.com/apiaryhq/apiary/e2e/cluster"
	"github.com/apiaryhq/apiary/e2e/framework"
	"github.com/apiaryhq/apiary/internal/testenv"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/operator/controllers"
	"github.com/apiaryhq/apiary/operator/render"
	"github.com/apiaryhq/apiary/operator/render/managedetcd"
)

// env is the installed Apiary, with the tests as its methods.
type env struct{ *framework.Env }

func TestE2E(t *testing.T) {
	e := env{framework.Setup(t)}
	t.Run("TenantBecomesReadyBehindLoadBalancer", e.testTenantReady)
	t.Run("TenantBootstrapIsKubeadmCompatible", e.testKubeadmBootstrap)
	t.Run("TenantsAreIsolated", e.testIsolation)
	t.Run("DataStoreQuotaConfinesATenant", e.testDataStoreQuota)
	t.Run("DataStoreCertConfinedToItsPrefix", e.testDataStoreCertConfined)
	t.Run("CompactedContinueTokenIsGone", e.testCompactedContinueToken)
	t.Run("NetworkPolicyConfinesTenants", e.testNetworkPolicy)
	t.Run("ScaleKeepsAPIAvailable", e.testScale)
	t.Run("ControlPlanePodDeleted", e.testPodDeletion)
	t.Run("CertificatesRenewOnTime", e.testCertRenewal)
	t.Run("TenantAcceptsOIDCTokens", e.testTenantOIDC)
	t.Run("DashboardInTheCluster", e.testDashboardInTheCluster)
	t.Run("UpgradeToMissingImagesStopsAndCancels", e.testUpgradeToMissingImages)
	t.Run("WebhookRejectsBadSpecs", e.testWebhook)
	t.Run("WebhookRefusesBoundaryFlags", e.testProtectedArgs)
	t.Run("NodePortTenantAnswers", e.testNodePortTenant)
	t.Run("OperatorMetricsNeedAuthorization", e.testOperatorMetrics)
	t.Run("OperatorRightsConfinedToItsNamespaces", e.testOperatorRights)
	t.Run("DeleteRemovesEverything", e.testDelete)
	t.Run("OperatorKilledMidReconcile", e.testOperatorRestart)
	t.Run("ManagedEtcdWithThreeMembers", e.testThreeMemberDataStore)
	t.Run("HostsOverSSH", e.testHostPreflight)
}

func (e *env) testTenantReady(t *testing.T) {
	took := e.CreateTenant(t, "alpha", nil)
	t.Logf("FIGURE tenant alpha: create → Ready (API answering through its LoadBalancer) in %s (first tenant: includes image pulls)", took.Round(time.Millisecond))
	// Ready means the API answers, which one replica is enough for; both
	// follow, and the rollout completes (status.version).
	var tcp *apiary.TenantControlPlane
	framework.Eventually(t, "both replicas ready and the rollout complete", time.Minute, func() error {
		tcp = e.TCP(t, "alpha")
		if tcp.Status.Version != "v1.37.2" || tcp.Status.ReadyReplicas != 2 || tcp.Status.Phase != apiary.PhaseReady {
			return fmt.Errorf("status version=%s readyReplicas=%d phase=%s", tcp.Status.Version, tcp.Status.ReadyReplicas, tcp.Status.Phase)
		}
		return nil
	})
	// Pods Running on the kubelet.
	var pods corev1.PodList
	if err := e.C.List(e.Ctx, &pods, client.InNamespace(framework.TenantsNS), client.MatchingLabels(render.SelectorLabels(tcp))); err != nil {
		t.Fatal(err)
	}
	running := 0
	for _, p := range pods.Items {
		if p.Status.Phase == corev1.PodRunning && p.Spec.NodeName != "" && p.DeletionTimestamp.IsZero() {
			running++
		}
	}
	if running != 2 {
		t.Errorf("%d control-plane pods Running, want 2", running)
	}
	// A MetalLB address on the Service, and it is the endpoint.
	var svc corev1.Service
	if err := e.C.Get(e.Ctx, client.ObjectKey{Namespace: framework.TenantsNS, Name: "alpha"}, &svc); err != nil {
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
	kc := e.ExportKubeconfig(t, "alpha")
	if server := framework.Kubectl(t, kc, "config", "view", "--minify", "-o", "jsonpath={.clusters[0].cluster.server}"); server != tcp.Status.Endpoint {
		t.Errorf("kubeconfig server %s, want %s", server, tcp.Status.Endpoint)
	}
	framework.Kubectl(t, kc, "create", "namespace", "alpha-ns")
	if got := framework.Kubectl(t, kc, "get", "namespace", "alpha-ns", "-o", "jsonpath={.metadata.name}"); got != "alpha-ns" {
		t.Errorf("read back namespace: %q", got)
	}
	var v struct {
		ServerVersion struct{ GitVersion string } `json:"serverVersion"`
	}
	if err := json.Unmarshal([]byte(framework.Kubectl(t, kc, "version", "-o", "json")), &v); err != nil {
		t.Fatal(err)
	}
	if v.ServerVersion.GitVersion != "v1.37.2" {
		t.Errorf("server version %q", v.ServerVersion.GitVersion)
	}
	// The tenant's controller-manager and scheduler run: the default
	// ServiceAccount appears in the new namespace.
	framework.Eventually(t, "default ServiceAccount in the tenant", time.Minute, func() error {
		_, err := framework.KubectlErr(kc, "get", "serviceaccount", "default", "-n", "alpha-ns")
		return err
	})
}

func namespaces(t *testing.T, kubeconfig string) []string {
	out := framework.Kubectl(t, kubeconfig, "get", "namespaces", "-o", "jsonpath={.items[*].metadata.name}")
	names := strings.Fields(out)
	sort.Strings(names)
	return names
}

func (e *env) testIsolation(t *testing.T) {
	took := e.CreateTenant(t, "beta", nil)
	t.Logf("FIGURE tenant beta: create → Ready in %s", took.Round(time.Millisecond))
	a, b := e.ExportKubeconfig(t, "alpha"), e.ExportKubeconfig(t, "beta")
	framework.Kubectl(t, b, "create", "namespace", "beta-ns")
	na, nb := namespaces(t, a), namespaces(t, b)
	if !slices.Contains(na, "alpha-ns") || slices.Contains(na, "beta-ns") {
		t.Errorf("alpha sees %v", na)
	}
	if !slices.Contains(nb, "beta-ns") || slices.Contains(nb, "alpha-ns") {
		t.Errorf("beta sees %v", nb)
	}
	// Both live on the same managed etcd, under different users.
	ta, tb := e.TCP(t, "alpha"), e.TCP(t, "beta")
	if ta.Status.DataStore.Name != "default" || tb.Status.DataStore.Name != "default" || ta.Status.DataStore.User == tb.Status.DataStore.User {
		t.Errorf("bindings %+v %+v", ta.Status.DataStore, tb.Status.DataStore)
	}
}

// poller sends GET /version to a tenant through its endpoint as a client
// would (a real request, served until a replica really stops; /readyz turns
// 500 on purpose while a replica drains) and counts failures and the
// longest outage.
type poller struct {
	url string
	hc  *http.Client
	// follow, when set, gives the client of each request instead of hc.
	follow              *kubeconfigFollower
	ok, failed          atomic.Int64
	mu                  sync.Mutex
	firstFail, lastGood time.Time
	began, ended        time.Time // the poll's window, for verdict
	longest             time.Duration
	slowest             time.Duration // the longest a successful request took
	failures            []string
}

func (e *env) newPoller(t *testing.T, name string) *poller {
	kc := e.ExportKubeconfig(t, name)
	cfg, err := clientcmd.BuildConfigFromFlags("", kc)
	if err != nil {
		t.Fatal(err)
	}
	hc, err := pollerClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &poller{url: cfg.Host + "/version", hc: hc}
}

// pollerClient is a poller's HTTP client for a tenant. A new connection
// for every request: a kept-alive connection to one pod would hide what
// the LoadBalancer does. A request fails when it errors, is not 200, or
// takes more than framework.RequestTimeout (5 s, as each request of the
// writer); a slower answer shows as slowest (on this 2-core machine
// requests during a switch's ScalingUp were seen to take over 4 s).
func pollerClient(cfg *rest.Config) (*http.Client, error) {
	tlsCfg, err := rest.TLSConfigFor(cfg)
	if err != nil {
		return nil, err
	}
	return &http.Client{Timeout: framework.RequestTimeout, Transport: &http.Transport{TLSClientConfig: tlsCfg, DisableKeepAlives: true}}, nil
}

// verdict logs the poll's figure and fails the test on any failed request
// (during says when, for the message) or when the poll did not run: fewer
// good answers than one a second over its window. A fixed count would fail
// a test for being quick (a stopped-and-cancelled upgrade took 4.7 s in
// CI: 45 answers at one per 100 ms). Call it once the poll has stopped.
func (p *poller) verdict(t *testing.T, figure, during string) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	ok, failed := p.ok.Load(), p.failed.Load()
	window := p.ended.Sub(p.began)
	t.Logf("FIGURE %s: /version %d OK, %d failed over %s, longest gap %s, slowest answer %s",
		figure, ok, failed, window.Round(100*time.Millisecond), p.longest.Round(time.Millisecond), p.slowest.Round(time.Millisecond))
	if failed > 0 {
		t.Errorf("%d of %d requests failed %s: %v", failed, ok+failed, during, p.failures)
	}
	if want := int64(window / time.Second); ok == 0 || ok < want {
		t.Errorf("%d successful requests over %s, want at least %d: the poll did not run", ok, window.Round(100*time.Millisecond), want)
	}
}

func (p *poller) run(ctx context.Context) {
	p.mu.Lock()
	p.began = time.Now()
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.ended = time.Now()
		p.mu.Unlock()
	}()
	for ctx.Err() == nil {
		hc := p.hc
		if p.follow != nil {
			hc = p.follow.client()
		}
		sent := time.Now()
		resp, err := hc.Get(p.url)
		now := time.Now()
		good := err == nil && resp.StatusCode == http.StatusOK
		if resp != nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		p.mu.Lock()
		if good {
			p.ok.Add(1)
			p.slowest = max(p.slowest, now.Sub(sent))
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
		tcp := e.TCP(t, name)
		tcp.Spec.Replicas = ptr.To(n)
		err := e.C.Update(e.Ctx, tcp)
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
	framework.Eventually(t, fmt.Sprintf("%s at %d ready replicas", name, n), 3*time.Minute, func() error {
		var dep appsv1.Deployment
		if err := e.C.Get(e.Ctx, client.ObjectKey{Namespace: framework.TenantsNS, Name: name}, &dep); err != nil {
			return err
		}
		if dep.Status.ReadyReplicas != n || dep.Status.Replicas != n || dep.Status.UpdatedReplicas != n {
			return fmt.Errorf("Deployment replicas=%d ready=%d updated=%d", dep.Status.Replicas, dep.Status.ReadyReplicas, dep.Status.UpdatedReplicas)
		}
		tcp := e.TCP(t, name)
		if tcp.Status.ReadyReplicas != n {
			return fmt.Errorf("status.readyReplicas=%d", tcp.Status.ReadyReplicas)
		}
		return nil
	})
}

func (e *env) testScale(t *testing.T) {
	p := e.newPoller(t, "alpha")
	ctx, cancel := context.WithCancel(e.Ctx)
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
	p.verdict(t, fmt.Sprintf("scale 2→3 in %s, 3→1 in %s", up.Round(time.Millisecond), down.Round(time.Millisecond)), "during the scale")
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
	sel := client.MatchingLabels(render.SelectorLabels(e.TCP(t, name)))
	want := int(ptr.Deref(e.TCP(t, name).Spec.Replicas, 2))
	// Start from exactly the wanted pods: none still terminating from an
	// earlier scale-down.
	var pods corev1.PodList
	framework.Eventually(t, "no terminating control-plane pod", time.Minute, func() error {
		if err := e.C.List(e.Ctx, &pods, client.InNamespace(framework.TenantsNS), sel); err != nil {
			return err
		}
		if len(pods.Items) != want {
			return fmt.Errorf("%d pods, want %d", len(pods.Items), want)
		}
		return nil
	})
	victim := pods.Items[0]
	p := e.newPoller(t, name)
	ctx, cancel := context.WithCancel(e.Ctx)
	done := make(chan struct{})
	go func() { p.run(ctx); close(done) }()
	time.Sleep(time.Second)
	deleted := time.Now()
	if err := e.C.Delete(e.Ctx, &victim); err != nil {
		t.Fatal(err)
	}
	framework.Eventually(t, "a ready replacement pod", 2*time.Minute, func() error {
		var now corev1.PodList
		if err := e.C.List(e.Ctx, &now, client.InNamespace(framework.TenantsNS), sel); err != nil {
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
			before := e.TCP(t, "alpha")
			changed := before.DeepCopy()
			tc.mutate(changed)
			err := e.C.Update(e.Ctx, changed)
			if err == nil || !strings.Contains(err.Error(), tc.field) || !strings.Contains(err.Error(), tc.rule) {
				t.Fatalf("update not rejected by the installed webhook with %s / %q: %v", tc.field, tc.rule, err)
			}
			if e.TCP(t, "alpha").Generation != before.Generation {
				t.Errorf("rejected update changed the spec")
			}
		})
	}
	t.Run("konnectivity off outside the allowed namespaces", func(t *testing.T) {
		// The chart allows it in the tenants' namespace only (the
		// NetworkPolicy test's tenant "direct").
		bad := &apiary.TenantControlPlane{ObjectMeta: metav1.ObjectMeta{Name: "direct", Namespace: "default"}}
		bad.Spec.Addons.Konnectivity.Enabled = ptr.To(false)
		err := e.C.Create(e.Ctx, bad, client.DryRunAll)
		if err == nil || !strings.Contains(err.Error(), "spec.addons.konnectivity.enabled") || !strings.Contains(err.Error(), "namespace default is not among the operator's --konnectivity-optional-namespaces") {
			t.Fatalf("create with konnectivity off in namespace default: %v", err)
		}
	})
	t.Run("create with overlapping CIDRs", func(t *testing.T) {
		bad := &apiary.TenantControlPlane{ObjectMeta: metav1.ObjectMeta{Name: "bad", Namespace: framework.TenantsNS},
			Spec: apiary.TenantControlPlaneSpec{Network: apiary.NetworkSpec{PodCIDR: "10.96.0.0/12"}}}
		err := e.C.Create(e.Ctx, bad)
		if err == nil || !strings.Contains(err.Error(), "spec.network.serviceCIDR") || !strings.Contains(err.Error(), "must not overlap podCIDR 10.96.0.0/12") {
			t.Fatalf("create not rejected with the field named: %v", err)
		}
	})
}

// portForward forwards a local port to a port of a pod in the Apiary
// namespace and returns the local port.
func (e *env) portForward(t *testing.T, pod string, port int) string {
	t.Helper()
	return e.portForwardTo(t, "pod/"+pod, 0, port)
}

// portForwardTo forwards local (0: any free port) to a port of target
// (pod/NAME, deployment/NAME) in the Apiary namespace and returns the
// local port.
func (e *env) portForwardTo(t *testing.T, target string, local, port int) string {
	t.Helper()
	bin, err := testenv.KubeBinary("kubectl")
	if err != nil {
		t.Fatal(err)
	}
	ports := fmt.Sprintf(":%d", port)
	if local != 0 {
		ports = fmt.Sprintf("%d:%d", local, port)
	}
	ctx, cancel := context.WithCancel(e.Ctx)
	cmd := exec.CommandContext(ctx, bin, "--kubeconfig", e.Kubeconfig, "-n", framework.SystemNS, "port-forward", target, ports, "--address", "127.0.0.1")
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); _ = cmd.Wait() })
	forwarded := ""
	sc := bufio.NewScanner(stdout)
	re := regexp.MustCompile(`Forwarding from 127\.0\.0\.1:(\d+)`)
	for sc.Scan() {
		if m := re.FindStringSubmatch(sc.Text()); m != nil {
			forwarded = m[1]
			break
		}
	}
	if forwarded == "" {
		t.Fatalf("kubectl port-forward to %s:%d did not start", target, port)
	}
	go io.Copy(io.Discard, stdout)
	return forwarded
}

// etcdRoot connects to the managed etcd as root through a port-forward.
func (e *env) etcdRoot(t *testing.T) *datastore.Client {
	t.Helper()
	port := e.portForward(t, "default-etcd-0", 2379)
	var ca, root corev1.Secret
	for name, s := range map[string]*corev1.Secret{"default-etcd-ca": &ca, "default-etcd-root": &root} {
		if err := e.C.Get(e.Ctx, client.ObjectKey{Namespace: framework.SystemNS, Name: name}, s); err != nil {
			t.Fatal(err)
		}
	}
	dc, err := datastore.Connect(e.Ctx, datastore.Config{
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
	tcp := e.TCP(t, "beta")
	tenant := datastore.Tenant{User: tcp.Status.DataStore.User, Prefix: tcp.Status.DataStore.Prefix}
	dc := e.etcdRoot(t)
	keys, err := dc.CountKeys(e.Ctx, tenant.Prefix+"/")
	if err != nil {
		t.Fatal(err)
	}
	if keys == 0 {
		t.Fatalf("beta has no keys under %s before deletion: the check would prove nothing", tenant.Prefix)
	}
	start := time.Now()
	if err := e.C.Delete(e.Ctx, tcp); err != nil {
		t.Fatal(err)
	}
	framework.Eventually(t, "beta gone", 2*time.Minute, func() error {
		err := e.C.Get(e.Ctx, client.ObjectKeyFromObject(tcp), &apiary.TenantControlPlane{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("still there: %v", err)
	})
	t.Logf("FIGURE tenant beta deleted in %s (%d etcd keys removed)", time.Since(start).Round(time.Millisecond), keys)
	framework.Eventually(t, "beta's pods gone", 2*time.Minute, func() error {
		var pods corev1.PodList
		if err := e.C.List(e.Ctx, &pods, client.InNamespace(framework.TenantsNS), client.MatchingLabels{render.LabelTenant: "beta"}); err != nil {
			return err
		}
		if len(pods.Items) > 0 {
			return fmt.Errorf("%d pods left", len(pods.Items))
		}
		return nil
	})
	var secrets corev1.SecretList
	if err := e.C.List(e.Ctx, &secrets, client.InNamespace(framework.TenantsNS), client.MatchingLabels{render.LabelTenant: "beta"}); err != nil {
		t.Fatal(err)
	}
	if len(secrets.Items) > 0 {
		t.Errorf("%d Secrets left", len(secrets.Items))
	}
	if err := e.C.Get(e.Ctx, client.ObjectKey{Namespace: framework.TenantsNS, Name: "beta"}, &corev1.Service{}); !apierrors.IsNotFound(err) {
		t.Errorf("Service left: %v", err)
	}
	left, err := dc.CountKeys(e.Ctx, tenant.Prefix+"/")
	if err != nil {
		t.Fatal(err)
	}
	user, _ := dc.UserExists(e.Ctx, tenant.User)
	role, _ := dc.RoleExists(e.Ctx, tenant.User)
	if left != 0 || user || role {
		t.Errorf("etcd after deletion: %d keys under %s, user exists=%v, role exists=%v", left, tenant.Prefix, user, role)
	}
	// alpha is untouched.
	if n, err := dc.CountKeys(e.Ctx, e.TCP(t, "alpha").Status.DataStore.Prefix+"/"); err != nil || n == 0 {
		t.Errorf("alpha's keys after beta's deletion: %d, %v", n, err)
	}
}

// leader returns the operator pod holding the leader lease.
func (e *env) leader(t *testing.T) string {
	t.Helper()
	var lease coordinationv1.Lease
	if err := e.C.Get(e.Ctx, client.ObjectKey{Namespace: framework.SystemNS, Name: framework.LeaseName}, &lease); err != nil {
		t.Fatal(err)
	}
	holder := ptr.Deref(lease.Spec.HolderIdentity, "")
	pod, _, _ := strings.Cut(holder, "_")
	if pod == "" {
		t.Fatalf("no leader in lease %s", framework.LeaseName)
	}
	return pod
}

// operatorRestarts returns the operator pods' container restarts by pod.
func (e *env) operatorRestarts(t *testing.T) map[string]int32 {
	t.Helper()
	var pods corev1.PodList
	if err := e.C.List(e.Ctx, &pods, client.InNamespace(framework.SystemNS), client.MatchingLabels{
		"app.kubernetes.io/name": "apiary", "app.kubernetes.io/instance": framework.Release, "app.kubernetes.io/component": "operator",
	}); err != nil {
		t.Fatal(err)
	}
	out := map[string]int32{}
	for _, p := range pods.Items {
		for _, cs := range p.Status.ContainerStatuses {
			out[p.Name] += cs.RestartCount
		}
	}
	return out
}

// killLeader deletes the operator's leader pod at once (grace 0, as a
// crash) and returns its name.
func (e *env) killLeader(t *testing.T) string {
	t.Helper()
	leader := e.leader(t)
	if err := e.C.Delete(e.Ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: framework.SystemNS, Name: leader}}, client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	return leader
}

// logWhatWaited logs, for a tenant slow to become Ready, its control-plane
// pods' and the operator's restarts, its conditions and its events, with
// times from start.
func (e *env) logWhatWaited(t *testing.T, name string, start time.Time) {
	t.Helper()
	since := func(ts metav1.Time) string { return ts.Sub(start).Round(100 * time.Millisecond).String() }
	var pods corev1.PodList
	for _, l := range []struct {
		ns  string
		sel client.MatchingLabels
	}{
		{framework.TenantsNS, render.SelectorLabels(e.TCP(t, name))},
		{framework.SystemNS, nil},
	} {
		if err := e.C.List(e.Ctx, &pods, client.InNamespace(l.ns), l.sel); err != nil {
			t.Logf("listing pods in %s: %v", l.ns, err)
			continue
		}
		for _, p := range pods.Items {
			for _, cs := range p.Status.ContainerStatuses {
				last := ""
				if term := cs.LastTerminationState.Terminated; term != nil {
					last = fmt.Sprintf(", last exit %d (%s) at %s: %.200s", term.ExitCode, term.Reason, since(term.FinishedAt), term.Message)
				}
				t.Logf("slow start: pod %s (created at %s) container %s: %d restarts, ready %v%s", p.Name, since(p.CreationTimestamp), cs.Name, cs.RestartCount, cs.Ready, last)
			}
		}
	}
	for _, c := range e.TCP(t, name).Status.Conditions {
		t.Logf("slow start: condition %s=%s (%s) at %s: %.200s", c.Type, c.Status, c.Reason, since(c.LastTransitionTime), c.Message)
	}
	var events corev1.EventList
	if err := e.C.List(e.Ctx, &events, client.InNamespace(framework.TenantsNS)); err == nil {
		for _, ev := range events.Items {
			// The operator's events (events.k8s.io) have an eventTime,
			// the kubelet's a lastTimestamp.
			at := ev.LastTimestamp
			if at.IsZero() {
				at = metav1.NewTime(ev.EventTime.Time)
			}
			if strings.HasPrefix(ev.InvolvedObject.Name, name) && at.After(start) {
				t.Logf("slow start: event %s %s/%s %s ×%d at %s: %.200s", ev.Type, ev.InvolvedObject.Kind, ev.InvolvedObject.Name, ev.Reason, ev.Count, since(at), ev.Message)
			}
		}
	}
}

func (e *env) testOperatorRestart(t *testing.T) {
	tcp := &apiary.TenantControlPlane{ObjectMeta: metav1.ObjectMeta{Name: "gamma", Namespace: framework.TenantsNS}}
	start := time.Now()
	if err := e.C.Create(e.Ctx, tcp); err != nil {
		t.Fatal(err)
	}
	// No later test uses gamma: on 2 cores its idle control plane would
	// slow every one of them.
	t.Cleanup(func() { e.deleteTenant(t, "gamma") })
	// Kill the leader while it provisions: as soon as the tenant's first
	// objects appear.
	framework.Eventually(t, "gamma provisioning started", time.Minute, func() error {
		var secrets corev1.SecretList
		if err := e.C.List(e.Ctx, &secrets, client.InNamespace(framework.TenantsNS), client.MatchingLabels{render.LabelTenant: "gamma"}); err != nil {
			return err
		}
		if len(secrets.Items) == 0 {
			return errors.New("no Secret yet")
		}
		return nil
	})
	restarts := e.operatorRestarts(t)
	leader := e.killLeader(t)
	t.Logf("killed operator leader %s %s after creating gamma", leader, time.Since(start).Round(time.Millisecond))
	e.WaitReady(t, "gamma")
	t.Logf("FIGURE gamma Ready %s after creation, across an operator leader kill", time.Since(start).Round(time.Millisecond))
	if time.Since(start) > 45*time.Second {
		// Usually about 20 s. What restarted and when says which wait
		// it was.
		e.logWhatWaited(t, "gamma", start)
	}
	if now := e.leader(t); now == leader {
		t.Errorf("the killed pod %s still holds the lease", leader)
	}
	// The standby took over as it was. It had started before
	// OperatorRightsConfinedToItsNamespaces deleted a tenant namespace;
	// when its controllers started their watches only on winning the
	// lease, the informers there were refused (the Roles had gone), the
	// new leader waited the 2-minute cache-sync timeout, exited and
	// restarted: gamma Ready after 2 m 30 s in full runs, 20 s alone.
	after := e.operatorRestarts(t)
	for pod, before := range restarts {
		if now, ok := after[pod]; pod != leader && ok && now != before {
			t.Errorf("operator pod %s restarted across the leader kill (%d restarts, %d before)", pod, now, before)
		}
	}
	// Nothing duplicated: one Deployment, one Service, each Secret once,
	// the pods of one ReplicaSet generation.
	var deps appsv1.DeploymentList
	var svcs corev1.ServiceList
	var secrets corev1.SecretList
	sel := client.MatchingLabels{render.LabelTenant: "gamma"}
	for _, l := range []client.ObjectList{&deps, &svcs, &secrets} {
		if err := e.C.List(e.Ctx, l, client.InNamespace(framework.TenantsNS), sel); err != nil {
			t.Fatal(err)
		}
	}
	if len(deps.Items) != 1 || len(svcs.Items) != 1 || len(secrets.Items) != len(render.AllSecretKinds) {
		t.Errorf("gamma has %d Deployments, %d Services, %d Secrets; want 1, 1, %d", len(deps.Items), len(svcs.Items), len(secrets.Items), len(render.AllSecretKinds))
	}
	var rss appsv1.ReplicaSetList
	if err := e.C.List(e.Ctx, &rss, client.InNamespace(framework.TenantsNS), client.MatchingLabels(render.SelectorLabels(e.TCP(t, "gamma")))); err != nil {
		t.Fatal(err)
	}
	if len(rss.Items) != 1 {
		t.Errorf("gamma's Deployment rolled %d ReplicaSets: its pod template changed during the restart", len(rss.Items))
	}
	kc := e.ExportKubeconfig(t, "gamma")
	framework.Kubectl(t, kc, "get", "namespaces")
}

// testThreeMemberDataStore creates a managed etcd of three members, puts a
// tenant on it, and removes both.
func (e *env) testThreeMemberDataStore(t *testing.T) {
	// Members keep their data in claims, as in production: the local
	// cluster has no provisioner, so the test provides static hostPath
	// volumes.
	// Twelve: three members, a replaced one (two claims: the one the
	// test deletes and the one the replacement deletes), the new members
	// of two scales up, and spares (a released volume is not reused).
	class := e.StaticVolumes(t, "trio", 12)
	ds := &apiary.DataStore{ObjectMeta: metav1.ObjectMeta{Name: "trio"}, Spec: apiary.DataStoreSpec{
		Managed: &apiary.ManagedEtcd{Namespace: framework.SystemNS, Replicas: 3, Storage: apiary.ManagedEtcdStorage{StorageClassName: &class}},
	}}
	t.Cleanup(func() {
		// After a failure too: the tenant first (the DataStore waits for it).
		_ = e.C.Delete(context.Background(), &apiary.TenantControlPlane{ObjectMeta: metav1.ObjectMeta{Namespace: framework.TenantsNS, Name: "on-trio"}})
		_ = e.C.Delete(context.Background(), &apiary.DataStore{ObjectMeta: metav1.ObjectMeta{Name: "trio"}})
	})
	start := time.Now()
	if err := e.C.Create(e.Ctx, ds); err != nil {
		t.Fatal(err)
	}
	framework.Eventually(t, "DataStore trio Ready", 5*time.Minute, func() error {
		if err := e.C.Get(e.Ctx, client.ObjectKey{Name: "trio"}, ds); err != nil {
			return err
		}
		return framework.ConditionIs(ds.Status.Conditions, apiary.ConditionReady, metav1.ConditionTrue, "")
	})
	t.Logf("FIGURE managed etcd with 3 members Ready (auth enabled, checked) in %s", time.Since(start).Round(time.Millisecond))
	allMembers := func(what string) {
		t.Helper()
		framework.Eventually(t, what, 3*time.Minute, func() error {
			if err := e.C.Get(e.Ctx, client.ObjectKey{Name: "trio"}, ds); err != nil {
				return err
			}
			if ds.Status.ReadyMembers != 3 || len(ds.Status.Endpoints) != 3 {
				return fmt.Errorf("readyMembers=%d endpoints=%v", ds.Status.ReadyMembers, ds.Status.Endpoints)
			}
			return framework.ConditionIs(ds.Status.Conditions, apiary.ConditionMembersReady, metav1.ConditionTrue, controllers.ReasonAllMembersReady)
		})
	}
	// Ready needs a quorum; all three members follow.
	allMembers("three ready members")
	took := e.CreateTenant(t, "on-trio", func(p *apiary.TenantControlPlane) { p.Spec.DataStore = "trio" })
	t.Logf("FIGURE tenant on the 3-member etcd Ready in %s", took.Round(time.Millisecond))
	kc := e.ExportKubeconfig(t, "on-trio")
	framework.Kubectl(t, kc, "create", "namespace", "on-trio-ns")

	// One member down: the other two keep quorum and the tenant keeps
	// taking writes; the member comes back with its data and rejoins.
	deleted := time.Now()
	if err := e.C.Delete(e.Ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: framework.SystemNS, Name: "trio-etcd-1"}}); err != nil {
		t.Fatal(err)
	}
	var lastErr error
	written := false
	for time.Since(deleted) < 20*time.Second {
		out, err := framework.KubectlErr(kc, "--request-timeout=3s", "create", "namespace", "while-a-member-restarts")
		if err == nil || strings.Contains(out, "AlreadyExists") {
			written = true
			break
		}
		lastErr = fmt.Errorf("%v: %s", err, out)
		time.Sleep(200 * time.Millisecond)
	}
	if !written {
		t.Fatalf("the tenant took no write within 20 s of losing one of three etcd members: %v", lastErr)
	}
	t.Logf("FIGURE first tenant write after deleting one of three etcd members: %s", time.Since(deleted).Round(time.Millisecond))
	framework.Eventually(t, "the member's new pod", time.Minute, func() error {
		var p corev1.Pod
		if err := e.C.Get(e.Ctx, client.ObjectKey{Namespace: framework.SystemNS, Name: "trio-etcd-1"}, &p); err != nil {
			return err
		}
		if p.CreationTimestamp.Time.Before(deleted.Add(-time.Second)) {
			return errors.New("still the old pod")
		}
		return nil
	})
	allMembers("the restarted member rejoins")
	t.Logf("FIGURE deleted etcd member back and all 3 ready after %s", time.Since(deleted).Round(time.Millisecond))
	for _, ns := range []string{"on-trio-ns", "while-a-member-restarts"} {
		framework.Kubectl(t, kc, "get", "namespace", ns)
	}
	t.Run("MovesToThePeerCAWithoutOutage", func(t *testing.T) { e.testPeerCAMove(t, ds) })
	t.Run("ScalesAndHeals", e.testEtcdScalesAndHeals)

	if err := e.C.Delete(e.Ctx, e.TCP(t, "on-trio")); err != nil {
		t.Fatal(err)
	}
	framework.Eventually(t, "on-trio gone", 2*time.Minute, func() error {
		if err := e.C.Get(e.Ctx, client.ObjectKey{Namespace: framework.TenantsNS, Name: "on-trio"}, &apiary.TenantControlPlane{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there: %v", err)
		}
		return nil
	})
	if err := e.C.Delete(e.Ctx, ds); err != nil {
		t.Fatal(err)
	}
	framework.Eventually(t, "DataStore trio, its members and their claims gone", 2*time.Minute, func() error {
		if err := e.C.Get(e.Ctx, client.ObjectKey{Name: "trio"}, &apiary.DataStore{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("DataStore: %v", err)
		}
		var pods corev1.PodList
		if err := e.C.List(e.Ctx, &pods, client.InNamespace(framework.SystemNS), client.MatchingLabels{managedetcd.LabelDataStore: "trio"}); err != nil {
			return err
		}
		if len(pods.Items) > 0 {
			return fmt.Errorf("%d etcd pods left", len(pods.Items))
		}
		var claims corev1.PersistentVolumeClaimList
		if err := e.C.List(e.Ctx, &claims, client.InNamespace(framework.SystemNS)); err != nil {
			return err
		}
		for _, c := range claims.Items {
			if strings.Contains(c.Name, "trio-etcd") {
				return fmt.Errorf("claim %s left", c.Name)
			}
		}
		return nil
	})
}
