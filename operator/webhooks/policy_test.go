package webhooks

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

func TestTenantPolicyKonnectivity(t *testing.T) {
	tcp := func(ns string, konnectivity bool) *apiary.TenantControlPlane {
		p := &apiary.TenantControlPlane{ObjectMeta: metav1.ObjectMeta{Name: "acme", Namespace: ns}}
		p.Spec.Addons.Konnectivity.Enabled = ptr.To(konnectivity)
		p.Default()
		return p
	}
	for _, tc := range []struct {
		name    string
		policy  TenantPolicy
		tcp     *apiary.TenantControlPlane
		refused bool
	}{
		{"on, no policy", TenantPolicy{}, tcp("team-a", true), false},
		{"off, no policy", TenantPolicy{}, tcp("team-a", false), true},
		{"off, namespace listed", TenantPolicy{KonnectivityOptionalNamespaces: []string{"lab", "team-a"}}, tcp("team-a", false), false},
		{"off, another namespace listed", TenantPolicy{KonnectivityOptionalNamespaces: []string{"lab"}}, tcp("team-a", false), true},
		{"off, every namespace", TenantPolicy{KonnectivityOptionalNamespaces: []string{"*"}}, tcp("team-a", false), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			errs := tc.policy.Validate(tc.tcp)
			if tc.refused != (len(errs) == 1) || (tc.refused && (errs[0].Field != "spec.addons.konnectivity.enabled" || !strings.Contains(errs[0].Detail, "namespace team-a is not among"))) {
				t.Fatalf("errors %v, want refused=%t", errs, tc.refused)
			}
		})
	}
	// The webhook applies it on create and on a spec change.
	w := TenantControlPlane{}
	if _, err := w.ValidateCreate(t.Context(), tcp("team-a", false)); err == nil || !strings.Contains(err.Error(), "spec.addons.konnectivity.enabled") {
		t.Fatalf("create: %v", err)
	}
	old := tcp("team-a", true)
	if _, err := w.ValidateUpdate(t.Context(), old, tcp("team-a", false)); err == nil {
		t.Fatal("update turning konnectivity off accepted")
	}
}

func TestNameCollisions(t *testing.T) {
	tenant := func(ns, name string) apiary.TenantControlPlane {
		return apiary.TenantControlPlane{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}}
	}
	a := tenant("team", "a")
	others := []apiary.TenantControlPlane{a, tenant("elsewhere", "a-front-proxy"), tenant("team", "b")}
	// "a-front-proxy"'s CA Secret would be "a-front-proxy-ca", a's
	// front-proxy CA.
	x := tenant("team", "a-front-proxy")
	errs := NameCollisions(&x, others)
	if len(errs) == 0 || !strings.Contains(errs.ToAggregate().Error(), "tenant team/a already has a Secret named a-front-proxy-ca") {
		t.Fatalf("a-front-proxy beside a: %v", errs)
	}
	// The same name in another namespace, or names that share nothing.
	for _, ok := range []apiary.TenantControlPlane{tenant("other", "a-front-proxy"), tenant("team", "c"), tenant("team", "a-frontproxy")} {
		if errs := NameCollisions(&ok, others); len(errs) > 0 {
			t.Errorf("%s/%s: %v", ok.Namespace, ok.Name, errs)
		}
	}
	// Either way round: "a" after "a-front-proxy".
	if errs := NameCollisions(&a, []apiary.TenantControlPlane{x}); len(errs) == 0 {
		t.Error("a beside a-front-proxy accepted")
	}
	z := tenant("team", "a-konnectivity")
	if errs := NameCollisions(&z, []apiary.TenantControlPlane{a}); len(errs) != 0 {
		t.Errorf("a-konnectivity beside a: %v", errs)
	}
}

func TestNamespaceManaged(t *testing.T) {
	w := TenantControlPlane{Namespaces: []string{"team-a"}}
	p := &apiary.TenantControlPlane{ObjectMeta: metav1.ObjectMeta{Name: "acme", Namespace: "team-b"}}
	p.Default()
	_, err := w.ValidateCreate(t.Context(), p)
	if err == nil || !strings.Contains(err.Error(), "metadata.namespace") || !strings.Contains(err.Error(), "manages TenantControlPlanes in namespaces [team-a] only") {
		t.Fatalf("tenant outside the operator's namespaces: %v", err)
	}
	p.Namespace = "team-a"
	if _, err := w.ValidateCreate(t.Context(), p); err != nil {
		t.Fatalf("tenant in the operator's namespaces: %v", err)
	}
	h := validHost()
	h.Namespace = "team-b"
	if _, err := (Host{Namespaces: []string{"team-a"}}).ValidateCreate(t.Context(), h); err == nil || !strings.Contains(err.Error(), "manages Hosts in namespaces [team-a] only") {
		t.Fatalf("Host outside the operator's namespaces: %v", err)
	}
}
