package hosts

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

// ReasonSecretNotFound: the Host's SSH key Secret is missing.
const ReasonSecretNotFound = "SecretNotFound"

// TargetOf resolves how to reach a Host over SSH: its address, user, the
// private key from its Secret (read from the API server by the operator,
// which does not cache users' key Secrets) and the pinned host key. The
// Host agent, the mode switch and the switch's checks in the CLI use it.
// It returns a condition reason with its error.
func TargetOf(ctx context.Context, reader client.Reader, h *apiary.Host) (Target, string, error) {
	var sec corev1.Secret
	key := client.ObjectKey{Namespace: h.Namespace, Name: h.Spec.SSHKeySecretRef.Name}
	if err := reader.Get(ctx, key, &sec); err != nil {
		if apierrors.IsNotFound(err) {
			return Target{}, ReasonSecretNotFound, fmt.Errorf("spec.sshKeySecretRef: Secret %s not found", key)
		}
		return Target{}, ReasonSecretNotFound, fmt.Errorf("reading Secret %s: %w", key, err)
	}
	pk := sec.Data[apiary.SSHPrivateKeyKey]
	if len(pk) == 0 {
		return Target{}, ReasonInvalidPrivateKey, fmt.Errorf("spec.sshKeySecretRef: Secret %s has no %q key", key, apiary.SSHPrivateKeyKey)
	}
	t := Target{
		Address:                  h.Spec.Address,
		Port:                     int(h.Spec.Port),
		User:                     h.Spec.User,
		PrivateKey:               pk,
		HostKey:                  h.Spec.HostKey,
		InsecureSkipHostKeyCheck: h.Spec.InsecureSkipHostKeyCheck,
	}
	if t.Port == 0 {
		t.Port = 22
	}
	if t.User == "" {
		t.User = "root"
	}
	return t, "", nil
}
