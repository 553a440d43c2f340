package controllers

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/apiaryhq/apiary/datastore"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

const (
	// DataStoreFinalizer keeps a DataStore while tenants store data on it.
	DataStoreFinalizer = "apiary.dev/datastore-in-use"
	// ConditionDeletionBlocked is True while a deleted DataStore still has
	// tenants.
	ConditionDeletionBlocked = "DeletionBlocked"

	ReasonAvailable = "Available"
	ReasonInUse     = "InUse"

	// DefaultDataStoreCheckInterval is how often a DataStore's etcd is
	// checked when nothing else happens: reachability changes emit no
	// Kubernetes event.
	DefaultDataStoreCheckInterval = 30 * time.Second
)

// DataStoreReconciler checks DataStores with real etcd calls, counts their
// tenants and protects them from deletion while they are used.
type DataStoreReconciler struct {
	Client     client.Client
	APIReader  client.Reader
	Recorder   events.EventRecorder
	DataStores *datastore.Pool
	// CheckInterval overrides DefaultDataStoreCheckInterval.
	CheckInterval time.Duration

	statuses statusMemo[apiary.DataStoreStatus]
}

// +kubebuilder:rbac:groups=apiary.dev,resources=datastores,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=apiary.dev,resources=datastores/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=apiary.dev,resources=datastores/finalizers,verbs=update

// SetupWithManager registers the controller; tenants binding or leaving
// re-count their DataStore.
func (r *DataStoreReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if err := IndexTenantsByDataStore(context.Background(), mgr); err != nil {
		return err
	}
	return ctrl.NewControllerManagedBy(mgr).
		For(&apiary.DataStore{}).
		Watches(&apiary.TenantControlPlane{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			tcp := o.(*apiary.TenantControlPlane)
			var reqs []reconcile.Request
			for _, name := range []string{tcp.Status.DataStore.Name, tcp.Spec.DataStore} {
				if name != "" {
					reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKey{Name: name}})
				}
			}
			return reqs
		}), builder.WithPredicates(tenantChangesDataStore())).
		// One unreachable etcd (each check waits for its timeout) must not
		// delay the others.
		WithOptions(controller.Options{MaxConcurrentReconciles: 4}).
		Complete(r)
}

// tenantChangesDataStore passes the tenant changes that change a
// DataStore's tenant list: binding, deletion and the cleanup finalizer.
func tenantChangesDataStore() predicate.Predicate {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		o, okOld := e.ObjectOld.(*apiary.TenantControlPlane)
		n, okNew := e.ObjectNew.(*apiary.TenantControlPlane)
		if !okOld || !okNew {
			return true
		}
		return o.Spec.DataStore != n.Spec.DataStore ||
			o.Status.DataStore.Name != n.Status.DataStore.Name ||
			!o.DeletionTimestamp.Equal(n.DeletionTimestamp) ||
			!slices.Equal(o.Finalizers, n.Finalizers)
	}}
}

