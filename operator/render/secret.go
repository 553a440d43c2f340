package render

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

// Secret wraps issued credentials in the tenant's Secret of the given kind.
// Secrets are created and updated with preconditions rather than applied,
// because their content is generated (keys are random): re-rendering is not
// idempotent, so a stale read must never overwrite them.
func Secret(tcp *apiary.TenantControlPlane, kind SecretKind, data map[string][]byte) *corev1.Secret {
	typ := corev1.SecretTypeOpaque
	if _, ok := data[KeyTLSKey]; ok {
		typ = corev1.SecretTypeTLS
	}
	labels := Labels(tcp)
	labels[LabelSecret] = string(kind)
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name:      SecretName(tcp, kind),
			Namespace: tcp.Namespace,
			Labels:    labels,
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion:         apiary.GroupVersion.String(),
				Kind:               "TenantControlPlane",
				Name:               tcp.Name,
				UID:                tcp.UID,
				Controller:         ptr.To(true),
				BlockOwnerDeletion: ptr.To(true),
			}},
		},
		Type: typ,
		Data: data,
	}
}
