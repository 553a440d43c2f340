package cli

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
)

func secret(ns, name string, data map[string]string) *corev1.Secret {
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Data: map[string][]byte{}}
	for k, v := range data {
		s.Data[k] = []byte(v)
	}
	return s
}

func fakeClient(objs ...client.Object) client.Client {
	return fake.NewClientBuilder().WithScheme(Scheme).WithObjects(objs...).Build()
}

func TestFetchKubeconfig(t *testing.T) {
	ctx := context.Background()
	ready := readyTenant() // status.kubeconfigSecret = alpha-admin-kubeconfig
	beta := failingTenant()
	gamma := newTenant()
	renamed := readyTenant()
	renamed.Name, renamed.Status.KubeconfigSecret = "renamed", "custom-secret"
	c := fakeClient(ready, beta, gamma, renamed,
		secret("team-a", "alpha-admin-kubeconfig", map[string]string{"kubeconfig": "public", "kubeconfig-internal": "internal"}),
		secret("team-b", "beta-admin-kubeconfig", map[string]string{"kubeconfig": "beta-public"}),
		secret("team-a", "custom-secret", map[string]string{"kubeconfig": "custom"}),
	)

	for _, tc := range []struct {
		name     string
		req      KubeconfigRequest
		want     string
		notReady bool
		errHas   []string
	}{
		{name: "ready", req: KubeconfigRequest{Namespace: "team-a", Name: "alpha"}, want: "public"},
		{name: "internal", req: KubeconfigRequest{Namespace: "team-a", Name: "alpha", Internal: true}, want: "internal"},
		{name: "status.kubeconfigSecret wins", req: KubeconfigRequest{Namespace: "team-a", Name: "renamed"}, want: "custom"},
		{name: "not found", req: KubeconfigRequest{Namespace: "team-z", Name: "nope"},
			errHas: []string{"tenantcontrolplane team-z/nope not found", "apiary status -n team-z"}},
		{name: "not ready", req: KubeconfigRequest{Namespace: "team-b", Name: "beta"},
			errHas: []string{"team-b/beta is not ready", "Ready=False, reason DataStoreNotReady", `"waiting for the datastore"`,
				"first failing condition: DataStoreReady=False, reason Unreachable", "--allow-not-ready", "apiary status beta -n team-b"}},
		{name: "not ready allowed", req: KubeconfigRequest{Namespace: "team-b", Name: "beta", AllowNotReady: true}, want: "beta-public", notReady: true},
		{name: "no conditions", req: KubeconfigRequest{Namespace: "team-a", Name: "gamma"},
			errHas: []string{"no Ready condition yet", "operator running"}},
		{name: "not ready allowed, no secret", req: KubeconfigRequest{Namespace: "team-a", Name: "gamma", AllowNotReady: true},
			errHas: []string{"secret team-a/gamma-admin-kubeconfig", "not found", "no Ready condition yet"}},
		{name: "missing key", req: KubeconfigRequest{Namespace: "team-b", Name: "beta", AllowNotReady: true, Internal: true},
			errHas: []string{`has no key "kubeconfig-internal"`, "it has: kubeconfig"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := FetchKubeconfig(ctx, c, tc.req)
			if len(tc.errHas) > 0 {
				if err == nil {
					t.Fatalf("got %q, want an error", res.Kubeconfig)
				}
				for _, s := range tc.errHas {
					if !strings.Contains(err.Error(), s) {
						t.Errorf("error %q does not contain %q", err, s)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if string(res.Kubeconfig) != tc.want {
				t.Errorf("kubeconfig = %q, want %q", res.Kubeconfig, tc.want)
			}
			if (res.NotReady != nil) != tc.notReady {
				t.Errorf("NotReady = %v, want %v", res.NotReady, tc.notReady)
			}
		})
	}
}

func TestFetchKubeconfigSecretMissingWhileReady(t *testing.T) {
	_, err := FetchKubeconfig(context.Background(), fakeClient(readyTenant()), KubeconfigRequest{Namespace: "team-a", Name: "alpha"})
	if err == nil || !strings.Contains(err.Error(), "secret team-a/alpha-admin-kubeconfig") || !strings.Contains(err.Error(), "not found") {
		t.Fatalf("err = %v", err)
	}
}

func TestFetchKubeconfigForbidden(t *testing.T) {
	c := fake.NewClientBuilder().WithScheme(Scheme).WithObjects(readyTenant()).WithInterceptorFuncs(interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if _, ok := obj.(*corev1.Secret); ok {
				return apierrors.NewForbidden(schema.GroupResource{Resource: "secrets"}, key.Name, errors.New(`User "bob" cannot get resource "secrets"`))
			}
			return c.Get(ctx, key, obj, opts...)
		},
	}).Build()
	_, err := FetchKubeconfig(context.Background(), c, KubeconfigRequest{Namespace: "team-a", Name: "alpha"})
	if err == nil {
		t.Fatal("no error")
	}
	for _, s := range []string{"forbidden", `verb "get"`, `resource "secrets"`, `namespace "team-a"`, `User "bob"`} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not contain %q", err, s)
		}
	}
}

