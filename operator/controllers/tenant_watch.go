package controllers

import (
	"context"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"

	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/tenant"
)

// tenantResources are the kinds package tenant applies inside a tenant.
var tenantResources = []schema.GroupVersionResource{
	{Version: "v1", Resource: "configmaps"},
	{Version: "v1", Resource: "serviceaccounts"},
	{Version: "v1", Resource: "services"},
	{Group: "apps", Version: "v1", Resource: "deployments"},
	{Group: "apps", Version: "v1", Resource: "daemonsets"},
	{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "roles"},
	{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "rolebindings"},
	{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "clusterroles"},
	{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "clusterrolebindings"},
}

// tenantWatch watches, inside one tenant, the metadata of the objects the
// bootstrap applied (label app.kubernetes.io/managed-by=apiary). When one is
// deleted it drops the tenant's bootstrap memo and enqueues the tenant, so
// the next reconcile applies everything again within seconds instead of at
// the next resync. Metadata only: the cache holds names and labels, not the
// objects.
type tenantWatch struct {
	kubeconfigHash [32]byte
	cancel         context.CancelFunc
}

// ensureWatch starts the tenant's watch, or restarts it when the kubeconfig
// changed. deleted receives the tenant when a watched object goes; nil
// disables watching (unit tests without a manager).
func (b *tenantBootstrapper) ensureWatch(tcp *apiary.TenantControlPlane, cfg *rest.Config, kubeconfigHash [32]byte) error {
	if b.deleted == nil {
		return nil
	}
	uid := tcp.UID
	b.mu.Lock()
	defer b.mu.Unlock()
	if w, ok := b.watches[uid]; ok {
		if w.kubeconfigHash == kubeconfigHash {
			return nil
		}
		w.cancel()
	}
	mc, err := metadata.NewForConfig(cfg)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	factory := metadatainformer.NewFilteredSharedInformerFactory(mc, 0, metav1.NamespaceAll, func(o *metav1.ListOptions) {
		o.LabelSelector = tenant.LabelManagedBy + "=" + tenant.ManagedBy
	})
	key := client.ObjectKeyFromObject(tcp)
	onDelete := func(any) {
		b.mu.Lock()
		delete(b.applied, uid)
		b.mu.Unlock()
		ref := &apiary.TenantControlPlane{}
		ref.Namespace, ref.Name, ref.UID = key.Namespace, key.Name, uid
		select {
		case b.deleted <- event.GenericEvent{Object: ref}:
		case <-ctx.Done():
		}
	}
	for _, gvr := range tenantResources {
		if _, err := factory.ForResource(gvr).Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{DeleteFunc: onDelete}); err != nil {
			cancel()
			return err
		}
	}
	factory.Start(ctx.Done())
	if b.watches == nil {
		b.watches = map[types.UID]tenantWatch{}
	}
	b.watches[uid] = tenantWatch{kubeconfigHash: kubeconfigHash, cancel: cancel}
	return nil
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
