// Package framework sets up Apiary end to end on the local management
// cluster (hack/devcluster) for the e2e suite and the e2e benchmarks: it
// installs the Helm chart with helm built from source, as a user would, and
// creates, waits for and talks to tenants.
package framework

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/crane"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/apiaryhq/apiary/cli"
	"github.com/apiaryhq/apiary/e2e/cluster"
	"github.com/apiaryhq/apiary/internal/testenv"
	"github.com/apiaryhq/apiary/operator"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

const (
	SystemNS  = "apiary-system"
	TenantsNS = "e2e-tenants"
	// DoomedNS is a second tenant namespace of the operator, which a test
	// deletes with a tenant in it.
	DoomedNS = "e2e-doomed"
	// DataStoreHostAddress is where registered-mode hosts reach the
	// default DataStore (spec.hostAccess.address), high in the
	// LoadBalancer pool, away from the tenants' addresses.
	DataStoreHostAddress = "10.202.0.240"
	Release              = "apiary"
	LeaseName            = "apiary-operator.apiary.dev"
	ReadyLimit           = 5 * time.Minute
)

// Env is the management cluster with Apiary installed.
type Env struct {
	T          testing.TB
	Ctx        context.Context
	Kubeconfig string
	Cfg        *rest.Config
	C          client.Client
	CS         *kubernetes.Clientset
	// NodeIP is the local cluster's node address.
	NodeIP string
}

// RegistryAtNode is the local registry as pods and SSH test hosts reach it.
func (e *Env) RegistryAtNode() string {
	_, port, _ := net.SplitHostPort(cluster.RegistryAddr)
	return net.JoinHostPort(e.NodeIP, port)
}

// Setup installs Apiary on the running local cluster and returns it; the
// tenants it creates are deleted when the test ends.
func Setup(t testing.TB) *Env {
	cl, err := cluster.New(cluster.Options{})
	if err != nil {
		t.Fatal(err)
	}
	e := &Env{T: t, Ctx: t.Context(), Kubeconfig: cl.KubeconfigPath(), NodeIP: cl.NodeIP().String()}
	if _, err := os.Stat(e.Kubeconfig); err != nil {
		t.Fatalf("no local management cluster (%v): run `make cluster-up` or `make e2e`", err)
	}
	if e.Cfg, err = clientcmd.BuildConfigFromFlags("", e.Kubeconfig); err != nil {
		t.Fatal(err)
	}
	scheme, err := operator.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	if e.C, err = client.New(e.Cfg, client.Options{Scheme: scheme}); err != nil {
		t.Fatal(err)
	}
	if e.CS, err = kubernetes.NewForConfig(e.Cfg); err != nil {
		t.Fatal(err)
	}
	// A previous run's namespaces may still be terminating. They come
	// before the chart, which grants the operator its rights there.
	for _, name := range []string{TenantsNS, DoomedNS} {
		Eventually(t, "namespace "+name+" created", 3*time.Minute, func() error {
			ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
			err := e.C.Create(e.Ctx, ns)
			if apierrors.IsAlreadyExists(err) {
				if err := e.C.Get(e.Ctx, client.ObjectKeyFromObject(ns), ns); err != nil {
					return err
				}
				if !ns.DeletionTimestamp.IsZero() {
					return fmt.Errorf("namespace %s is still terminating", name)
				}
				return nil
			}
			return err
		})
	}
	e.installChart()
	t.Cleanup(e.cleanup)
	return e
}

