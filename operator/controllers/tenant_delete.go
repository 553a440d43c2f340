package controllers

import (
	"context"
	"errors"
	"fmt"
	"slices"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/apiaryhq/apiary/datastore"
	"github.com/apiaryhq/apiary/hosts"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/operator/render"
)

// finalize removes the tenant's pods, its datastore slice (user first, so
// that nothing writes while its keys are deleted), then its objects, then
// the finalizer.
func (r *TenantControlPlaneReconciler) finalize(ctx context.Context, orig, tcp *apiary.TenantControlPlane) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(orig, TenantFinalizer) {
		return ctrl.Result{}, nil
	}
	logger := log.FromContext(ctx)
	r.refusals.Delete(tcp.UID)
	// In a namespace being deleted, the namespace controller deletes every
	// object of the tenant there (its Secrets too), and may already have
	// deleted the Role that lets the operator do it: only the etcd slice,
	// outside the namespace, is the finalizer's to remove.
	inNamespace := !namespaceGoing(ctx, r.APIReader, tcp.Namespace)
	if inNamespace {
		r.stopHostsForDeletion(ctx, tcp)
		if err := r.deleteOwned(ctx, tcp, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: render.DeploymentName(tcp), Namespace: tcp.Namespace}}); err != nil {
			return ctrl.Result{}, err
		}
	}
	if name := tcp.Status.DataStore.Name; name != "" {
		if tcp.Annotations[AnnotationOrphanDataStoreData] == "true" {
			slice := datastore.TenantFor(tcp.UID)
			r.Recorder.Eventf(tcp, nil, corev1.EventTypeWarning, "DataStoreDataOrphaned", "ReleaseDataStore",
				"annotation %s: etcd user and role %s and the keys under %s on DataStore %s are left in place; remove them with etcdctl as root",
				AnnotationOrphanDataStoreData, slice.User, slice.Prefix, name)
		} else if err := r.releaseDataStore(ctx, tcp, name); err != nil {
			r.setCondition(tcp, apiary.ConditionDataStoreReady, metav1.ConditionFalse, datastore.ReasonOf(err),
				fmt.Sprintf("cannot remove the tenant's etcd keys, role and user from DataStore %s yet: %v; if the DataStore is gone for good, annotate the tenant %s=true to finish the deletion and leave them behind", name, err, AnnotationOrphanDataStoreData))
			return ctrl.Result{}, errors.Join(err, r.writeStatus(ctx, orig, tcp))
		}
	}
	if inNamespace {
		if err := r.deleteNamespaced(ctx, tcp); err != nil {
			return ctrl.Result{}, err
		}
	}
	patch := client.MergeFrom(orig.DeepCopy())
	controllerutil.RemoveFinalizer(orig, TenantFinalizer)
	if err := r.Client.Patch(ctx, orig, patch, client.FieldOwner(FieldOwner)); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	r.statuses.forget(orig.UID)
	r.usages.stop(orig.UID)
	r.nudged.forget(orig.UID)
	r.slices.forget(orig.UID)
	r.forgetTenant(orig.UID)
	logger.Info("tenant removed", "dataStore", tcp.Status.DataStore.Name, "prefix", tcp.Status.DataStore.Prefix)
	return ctrl.Result{}, nil
}

// stopHostsForDeletion takes the control plane off every host that runs
// it, before the tenant's credentials are revoked: left there, its static
// Pods would crash-loop until the Host is deleted. No drain: the tenant is
// going. A host that cannot be reached is reported and left; deleting or
// resetting its Host removes the manifests (kubeadm reset).
func (r *TenantControlPlaneReconciler) stopHostsForDeletion(ctx context.Context, tcp *apiary.TenantControlPlane) {
	files, manifests := render.StaticPodPaths(render.Inputs{TCP: tcp, Version: tcp.Spec.Version})
	files = render.WithEarlierSpecFiles(files)
	for i := range tcp.Status.ControlPlaneHosts {
		h := &tcp.Status.ControlPlaneHosts[i]
		if h.Step == apiary.HostStepStop && h.Result == resultSucceeded {
			continue
		}
		err := func() error {
			c, err := r.dialHost(ctx, tcp, h.Host)
			if err != nil {
				return err
			}
			defer c.Close()
			return hosts.RemoveControlPlane(ctx, c, manifests, files, []string{render.KubeletCAPath}, hostRemoveWait)
		}()
		if err != nil {
			r.Recorder.Eventf(tcp, nil, corev1.EventTypeWarning, "ControlPlaneLeftOnHost", "Delete",
				"Host %s: %v; its static Pods stay until the Host is deleted or reset", h.Host, err)
			continue
		}
		// Journaled as stopped, so that a finalize that has to run again
		// (the datastore not reachable yet) does not dial it again.
		h.Step, h.Result, h.Serving, h.ConfigHash = apiary.HostStepStop, resultSucceeded, false, ""
		r.Recorder.Eventf(tcp, nil, corev1.EventTypeNormal, "HostStepSucceeded", "Delete", "Host %s: control plane removed with the tenant", h.Host)
	}
}

// deleteNamespaced deletes what the tenant owns in its namespace.
func (r *TenantControlPlaneReconciler) deleteNamespaced(ctx context.Context, tcp *apiary.TenantControlPlane) error {
	objs := []client.Object{
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: render.ServiceName(tcp), Namespace: tcp.Namespace}},
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: render.KonnectivityConfigMapName(tcp), Namespace: tcp.Namespace}},
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: render.AdmissionConfigMapName(tcp), Namespace: tcp.Namespace}},
		&networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: render.NetworkPolicyName(tcp.Name), Namespace: tcp.Namespace}},
	}
	// Delete the Secrets explicitly rather than leave them to the garbage
	// collector: they hold credentials, and nothing should outlive the
	// tenant even where garbage collection lags or is disabled.
	for _, kind := range append(slices.Clone(render.AllSecretKinds), render.SecretCANext) {
		objs = append(objs, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: render.SecretName(tcp, kind), Namespace: tcp.Namespace}})
	}
	for _, obj := range objs {
		if err := r.deleteOwned(ctx, tcp, obj); err != nil {
			return err
		}
	}
	return nil
}

// deleteOwned deletes an object if it exists and belongs to this tenant.
func (r *TenantControlPlaneReconciler) deleteOwned(ctx context.Context, tcp *apiary.TenantControlPlane, obj client.Object) error {
	return deleteOwnedBy(ctx, r.APIReader, r.Client, tcp.UID, obj)
}

// deleteOwnedBy deletes an object if it exists and its controller is the
// given owner (never something of the same name that someone else made).
func deleteOwnedBy(ctx context.Context, reader client.Reader, c client.Client, owner types.UID, obj client.Object) error {
	if err := reader.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
		return client.IgnoreNotFound(err)
	}
	if ref := metav1.GetControllerOf(obj); ref == nil || ref.UID != owner {
		return nil
	}
	if err := c.Delete(ctx, obj, client.Preconditions{UID: new(obj.GetUID())}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting %T %s/%s: %w", obj, obj.GetNamespace(), obj.GetName(), err)
	}
	return nil
}