// Reconcile checks one DataStore.
func (r *DataStoreReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var orig apiary.DataStore
	if err := r.Client.Get(ctx, req.NamespacedName, &orig); err != nil {
		if client.IgnoreNotFound(err) == nil {
			r.DataStores.Forget(req.Name)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	ds := orig.DeepCopy()

	usedBy, err := r.tenants(ctx, ds.Name)
	if err != nil {
		return ctrl.Result{}, err
	}
	ds.Status.UsedBy = usedBy
	ds.Status.Tenants = int32(len(usedBy))
	ds.Status.ObservedGeneration = ds.Generation

	if !ds.DeletionTimestamp.IsZero() {
		return r.finalize(ctx, &orig, ds)
	}
	if !controllerutil.ContainsFinalizer(ds, DataStoreFinalizer) {
		patch := client.MergeFrom(orig.DeepCopy())
		controllerutil.AddFinalizer(&orig, DataStoreFinalizer)
		if err := r.Client.Patch(ctx, &orig, patch, client.FieldOwner(FieldOwner)); err != nil {
			return ctrl.Result{}, fmt.Errorf("adding finalizer: %w", err)
		}
		ds.Finalizers, ds.ResourceVersion = orig.Finalizers, orig.ResourceVersion
	}

	checkErr := r.check(ctx, ds)
	if checkErr != nil {
		r.set(ds, apiary.ConditionReady, metav1.ConditionFalse, datastore.ReasonOf(checkErr), checkErr.Error())
	} else {
		r.set(ds, apiary.ConditionReady, metav1.ConditionTrue, ReasonAvailable,
			fmt.Sprintf("etcd answers at %s with authentication enabled", strings.Join(ds.Spec.Endpoints, ",")))
	}
	if err := r.writeStatus(ctx, &orig, ds); err != nil {
		return ctrl.Result{}, err
	}
	interval := r.CheckInterval
	if interval == 0 {
		interval = DefaultDataStoreCheckInterval
	}
	return ctrl.Result{RequeueAfter: interval}, nil
}

func (r *DataStoreReconciler) check(ctx context.Context, ds *apiary.DataStore) error {
	cfg, err := dataStoreConfig(ctx, r.APIReader, ds)
	if err != nil {
		return err
	}
	callCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	dc, err := r.DataStores.Get(callCtx, ds.Name, cfg)
	if err != nil {
		return err
	}
	return dc.Check(callCtx)
}

// tenants lists the tenants bound to (or asking for) a DataStore as
// namespace/name, sorted.
func (r *DataStoreReconciler) tenants(ctx context.Context, name string) ([]string, error) {
	var list apiary.TenantControlPlaneList
	if err := r.Client.List(ctx, &list, client.MatchingFields{dataStoreIndex: name}); err != nil {
		return nil, fmt.Errorf("listing tenants of DataStore %s: %w", name, err)
	}
	used := make([]string, 0, len(list.Items))
	for _, t := range list.Items {
		// A tenant whose finalizer is gone no longer holds data here.
		if !t.DeletionTimestamp.IsZero() && !controllerutil.ContainsFinalizer(&t, TenantFinalizer) {
			continue
		}
		used = append(used, t.Namespace+"/"+t.Name)
	}
	slices.Sort(used)
	return used, nil
}

func (r *DataStoreReconciler) finalize(ctx context.Context, orig, ds *apiary.DataStore) (ctrl.Result, error) {
	if len(ds.Status.UsedBy) > 0 {
		msg := fmt.Sprintf("DataStore %s still stores %d tenant(s): %s; delete them first", ds.Name, len(ds.Status.UsedBy), strings.Join(ds.Status.UsedBy, ", "))
		r.set(ds, ConditionDeletionBlocked, metav1.ConditionTrue, ReasonInUse, msg)
		// Re-checked when a tenant goes (watch), not on a timer.
		return ctrl.Result{}, r.writeStatus(ctx, orig, ds)
	}
	r.DataStores.Forget(ds.Name)
	r.statuses.forget(ds.UID)
	if !controllerutil.ContainsFinalizer(orig, DataStoreFinalizer) {
		return ctrl.Result{}, nil
	}
	patch := client.MergeFrom(orig.DeepCopy())
	controllerutil.RemoveFinalizer(orig, DataStoreFinalizer)
	return ctrl.Result{}, client.IgnoreNotFound(r.Client.Patch(ctx, orig, patch, client.FieldOwner(FieldOwner)))
}

func (r *DataStoreReconciler) set(ds *apiary.DataStore, typ string, status metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(&ds.Status.Conditions, metav1.Condition{
		Type: typ, Status: status, Reason: reason, Message: msg, ObservedGeneration: ds.Generation,
	})
}

func (r *DataStoreReconciler) writeStatus(ctx context.Context, orig, ds *apiary.DataStore) error {
	base := r.statuses.base(orig.UID, orig.ResourceVersion, orig.Status)
	if equality.Semantic.DeepEqual(base, ds.Status) {
		return nil
	}
	for _, c := range ds.Status.Conditions {
		old := meta.FindStatusCondition(base.Conditions, c.Type)
		if old != nil && old.Status == c.Status && old.Reason == c.Reason {
			continue
		}
		typ := corev1.EventTypeNormal
		if (c.Type == apiary.ConditionReady) != (c.Status == metav1.ConditionTrue) {
			typ = corev1.EventTypeWarning
		}
		r.Recorder.Eventf(ds, nil, typ, c.Reason, c.Type, "%s=%s: %s", c.Type, c.Status, c.Message)
	}
	before := orig.DeepCopy()
	before.Status = base
	updated := before.DeepCopy()
	updated.Status = ds.Status
	if err := r.Client.Status().Patch(ctx, updated, client.MergeFrom(before), client.FieldOwner(FieldOwner)); err != nil {
		return client.IgnoreNotFound(err)
	}
	r.statuses.remember(orig.UID, updated.ResourceVersion, *ds.Status.DeepCopy())
	return nil
}