// installChart installs the chart with helm (from source), as a user does;
// the operator image is pulled from the local registry on every start so
// that a rebuilt image is used.
func (e *Env) installChart() {
	e.T.Helper()
	start := time.Now()
	// The operator image in the local registry is rebuilt from this tree by
	// every `devcluster up` under the same tag: its digest in a pod
	// annotation rolls the operator when it changed.
	digest, err := crane.Digest(cluster.RegistryAddr+"/apiaryhq/apiary:"+strings.TrimSpace(chartAppVersion(e.T)), crane.Insecure)
	if err != nil {
		e.T.Fatalf("the Apiary image is not in the local registry (run `go run ./hack/devcluster up`): %v", err)
	}
	e.Helm("upgrade", "--install", Release, filepath.Join(testenv.RepoRoot(), "charts", "apiary"),
		"--namespace", SystemNS, "--create-namespace",
		"--set", "image.pullPolicy=Always",
		"--set-string", `podAnnotations.apiary\.dev/image-digest=`+digest,
		"--set", "defaultDataStore.managed.storage.emptyDir=true",
		// Registered-mode hosts reach it at a fixed address, which its
		// certificate names from the start.
		"--set", "defaultDataStore.hostAccess.address="+DataStoreHostAddress,
		// The operator pulls node bundles itself, from the local registry
		// at the node address.
		"--set", "operator.nodeBundle.repository="+e.RegistryAtNode()+"/apiaryhq/node-bundle",
		"--set", "operator.nodeBundle.insecure=true",
		// The NetworkPolicy test's tenant runs without konnectivity.
		"--set", "tenantPolicy.konnectivityOptionalNamespaces={"+TenantsNS+"}",
		// The operator's namespaced rights in the tenants' namespace and
		// its own only: the whole suite runs least-privileged.
		"--set", "operator.tenantNamespaces={"+TenantsNS+","+DoomedNS+"}",
		"--wait", "--timeout", "5m")
	e.T.Logf("helm install: %s", time.Since(start).Round(time.Millisecond))
	// helm --wait returns when the new pods are ready; a replaced operator
	// keeps reconciling while it drains, and would render tenants with the
	// old code. Wait until only the new pods are left.
	e.Eventually("only the new operator pods", 2*time.Minute, func() error {
		var pods corev1.PodList
		if err := e.C.List(e.Ctx, &pods, client.InNamespace(SystemNS), client.MatchingLabels{
			"app.kubernetes.io/name": "apiary", "app.kubernetes.io/instance": Release, "app.kubernetes.io/component": "operator",
		}); err != nil {
			return err
		}
		for _, p := range pods.Items {
			if p.Annotations["apiary.dev/image-digest"] != digest || !p.DeletionTimestamp.IsZero() {
				return fmt.Errorf("operator pod %s still running the previous image", p.Name)
			}
		}
		return nil
	})
	// helm --wait sees the operator pods ready; the webhook Service may take
	// a moment more to route to them.
	e.Eventually("the webhooks answer", time.Minute, func() error {
		probe := &apiary.TenantControlPlane{ObjectMeta: metav1.ObjectMeta{Name: "probe", Namespace: TenantsNS}}
		return e.C.Create(e.Ctx, probe, client.DryRunAll)
	})
	e.Eventually("DataStore default Ready", 5*time.Minute, func() error {
		var ds apiary.DataStore
		if err := e.C.Get(e.Ctx, client.ObjectKey{Name: "default"}, &ds); err != nil {
			return err
		}
		return ConditionIs(ds.Status.Conditions, apiary.ConditionReady, metav1.ConditionTrue, "")
	})
	e.T.Logf("chart installed and default DataStore Ready after %s", time.Since(start).Round(time.Millisecond))
}

