//go:build integration

package asuser

import (
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/apiaryhq/apiary/dashboard/session"
	"github.com/apiaryhq/apiary/internal/dashtest"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

// In a real kube-apiserver with RBAC, a dashboard identity that may only
// impersonate shows each user what the user's own RBAC allows: alice
// (group team-a) lists tenant a and not tenant b, may not scale what she
// may only read, and nobody gets the dashboard's rights by being it.
func TestActsAsTheUser(t *testing.T) {
	k := dashtest.Start(t)
	ctx := t.Context()
	clients, err := New(k.Dashboard)
	if err != nil {
		t.Fatal(err)
	}
	alice := dashtest.Alice

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
	if err != nil {
		t.Fatal(err)
	}
	var a apiary.TenantControlPlane
	if err := as.Get(ctx, client.ObjectKey{Namespace: "team-a", Name: "a"}, &a); err != nil {
		t.Fatal(err)
	}
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
	self, err := client.New(k.Dashboard, client.Options{Scheme: k.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	var list apiary.TenantControlPlaneList
	if err := self.List(ctx, &list, client.InNamespace("team-a")); !apierrors.IsForbidden(err) {
		t.Errorf("the dashboard's own identity listing tenants: %v, want forbidden", err)
	}
}
