//go:build integration

// Integration tests of the apiary CLI against a real kube-apiserver and etcd
// (controller-runtime envtest, with binaries built from source by
// "make tools"): they run the real cobra command tree as a user would.

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/apiaryhq/apiary/internal/testenv"
	apiaryv1alpha1 "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

// testEnv is one kube-apiserver + etcd shared by the tests of this package.
type testEnv struct {
	env    *testenv.Env
	client client.Client // cluster-admin, to set the scene
	// kubeconfig is the content of a cluster-admin kubeconfig whose current
	// context is "envtest".
	kubeconfig []byte
}

var (
	sharedOnce sync.Once
	shared     *testEnv
	sharedErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if shared != nil {
		if err := shared.env.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "stopping envtest: %v\n", err)
		}
	}
	os.Exit(code)
}

// environment starts the shared envtest on first use; it fails the test,
// never skips it, when the binaries are missing.
func environment(t *testing.T) *testEnv {
	t.Helper()
	sharedOnce.Do(func() { shared, sharedErr = startEnv() })
	if sharedErr != nil {
		t.Fatal(sharedErr)
	}
	return shared
}

func startEnv() (*testEnv, error) {
	e, err := testenv.New(testenv.Options{})
	if err != nil {
		return nil, err
	}
	env, cfg := e.Environment, e.Config
	te := &testEnv{env: e}
	fail := func(err error) (*testEnv, error) {
		_ = e.Stop()
		return nil, err
	}

	scheme := runtime.NewScheme()
	utilruntime.Must(corev1.AddToScheme(scheme))
	utilruntime.Must(rbacv1.AddToScheme(scheme))
	utilruntime.Must(apiaryv1alpha1.AddToScheme(scheme))
	if te.client, err = client.New(cfg, client.Options{Scheme: scheme}); err != nil {
		return fail(err)
	}
	admin, err := env.AddUser(envtest.User{Name: "apiary-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return fail(err)
	}
	if te.kubeconfig, err = admin.KubeConfig(); err != nil {
		return fail(err)
	}
	return te, nil
}

// writeKubeconfig writes a kubeconfig for user (envtest's AddUser) to a temp
// file. Its current context is "envtest"; namespace, when set, becomes the
// context's namespace. A second context, "unreachable", points nowhere.
func (e *testEnv) writeKubeconfig(t *testing.T, content []byte, namespace string) string {
	t.Helper()
	cfg, err := clientcmd.Load(content)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Contexts[cfg.CurrentContext].Namespace = namespace
	cfg.Clusters["nowhere"] = &clientcmdapi.Cluster{Server: "https://127.0.0.1:1"}
	cfg.Contexts["unreachable"] = &clientcmdapi.Context{Cluster: "nowhere", AuthInfo: cfg.Contexts[cfg.CurrentContext].AuthInfo}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// apiary runs the apiary command line, returning its exit code, stdout and
// stderr.
func apiary(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	code := run(ctx, args, &stdout, &stderr)
	t.Logf("apiary %s: exit %d\n--- stdout:\n%s--- stderr:\n%s", strings.Join(args, " "), code, stdout.String(), stderr.String())
	return code, stdout.String(), stderr.String()
}

func (e *testEnv) namespace(t *testing.T, name string) {
	t.Helper()
	if err := e.client.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
		t.Fatal(err)
	}
}

func condition(typ string, status metav1.ConditionStatus, reason, message string) metav1.Condition {
	return metav1.Condition{Type: typ, Status: status, Reason: reason, Message: message,
		LastTransitionTime: metav1.NewTime(time.Now().Add(-time.Hour).Truncate(time.Second))}
}

func readyConditions() []metav1.Condition {
	return []metav1.Condition{
		condition(apiaryv1alpha1.ConditionDataStoreReady, metav1.ConditionTrue, "Bound", "bound"),
		condition(apiaryv1alpha1.ConditionCertificatesReady, metav1.ConditionTrue, "Issued", "issued"),
		condition(apiaryv1alpha1.ConditionEndpointReady, metav1.ConditionTrue, "Assigned", "assigned"),
		condition(apiaryv1alpha1.ConditionControlPlaneAvailable, metav1.ConditionTrue, "Available", "2/2 pods ready"),
		condition(apiaryv1alpha1.ConditionReady, metav1.ConditionTrue, "Ready", "the tenant API answers"),
	}
}

func notReadyConditions() []metav1.Condition {
	return []metav1.Condition{
		condition(apiaryv1alpha1.ConditionDataStoreReady, metav1.ConditionFalse, "Unreachable", "dial tcp 10.0.0.5:2379: connection refused"),
		condition(apiaryv1alpha1.ConditionCertificatesReady, metav1.ConditionTrue, "Issued", "issued"),
		condition(apiaryv1alpha1.ConditionEndpointReady, metav1.ConditionTrue, "Assigned", "assigned"),
		condition(apiaryv1alpha1.ConditionControlPlaneAvailable, metav1.ConditionFalse, "NoPods", "0/2 pods ready"),
		condition(apiaryv1alpha1.ConditionReady, metav1.ConditionFalse, "DataStoreNotReady", "waiting for the datastore"),
	}
}

// tenant creates a TenantControlPlane with an explicit spec (no defaulting
// webhook runs here), then writes status through the status subresource, as
// the operator would.
func (e *testEnv) tenant(t *testing.T, ns, name string, status apiaryv1alpha1.TenantControlPlaneStatus) *apiaryv1alpha1.TenantControlPlane {
	t.Helper()
	ctx := context.Background()
	tcp := &apiaryv1alpha1.TenantControlPlane{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: apiaryv1alpha1.TenantControlPlaneSpec{
			Version:  "v1.37.2",
			Mode:     apiaryv1alpha1.ModeStandalone,
			Replicas: ptr.To(int32(2)),
			Network: apiaryv1alpha1.NetworkSpec{
				ServiceType:   corev1.ServiceTypeLoadBalancer,
				Port:          6443,
				PodCIDR:       "10.244.0.0/16",
				ServiceCIDR:   "10.96.0.0/16",
				DNSServiceIP:  "10.96.0.10",
				ClusterDomain: "cluster.local",
			},
			Addons: apiaryv1alpha1.AddonsSpec{
				CoreDNS:      apiaryv1alpha1.AddonSpec{Enabled: ptr.To(true)},
				KubeProxy:    apiaryv1alpha1.AddonSpec{Enabled: ptr.To(true)},
				Konnectivity: apiaryv1alpha1.AddonSpec{Enabled: ptr.To(true)},
			},
		},
	}
	if err := e.client.Create(ctx, tcp); err != nil {
		t.Fatal(err)
	}
	tcp.Status = status
	tcp.Status.ObservedGeneration = tcp.Generation
	if err := e.client.Status().Update(ctx, tcp); err != nil {
		t.Fatal(err)
	}
	return tcp
}

func (e *testEnv) secret(t *testing.T, ns, name string, data map[string]string) {
	t.Helper()
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, StringData: data}
	if err := e.client.Create(context.Background(), s); err != nil {
		t.Fatal(err)
	}
}

