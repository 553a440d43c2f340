package controllers

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"

	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/operator/render"
	"github.com/apiaryhq/apiary/operator/tenantcluster"
	"github.com/apiaryhq/apiary/tenant"
)

// DefaultBootstrapResync is how long an applied, unchanged bootstrap is
// trusted before it is applied again. A deletion inside the tenant is seen
// by the tenant's watch (tenant_watch.go) and re-applied at once; the resync
// also repairs what the watch missed (changed objects, a deletion while the
// watch was down). A Ready tenant is reconciled every 5 minutes.
const DefaultBootstrapResync = 4 * time.Minute

// tenantBootstrapper applies the objects of package tenant inside tenant
// clusters, through the tenant cluster cache.
type tenantBootstrapper struct {
	tenants *tenantcluster.Cache

	mu      sync.Mutex
	applied map[types.UID]appliedBootstrap
	// deletions counts the deletions seen inside each tenant: an apply
	// that a deletion overtook must not record itself as complete.
	deletions map[types.UID]uint64
	// deleted receives a tenant when an object applied inside it is
	// deleted (tenant_watch.go); the controller reads it as a source.
	deleted chan event.GenericEvent
}

type appliedBootstrap struct {
	hash [32]byte
	at   time.Time
	// result of that apply, reported again while it is skipped (the
	// status write that carried it may have failed).
	result bootstrapResult
}

// bootstrapResult says what one bootstrap did.
type bootstrapResult struct {
	applied, removed int
	parts            []tenant.Part
	skipped          bool
	// createdOnce: the create-once objects exist (made now or before).
	createdOnce bool
}

// remember records a complete apply, unless a deletion inside the tenant
// was seen since it started (seen): the deleted object may have been
// applied before its deletion, so the memo stays empty and the reconcile
// the deletion queued applies again.
func (b *tenantBootstrapper) remember(uid types.UID, seen uint64, a appliedBootstrap) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.deletions[uid] != seen {
		return
	}
	if b.applied == nil {
		b.applied = map[types.UID]appliedBootstrap{}
	}
	b.applied[uid] = a
}

// forget drops what is remembered of a deleted tenant.
func (b *tenantBootstrapper) forget(uid types.UID) {
	b.tenants.Forget(uid)
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.applied, uid)
	delete(b.deletions, uid)
}

// bootstrap applies every enabled part and removes the objects of disabled
// ones. Unchanged input applied less than bootstrapResync ago is skipped.
func (b *tenantBootstrapper) bootstrap(ctx context.Context, in tenant.Inputs, kubeconfig []byte, now time.Time, resync time.Duration) (bootstrapResult, error) {
	var res bootstrapResult
	type rendered struct {
		part    tenant.Part
		enabled bool
		objs    []*unstructured.Unstructured
	}
	var all []rendered
	h := sha256.New()
	for _, p := range tenant.Parts {
		objs, err := tenant.Render(in, p)
		if err != nil {
			return res, err
		}
		r := rendered{part: p, enabled: in.Enabled(p), objs: objs}
		all = append(all, r)
		if r.enabled {
			res.parts = append(res.parts, p)
		}
		fmt.Fprintf(h, "%s=%t;", p, r.enabled)
		if err := json.NewEncoder(h).Encode(objs); err != nil {
			return res, err
		}
	}
	var sum [32]byte
	copy(sum[:], h.Sum(nil))
	uid := in.TCP.UID
	b.mu.Lock()
	last, ok := b.applied[uid]
	seen := b.deletions[uid]
	b.mu.Unlock()
	if ok && last.hash == sum && now.Sub(last.at) < resync {
		res = last.result
		res.skipped = true
		return res, nil
	}

	tc, err := b.tenants.For(uid, kubeconfig)
	if err != nil {
		return res, err
	}
	c := tc.Client
	// The kinds applied, to watch for deletions (tenant_watch.go).
	kinds := map[schema.GroupVersionKind]bool{}
	for _, r := range all {
		for _, o := range r.objs {
			what := fmt.Sprintf("%s %s", o.GetKind(), client.ObjectKeyFromObject(o))
			if !r.enabled {
				err := c.Delete(ctx, o)
				switch {
				case err == nil:
					res.removed++
				case apierrors.IsNotFound(err):
				default:
					return res, fmt.Errorf("removing %s of disabled %s: %w", what, r.part, err)
				}
				continue
			}
			if o.GetAnnotations()[tenant.AnnotationCreateOnce] == "true" {
				if in.TCP.Status.AdminBindingCreated {
					continue
				}
				if err := c.Create(ctx, o, client.FieldOwner(FieldOwner)); err != nil && !apierrors.IsAlreadyExists(err) {
					return res, fmt.Errorf("creating %s (%s): %w", what, r.part, err)
				}
				res.createdOnce = true
				continue
			}
			if err := c.Apply(ctx, client.ApplyConfigurationFromUnstructured(o), client.FieldOwner(FieldOwner), client.ForceOwnership); err != nil {
				return res, fmt.Errorf("applying %s (%s): %w", what, r.part, err)
			}
			kinds[o.GroupVersionKind()] = true
			res.applied++
		}
	}
	b.remember(uid, seen, appliedBootstrap{hash: sum, at: now, result: res})
	// Watched from now on, so that a deleted object comes back at once.
	if err := b.ensureWatch(in.TCP, tc, kinds); err != nil {
		return res, fmt.Errorf("watching the applied objects inside the tenant: %w", err)
	}
	return res, nil
}

