// Package dashtest starts what the dashboard's integration tests share: a
// real kube-apiserver with RBAC, namespaces team-a and team-b with a
// tenant each (a, b), a dashboard identity that may only impersonate, and
// read rights on team-a's tenants for the group oidc:team-a.
package dashtest

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/apiaryhq/apiary/dashboard/session"
	"github.com/apiaryhq/apiary/internal/testenv"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

// Alice is a signed-in member of team a.
var Alice = session.Session{User: "oidc:alice@example.test", Groups: []string{"oidc:team-a"}, CSRF: "x"}

// Cluster is the shared set-up.
type Cluster struct {
	// Admin is a client with every right (system:masters).
	Admin       client.Client
	AdminConfig *rest.Config
	// Dashboard is the dashboard's own configuration: impersonate only.
	Dashboard *rest.Config
	Scheme    *runtime.Scheme
}

// Start builds the cluster for one test.
func Start(t testing.TB) *Cluster {
	t.Helper()
	env, admin := testenv.Start(t, testenv.Options{})
	ctx := t.Context()
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = apiary.AddToScheme(scheme)
	c, err := client.New(admin, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	objs := []client.Object{
		&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "dashboard"},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"users", "groups"}, Verbs: []string{"impersonate"}}}},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "dashboard"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "dashboard"},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, Name: "dashboard"}}},
	}
	for _, ns := range []string{"team-a", "team-b"} {
		objs = append(objs, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}},
			&apiary.TenantControlPlane{
				ObjectMeta: metav1.ObjectMeta{Name: strings.TrimPrefix(ns, "team-"), Namespace: ns},
				Spec:       apiary.TenantControlPlaneSpec{Network: apiary.NetworkSpec{ServiceType: corev1.ServiceTypeClusterIP}},
			})
	}
	objs = append(objs,
		&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "read-tenants", Namespace: "team-a"},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{apiary.GroupVersion.Group}, Resources: []string{"tenantcontrolplanes"}, Verbs: []string{"get", "list", "watch"}}}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "team-a", Namespace: "team-a"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "read-tenants"},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.GroupKind, Name: "oidc:team-a"}}})
	for _, o := range objs {
		if err := c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	dashboard, err := env.AddUser(envtest.User{Name: "dashboard"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return &Cluster{Admin: c, AdminConfig: admin, Dashboard: dashboard.Config(), Scheme: scheme}
}
