package controllers

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/apiaryhq/apiary/datastore"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

// admitted says whether a DataStore takes tenants of the namespace, and
// why not.
func (r *TenantControlPlaneReconciler) admitted(ctx context.Context, ds *apiary.DataStore, namespace string) (bool, string, error) {
	if ds.Spec.NamespaceSelector == nil {
		return true, "", nil
	}
	var ns corev1.Namespace
	if err := r.Client.Get(ctx, client.ObjectKey{Name: namespace}, &ns); err != nil {
		return false, "", fmt.Errorf("reading namespace %s: %w", namespace, err)
	}
	ok, err := ds.Admits(ns.Labels)
	if err != nil || ok {
		return ok, "", err
	}
	return false, fmt.Sprintf("DataStore %s does not take tenants of namespace %s: its spec.namespaceSelector (%s) does not match the namespace's labels", ds.Name, namespace, metav1.FormatLabelSelector(ds.Spec.NamespaceSelector)), nil
}

// dataStoreChangesTenants passes the DataStore changes that matter to its
// tenants: readiness, spec, endpoints, protection (finalizer) and deletion. Its tenant
// count changes whenever a tenant comes or goes; reacting to that would
// reconcile every tenant of a DataStore for each new one.
func dataStoreChangesTenants() predicate.Predicate {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		oldDS, okOld := e.ObjectOld.(*apiary.DataStore)
		newDS, okNew := e.ObjectNew.(*apiary.DataStore)
		if !okOld || !okNew {
			return true
		}
		oldReady := meta.FindStatusCondition(oldDS.Status.Conditions, apiary.ConditionReady)
		newReady := meta.FindStatusCondition(newDS.Status.Conditions, apiary.ConditionReady)
		return oldDS.Generation != newDS.Generation ||
			!oldDS.DeletionTimestamp.Equal(newDS.DeletionTimestamp) ||
			!slices.Equal(oldDS.Finalizers, newDS.Finalizers) ||
			// A managed etcd's voting members changed: the tenants'
			// --etcd-servers follow them.
			!slices.Equal(oldDS.Status.Endpoints, newDS.Status.Endpoints) ||
			(oldReady == nil) != (newReady == nil) ||
			(oldReady != nil && (oldReady.Status != newReady.Status || oldReady.Reason != newReady.Reason))
	}}
}

// IndexTenantsByDataStore lets the DataStore controller and the watch above
// find a DataStore's tenants.
func IndexTenantsByDataStore(ctx context.Context, mgr ctrl.Manager) error {
	err := mgr.GetFieldIndexer().IndexField(ctx, &apiary.TenantControlPlane{}, dataStoreIndex, func(o client.Object) []string {
		tcp := o.(*apiary.TenantControlPlane)
		if tcp.Status.DataStore.Name != "" {
			return []string{tcp.Status.DataStore.Name}
		}
		if tcp.Spec.DataStore != "" {
			return []string{tcp.Spec.DataStore}
		}
		return nil
	})
	if err != nil && !strings.Contains(err.Error(), "indexer conflict") {
		return fmt.Errorf("indexing tenants by DataStore: %w", err)
	}
	return nil
}

func (r *TenantControlPlaneReconciler) tenantsOfDataStore(ctx context.Context, o client.Object) []reconcile.Request {
	var list apiary.TenantControlPlaneList
	if err := r.Client.List(ctx, &list, client.MatchingFields{dataStoreIndex: o.GetName()}); err != nil {
		log.FromContext(ctx).Error(err, "listing tenants of DataStore", "dataStore", o.GetName())
		return nil
	}
	var reqs []reconcile.Request
	for _, t := range list.Items {
		reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&t)})
	}
	// Tenants waiting for placement may now find a DataStore.
	var unplaced apiary.TenantControlPlaneList
	if err := r.Client.List(ctx, &unplaced); err == nil {
		for _, t := range unplaced.Items {
			if t.Spec.DataStore == "" && t.Status.DataStore.Name == "" {
				reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&t)})
			}
		}
	}
	return reqs
}