func mustContain(t *testing.T, what, got string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(got, w) {
			t.Errorf("%s does not contain %q:\n%s", what, w, got)
		}
	}
}

// rows returns the table rows (split into fields) whose first field has the
// given prefix, in output order.
func rows(out, prefix string) [][]string {
	var r [][]string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if f := strings.Fields(line); len(f) > 0 && strings.HasPrefix(f[0], prefix) {
			r = append(r, f)
		}
	}
	return r
}

func TestStatus(t *testing.T) {
	e := environment(t)
	e.namespace(t, "st-a")
	e.namespace(t, "st-b")
	e.namespace(t, "st-empty")
	e.tenant(t, "st-a", "alpha", apiaryv1alpha1.TenantControlPlaneStatus{
		Conditions: readyConditions(), Phase: apiaryv1alpha1.PhaseReady, Version: "v1.37.2",
		Mode: apiaryv1alpha1.ModeStandalone, Endpoint: "https://203.0.113.10:6443", KubeconfigSecret: "alpha-admin-kubeconfig",
		Replicas: 2, ReadyReplicas: 2,
		DataStore: apiaryv1alpha1.DataStoreBinding{Name: "shared-1", Prefix: "/apiary/st-a/alpha/", User: "apiary-st-a-alpha"},
	})
	e.tenant(t, "st-b", "beta", apiaryv1alpha1.TenantControlPlaneStatus{
		Conditions: notReadyConditions(), Phase: apiaryv1alpha1.PhaseNotReady, Version: "v1.36.4",
		Mode: apiaryv1alpha1.ModeStandalone, Endpoint: "https://203.0.113.11:6443", Replicas: 2, ReadyReplicas: 0,
		DataStore: apiaryv1alpha1.DataStoreBinding{Name: "shared-2", Prefix: "/apiary/st-b/beta/", User: "apiary-st-b-beta"},
		Certificates: []apiaryv1alpha1.CertificateStatus{
			{Name: "ca", Secret: "beta-ca", NotAfter: metav1.NewTime(time.Date(2036, 1, 2, 3, 4, 5, 0, time.UTC))},
			{Name: "apiserver", Secret: "beta-apiserver", NotAfter: metav1.NewTime(time.Date(2027, 1, 2, 3, 4, 5, 0, time.UTC))},
		},
	})
	kubeconfig := e.writeKubeconfig(t, e.kubeconfig, "")

	t.Run("all namespaces", func(t *testing.T) {
		code, out, errOut := apiary(t, "status", "-A", "--kubeconfig", kubeconfig)
		if code != 0 || errOut != "" {
			t.Fatalf("exit %d, stderr %q", code, errOut)
		}
		header := strings.Fields(strings.SplitN(out, "\n", 2)[0])
		wantHeader := []string{"NAMESPACE", "NAME", "VERSION", "MODE", "PHASE", "READY", "ENDPOINT", "DATASTORE", "CONDITIONS"}
		if strings.Join(header, " ") != strings.Join(wantHeader, " ") {
			t.Errorf("header = %v, want %v", header, wantHeader)
		}
		got := rows(out, "st-")
		want := [][]string{
			{"st-a", "alpha", "v1.37.2", "standalone", "Ready", "2/2", "https://203.0.113.10:6443", "shared-1", "all", "ready"},
			{"st-b", "beta", "v1.36.4", "standalone", "NotReady", "0/2", "https://203.0.113.11:6443", "shared-2",
				"DataStoreReady=Unreachable,ControlPlaneAvailable=NoPods,Ready=DataStoreNotReady"},
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("rows:\n got %v\nwant %v", got, want)
		}
	})

	t.Run("one namespace", func(t *testing.T) {
		code, out, _ := apiary(t, "status", "-n", "st-a", "--kubeconfig", kubeconfig)
		if code != 0 || !strings.HasPrefix(out, "NAME ") || len(rows(out, "alpha")) != 1 || strings.Contains(out, "beta") {
			t.Errorf("exit %d:\n%s", code, out)
		}
	})

	t.Run("namespace of the context, kubeconfig from KUBECONFIG", func(t *testing.T) {
		t.Setenv("KUBECONFIG", e.writeKubeconfig(t, e.kubeconfig, "st-b"))
		code, out, _ := apiary(t, "status")
		if code != 0 || len(rows(out, "beta")) != 1 || strings.Contains(out, "alpha") {
			t.Errorf("exit %d:\n%s", code, out)
		}
	})

	t.Run("--context", func(t *testing.T) {
		code, _, errOut := apiary(t, "status", "-n", "st-a", "--kubeconfig", kubeconfig, "--context", "unreachable")
		if code != 1 || !strings.Contains(errOut, "127.0.0.1:1") {
			t.Errorf("context unreachable: exit %d, stderr %q", code, errOut)
		}
		code, _, errOut = apiary(t, "status", "--kubeconfig", kubeconfig, "--context", "nope")
		if code != 1 || !strings.Contains(errOut, "nope") {
			t.Errorf("context nope: exit %d, stderr %q", code, errOut)
		}
	})

	t.Run("empty namespace", func(t *testing.T) {
		code, out, errOut := apiary(t, "status", "-n", "st-empty", "--kubeconfig", kubeconfig)
		if code != 0 || out != "" || errOut != "No tenant control planes found in namespace st-empty.\n" {
			t.Errorf("exit %d, stdout %q, stderr %q", code, out, errOut)
		}
	})

	t.Run("detail", func(t *testing.T) {
		code, out, _ := apiary(t, "status", "beta", "-n", "st-b", "--kubeconfig", kubeconfig)
		if code != 0 {
			t.Fatalf("exit %d", code)
		}
		mustContain(t, "detail", out,
			"Name:", "beta", "Namespace:", "st-b", "Phase:", "NotReady", "v1.36.4 (spec asks for v1.37.2)",
			"https://203.0.113.11:6443", "0/2 ready",
			"shared-2", "/apiary/st-b/beta/", "apiary-st-b-beta",
			"DataStoreReady", "Unreachable", "dial tcp 10.0.0.5:2379: connection refused",
			"CertificatesReady", "EndpointReady", "ControlPlaneAvailable", "NoPods", "DataStoreNotReady", "waiting for the datastore",
			"ca ", "beta-ca", "2036-01-02T03:04:05Z", "apiserver", "2027-01-02T03:04:05Z")
		// Every condition is listed with its age (set an hour ago).
		aged := 0
		for _, line := range strings.Split(out, "\n") {
			if f := strings.Fields(line); len(f) >= 4 && regexp.MustCompile(`^6[0-9]m$`).MatchString(f[3]) {
				aged++
			}
		}
		if aged != 5 {
			t.Errorf("want 5 conditions aged about 60m, found %d", aged)
		}
	})

	t.Run("completion of NAME", func(t *testing.T) {
		code, out, _ := apiary(t, "__complete", "kubeconfig", "-n", "st-a", "--kubeconfig", kubeconfig, "")
		if code != 0 || !strings.HasPrefix(out, "alpha\n") {
			t.Errorf("exit %d, stdout %q", code, out)
		}
	})

	t.Run("detail not found", func(t *testing.T) {
		code, _, errOut := apiary(t, "status", "nope", "-n", "st-a", "--kubeconfig", kubeconfig)
		if code != 1 || !strings.Contains(errOut, "tenantcontrolplane st-a/nope not found") {
			t.Errorf("exit %d, stderr %q", code, errOut)
		}
	})

	t.Run("json", func(t *testing.T) {
		code, out, _ := apiary(t, "status", "-A", "-o", "json", "--kubeconfig", kubeconfig)
		if code != 0 {
			t.Fatalf("exit %d", code)
		}
		var list apiaryv1alpha1.TenantControlPlaneList
		if err := json.Unmarshal([]byte(out), &list); err != nil {
			t.Fatal(err)
		}
		found := map[string]string{}
		for _, tcp := range list.Items {
			found[tcp.Namespace+"/"+tcp.Name] = string(tcp.Status.Phase)
		}
		if list.Kind != "TenantControlPlaneList" || found["st-a/alpha"] != "Ready" || found["st-b/beta"] != "NotReady" {
			t.Errorf("kind %q, items %v", list.Kind, found)
		}
	})

	t.Run("yaml", func(t *testing.T) {
		code, out, _ := apiary(t, "status", "alpha", "-n", "st-a", "-o", "yaml", "--kubeconfig", kubeconfig)
		if code != 0 {
			t.Fatalf("exit %d", code)
		}
		mustContain(t, "yaml", out, "apiVersion: apiary.dev/v1alpha1", "kind: TenantControlPlane", "name: alpha", "phase: Ready")
		if strings.Contains(out, "managedFields") {
			t.Error("managedFields should be dropped")
		}
	})
}

