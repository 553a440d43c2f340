package controllers

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"

	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/tenant"
)

// tenantWatch watches, inside one tenant, the metadata of the objects the
// bootstrap applied (label app.kubernetes.io/managed-by=apiary), one
// informer per kind it applied. When one of an enabled part is deleted it
// drops the tenant's bootstrap memo and enqueues the tenant, so the next
// reconcile applies everything again within seconds instead of at the next
// resync. Metadata only: the cache holds names and labels, not the objects.
type tenantWatch struct {
	// key says what the watch was started for: the kubeconfig and the
	// resources; a different key restarts it.
	key    string
	cancel context.CancelFunc
}

// ensureWatch starts the tenant's watch on the resources of kinds, or
// restarts it when the kubeconfig or the kinds changed. Nothing is watched
// while b.deleted is nil (no controller reads the events: unit tests).
func (b *tenantBootstrapper) ensureWatch(tcp *apiary.TenantControlPlane, tc tenantClient, kinds map[schema.GroupVersionKind]bool) error {
	if b.deleted == nil {
		return nil
	}
	var gvrs []schema.GroupVersionResource
	for gvk := range kinds {
		m, err := tc.c.RESTMapper().RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			return fmt.Errorf("resource of %s: %w", gvk, err)
		}
		gvrs = append(gvrs, m.Resource)
	}
	sort.Slice(gvrs, func(i, j int) bool { return gvrs[i].String() < gvrs[j].String() })
	var key strings.Builder
	fmt.Fprintf(&key, "%x", tc.kubeconfigHash)
	for _, r := range gvrs {
		key.WriteString(";" + r.String())
	}
	uid := tcp.UID
	b.mu.Lock()
	defer b.mu.Unlock()
	if w, ok := b.watches[uid]; ok {
		if w.key == key.String() {
			return nil
		}
		w.cancel()
		delete(b.watches, uid)
	}
	mc, err := metadata.NewForConfig(tc.cfg)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	factory := metadatainformer.NewFilteredSharedInformerFactory(mc, 0, metav1.NamespaceAll, func(o *metav1.ListOptions) {
		o.LabelSelector = tenant.LabelManagedBy + "=" + tenant.ManagedBy
	})
	ref := &apiary.TenantControlPlane{}
	ref.Namespace, ref.Name, ref.UID = tcp.Namespace, tcp.Name, uid
	onDelete := func(obj any) {
		if !b.forgetDeleted(uid, obj) {
			return
		}
		select {
		case b.deleted <- event.GenericEvent{Object: ref}:
		case <-ctx.Done():
		}
	}
	for _, gvr := range gvrs {
		if _, err := factory.ForResource(gvr).Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{DeleteFunc: onDelete}); err != nil {
			cancel()
			return err
		}
	}
	factory.Start(ctx.Done())
	if b.watches == nil {
		b.watches = map[types.UID]tenantWatch{}
	}
	b.watches[uid] = tenantWatch{key: key.String(), cancel: cancel}
	return nil
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

// stopWatch stops the tenant's watch (the tenant is gone).
func (b *tenantBootstrapper) stopWatch(uid types.UID) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if w, ok := b.watches[uid]; ok {
		w.cancel()
		delete(b.watches, uid)
	}
}
