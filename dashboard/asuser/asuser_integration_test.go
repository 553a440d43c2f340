//go:build integration

package asuser

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/apiaryhq/apiary/dashboard/session"
	"github.com/apiaryhq/apiary/internal/testenv"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

// In a real kube-apiserver with RBAC, a dashboard identity that may only
// impersonate shows each user what the user's own RBAC allows: alice
// (group team-a) lists tenant a and not tenant b, may not scale what she
// may only read, and nobody gets the dashboard's rights by being it.
func TestActsAsTheUser(t *testing.T) {
	env, admin := testenv.Start(t, testenv.Options{})
	ctx := t.Context()
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = apiary.AddToScheme(scheme)
	c, err := client.New(admin, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, ns := range []string{"team-a", "team-b"} {
		must(c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}))
		must(c.Create(ctx, &apiary.TenantControlPlane{
			ObjectMeta: metav1.ObjectMeta{Name: strings.TrimPrefix(ns, "team-"), Namespace: ns},
			Spec:       apiary.TenantControlPlaneSpec{Network: apiary.NetworkSpec{ServiceType: corev1.ServiceTypeClusterIP}},
		}))
	}
	// The dashboard: impersonate, nothing else.
	must(c.Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "dashboard"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"users", "groups"}, Verbs: []string{"impersonate"}}}}))
	must(c.Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "dashboard"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "dashboard"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, Name: "dashboard"}}}))
	// Team a reads its tenants.
	must(c.Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "read-tenants", Namespace: "team-a"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{apiary.GroupVersion.Group}, Resources: []string{"tenantcontrolplanes"}, Verbs: []string{"get", "list", "watch"}}}}))
	must(c.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "team-a", Namespace: "team-a"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "read-tenants"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.GroupKind, Name: "oidc:team-a"}}}))

	dashboard, err := env.AddUser(envtest.User{Name: "dashboard"}, nil)
	must(err)
	clients, err := New(dashboard.Config())
	must(err)
	alice := session.Session{User: "oidc:alice@example.test", Groups: []string{"oidc:team-a"}, CSRF: "x"}

	got, err := clients.Tenants(ctx, alice, "team-a")
	if err != nil || len(got) != 1 || got[0].Name != "a" {
		t.Errorf("alice in team-a: %v %v, want tenant a", got, err)
	}
	if _, err := clients.Tenants(ctx, alice, "team-b"); err == nil || !strings.Contains(err.Error(), "may not list TenantControlPlanes in namespace team-b") {
		t.Errorf("alice in team-b: %v, want refused", err)
	}
	if _, err := clients.Tenants(ctx, alice, ""); err == nil || !strings.Contains(err.Error(), "in all namespaces") {
		t.Errorf("alice in all namespaces: %v, want refused", err)
	}
	// Read is not write: scaling tenant a is refused for alice.
	as, err := clients.For(alice)
	must(err)
	var a apiary.TenantControlPlane
	must(as.Get(ctx, client.ObjectKey{Namespace: "team-a", Name: "a"}, &a))
	patch := client.MergeFrom(a.DeepCopy())
	a.Spec.Replicas = new(int32(3))
	if err := as.Patch(ctx, &a, patch); !apierrors.IsForbidden(err) {
		t.Errorf("alice scaling tenant a with read-only rights: %v, want forbidden", err)
	}
	// Without groups, alice is nobody in team-a.
	if _, err := clients.Tenants(ctx, session.Session{User: alice.User}, "team-a"); err == nil {
		t.Error("alice without her groups listed team-a")
	}
	// The dashboard itself, unimpersonated, reads no tenant.
	self, err := client.New(dashboard.Config(), client.Options{Scheme: scheme})
	must(err)
	var list apiary.TenantControlPlaneList
	if err := self.List(ctx, &list, client.InNamespace("team-a")); !apierrors.IsForbidden(err) {
		t.Error("the dashboard's own identity lists tenants")
	}
}