func TestListForbiddenAllNamespaces(t *testing.T) {
	c := fake.NewClientBuilder().WithScheme(Scheme).WithInterceptorFuncs(interceptor.Funcs{
		List: func(context.Context, client.WithWatch, client.ObjectList, ...client.ListOption) error {
			return apierrors.NewForbidden(schema.GroupResource{Group: "apiary.dev", Resource: "tenantcontrolplanes"}, "", errors.New("no"))
		},
	}).Build()
	_, err := ListTenants(context.Background(), c, "")
	if err == nil || !strings.Contains(err.Error(), `verb "list" on resource "tenantcontrolplanes.apiary.dev" cluster-wide`) {
		t.Fatalf("err = %v", err)
	}
}

func TestRunStatus(t *testing.T) {
	c := fakeClient(readyTenant(), newTenant(), failingTenant())
	run := func(ns string, args []string, opts StatusOptions) (string, string, error) {
		var out, errOut bytes.Buffer
		err := runStatus(context.Background(), c, &out, &errOut, ns, args, opts)
		return out.String(), errOut.String(), err
	}

	out, _, err := run("team-a", nil, StatusOptions{})
	if err != nil || !strings.Contains(out, "alpha") || !strings.Contains(out, "gamma") || strings.Contains(out, "beta") {
		t.Errorf("status -n team-a: err=%v\n%s", err, out)
	}
	_, errOut, err := run("empty", nil, StatusOptions{})
	if err != nil || errOut != "No tenant control planes found in namespace empty.\n" {
		t.Errorf("empty namespace: err=%v stderr=%q", err, errOut)
	}
	out, _, err = run("", nil, StatusOptions{AllNamespaces: true, Output: "yaml"})
	if err != nil || !strings.Contains(out, "kind: TenantControlPlaneList") || !strings.Contains(out, "kind: TenantControlPlane\n") {
		t.Errorf("-A -o yaml: err=%v\n%s", err, out)
	}
	out, _, err = run("team-b", []string{"beta"}, StatusOptions{})
	if err != nil || !strings.Contains(out, "Unreachable") {
		t.Errorf("status beta: err=%v\n%s", err, out)
	}
	_, _, err = run("team-b", []string{"nope"}, StatusOptions{})
	var nf *NotFoundError
	if !errors.As(err, &nf) {
		t.Errorf("status nope: err=%v, want NotFoundError", err)
	}
}

func TestCommandsHaveHelp(t *testing.T) {
	flags := &ConfigFlags{}
	for _, cmd := range []*cobra.Command{NewStatusCommand(flags), NewKubeconfigCommand(flags), NewVersionCommand("v1.2.3")} {
		if cmd.Short == "" || cmd.Long == "" || cmd.Example == "" {
			t.Errorf("%s: Short, Long and Example must all be set", cmd.Name())
		}
	}
}

func TestVersionCommand(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{}, "apiary version v1.2.3 ("}, // not nil: cobra would read os.Args
		{[]string{"--short"}, "v1.2.3\n"},
	} {
		cmd := NewVersionCommand("v1.2.3")
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetArgs(tc.args)
		if err := cmd.Execute(); err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(out.String(), tc.want) {
			t.Errorf("version %v = %q, want prefix %q", tc.args, out.String(), tc.want)
		}
	}
	if BuildVersion("v9.9.9") != "v9.9.9" {
		t.Error("BuildVersion must keep an explicit version")
	}
}
