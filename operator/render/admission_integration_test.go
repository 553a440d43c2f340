//go:build integration

package render

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/apiaryhq/apiary/internal/testenv"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

// TestQuotaPolicyInARealAPIServer loads the rendered AdmissionConfiguration
// and quota policy into a real kube-apiserver the way a tenant's runs them,
// and checks what the policy refuses and lets through, as the cluster
// admin (system:masters, which admission policies do not exempt), and
// that it comes and goes with the file and no restart.
func TestQuotaPolicyInARealAPIServer(t *testing.T) {
	dir := t.TempDir()
	policies := testenv.NewAtomicDir(t, filepath.Join(dir, "policies"), map[string]string{KeyQuotaPolicy: ""})
	config := filepath.Join(dir, KeyAdmissionConfig)
	if err := os.WriteFile(config, []byte(strings.ReplaceAll(AdmissionConfiguration, policiesDir, policies.Dir)), 0o644); err != nil {
		t.Fatal(err)
	}
	tcp := fixture()
	tcp.Spec.Version = "v1.37.2"
	args := map[string]string{}
	for _, a := range APIServerArgs(inputs(tcp)) {
		if k, v, _ := strings.Cut(strings.TrimPrefix(a, "--"), "="); k == featureGates {
			args[k] = v
		}
	}
	args["admission-control-config-file"] = config
	_, cfg := testenv.Start(t, testenv.Options{APIServerArgs: args})
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	const ns = "default"
	cm := func(name string, finalizers ...string) *corev1.ConfigMap {
		return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Finalizers: finalizers}, Data: map[string]string{"k": "v"}}
	}
	// What exists before the tenant goes over quota.
	_, err = cs.CoreV1().ConfigMaps(ns).Create(ctx, cm("kept"), metav1.CreateOptions{})
	must(err)
	_, err = cs.CoreV1().ConfigMaps(ns).Create(ctx, cm("finalized", "example.com/hold"), metav1.CreateOptions{})
	must(err)
	lease, err := cs.CoordinationV1().Leases(ns).Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "heartbeat", Namespace: ns}}, metav1.CreateOptions{})
	must(err)
	_, err = cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "app", Namespace: ns}}, metav1.CreateOptions{})
	must(err)

	policy, err := QuotaPolicy(tcp, apiary.TenantQuota{Bytes: resource.NewQuantity(8<<20, resource.BinarySI)})
	must(err)
	start := time.Now()
	policies.Write(t, map[string]string{KeyQuotaPolicy: policy})
	var refused error
	for {
		_, refused = cs.CoreV1().ConfigMaps(ns).Create(ctx, cm("new"), metav1.CreateOptions{})
		if refused != nil {
			break
		}
		must(cs.CoreV1().ConfigMaps(ns).Delete(ctx, "new", metav1.DeleteOptions{}))
		if time.Since(start) > 90*time.Second {
			t.Fatal("the policy file was not loaded within 90 s")
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("FIGURE quota policy in force %s after the file changed", time.Since(start).Round(time.Millisecond))
	wantRefused := func(what string, err error) {
		t.Helper()
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "tenant tenants/acme is over its datastore quota (8.0 MiB)") || !strings.Contains(err.Error(), "deletes are allowed") {
			t.Errorf("%s: got %v, want Forbidden with the quota message", what, err)
		}
	}
	wantRefused("create ConfigMap", refused)
	_, err = cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "more"}}, metav1.CreateOptions{})
	wantRefused("create Namespace (cluster-scoped)", err)
	_, err = cs.CoordinationV1().Leases(ns).Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "another", Namespace: ns}}, metav1.CreateOptions{})
	wantRefused("create Lease", err)
	_, err = cs.CoreV1().ConfigMaps(ns).Patch(ctx, "kept", types.MergePatchType, []byte(`{"data":{"big":"`+strings.Repeat("x", 1000)+`"}}`), metav1.PatchOptions{})
	wantRefused("patch ConfigMap", err)
	_, err = cs.CoreV1().ConfigMaps(ns).Patch(ctx, "kept", types.ApplyPatchType, []byte(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"kept"},"data":{"k":"w"}}`), metav1.PatchOptions{FieldManager: "tenant", Force: new(true)})
	wantRefused("server-side apply", err)
	// A tenant admin cannot remove or shadow the policy through its API:
	// it is not an API object, and static names are reserved.
	if err := cs.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Delete(ctx, QuotaPolicyName, metav1.DeleteOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("deleting the static binding through the API: %v, want NotFound", err)
	}
	_, err = cs.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(ctx, &admissionregistrationv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "shadow.static.k8s.io"},
		Spec:       admissionregistrationv1.ValidatingAdmissionPolicySpec{Validations: []admissionregistrationv1.Validation{{Expression: "true"}}},
	}, metav1.CreateOptions{})
	if err == nil {
		t.Errorf("created a policy with the static suffix through the API")
	}

	// What keeps the cluster alive and lets the tenant get back under.
	lease.Spec.HolderIdentity = new("node-1")
	_, err = cs.CoordinationV1().Leases(ns).Update(ctx, lease, metav1.UpdateOptions{})
	must(err)
	_, err = cs.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{
		ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: "get", Resource: "pods"},
	}}, metav1.CreateOptions{})
	must(err)
	_, err = cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "app", &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	must(err)
	must(cs.CoreV1().ConfigMaps(ns).Delete(ctx, "kept", metav1.DeleteOptions{}))
	// A deletion held by a finalizer finishes: the finalizer's removal is
	// an update of an object being deleted.
	must(cs.CoreV1().ConfigMaps(ns).Delete(ctx, "finalized", metav1.DeleteOptions{}))
	_, err = cs.CoreV1().ConfigMaps(ns).Patch(ctx, "finalized", types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
	must(err)
	if _, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, "finalized", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("finalized ConfigMap after its finalizer was removed: %v, want NotFound", err)
	}

	// Back under quota: the file is emptied and writes work again.
	start = time.Now()
	policies.Write(t, map[string]string{KeyQuotaPolicy: ""})
	for {
		if _, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, cm("after"), metav1.CreateOptions{}); err == nil {
			break
		}
		if time.Since(start) > 90*time.Second {
			t.Fatal("the emptied policy file was not reloaded within 90 s")
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("FIGURE quota policy lifted %s after the file changed", time.Since(start).Round(time.Millisecond))
}