func chartAppVersion(t testing.TB) string {
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

func (e *Env) cleanup() {
	if os.Getenv("APIARY_E2E_KEEP") != "" {
		e.T.Log("APIARY_E2E_KEEP set: leaving tenants and the release in place")
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var list apiary.TenantControlPlaneList
	_ = e.C.List(ctx, &list, client.InNamespace(TenantsNS))
	for i := range list.Items {
		_ = e.C.Delete(ctx, &list.Items[i])
	}
	for ctx.Err() == nil {
		if err := e.C.List(ctx, &list, client.InNamespace(TenantsNS)); err != nil || len(list.Items) == 0 {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	_ = e.C.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: TenantsNS}})
}

func (e *Env) Helm(args ...string) string {
	e.T.Helper()
	bin, err := testenv.HelmBinary()
	if err != nil {
		e.T.Fatal(err)
	}
	cmd := exec.CommandContext(e.Ctx, bin, args...)
	home := e.T.TempDir()
	cmd.Env = append(os.Environ(), "KUBECONFIG="+e.Kubeconfig, "HELM_CACHE_HOME="+home, "HELM_CONFIG_HOME="+home, "HELM_DATA_HOME="+home)
	out, err := cmd.CombinedOutput()
	if err != nil {
		e.T.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func (e *Env) Eventually(what string, timeout time.Duration, f func() error) {
	e.T.Helper()
	Eventually(e.T, what, timeout, f)
}

// Eventually is testenv.Eventually, for the e2e tests' convenience.
func Eventually(t testing.TB, what string, timeout time.Duration, f func() error) {
	t.Helper()
	testenv.Eventually(t, what, timeout, f)
}

// FindCondition is the condition of that type, or an empty one.
func FindCondition(conds []metav1.Condition, typ string) metav1.Condition {
	for _, c := range conds {
		if c.Type == typ {
			return c
		}
	}
	return metav1.Condition{}
}

func ConditionIs(conds []metav1.Condition, typ string, status metav1.ConditionStatus, reason string) error {
	c := meta.FindStatusCondition(conds, typ)
	if c == nil {
		return fmt.Errorf("no %s condition yet", typ)
	}
	if c.Status != status || (reason != "" && c.Reason != reason) {
		return fmt.Errorf("%s is %s/%s: %s", typ, c.Status, c.Reason, c.Message)
	}
	return nil
}

func (e *Env) TCP(t testing.TB, name string) *apiary.TenantControlPlane {
	t.Helper()
	var tcp apiary.TenantControlPlane
	if err := e.C.Get(e.Ctx, client.ObjectKey{Namespace: TenantsNS, Name: name}, &tcp); err != nil {
		t.Fatal(err)
	}
	return &tcp
}

// createTenant creates a tenant and returns how long it took to be Ready
// (the operator's own probe through the LoadBalancer succeeded).
func (e *Env) CreateTenant(t testing.TB, name string, mutate func(*apiary.TenantControlPlane)) time.Duration {
	t.Helper()
	tcp := &apiary.TenantControlPlane{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: TenantsNS}}
	if mutate != nil {
		mutate(tcp)
	}
	start := time.Now()
	if err := e.C.Create(e.Ctx, tcp); err != nil {
		t.Fatal(err)
	}
	e.WaitReady(t, name)
	return time.Since(start)
}

func (e *Env) WaitReady(t testing.TB, name string) {
	t.Helper()
	Eventually(t, name+" Ready", ReadyLimit, func() error {
		var tcp apiary.TenantControlPlane
		if err := e.C.Get(e.Ctx, client.ObjectKey{Namespace: TenantsNS, Name: name}, &tcp); err != nil {
			return err
		}
		return ConditionIs(tcp.Status.Conditions, apiary.ConditionReady, metav1.ConditionTrue, "")
	})
}

// exportKubeconfig runs `apiary kubeconfig` against the management cluster
// and writes the tenant's admin kubeconfig to a file.
func (e *Env) ExportKubeconfig(t testing.TB, name string) string {
	t.Helper()
	var out, errOut bytes.Buffer
	cmd := cli.NewKubeconfigCommand(&cli.ConfigFlags{Kubeconfig: e.Kubeconfig, Namespace: TenantsNS})
	cmd.SetArgs([]string{name})
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	if err := cmd.ExecuteContext(e.Ctx); err != nil {
		t.Fatalf("apiary kubeconfig %s: %v: %s", name, err, errOut.String())
	}
	path := filepath.Join(t.TempDir(), name+".kubeconfig")
	if err := os.WriteFile(path, out.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func Kubectl(t testing.TB, kubeconfig string, args ...string) string {
	t.Helper()
	out, err := KubectlErr(kubeconfig, args...)
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

func KubectlErr(kubeconfig string, args ...string) (string, error) {
	bin, err := testenv.KubeBinary("kubectl")
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, append([]string{"--kubeconfig", kubeconfig, "--request-timeout=10s"}, args...)...).CombinedOutput()
	return strings.TrimSpace(string(out)), err
}
