//go:build integration

package operator_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

// testAdmissionChecksTheAuthor: the webhooks refuse, by name, what the
// spec alone cannot tell: a Host whose author may not read its SSH key
// Secret, a tenant whose objects would take another tenant's names, and
// konnectivity off where the platform admin did not allow it.
func (s *suite) testAdmissionChecksTheAuthor(t *testing.T) {
	// eve may write Hosts in the tenants' namespace, not read its Secrets.
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "host-writer", Namespace: tenantsNS}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{apiary.GroupVersion.Group}, Resources: []string{"hosts"}, Verbs: []string{"create", "update", "get"}},
	}}
	s.must(s.c.Create(s.ctx, role))
	s.must(s.c.Create(s.ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "eve-hosts", Namespace: tenantsNS},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: "eve"}}}))
	s.must(s.c.Create(s.ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "prod-key", Namespace: tenantsNS}, Type: corev1.SecretTypeSSHAuth,
		Data: map[string][]byte{corev1.SSHAuthPrivateKey: []byte("not a key, never read")}}))
	cfg := rest.CopyConfig(s.cfg)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "eve"}
	eve, err := client.New(cfg, client.Options{Scheme: s.c.Scheme()})
	s.must(err)
	host := &apiary.Host{ObjectMeta: metav1.ObjectMeta{Name: "borrowed", Namespace: tenantsNS}, Spec: apiary.HostSpec{
		TenantControlPlane: "alpha", Address: "192.0.2.50", SSHKeySecretRef: corev1.LocalObjectReference{Name: "prod-key"},
		HostKey: "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl",
	}}
	err = eve.Create(s.ctx, host.DeepCopy(), client.DryRunAll)
	if err == nil || !strings.Contains(err.Error(), "spec.sshKeySecretRef.name") || !strings.Contains(err.Error(), "eve may not get Secret tenants/prod-key") {
		t.Fatalf("Host with a key its author may not read: %v", err)
	}
	// The control: once eve may read that Secret, the same Host passes.
	s.must(s.c.Create(s.ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "prod-key-reader", Namespace: tenantsNS}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"secrets"}, ResourceNames: []string{"prod-key"}, Verbs: []string{"get"}},
	}}))
	s.must(s.c.Create(s.ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "eve-prod-key", Namespace: tenantsNS},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "prod-key-reader"},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: "eve"}}}))
	eventually(t, "eve may use a key she may read", 10*time.Second, func() error {
		return eve.Create(s.ctx, host.DeepCopy(), client.DryRunAll)
	})

	// "collide-front-proxy" would need "collide"'s front-proxy CA Secret.
	s.must(s.c.Create(s.ctx, newTCP("collide", "default")))
	err = s.c.Create(s.ctx, newTCP("collide-front-proxy", "default"), client.DryRunAll)
	if err == nil || !strings.Contains(err.Error(), "tenant tenants/collide already has a Secret named collide-front-proxy-ca") {
		t.Fatalf("a tenant taking another's Secret name: %v", err)
	}
	s.must(s.c.Delete(s.ctx, s.getTCP("collide")))

	// A DataStore that takes only labelled namespaces.
	restricted := s.etcd.Config()
	s.createDataStore("restricted", restricted)
	ds := s.dataStore("restricted")
	patch := client.MergeFrom(ds.DeepCopy())
	ds.Spec.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"apiary.dev/datastore": "restricted"}}
	s.must(s.c.Patch(s.ctx, ds, patch))
	// The webhook reads DataStores from the operator's cache, which sees
	// the patch a moment later.
	s.eventually("a tenant on a DataStore that does not take its namespace refused", 10*time.Second, func() error {
		err := s.c.Create(s.ctx, newTCP("on-restricted", "restricted"), client.DryRunAll)
		if err == nil || !strings.Contains(err.Error(), "spec.dataStore") || !strings.Contains(err.Error(), "DataStore restricted does not take tenants of namespace tenants") {
			return fmt.Errorf("got %v", err)
		}
		return nil
	})

	// No namespace may turn konnectivity off unless the operator says so.
	direct := newTCP("direct", "default")
	direct.Spec.Addons.Konnectivity.Enabled = ptr.To(false)
	err = s.c.Create(s.ctx, direct, client.DryRunAll)
	if err == nil || !strings.Contains(err.Error(), "spec.addons.konnectivity.enabled") || !strings.Contains(err.Error(), "--konnectivity-optional-namespaces") {
		t.Fatalf("konnectivity off without the admin's consent: %v", err)
	}
}
