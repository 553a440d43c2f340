package controllers

import (
	"context"
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"

	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/operator/tenantcluster"
	"github.com/apiaryhq/apiary/tenant"
)

// bootstrapWatch is the name of the watch, inside each tenant, of the
// metadata of the objects the bootstrap applied (label
// app.kubernetes.io/managed-by=apiary), on each resource it applied. When
// one of an enabled part is deleted it drops the tenant's bootstrap memo and
// enqueues the tenant, so the next reconcile applies everything again
// within seconds instead of at the next resync.
const bootstrapWatch = "bootstrap"

// ensureWatch starts the tenant's bootstrap watch on the resources of kinds,
// or restarts it when the kubeconfig or the kinds changed. Nothing is
// watched while b.deleted is nil (no controller reads the events: unit
// tests).
func (b *tenantBootstrapper) ensureWatch(tcp *apiary.TenantControlPlane, tc *tenantcluster.Access, kinds map[schema.GroupVersionKind]bool) error {
	if b.deleted == nil {
		return nil
	}
	var gvrs []schema.GroupVersionResource
	for gvk := range kinds {
		m, err := tc.Client.RESTMapper().RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			return fmt.Errorf("resource of %s: %w", gvk, err)
		}
		gvrs = append(gvrs, m.Resource)
	}
	uid := tcp.UID
	ref := &apiary.TenantControlPlane{}
	ref.Namespace, ref.Name, ref.UID = tcp.Namespace, tcp.Name, uid
	return b.tenants.Watch(uid, tc, tenantcluster.Watch{
		Name:          bootstrapWatch,
		Resources:     gvrs,
		LabelSelector: tenant.LabelManagedBy + "=" + tenant.ManagedBy,
		OnDelete: func(ctx context.Context, obj any) {
			if !b.forgetDeleted(uid, obj) {
				return
			}
			select {
			case b.deleted <- event.GenericEvent{Object: ref}:
			case <-ctx.Done():
			}
		},
	})
}

// forgetDeleted drops the tenant's bootstrap memo when obj, just deleted,
// belongs to a part the last bootstrap applied, and says so. Objects of a
// disabled part are the bootstrap's own removals: nothing to re-apply.
func (b *tenantBootstrapper) forgetDeleted(uid types.UID, obj any) bool {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if o, ok := obj.(client.Object); ok {
		if last, ok := b.applied[uid]; ok && !slices.Contains(last.result.parts, tenant.Part(o.GetLabels()[tenant.LabelPart])) {
			return false
		}
	}
	delete(b.applied, uid)
	if b.deletions == nil {
		b.deletions = map[types.UID]uint64{}
	}
	b.deletions[uid]++
	return true
}
