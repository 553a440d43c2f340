// Package controllers holds the reconcilers of Apiary's resources.
package controllers

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	appsv1ac "k8s.io/client-go/applyconfigurations/apps/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/apiaryhq/apiary/datastore"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/operator/render"
	"github.com/apiaryhq/apiary/operator/webhooks"
	"github.com/apiaryhq/apiary/pki"
)

const (
	// FieldOwner is the one field manager of everything the operator applies.
	FieldOwner = "apiary-operator"
	// TenantFinalizer removes a tenant's datastore slice before the tenant
	// goes away.
	TenantFinalizer = "apiary.dev/tenant-cleanup"
	// AnnotationDefaultDataStore marks the DataStore placement prefers.
	AnnotationDefaultDataStore = "apiary.dev/default-datastore"
	// AnnotationOrphanDataStoreData on a tenant being deleted lets the
	// deletion finish without removing its etcd user, role and keys: the
	// escape hatch when its DataStore is gone for good. The slice stays
	// behind (an event names it) for an etcd admin to remove.
	AnnotationOrphanDataStoreData = "apiary.dev/orphan-datastore-data"

	// apiUnreachableFastPoll is how long the tenant API is probed every
	// second before backing off.
	apiUnreachableFastPoll = 30 * time.Second

	// dataStoreIndex indexes tenants by the DataStore they are bound to.
	dataStoreIndex = "status.dataStore.name"
)

// Condition reasons of a TenantControlPlane.
const (
	ReasonBound                   = "Bound"
	ReasonDataStoreNotFound       = "DataStoreNotFound"
	ReasonDataStoreNotReady       = "DataStoreNotReady"
	ReasonNoDataStoreAvailable    = "NoDataStoreAvailable"
	ReasonIssued                  = "Issued"
	ReasonIssueFailed             = "IssueFailed"
	ReasonWaitingForEndpoint      = "WaitingForEndpoint"
	ReasonAddressAssigned         = "AddressAssigned"
	ReasonWaitingForAddress       = "WaitingForAddress"
	ReasonReplicasReady           = "ReplicasReady"
	ReasonNoReadyReplicas         = "NoReadyReplicas"
	ReasonWaitingForPrerequisites = "WaitingForPrerequisites"
	ReasonAPIAnswering            = "APIAnswering"
	ReasonAPIUnreachable          = "APIUnreachable"
	ReasonRegisteredNotSupported  = "RegisteredModeNotSupported"
	ReasonDeleting                = "Deleting"
	ReasonApplied                 = "Applied"
	ReasonBootstrapFailed         = "BootstrapFailed"
	ReasonInvalidSpec             = "InvalidSpec"
	ReasonNamespaceNotAllowed     = "NamespaceNotAllowed"
)

// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get;list;watch

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

// TenantControlPlaneReconciler reconciles TenantControlPlanes: datastore
// binding, credentials, Service, Deployment, status.
type TenantControlPlaneReconciler struct {
	Client client.Client
	// APIReader reads objects the operator does not cache (DataStore
	// Secrets, Nodes).
	APIReader  client.Reader
	Recorder   events.EventRecorder
	DataStores *datastore.Pool
	// ImageRepository replaces registry.k8s.io in control-plane images.
	ImageRepository string
	// ClusterDomain is the management cluster's DNS domain.
	ClusterDomain string
	// MaxConcurrentReconciles bounds parallel reconciles.
	MaxConcurrentReconciles int
	// BootstrapResync bounds how long an unchanged tenant bootstrap is not
	// re-applied (DefaultBootstrapResync when 0).
	BootstrapResync time.Duration
	// Now is the clock (tests move it to check renewal).
	Now func() time.Time
	// NetworkPolicy, when set, confines each tenant's control-plane pods
	// with a NetworkPolicy of these inputs.
	NetworkPolicy *render.PolicyInputs
	// Policy is what the platform admin allows tenants; the controller
	// checks it as the webhook does.
	Policy webhooks.TenantPolicy
	// UsageInterval is how often each tenant's datastore usage is measured
	// (DefaultUsageInterval when 0).
	UsageInterval time.Duration

	statuses     statusMemo[apiary.TenantControlPlaneStatus]
	bootstrapper tenantBootstrapper
	usages       usages
	// nudged is the quota policy each tenant's pods were last told of.
	nudged byUID[string]
}