func TestKubeconfig(t *testing.T) {
	e := environment(t)
	const ns = "kc"
	e.namespace(t, ns)
	kubeconfig := e.writeKubeconfig(t, e.kubeconfig, "")

	const public = "apiVersion: v1\nkind: Config\nclusters:\n- name: ready\n  cluster:\n    server: https://203.0.113.20:6443\n"
	const internal = "apiVersion: v1\nkind: Config\nclusters:\n- name: ready\n  cluster:\n    server: https://ready.kc.svc:6443\n" // no trailing newline below
	readyStatus := apiaryv1alpha1.TenantControlPlaneStatus{Conditions: readyConditions(), Phase: apiaryv1alpha1.PhaseReady}
	e.tenant(t, ns, "ready", readyStatus)
	e.secret(t, ns, "ready-admin-kubeconfig", map[string]string{
		apiaryv1alpha1.KubeconfigKey:         public,
		apiaryv1alpha1.InternalKubeconfigKey: strings.TrimSuffix(internal, "\n"),
	})
	e.tenant(t, ns, "pending", apiaryv1alpha1.TenantControlPlaneStatus{Conditions: notReadyConditions(), Phase: apiaryv1alpha1.PhaseNotReady})
	e.secret(t, ns, "pending-admin-kubeconfig", map[string]string{apiaryv1alpha1.KubeconfigKey: "pending-kubeconfig"})
	e.tenant(t, ns, "nosecret", readyStatus)
	e.tenant(t, ns, "fresh", apiaryv1alpha1.TenantControlPlaneStatus{})
	custom := readyStatus
	custom.KubeconfigSecret = "elsewhere"
	e.tenant(t, ns, "custom", custom)
	e.secret(t, ns, "elsewhere", map[string]string{apiaryv1alpha1.KubeconfigKey: "custom-kubeconfig"})
	e.secret(t, ns, "custom-admin-kubeconfig", map[string]string{apiaryv1alpha1.KubeconfigKey: "wrong: status.kubeconfigSecret must win"})

	t.Run("ready prints the Secret exactly", func(t *testing.T) {
		code, out, errOut := apiary(t, "kubeconfig", "ready", "-n", ns, "--kubeconfig", kubeconfig)
		if code != 0 || out != public || errOut != "" {
			t.Errorf("exit %d, stdout %q, stderr %q", code, out, errOut)
		}
	})

	t.Run("--internal", func(t *testing.T) {
		code, out, _ := apiary(t, "kubeconfig", "ready", "-n", ns, "--internal", "--kubeconfig", kubeconfig)
		if code != 0 || out != strings.TrimSuffix(internal, "\n") {
			t.Errorf("exit %d, stdout %q", code, out)
		}
	})

	t.Run("status.kubeconfigSecret", func(t *testing.T) {
		code, out, _ := apiary(t, "kubeconfig", "custom", "-n", ns, "--kubeconfig", kubeconfig)
		if code != 0 || out != "custom-kubeconfig" {
			t.Errorf("exit %d, stdout %q", code, out)
		}
	})

	t.Run("not found", func(t *testing.T) {
		code, out, errOut := apiary(t, "kubeconfig", "nope", "-n", ns, "--kubeconfig", kubeconfig)
		if code != 1 || out != "" {
			t.Errorf("exit %d, stdout %q", code, out)
		}
		mustContain(t, "stderr", errOut, "tenantcontrolplane kc/nope not found", "apiary status -n kc")
	})

	t.Run("not ready", func(t *testing.T) {
		code, out, errOut := apiary(t, "kubeconfig", "pending", "-n", ns, "--kubeconfig", kubeconfig)
		if code != 1 || out != "" {
			t.Errorf("exit %d, stdout %q", code, out)
		}
		mustContain(t, "stderr", errOut, "kc/pending is not ready", "Ready=False", "DataStoreNotReady", "waiting for the datastore",
			"first failing condition: DataStoreReady=False, reason Unreachable", "--allow-not-ready")
	})

	t.Run("not ready, --allow-not-ready", func(t *testing.T) {
		code, out, errOut := apiary(t, "kubeconfig", "pending", "-n", ns, "--allow-not-ready", "--kubeconfig", kubeconfig)
		if code != 0 || out != "pending-kubeconfig" {
			t.Errorf("exit %d, stdout %q", code, out)
		}
		mustContain(t, "stderr", errOut, "Warning:", "not ready", "DataStoreNotReady")
	})

	t.Run("no conditions yet", func(t *testing.T) {
		code, _, errOut := apiary(t, "kubeconfig", "fresh", "-n", ns, "--kubeconfig", kubeconfig)
		if code != 1 {
			t.Errorf("exit %d", code)
		}
		mustContain(t, "stderr", errOut, "kc/fresh is not ready", "no Ready condition yet")
	})

	t.Run("missing Secret", func(t *testing.T) {
		code, _, errOut := apiary(t, "kubeconfig", "nosecret", "-n", ns, "--kubeconfig", kubeconfig)
		if code != 1 {
			t.Errorf("exit %d", code)
		}
		mustContain(t, "stderr", errOut, "secret kc/nosecret-admin-kubeconfig", "not found")
		code, _, errOut = apiary(t, "kubeconfig", "fresh", "-n", ns, "--allow-not-ready", "--kubeconfig", kubeconfig)
		if code != 1 {
			t.Errorf("--allow-not-ready: exit %d", code)
		}
		mustContain(t, "stderr", errOut, "secret kc/fresh-admin-kubeconfig", "not found")
	})

	t.Run("missing key", func(t *testing.T) {
		code, _, errOut := apiary(t, "kubeconfig", "custom", "-n", ns, "--internal", "--kubeconfig", kubeconfig)
		if code != 1 {
			t.Errorf("exit %d", code)
		}
		mustContain(t, "stderr", errOut, "secret kc/elsewhere", `has no key "kubeconfig-internal"`, "it has: kubeconfig")
	})

	t.Run("RBAC", func(t *testing.T) {
		ctx := context.Background()
		// bob may read tenants in kc, but not Secrets, and nothing cluster-wide.
		role := &rbacv1.Role{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "tenant-reader"},
			Rules:      []rbacv1.PolicyRule{{APIGroups: []string{"apiary.dev"}, Resources: []string{"tenantcontrolplanes"}, Verbs: []string{"get", "list"}}},
		}
		binding := &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "bob-tenant-reader"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
			Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "bob"}},
		}
		for _, o := range []client.Object{role, binding} {
			if err := e.client.Create(ctx, o); err != nil {
				t.Fatal(err)
			}
		}
		bob, err := e.env.AddUser(envtest.User{Name: "bob"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		content, err := bob.KubeConfig()
		if err != nil {
			t.Fatal(err)
		}
		bobKubeconfig := e.writeKubeconfig(t, content, ns)

		// RBAC takes effect asynchronously; wait until bob can list tenants.
		deadline := time.Now().Add(30 * time.Second)
		for {
			code, _, _ := apiary(t, "status", "--kubeconfig", bobKubeconfig)
			if code == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("bob cannot list the tenants of kc")
			}
			time.Sleep(200 * time.Millisecond)
		}

		code, out, errOut := apiary(t, "kubeconfig", "ready", "--kubeconfig", bobKubeconfig)
		if code != 1 || out != "" {
			t.Errorf("exit %d, stdout %q", code, out)
		}
		mustContain(t, "stderr", errOut, "forbidden", `get secrets "ready-admin-kubeconfig" in namespace "kc"`, `verb "get"`, `resource "secrets"`, `User "bob"`)

		code, _, errOut = apiary(t, "status", "-A", "--kubeconfig", bobKubeconfig)
		if code != 1 {
			t.Errorf("status -A: exit %d", code)
		}
		mustContain(t, "stderr", errOut, "forbidden", `verb "list"`, `resource "tenantcontrolplanes.apiary.dev" cluster-wide`)
	})
}

