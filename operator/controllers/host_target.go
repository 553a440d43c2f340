package controllers

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/apiaryhq/apiary/hosts"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

// hostTarget resolves how to reach a Host over SSH: its address, user, the
// private key from its Secret (read from the API server: the operator does
// not cache users' key Secrets) and the pinned host key. The Host agent
// uses it, and so will the mode switch, which writes control planes to
// hosts. It returns a condition reason with its error.
func hostTarget(ctx context.Context, reader client.Reader, h *apiary.Host) (hosts.Target, string, error) {
	var sec corev1.Secret
	key := client.ObjectKey{Namespace: h.Namespace, Name: h.Spec.SSHKeySecretRef.Name}
	if err := reader.Get(ctx, key, &sec); err != nil {
		if apierrors.IsNotFound(err) {
			return hosts.Target{}, ReasonSecretNotFound, fmt.Errorf("spec.sshKeySecretRef: Secret %s not found", key)
		}
		return hosts.Target{}, ReasonSecretNotFound, fmt.Errorf("reading Secret %s: %w", key, err)
	}
	pk := sec.Data[apiary.SSHPrivateKeyKey]
	if len(pk) == 0 {
		return hosts.Target{}, hosts.ReasonInvalidPrivateKey, fmt.Errorf("spec.sshKeySecretRef: Secret %s has no %q key", key, apiary.SSHPrivateKeyKey)
	}
	t := hosts.Target{
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