// +kubebuilder:rbac:groups=apiary.dev,resources=tenantcontrolplanes,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=apiary.dev,resources=tenantcontrolplanes/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=apiary.dev,resources=tenantcontrolplanes/finalizers,verbs=update
// +kubebuilder:rbac:groups=apiary.dev,resources=datastores,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch;create;update;delete
// +kubebuilder:rbac:groups="",resources=services,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",resources=configmaps,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list
// +kubebuilder:rbac:groups=apps,resources=deployments,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=networking.k8s.io,resources=networkpolicies,verbs=get;list;watch;create;update;patch;delete

// SetupWithManager registers the controller and its watches.
func (r *TenantControlPlaneReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Now == nil {
		r.Now = time.Now
	}
	if err := IndexTenantsByDataStore(context.Background(), mgr); err != nil {
		return err
	}
	// Deletions of what the bootstrap applied inside tenants.
	r.bootstrapper.deleted = make(chan event.GenericEvent, 64)
	// Tenants whose datastore usage crossed their quota (either way).
	crossed := make(chan event.GenericEvent, 64)
	if r.usages == nil {
		r.usages = &usageTracker{connect: r.DataStores.Get, events: crossed}
	}
	return ctrl.NewControllerManagedBy(mgr).
		For(&apiary.TenantControlPlane{}, builder.WithPredicates(predicate.Or(predicate.GenerationChangedPredicate{}, predicate.AnnotationChangedPredicate{}, deletionPredicate()))).
		WatchesRawSource(source.Channel(r.bootstrapper.deleted, &handler.EnqueueRequestForObject{})).
		WatchesRawSource(source.Channel(crossed, &handler.EnqueueRequestForObject{})).
		Owns(&corev1.Secret{}).
		Owns(&corev1.Service{}).
		Owns(&appsv1.Deployment{}).
		Owns(&networkingv1.NetworkPolicy{}).
		// The admission ConfigMap carries the quota policy: an edit is
		// undone at once.
		Owns(&corev1.ConfigMap{}).
		// The management cluster's own ranges, which tenant policies exclude.
		Watches(&corev1.Node{}, handler.EnqueueRequestsFromMapFunc(r.allTenants), builder.WithPredicates(nodeRangesChanged())).
		Watches(&networkingv1.ServiceCIDR{}, handler.EnqueueRequestsFromMapFunc(r.allTenants), builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		// A DataStore turning Ready (or not) changes its tenants' conditions.
		Watches(&apiary.DataStore{}, handler.EnqueueRequestsFromMapFunc(r.tenantsOfDataStore), builder.WithPredicates(dataStoreChangesTenants())).
		WithOptions(controller.Options{MaxConcurrentReconciles: max(r.MaxConcurrentReconciles, 1)}).
		Complete(r)
}

// deletionPredicate passes updates that start a deletion (the generation does
// not change when deletionTimestamp is set on an object with finalizers... it
// does for CRDs, but be explicit).
func deletionPredicate() predicate.Predicate {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		return e.ObjectNew.GetDeletionTimestamp() != nil
	}}
}

// dataStoreChangesTenants passes the DataStore changes that matter to its
// tenants: readiness, spec, protection (finalizer) and deletion. Its tenant
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

// olderTenants are the tenants of tcp's namespace created before it: a
// name collision is the newer tenant's to resolve.
func (r *TenantControlPlaneReconciler) olderTenants(ctx context.Context, tcp *apiary.TenantControlPlane) ([]apiary.TenantControlPlane, error) {
	var list apiary.TenantControlPlaneList
	if err := r.Client.List(ctx, &list, client.InNamespace(tcp.Namespace)); err != nil {
		return nil, fmt.Errorf("listing the tenants of namespace %s: %w", tcp.Namespace, err)
	}
	var older []apiary.TenantControlPlane
	for _, o := range list.Items {
		t, mine := o.CreationTimestamp, tcp.CreationTimestamp
		if t.Before(&mine) || (t.Equal(&mine) && o.Name < tcp.Name) {
			older = append(older, o)
		}
	}
	return older, nil
}

