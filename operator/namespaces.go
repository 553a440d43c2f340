package operator

import (
	"context"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
)

// usableNamespaces are the namespaces, of those the operator works in,
// that exist and are not being deleted. Only there does it still hold its
// Roles (the namespace controller deletes a going namespace's Roles as
// early as anything else), so only there may it list Secrets, Deployments
// and the rest: one informer refused its list keeps the whole cache from
// syncing, and the operator from starting.
func usableNamespaces(ctx context.Context, r client.Reader, names []string) ([]string, error) {
	var out []string
	for _, name := range names {
		var ns corev1.Namespace
		err := r.Get(ctx, client.ObjectKey{Name: name}, &ns)
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			return nil, fmt.Errorf("reading namespace %s: %w", name, err)
		case ns.DeletionTimestamp.IsZero():
			out = append(out, name)
		}
	}
	return out, nil
}

// namespacesWatch ends the manager (the pod restarts) when a namespace the
// operator should work in, missing or going when it started, exists again:
// the cache's namespaces are fixed when it starts. A namespace that goes
// needs no restart: its informers, synced when the replica started (the
// controllers warm up on standbys too, see NewManager), only fail to list
// until the next start, and tenants and Hosts there, cached with
// cluster-wide rights, still get their finalizers run.
type namespacesWatch struct {
	reader   client.Reader
	names    []string
	started  []string
	interval time.Duration
}

func (w namespacesWatch) Start(ctx context.Context) error {
	t := time.NewTicker(w.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		now, err := usableNamespaces(ctx, w.reader, w.names)
		if err != nil {
			log.FromContext(ctx).Error(err, "checking the tenant namespaces")
			continue
		}
		for _, ns := range now {
			if !slices.Contains(w.started, ns) {
				return fmt.Errorf("namespace %s of --tenant-namespaces exists now; restarting to watch it", ns)
			}
		}
	}
}

// NeedLeaderElection: every replica's cache (webhooks read it too).
func (namespacesWatch) NeedLeaderElection() bool { return false }
