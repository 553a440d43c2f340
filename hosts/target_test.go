package hosts

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

func TestTargetOf(t *testing.T) {
	h := &apiary.Host{ObjectMeta: metav1.ObjectMeta{Namespace: "t", Name: "h"}, Spec: apiary.HostSpec{
		Address: "192.0.2.30", SSHKeySecretRef: corev1.LocalObjectReference{Name: "key"}, HostKey: "ssh-ed25519 AAAA"}}
	empty := fake.NewClientBuilder().WithScheme(scheme.Scheme).Build()
	if _, reason, err := TargetOf(t.Context(), empty, h); reason != ReasonSecretNotFound || err == nil || !strings.Contains(err.Error(), "spec.sshKeySecretRef") {
		t.Errorf("missing Secret: %s %v", reason, err)
	}
	noKey := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithObjects(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "t", Name: "key"}}).Build()
	if _, reason, err := TargetOf(t.Context(), noKey, h); reason != ReasonInvalidPrivateKey || err == nil {
		t.Errorf("Secret without the key: %s %v", reason, err)
	}
	withKey := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithObjects(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "t", Name: "key"},
		Data: map[string][]byte{apiary.SSHPrivateKeyKey: []byte("PEM")}}).Build()
	got, _, err := TargetOf(t.Context(), withKey, h)
	if err != nil || got.Port != 22 || got.User != "root" || string(got.PrivateKey) != "PEM" || got.HostKey != h.Spec.HostKey || got.Address != h.Spec.Address {
		t.Errorf("target %+v, %v", got, err)
	}
}