func TestSwitch(t *testing.T) {
	e := environment(t)
	const ns = "sw"
	e.namespace(t, ns)
	kubeconfig := e.writeKubeconfig(t, e.kubeconfig, ns)
	ctx := context.Background()
	e.tenant(t, ns, "dev", apiaryv1alpha1.TenantControlPlaneStatus{Conditions: readyConditions(), Phase: apiaryv1alpha1.PhaseReady, Mode: apiaryv1alpha1.ModeStandalone})
	mode := func() apiaryv1alpha1.Mode {
		t.Helper()
		var tcp apiaryv1alpha1.TenantControlPlane
		if err := e.client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "dev"}, &tcp); err != nil {
			t.Fatal(err)
		}
		return tcp.Spec.Mode
	}

	t.Run("unknown mode", func(t *testing.T) {
		code, _, stderr := apiary(t, "--kubeconfig", kubeconfig, "switch", "dev", "hosted", "--yes")
		if code == 0 || !strings.Contains(stderr, `mode "hosted": use standalone or registered`) {
			t.Errorf("exit %d, stderr %q", code, stderr)
		}
	})
	t.Run("no control-plane Host: refused, nothing changed", func(t *testing.T) {
		code, stdout, stderr := apiary(t, "--kubeconfig", kubeconfig, "switch", "dev", "registered", "--yes")
		if code == 0 || !strings.Contains(stdout, "✗ control-plane Hosts: none") || !strings.Contains(stderr, "cannot go through") {
			t.Errorf("exit %d", code)
		}
		if m := mode(); m != apiaryv1alpha1.ModeStandalone {
			t.Errorf("spec.mode %s after a refused switch", m)
		}
	})
	t.Run("with a control-plane Host in Standby", func(t *testing.T) {
		h := &apiaryv1alpha1.Host{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "cp-1"},
			Spec: apiaryv1alpha1.HostSpec{TenantControlPlane: "dev", Address: "192.0.2.10", Role: apiaryv1alpha1.HostRoleControlPlane,
				SSHKeySecretRef: corev1.LocalObjectReference{Name: "key"}, InsecureSkipHostKeyCheck: true},
		}
		if err := e.client.Create(ctx, h); err != nil {
			t.Fatal(err)
		}
		// Installed, not joined: a standalone tenant's control-plane Host.
		h.Status.Phase = apiaryv1alpha1.HostPhaseStandby
		h.Status.Conditions = []metav1.Condition{{Type: apiaryv1alpha1.HostConditionInstalled, Status: metav1.ConditionTrue, Reason: "Installed",
			Message: "kubelet, kubeadm, kubectl", LastTransitionTime: metav1.Now()}}
		if err := e.client.Status().Update(ctx, h); err != nil {
			t.Fatal(err)
		}
		code, stdout, _ := apiary(t, "--kubeconfig", kubeconfig, "switch", "dev", "registered", "--yes")
		if code != 0 {
			t.Fatalf("exit %d", code)
		}
		mustContain(t, "stdout", stdout, "standalone → registered", "Host cp-1 (192.0.2.10): installed; joins when the switch starts", "spec.mode set to registered")
		if m := mode(); m != apiaryv1alpha1.ModeRegistered {
			t.Errorf("spec.mode %s, want registered", m)
		}
		// Again: nothing to do; --wait returns once the operator reports
		// the mode in effect.
		var tcp apiaryv1alpha1.TenantControlPlane
		if err := e.client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "dev"}, &tcp); err != nil {
			t.Fatal(err)
		}
		tcp.Status.Mode = apiaryv1alpha1.ModeRegistered
		tcp.Status.Conditions = append(tcp.Status.Conditions, metav1.Condition{Type: apiaryv1alpha1.ConditionModeSwitched, Status: metav1.ConditionTrue,
			Reason: "InEffect", Message: "switched from standalone to registered in 41s", ObservedGeneration: tcp.Generation, LastTransitionTime: metav1.Now()})
		if err := e.client.Status().Update(ctx, &tcp); err != nil {
			t.Fatal(err)
		}
		code, stdout, _ = apiary(t, "--kubeconfig", kubeconfig, "switch", "dev", "registered", "--wait", "20s")
		if code != 0 {
			t.Fatalf("exit %d", code)
		}
		mustContain(t, "stdout", stdout, "spec.mode is already registered", "InEffect: switched from standalone to registered", "tenantcontrolplane/dev: registered")
	})
}