// Reconcile drives one tenant towards its spec and records what it observed.
func (r *TenantControlPlaneReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var orig apiary.TenantControlPlane
	if err := r.Client.Get(ctx, req.NamespacedName, &orig); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	tcp := orig.DeepCopy()
	// Render from a defaulted copy: an object written while the webhook was
	// down renders the same as one that went through it. The spec is never
	// written back.
	tcp.Default()

	if !tcp.DeletionTimestamp.IsZero() {
		return r.finalize(ctx, &orig, tcp)
	}
	if !controllerutil.ContainsFinalizer(&orig, TenantFinalizer) {
		patch := client.MergeFrom(orig.DeepCopy())
		controllerutil.AddFinalizer(&orig, TenantFinalizer)
		if err := r.Client.Patch(ctx, &orig, patch, client.FieldOwner(FieldOwner)); err != nil {
			return ctrl.Result{}, fmt.Errorf("adding finalizer: %w", err)
		}
		tcp.Finalizers = orig.Finalizers
		tcp.ResourceVersion = orig.ResourceVersion
	}

	// The webhook may be off, deleted or bypassed: check again before
	// anything of the spec reaches a pod. What runs keeps running.
	errs := append(webhooks.Validate(tcp), r.Policy.Validate(tcp)...)
	older, err := r.olderTenants(ctx, tcp)
	if err != nil {
		return ctrl.Result{}, err
	}
	errs = append(errs, webhooks.NameCollisions(tcp, older)...)
	if len(errs) > 0 {
		tcp.Status.ObservedGeneration = tcp.Generation
		r.setCondition(tcp, apiary.ConditionReady, metav1.ConditionFalse, ReasonInvalidSpec,
			"the spec is refused and nothing of it was applied (the admission webhook did not check it): "+errs.ToAggregate().Error())
		return ctrl.Result{}, r.writeStatus(ctx, &orig, tcp)
	}

	result, reconcileErr := r.reconcile(ctx, tcp)
	if errors.Is(reconcileErr, errCacheBehind) {
		result, reconcileErr = ctrl.Result{RequeueAfter: 200 * time.Millisecond}, nil
	}
	if err := r.writeStatus(ctx, &orig, tcp); err != nil {
		return ctrl.Result{}, errors.Join(reconcileErr, err)
	}
	return result, reconcileErr
}

