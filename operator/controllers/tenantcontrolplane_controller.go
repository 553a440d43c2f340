// Package controllers holds the reconcilers of Apiary's resources.
package controllers

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
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
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/apiaryhq/apiary/datastore"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/operator/render"
	"github.com/apiaryhq/apiary/operator/tenantcluster"
	"github.com/apiaryhq/apiary/operator/webhooks"
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
	ReasonRenewed                 = "Renewed"
	ReasonRotationRequested       = "RotationRequested"
	ReasonRotated                 = "Rotated"
	ReasonIssueFailed             = "IssueFailed"
	ReasonWaitingForEndpoint      = "WaitingForEndpoint"
	ReasonAddressAssigned         = "AddressAssigned"
	ReasonWaitingForAddress       = "WaitingForAddress"
	ReasonReplicasReady           = "ReplicasReady"
	ReasonNoReadyReplicas         = "NoReadyReplicas"
	ReasonWaitingForPrerequisites = "WaitingForPrerequisites"
	ReasonAPIAnswering            = "APIAnswering"
	ReasonAPIUnreachable          = "APIUnreachable"
	ReasonDeleting                = "Deleting"
	ReasonApplied                 = "Applied"
	ReasonBootstrapFailed         = "BootstrapFailed"
	ReasonInvalidSpec             = "InvalidSpec"
	ReasonNamespaceNotAllowed     = "NamespaceNotAllowed"
)

// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get;list;watch

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
	// refusals: since when each Ready tenant's API has refused /readyz
	// (tenant UID → time.Time), see briefRefusal.
	refusals sync.Map
	// NetworkPolicy, when set, confines each tenant's control-plane pods
	// with a NetworkPolicy of these inputs.
	NetworkPolicy *render.PolicyInputs
	// Policy is what the platform admin allows tenants; the controller
	// checks it as the webhook does.
	Policy webhooks.TenantPolicy
	// UsageInterval is how often each tenant's datastore usage is measured
	// (DefaultUsageInterval when 0).
	UsageInterval time.Duration
	// Tenants reaches tenant clusters (shared with the Host controller);
	// SetupWithManager makes one when nil.
	Tenants *tenantcluster.Cache
	// agentCounter reads a control-plane host's konnectivity agents
	// (agentsOnHost when nil; tests set it).
	agentCounter agentCounter

	statuses     statusMemo[apiary.TenantControlPlaneStatus]
	bootstrapper tenantBootstrapper
	usages       usages
	// nudged is the quota policy each tenant's pods were last told of.
	nudged byUID[string]
	// slices are the host backends last applied to each tenant's
	// EndpointSlices.
	slices byUID[appliedSlices]
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
// +kubebuilder:rbac:groups=discovery.k8s.io,resources=endpointslices,verbs=get;list;create;patch;delete
// +kubebuilder:rbac:groups=apiary.dev,resources=hosts,verbs=get;list;watch

// SetupWithManager registers the controller and its watches.
func (r *TenantControlPlaneReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Now == nil {
		r.Now = time.Now
	}
	if err := IndexTenantsByDataStore(context.Background(), mgr); err != nil {
		return err
	}
	if r.Tenants == nil {
		r.Tenants = tenantcluster.New()
		if err := mgr.Add(r.Tenants); err != nil {
			return fmt.Errorf("adding the tenant cluster cache: %w", err)
		}
	}
	r.bootstrapper.tenants = r.Tenants
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
		// A control-plane Host joining or leaving moves a registered tenant.
		Watches(&apiary.Host{}, handler.EnqueueRequestsFromMapFunc(tenantOfHost), builder.WithPredicates(hostChangesTenant())).
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
	// The status as last written, even if the cache has not caught up:
	// the mode switch's journal must never step back.
	written := r.statuses.base(orig.UID, orig.ResourceVersion, orig.Status)
	tcp.Status = *written.DeepCopy()
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
	if st.Mode == "" {
		// Every tenant starts hosted; registered is switched to.
		st.Mode = apiary.ModeStandalone
	}
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
	cr.rotation = r.rotation(tcp)
	cr.renewTogether(tcp.Status.Certificates)
	ca, err := r.issueBase(ctx, tcp, cr, ds, dsCfg)
	if err != nil {
		return ctrl.Result{}, r.credentialsFailed(tcp, cr, err)
	}

	// 3. Service and endpoint.
	ep, ok, err := r.reconcileEndpoint(ctx, tcp)
	if err != nil || !ok {
		r.recordIssued(tcp, cr)
		return ctrl.Result{}, err
	}

	// 4. Credentials that name the endpoint.
	if err := r.issueEndpointBound(ctx, tcp, cr, ca, ep); err != nil {
		return ctrl.Result{}, r.credentialsFailed(tcp, cr, err)
	}
	r.credentialsIssued(tcp, cr)

	// 5. Deployment, and the non-secret files it mounts: the token issuers'
	// authentication configuration, the egress configuration, and the
	// admission configuration with the quota policy.
	authn, authnNext, err := r.reconcileAuthentication(ctx, tcp)
	if err != nil {
		return ctrl.Result{}, err
	}
	quota, depRolled, err := r.reconcileDeployment(ctx, tcp, cr, ds, dsCfg, ep, authn)
	if err != nil {
		return ctrl.Result{}, err
	}

	// 6. The mode: the control plane on the tenant's control-plane Hosts
	// (registered) or not, and the switch between them.
	modeNext, err := r.reconcileMode(ctx, tcp, modeInputs{cr: cr, ca: ca, ds: ds, ep: ep, exceeded: quota.exceeded, authn: authn})
	if err != nil {
		return ctrl.Result{}, err
	}

	// The version: what runs, what an upgrade waits for.
	versionNext, err := r.observeVersion(ctx, tcp)
	if err != nil {
		return ctrl.Result{}, err
	}
	if err := r.observeHostVersions(ctx, tcp); err != nil {
		return ctrl.Result{}, err
	}

	// 7. The tenant API, probed through its endpoint.
	api := r.probeTenantAPI(ctx, tcp, cr.trust, ep)

	// 8. What kubeadm join and the nodes need inside the tenant.
	caObs := r.observeCA(ctx, tcp, cr, modeInputs{cr: cr, ca: ca, ds: ds, ep: ep, exceeded: quota.exceeded, authn: authn}, depRolled, api)
	bootstrapErr := r.reconcileBootstrap(ctx, tcp, cr, ep, api, quota.exceeded != nil, rootCAInput(tcp))

	// A CA rotation moves on once everything caught up with its phase.
	caNext, err := r.advanceCA(ctx, tcp, cr, ca, caObs)
	if err != nil {
		return ctrl.Result{}, err
	}

	// 9. Ready: a summary of the above.
	result := r.summarizeReady(tcp, ep, api, bootstrapErr)
	for _, next := range []time.Duration{modeNext, versionNext, caNext, authnNext} {
		if next > 0 && (result.RequeueAfter == 0 || next < result.RequeueAfter) {
			result.RequeueAfter = next
		}
	}
	// Usage is measured again when due, whatever else happens.
	if result.RequeueAfter == 0 || quota.next < result.RequeueAfter {
		result.RequeueAfter = quota.next
	}
	// Certificates are renewed when due, whatever else happens.
	if next := cr.nextRenewal(); !next.IsZero() {
		renew := max(next.Sub(r.Now()), time.Second)
		if result.RequeueAfter == 0 || renew < result.RequeueAfter {
			result.RequeueAfter = renew
		}
	}
	return result, nil
}