// errNoAdminKubeconfig means the credentials step has not stored the
// operator's kubeconfig the bootstrap needs.
var errNoAdminKubeconfig = errors.New("the operator's kubeconfig for the tenant is not issued yet")

// forgetTenant is called when a tenant is gone.
func (r *TenantControlPlaneReconciler) forgetTenant(uid types.UID) {
	r.bootstrapper.forget(uid)
}

// bootstrapTenant applies the tenant-side objects and sets
// TenantBootstrapped.
func (r *TenantControlPlaneReconciler) bootstrapTenant(ctx context.Context, tcp *apiary.TenantControlPlane, cr *credentials, server, rootCA string) error {
	kubeconfig := cr.data[render.SecretOperatorKubeconfig][apiary.KubeconfigKey]
	// cluster-info carries the bundle: a host joining mid-rotation trusts
	// both CAs (kubeadm's discovery accepts a bundle holding the pinned one).
	caPEM := cr.trust
	if len(kubeconfig) == 0 || len(caPEM) == 0 {
		r.setCondition(tcp, apiary.ConditionTenantBootstrapped, metav1.ConditionFalse, ReasonBootstrapFailed, errNoAdminKubeconfig.Error())
		return errNoAdminKubeconfig
	}
	in := tenant.Inputs{TCP: tcp, Version: tcp.RunningVersion(), Server: server, CACert: caPEM, RootCA: rootCA, ImageRepository: r.ImageRepository}
	resync := r.BootstrapResync
	if resync == 0 {
		resync = DefaultBootstrapResync
	}
	res, err := r.bootstrapper.bootstrap(ctx, in, kubeconfig, r.Now(), resync)
	if err != nil {
		r.setCondition(tcp, apiary.ConditionTenantBootstrapped, metav1.ConditionFalse, ReasonBootstrapFailed, err.Error())
		return err
	}
	if res.createdOnce {
		tcp.Status.AdminBindingCreated = true
	}
	msg := fmt.Sprintf("applied %d objects inside the tenant (%v)", res.applied, res.parts)
	if res.removed > 0 {
		msg += fmt.Sprintf("; removed %d objects of disabled addons", res.removed)
	}
	r.setCondition(tcp, apiary.ConditionTenantBootstrapped, metav1.ConditionTrue, ReasonApplied, msg)
	return nil
}