// reconcile runs the steps in order; each step sets its condition. A step
// that cannot proceed marks what depends on it as waiting.
func (r *TenantControlPlaneReconciler) reconcile(ctx context.Context, tcp *apiary.TenantControlPlane) (ctrl.Result, error) {
	st := &tcp.Status
	st.ObservedGeneration = tcp.Generation
	st.Mode = apiary.ModeStandalone
	st.KubeconfigSecret = ""

	// 1. Datastore binding.
	// A nil DataStore without error means waiting for it (its watch
	// triggers the next reconcile).
	ds, dsCfg, err := r.bindDataStore(ctx, tcp)
	if ds == nil || err != nil {
		r.waiting(tcp, "the datastore is not ready", apiary.ConditionCertificatesReady, apiary.ConditionControlPlaneAvailable, apiary.ConditionReady)
		return ctrl.Result{}, err
	}

	// The network boundary before anything of the tenant runs.
	if err := r.applyNetworkPolicy(ctx, tcp, ds); err != nil {
		return ctrl.Result{}, err
	}

	// 2. Credentials that do not depend on the endpoint.
	cr, err := newCredentials(ctx, r.Client, r.APIReader, tenantSecrets{tcp}, r.Now())
	if err != nil {
		return ctrl.Result{}, err
	}
	ca, err := r.issueBase(ctx, tcp, cr, ds, dsCfg)
	if err != nil {
		return ctrl.Result{}, r.credentialsFailed(tcp, cr, err)
	}

	// 3. Service and endpoint.
	svc := render.Service(tcp)
	if err := r.Client.Apply(ctx, svc, client.FieldOwner(FieldOwner), client.ForceOwnership); err != nil {
		return ctrl.Result{}, fmt.Errorf("applying Service: %w", err)
	}
	ep, why, err := r.observeEndpoint(ctx, tcp, svc)
	if err != nil {
		return ctrl.Result{}, err
	}
	if why != "" {
		st.Endpoint = ""
		r.setCondition(tcp, apiary.ConditionEndpointReady, metav1.ConditionFalse, ReasonWaitingForAddress, why)
		r.waiting(tcp, "the tenant endpoint has no address yet", apiary.ConditionCertificatesReady, apiary.ConditionControlPlaneAvailable, apiary.ConditionReady)
		r.recordIssued(tcp, cr)
		return ctrl.Result{}, nil
	}
	st.Endpoint = ep.URL()
	r.setCondition(tcp, apiary.ConditionEndpointReady, metav1.ConditionTrue, ReasonAddressAssigned, "the tenant API is exposed at "+st.Endpoint)

	// 4. Credentials that name the endpoint.
	if err := r.issueEndpointBound(ctx, tcp, cr, ca, ep); err != nil {
		return ctrl.Result{}, r.credentialsFailed(tcp, cr, err)
	}
	st.Certificates = cr.sortedCerts()
	st.KubeconfigSecret = tcp.AdminKubeconfigSecretName()
	r.setCondition(tcp, apiary.ConditionCertificatesReady, metav1.ConditionTrue, ReasonIssued, fmt.Sprintf("%d Secrets hold valid credentials", len(render.AllSecretKinds)))
	r.recordIssued(tcp, cr)

	// 5. Deployment, and the non-secret files it mounts: the egress
	// configuration, and the admission configuration with the quota policy.
	if err := r.konnectivityConfigMap(ctx, tcp); err != nil {
		return ctrl.Result{}, err
	}
	quota := r.reconcileQuota(ctx, tcp, ds, dsCfg)
	if err := r.applyAdmission(ctx, tcp, quota.exceeded); err != nil {
		return ctrl.Result{}, err
	}
	mounted := map[string]map[string][]byte{}
	for _, kind := range render.MountedSecrets {
		mounted[string(kind)] = cr.data[kind]
	}
	advertise := ep.Host
	if net.ParseIP(advertise) == nil {
		advertise = ep.ClusterIP
	}
	dep := render.Deployment(render.Inputs{
		TCP:              tcp,
		AdvertiseAddress: advertise,
		EtcdServers:      dsCfg.Endpoints,
		EtcdPrefix:       st.DataStore.Prefix,
		ConfigHash:       render.ConfigHash(mounted),
		ImageRepository:  r.ImageRepository,
	})
	if err := r.Client.Apply(ctx, dep, client.FieldOwner(FieldOwner), client.ForceOwnership); err != nil {
		return ctrl.Result{}, fmt.Errorf("applying Deployment: %w", err)
	}
	r.observeDeployment(tcp, dep)

	// 6. Ready: everything above, and the API answering through its endpoint.
	result := r.observeReady(ctx, tcp, cr, ca, ep, quota.exceeded != nil)
	// Usage is measured again when due, whatever else happens.
	if result.RequeueAfter == 0 || quota.next < result.RequeueAfter {
		result.RequeueAfter = quota.next
	}
	return result, nil
}

// konnectivityConfigMap applies the egress selector configuration the API
// server mounts, or removes it when konnectivity is off.
func (r *TenantControlPlaneReconciler) konnectivityConfigMap(ctx context.Context, tcp *apiary.TenantControlPlane) error {
	if render.KonnectivityEnabled(tcp) {
		if err := r.Client.Apply(ctx, render.KonnectivityConfigMap(tcp), client.FieldOwner(FieldOwner), client.ForceOwnership); err != nil {
			return fmt.Errorf("applying ConfigMap %s: %w", render.KonnectivityConfigMapName(tcp), err)
		}
		return nil
	}
	return r.deleteOwned(ctx, tcp, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: tcp.Namespace, Name: render.KonnectivityConfigMapName(tcp)}})
}