// TestCertsRotate: "apiary certs rotate" asks first and sets the
// annotation the operator answers, a new token per request; --wait fails
// while status.certificateRotation does not answer that token (set here as
// the operator would; the operator's side and a successful --wait are in
// e2e).
func TestCertsRotate(t *testing.T) {
	e := environment(t)
	const ns = "rot"
	e.namespace(t, ns)
	kubeconfig := e.writeKubeconfig(t, e.kubeconfig, ns)
	ctx := context.Background()
	e.tenant(t, ns, "dev", apiaryv1alpha1.TenantControlPlaneStatus{Conditions: readyConditions(), Phase: apiaryv1alpha1.PhaseReady, Mode: apiaryv1alpha1.ModeStandalone})
	get := func() *apiaryv1alpha1.TenantControlPlane {
		t.Helper()
		var tcp apiaryv1alpha1.TenantControlPlane
		if err := e.client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "dev"}, &tcp); err != nil {
			t.Fatal(err)
		}
		return &tcp
	}

	t.Run("not confirmed: nothing changed", func(t *testing.T) {
		code, stdout, stderr := apiary(t, "--kubeconfig", kubeconfig, "certs", "rotate", "dev")
		if code == 0 || !strings.Contains(stdout, "Re-issue every leaf certificate of tenant rot/dev") || !strings.Contains(stderr, "not rotated") {
			t.Errorf("exit %d", code)
		}
		if v, ok := get().Annotations[apiaryv1alpha1.AnnotationRotateCertificates]; ok {
			t.Errorf("annotation set to %q without confirmation", v)
		}
	})
	t.Run("unknown tenant", func(t *testing.T) {
		code, _, stderr := apiary(t, "--kubeconfig", kubeconfig, "certs", "rotate", "nope", "--yes")
		if code == 0 || !strings.Contains(stderr, "nope") {
			t.Errorf("exit %d, stderr %q", code, stderr)
		}
	})
	t.Run("requested, then waited for", func(t *testing.T) {
		code, stdout, stderr := apiary(t, "--kubeconfig", kubeconfig, "certs", "rotate", "dev", "--yes", "--wait", "2s")
		if code == 0 || !strings.Contains(stderr, "not completed after 2s") {
			t.Errorf("--wait with no operator answering: exit %d", code)
		}
		tcp := get()
		token := tcp.Annotations[apiaryv1alpha1.AnnotationRotateCertificates]
		if _, err := time.Parse(time.RFC3339Nano, token); err != nil || !strings.Contains(stdout, "certificate rotation "+token+" requested") {
			t.Fatalf("annotation %q (%v)", token, err)
		}
		// The operator's answer to this token.
		now := metav1.Now()
		tcp.Status.CertificateRotation = &apiaryv1alpha1.CertificateRotation{Token: token, Requested: now, Completed: &now}
		if err := e.client.Status().Update(ctx, tcp); err != nil {
			t.Fatal(err)
		}
		// A second request is a new token, which the first rotation does
		// not answer.
		code, _, stderr = apiary(t, "--kubeconfig", kubeconfig, "certs", "rotate", "dev", "--yes", "--wait", "2s")
		if code == 0 || !strings.Contains(stderr, "not completed after 2s") {
			t.Errorf("a new request was reported completed by the previous rotation: exit %d", code)
		}
		if again := get().Annotations[apiaryv1alpha1.AnnotationRotateCertificates]; again == token {
			t.Errorf("a second rotation reused the token %s", token)
		}
	})
}