// bindDataStore resolves the tenant's DataStore (placement when unset),
// ensures its etcd user, role and prefix, and sets DataStoreReady.
func (r *TenantControlPlaneReconciler) bindDataStore(ctx context.Context, tcp *apiary.TenantControlPlane) (*apiary.DataStore, datastore.Config, error) {
	st := &tcp.Status
	fail := func(reason, msg string, err error) (*apiary.DataStore, datastore.Config, error) {
		r.setCondition(tcp, apiary.ConditionDataStoreReady, metav1.ConditionFalse, reason, msg)
		return nil, datastore.Config{}, err
	}
	name := st.DataStore.Name
	if name == "" {
		name = tcp.Spec.DataStore
	}
	if name == "" {
		placed, err := r.place(ctx, tcp.Namespace)
		if err != nil {
			return fail(ReasonNoDataStoreAvailable, err.Error(), nil)
		}
		name = placed
	}
	var ds apiary.DataStore
	if err := r.Client.Get(ctx, client.ObjectKey{Name: name}, &ds); err != nil {
		if apierrors.IsNotFound(err) {
			return fail(ReasonDataStoreNotFound, fmt.Sprintf("DataStore %q does not exist", name), nil)
		}
		return fail("Error", err.Error(), err)
	}
	// Checked at every reconcile, not only when binding: status.dataStore
	// must not carry a tenant onto a DataStore its namespace may not use.
	if ok, why, err := r.admitted(ctx, &ds, tcp.Namespace); err != nil || !ok {
		if err != nil {
			return fail("Error", err.Error(), err)
		}
		return fail(ReasonNamespaceNotAllowed, why, nil)
	}
	// Only a DataStore its controller has checked and protected (finalizer)
	// takes tenants: otherwise it could be deleted under their data.
	if !ds.DeletionTimestamp.IsZero() {
		return fail(ReasonDataStoreNotReady, fmt.Sprintf("DataStore %s is being deleted", name), nil)
	}
	if c := meta.FindStatusCondition(ds.Status.Conditions, apiary.ConditionReady); c == nil || c.Status != metav1.ConditionTrue || !controllerutil.ContainsFinalizer(&ds, DataStoreFinalizer) {
		reason, msg := ReasonDataStoreNotReady, "it has not been checked yet"
		if c != nil && c.Status != metav1.ConditionTrue {
			reason, msg = c.Reason, c.Message
		}
		return fail(reason, fmt.Sprintf("DataStore %s is not Ready: %s", name, msg), nil)
	}
	cfg, err := dataStoreConfig(ctx, r.APIReader, &ds, r.ClusterDomain)
	if err != nil {
		return fail(datastore.ReasonOf(err), fmt.Sprintf("DataStore %s: %v", name, err), err)
	}
	tenant := datastore.TenantFor(tcp.UID)
	callCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	dc, err := r.DataStores.Get(callCtx, name, cfg)
	if err == nil {
		var changed bool
		changed, err = dc.EnsureTenant(callCtx, tenant)
		if err == nil && changed {
			r.Recorder.Eventf(tcp, &ds, corev1.EventTypeNormal, ReasonBound, "BindDataStore",
				"created etcd user and role %s with access to %s on DataStore %s", tenant.User, tenant.Prefix, name)
		}
	}
	if err != nil {
		return fail(datastore.ReasonOf(err), fmt.Sprintf("DataStore %s: %v", name, err), err)
	}
	// Usage is kept: the quota step measures it only now and then.
	st.DataStore = apiary.DataStoreBinding{Name: name, Prefix: tenant.Prefix, User: tenant.User, Usage: st.DataStore.Usage}
	r.setCondition(tcp, apiary.ConditionDataStoreReady, metav1.ConditionTrue, ReasonBound,
		fmt.Sprintf("etcd user %s may read and write %s/ on DataStore %s", tenant.User, tenant.Prefix, name))
	return &ds, cfg, nil
}

// place picks a DataStore for a tenant that names none: the Ready one
// annotated as default, else the Ready one with the fewest tenants.
func (r *TenantControlPlaneReconciler) place(ctx context.Context, namespace string) (string, error) {
	var list apiary.DataStoreList
	if err := r.Client.List(ctx, &list); err != nil {
		return "", fmt.Errorf("listing DataStores: %w", err)
	}
	var ready []apiary.DataStore
	for _, ds := range list.Items {
		if !ds.DeletionTimestamp.IsZero() || !meta.IsStatusConditionTrue(ds.Status.Conditions, apiary.ConditionReady) {
			continue
		}
		if ok, _, err := r.admitted(ctx, &ds, namespace); err != nil || !ok {
			continue
		}
		ready = append(ready, ds)
	}
	if len(ready) == 0 {
		return "", fmt.Errorf("no Ready DataStore that takes tenants of namespace %s to place the tenant on (%d DataStores exist); create one, or set spec.dataStore", namespace, len(list.Items))
	}
	slices.SortFunc(ready, func(a, b apiary.DataStore) int {
		ad, bd := a.Annotations[AnnotationDefaultDataStore] == "true", b.Annotations[AnnotationDefaultDataStore] == "true"
		switch {
		case ad != bd:
			if ad {
				return -1
			}
			return 1
		case a.Status.Tenants != b.Status.Tenants:
			return int(a.Status.Tenants - b.Status.Tenants)
		}
		return strings.Compare(a.Name, b.Name)
	})
	return ready[0].Name, nil
}

func (r *TenantControlPlaneReconciler) releaseDataStore(ctx context.Context, tcp *apiary.TenantControlPlane, name string) error {
	var ds apiary.DataStore
	if err := r.Client.Get(ctx, client.ObjectKey{Name: name}, &ds); err != nil {
		if apierrors.IsNotFound(err) {
			// The DataStore protects itself while tenants use it, so it can
			// only be gone if someone removed its finalizer by hand.
			r.Recorder.Eventf(tcp, nil, corev1.EventTypeWarning, ReasonDataStoreNotFound, "ReleaseDataStore",
				"DataStore %s no longer exists: the tenant's etcd user %s and keys under %s could not be removed", name, tcp.Status.DataStore.User, tcp.Status.DataStore.Prefix)
			return nil
		}
		return err
	}
	cfg, err := dataStoreConfig(ctx, r.APIReader, &ds, r.ClusterDomain)
	if err != nil {
		return err
	}
	callCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	dc, err := r.DataStores.Get(callCtx, name, cfg)
	if err != nil {
		return err
	}
	// From the UID, never from status: status.dataStore is only a record,
	// and a forged prefix there must not delete another tenant's keys.
	tenant := datastore.TenantFor(tcp.UID)
	if err := dc.DeleteTenant(callCtx, tenant); err != nil {
		return err
	}
	r.Recorder.Eventf(tcp, &ds, corev1.EventTypeNormal, "Released", "ReleaseDataStore",
		"removed etcd user and role %s and every key under %s from DataStore %s", tenant.User, tenant.Prefix, name)
	return nil
}