// issueBase issues the CAs, the service-account key, the client
// certificates that do not name the endpoint, and the datastore client.
func (r *TenantControlPlaneReconciler) issueBase(ctx context.Context, tcp *apiary.TenantControlPlane, cr *credentials, ds *apiary.DataStore, dsCfg datastore.Config) (*pki.KeyPair, error) {
	ca, err := cr.ca(ctx, render.SecretCA, render.CACommonName(tcp))
	if err != nil {
		return nil, err
	}
	frontProxyCA, err := cr.ca(ctx, render.SecretFrontProxyCA, render.FrontProxyCACommonName(tcp))
	if err != nil {
		return nil, err
	}
	if err := cr.serviceAccountKey(ctx); err != nil {
		return nil, err
	}
	dsCA, err := pki.ParseKeyPair(dsCfg.CACert, dsCfg.CAKey)
	if err != nil {
		return nil, fmt.Errorf("DataStore %s CA: %w", ds.Name, err)
	}
	tenant := datastore.Tenant{User: tcp.Status.DataStore.User, Prefix: tcp.Status.DataStore.Prefix}
	if err := cr.leaf(ctx, render.SecretDataStoreClient, dsCA, datastore.ClientCertRequest(tenant), map[string][]byte{render.KeyCACert: dsCfg.CACert}); err != nil {
		return nil, err
	}
	if err := cr.leaf(ctx, render.SecretAPIServerKubeletClient, ca, render.ClientCertRequest(render.KubeletClientCN, render.MastersGroup), nil); err != nil {
		return nil, err
	}
	if err := cr.leaf(ctx, render.SecretFrontProxyClient, frontProxyCA, render.ClientCertRequest(render.FrontProxyClientCN), nil); err != nil {
		return nil, err
	}
	loopback := render.LoopbackURL(tcp)
	if err := cr.kubeconfigs(ctx, render.SecretControllerManagerConfig, ca, render.ClientCertRequest(render.ControllerManagerCN), "controller-manager",
		kubeconfig{key: apiary.KubeconfigKey, server: loopback}); err != nil {
		return nil, err
	}
	if err := cr.kubeconfigs(ctx, render.SecretSchedulerConfig, ca, render.ClientCertRequest(render.SchedulerCN), "scheduler",
		kubeconfig{key: apiary.KubeconfigKey, server: loopback}); err != nil {
		return nil, err
	}
	if err := cr.kubeconfigs(ctx, render.SecretKonnectivityKubeconfig, ca, render.ClientCertRequest(render.KonnectivityCN), "konnectivity-server-client",
		kubeconfig{key: apiary.KubeconfigKey, server: loopback}); err != nil {
		return nil, err
	}
	return ca, nil
}

// issueEndpointBound issues the serving certificate and the admin
// kubeconfigs, which name the endpoint.
func (r *TenantControlPlaneReconciler) issueEndpointBound(ctx context.Context, tcp *apiary.TenantControlPlane, cr *credentials, ca *pki.KeyPair, ep render.Endpoint) error {
	if err := cr.leaf(ctx, render.SecretAPIServer, ca, render.APIServerCertRequest(tcp, ep, r.ClusterDomain), nil); err != nil {
		return err
	}
	if err := cr.leaf(ctx, render.SecretKonnectivityServer, ca, render.KonnectivityServerCertRequest(tcp, ep, r.ClusterDomain), nil); err != nil {
		return err
	}
	if err := cr.kubeconfigs(ctx, render.SecretOperatorKubeconfig, ca, render.ClientCertRequest(render.OperatorCN, render.MastersGroup), "apiary-operator",
		kubeconfig{key: apiary.KubeconfigKey, server: ep.URL()}); err != nil {
		return err
	}
	return cr.kubeconfigs(ctx, render.SecretAdminKubeconfig, ca, render.ClientCertRequest(render.AdminCN, render.ClusterAdminsGroup), "admin",
		kubeconfig{key: apiary.KubeconfigKey, server: ep.URL()},
		kubeconfig{key: apiary.InternalKubeconfigKey, server: render.InternalURL(tcp)})
}

func (r *TenantControlPlaneReconciler) credentialsFailed(tcp *apiary.TenantControlPlane, cr *credentials, err error) error {
	if errors.Is(err, errCacheBehind) {
		return err
	}
	r.setCondition(tcp, apiary.ConditionCertificatesReady, metav1.ConditionFalse, ReasonIssueFailed, err.Error())
	r.recordIssued(tcp, cr)
	r.Recorder.Eventf(tcp, nil, corev1.EventTypeWarning, ReasonIssueFailed, "IssueCredentials", "%s", err.Error())
	return err
}