// TestCertsRotateCA: "apiary certs rotate --ca" asks (naming what it
// costs), sets apiary.dev/rotate-ca, follows status.caRotation phase by
// phase, and refuses a second request while a rotation is under way.
func TestCertsRotateCA(t *testing.T) {
	e := environment(t)
	const ns = "rotca"
	e.namespace(t, ns)
	kubeconfig := e.writeKubeconfig(t, e.kubeconfig, ns)
	ctx := context.Background()
	e.tenant(t, ns, "dev", apiaryv1alpha1.TenantControlPlaneStatus{Conditions: readyConditions(), Phase: apiaryv1alpha1.PhaseReady, Mode: apiaryv1alpha1.ModeStandalone})
	get := func() *apiaryv1alpha1.TenantControlPlane {
		t.Helper()
		var tcp apiaryv1alpha1.TenantControlPlane
		if err := e.client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "dev"}, &tcp); err != nil {
			t.Fatal(err)
		}
		return &tcp
	}
	code, stdout, stderr := apiary(t, "--kubeconfig", kubeconfig, "certs", "rotate", "dev", "--ca")
	if code == 0 || !strings.Contains(stdout, "Replace the cluster CA of tenant rotca/dev") || !strings.Contains(stdout, "kubeconfigs exported before stop working") || !strings.Contains(stderr, "not rotated") {
		t.Errorf("not confirmed: exit %d, stdout %q", code, stdout)
	}
	if _, ok := get().Annotations[apiaryv1alpha1.AnnotationRotateCA]; ok {
		t.Error("annotation set without confirmation")
	}
	code, stdout, stderr = apiary(t, "--kubeconfig", kubeconfig, "certs", "rotate", "dev", "--ca", "--yes", "--wait", "2s")
	if code == 0 || !strings.Contains(stderr, "CA rotation") || !strings.Contains(stderr, "not completed after 2s") {
		t.Errorf("--wait with no operator answering: exit %d, stderr %q", code, stderr)
	}
	tcp := get()
	token := tcp.Annotations[apiaryv1alpha1.AnnotationRotateCA]
	if token == "" || !strings.Contains(stdout, "CA rotation "+token+" requested") {
		t.Fatalf("annotation %q, stdout %q", token, stdout)
	}
	if _, ok := tcp.Annotations[apiaryv1alpha1.AnnotationRotateCertificates]; ok {
		t.Error("--ca also asked for a leaf rotation")
	}
	// The operator's answer: under way, then the CLI refuses another.
	now := metav1.Now()
	tcp.Status.CARotation = &apiaryv1alpha1.CARotation{Token: token, Requested: now, Phase: apiaryv1alpha1.CARotationReissue, PhaseStarted: now, Message: "waits for Hosts w1"}
	if err := e.client.Status().Update(ctx, tcp); err != nil {
		t.Fatal(err)
	}
	code, _, stderr = apiary(t, "--kubeconfig", kubeconfig, "certs", "rotate", "dev", "--ca", "--yes")
	if code == 0 || !strings.Contains(stderr, "is under way (phase Reissue)") {
		t.Errorf("a second request during a rotation: exit %d, stderr %q", code, stderr)
	}
	if again := get().Annotations[apiaryv1alpha1.AnnotationRotateCA]; again != token {
		t.Errorf("the annotation changed during a rotation: %q", again)
	}
	code, stdout, _ = apiary(t, "--kubeconfig", kubeconfig, "status", "dev")
	mustContain(t, "status", stdout, "CA rotation "+token, "phase Reissue", "waits for Hosts w1")
	_ = code
}