// recordIssued emits one event per reconcile that wrote credentials (one
// event, not one per Secret: events.k8s.io would merge same-reason events
// of an object into a series and keep only the first message).
func (r *TenantControlPlaneReconciler) recordIssued(tcp *apiary.TenantControlPlane, cr *credentials) {
	if cr == nil || len(cr.issued) == 0 {
		return
	}
	r.Recorder.Eventf(tcp, nil, corev1.EventTypeNormal, ReasonIssued, "IssueCredentials", "issued %s", strings.Join(cr.issued, ", "))
	cr.issued = nil
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

// observeEndpoint reads the address the Service actually got. It returns why
// there is none yet.
func (r *TenantControlPlaneReconciler) observeEndpoint(ctx context.Context, tcp *apiary.TenantControlPlane, svc *corev1ac.ServiceApplyConfiguration) (render.Endpoint, string, error) {
	n := tcp.Spec.Network
	ep := render.Endpoint{Port: n.Port}
	if svc.Spec != nil && svc.Spec.ClusterIP != nil && *svc.Spec.ClusterIP != corev1.ClusterIPNone {
		ep.ClusterIP = *svc.Spec.ClusterIP
	}
	switch n.ServiceType {
	case corev1.ServiceTypeLoadBalancer:
		if svc.Status != nil && svc.Status.LoadBalancer != nil {
			for _, in := range svc.Status.LoadBalancer.Ingress {
				if in.IP != nil && *in.IP != "" {
					ep.Host = *in.IP
					return ep, "", nil
				}
				if in.Hostname != nil && *in.Hostname != "" {
					ep.Host = *in.Hostname
					return ep, "", nil
				}
			}
		}
		return ep, fmt.Sprintf("Service %s/%s of type LoadBalancer has no address yet", tcp.Namespace, render.ServiceName(tcp)), nil
	case corev1.ServiceTypeNodePort:
		// The Service also carries the konnectivity port: take the NodePort
		// of the API's own port, not the last one allocated.
		allocated := false
		for _, p := range svc.Spec.Ports {
			if p.Port != nil && *p.Port == n.Port && p.NodePort != nil && *p.NodePort != 0 {
				ep.Port, allocated = *p.NodePort, true
			}
		}
		if !allocated {
			return ep, "the NodePort has not been allocated yet", nil
		}
		ep.Host = n.Address
		if ep.Host == "" {
			addr, err := r.nodeAddress(ctx)
			if err != nil {
				return ep, "", err
			}
			if addr == "" {
				return ep, "no Node has an InternalIP to reach the NodePort at; set spec.network.address", nil
			}
			ep.Host = addr
		}
		return ep, "", nil
	default:
		if ep.ClusterIP == "" {
			return ep, "the Service has no ClusterIP yet", nil
		}
		ep.Host = ep.ClusterIP
		return ep, "", nil
	}
}

func (r *TenantControlPlaneReconciler) nodeAddress(ctx context.Context) (string, error) {
	var nodes corev1.NodeList
	if err := r.APIReader.List(ctx, &nodes, &client.ListOptions{LabelSelector: labels.Everything(), Limit: 20}); err != nil {
		return "", fmt.Errorf("listing Nodes for the NodePort address: %w", err)
	}
	for _, node := range nodes.Items {
		for _, a := range node.Status.Addresses {
			if a.Type == corev1.NodeInternalIP {
				return a.Address, nil
			}
		}
	}
	return "", nil
}

func (r *TenantControlPlaneReconciler) observeDeployment(tcp *apiary.TenantControlPlane, dep *appsv1ac.DeploymentApplyConfiguration) {
	st := &tcp.Status
	st.Selector = labels.SelectorFromSet(render.SelectorLabels(tcp)).String()
	var replicas, ready, updated int32
	var observed, generation int64
	if dep.Status != nil {
		replicas, ready, updated = deref(dep.Status.Replicas), deref(dep.Status.ReadyReplicas), deref(dep.Status.UpdatedReplicas)
		observed = deref(dep.Status.ObservedGeneration)
	}
	if dep.Generation != nil {
		generation = *dep.Generation
	}
	st.Replicas, st.ReadyReplicas = replicas, ready
	if ready > 0 {
		r.setCondition(tcp, apiary.ConditionControlPlaneAvailable, metav1.ConditionTrue, ReasonReplicasReady,
			fmt.Sprintf("%d of %d control-plane replicas ready", ready, *tcp.Spec.Replicas))
	} else {
		r.setCondition(tcp, apiary.ConditionControlPlaneAvailable, metav1.ConditionFalse, ReasonNoReadyReplicas,
			fmt.Sprintf("0 of %d control-plane replicas ready", *tcp.Spec.Replicas))
	}
	// The version runs once the rollout of the current template is complete.
	if observed >= generation && updated == *tcp.Spec.Replicas && ready == *tcp.Spec.Replicas {
		st.Version = tcp.Spec.Version
	}
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// observeReady sets Ready: every condition True and the tenant API answering
// /readyz through its public endpoint, verified against the tenant CA.
func (r *TenantControlPlaneReconciler) observeReady(ctx context.Context, tcp *apiary.TenantControlPlane, cr *credentials, ca *pki.KeyPair, ep render.Endpoint, overQuota bool) ctrl.Result {
	for _, c := range []string{apiary.ConditionDataStoreReady, apiary.ConditionCertificatesReady, apiary.ConditionEndpointReady, apiary.ConditionControlPlaneAvailable} {
		if !meta.IsStatusConditionTrue(tcp.Status.Conditions, c) {
			r.setCondition(tcp, apiary.ConditionReady, metav1.ConditionFalse, ReasonWaitingForPrerequisites, c+" is not True")
			return ctrl.Result{}
		}
	}
	if err := probeAPI(ctx, ca, ep); err != nil {
		r.setCondition(tcp, apiary.ConditionReady, metav1.ConditionFalse, ReasonAPIUnreachable, err.Error())
		// Poll fast while a new control plane comes up (Ready within
		// seconds matters), then back off: an endpoint that stays
		// unreachable emits no event and must not become a hot loop.
		if c := meta.FindStatusCondition(tcp.Status.Conditions, apiary.ConditionReady); c != nil && r.Now().Sub(c.LastTransitionTime.Time) > apiUnreachableFastPoll {
			return ctrl.Result{RequeueAfter: 15 * time.Second}
		}
		return ctrl.Result{RequeueAfter: time.Second}
	}
	// The API answers: apply what kubeadm join and the nodes need inside
	// the tenant. Over quota the tenant refuses the applies too: a tenant
	// bootstrapped before keeps what it has until it is back under.
	if overQuota && meta.IsStatusConditionTrue(tcp.Status.Conditions, apiary.ConditionTenantBootstrapped) {
		log.FromContext(ctx).V(1).Info("tenant over its datastore quota: bootstrap not re-applied")
	} else if err := r.bootstrapTenant(ctx, tcp, cr, ep.URL()); err != nil {
		log.FromContext(ctx).Info("tenant bootstrap failed", "error", err.Error())
		r.setCondition(tcp, apiary.ConditionReady, metav1.ConditionFalse, ReasonWaitingForPrerequisites, apiary.ConditionTenantBootstrapped+" is not True")
		// A fresh API server may lack kube-public for a moment: retry
		// fast at first, then back off.
		if c := meta.FindStatusCondition(tcp.Status.Conditions, apiary.ConditionTenantBootstrapped); c != nil && r.Now().Sub(c.LastTransitionTime.Time) > apiUnreachableFastPoll {
			return ctrl.Result{RequeueAfter: 15 * time.Second}
		}
		return ctrl.Result{RequeueAfter: time.Second}
	}
	if tcp.Spec.Mode == apiary.ModeRegistered {
		r.setCondition(tcp, apiary.ConditionReady, metav1.ConditionFalse, ReasonRegisteredNotSupported,
			"spec.mode registered is not supported yet; the control plane runs standalone and answers at "+ep.URL())
		return ctrl.Result{}
	}
	r.setCondition(tcp, apiary.ConditionReady, metav1.ConditionTrue, ReasonAPIAnswering, "the tenant API answers at "+ep.URL())
	// Re-check now and then: a broken endpoint emits no event.
	return ctrl.Result{RequeueAfter: 5 * time.Minute}
}

func probeAPI(ctx context.Context, ca *pki.KeyPair, ep render.Endpoint) error {
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	hc := &http.Client{
		Timeout:   2 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}},
	}
	defer hc.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, ep.URL()+"/readyz", nil)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("GET %s/readyz: %w", ep.URL(), err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s/readyz: %s", ep.URL(), resp.Status)
	}
	return nil
}

// waiting marks conditions that cannot be evaluated until an earlier step
// succeeds.
func (r *TenantControlPlaneReconciler) waiting(tcp *apiary.TenantControlPlane, why string, conditions ...string) {
	for _, c := range conditions {
		r.setCondition(tcp, c, metav1.ConditionFalse, ReasonWaitingForPrerequisites, why)
	}
}

func (r *TenantControlPlaneReconciler) setCondition(tcp *apiary.TenantControlPlane, typ string, status metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(&tcp.Status.Conditions, metav1.Condition{
		Type: typ, Status: status, Reason: reason, Message: msg, ObservedGeneration: tcp.Generation,
	})
}

// writeStatus derives the phase, emits events for condition transitions and
// patches the status only when it changed.
func (r *TenantControlPlaneReconciler) writeStatus(ctx context.Context, orig, tcp *apiary.TenantControlPlane) error {
	st := &tcp.Status
	switch {
	case !tcp.DeletionTimestamp.IsZero():
		st.Phase = apiary.PhaseDeleting
	case meta.IsStatusConditionTrue(st.Conditions, apiary.ConditionReady):
		st.Phase = apiary.PhaseReady
	case st.Version == "":
		st.Phase = apiary.PhaseProvisioning
	default:
		st.Phase = apiary.PhaseNotReady
	}
	base := r.statuses.base(orig.UID, orig.ResourceVersion, orig.Status)
	if equality.Semantic.DeepEqual(base, *st) {
		return nil
	}
	recordTransitions(r.Recorder, tcp, base.Conditions, st.Conditions, func(c metav1.Condition) bool {
		return c.Status != metav1.ConditionTrue && c.Reason != ReasonWaitingForPrerequisites && c.Reason != ReasonWaitingForAddress && c.Reason != ReasonNoReadyReplicas
	})
	before := orig.DeepCopy()
	before.Status = base
	updated := before.DeepCopy()
	updated.Status = *st
	if err := r.Client.Status().Patch(ctx, updated, client.MergeFrom(before), client.FieldOwner(FieldOwner)); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("writing status: %w", err)
	}
	r.statuses.remember(orig.UID, updated.ResourceVersion, *st.DeepCopy())
	return nil
}

// finalize removes the tenant's pods, its datastore slice (user first, so
// that nothing writes while its keys are deleted), then its objects, then
// the finalizer.
func (r *TenantControlPlaneReconciler) finalize(ctx context.Context, orig, tcp *apiary.TenantControlPlane) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(orig, TenantFinalizer) {
		return ctrl.Result{}, nil
	}
	logger := log.FromContext(ctx)
	// In a namespace being deleted, the namespace controller deletes every
	// object of the tenant there (its Secrets too), and may already have
	// deleted the Role that lets the operator do it: only the etcd slice,
	// outside the namespace, is the finalizer's to remove.
	inNamespace := !namespaceGoing(ctx, r.APIReader, tcp.Namespace)
	if inNamespace {
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
	r.forgetTenant(orig.UID)
	logger.Info("tenant removed", "dataStore", tcp.Status.DataStore.Name, "prefix", tcp.Status.DataStore.Prefix)
	return ctrl.Result{}, nil
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
	for _, kind := range render.AllSecretKinds {
		objs = append(objs, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: render.SecretName(tcp, kind), Namespace: tcp.Namespace}})
	}
	for _, obj := range objs {
		if err := r.deleteOwned(ctx, tcp, obj); err != nil {
			return err
		}
	}
	return nil
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
