package controllers

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	appsv1ac "k8s.io/client-go/applyconfigurations/apps/v1"
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

	"github.com/apiaryhq/apiary/datastore"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/operator/render"
	"github.com/apiaryhq/apiary/operator/render/managedetcd"
	"github.com/apiaryhq/apiary/pki"
)

const (
	// DataStoreFinalizer keeps a DataStore while tenants store data on it.
	DataStoreFinalizer = "apiary.dev/datastore-in-use"
	// ConditionDeletionBlocked is True while a deleted DataStore still has
	// tenants.
	ConditionDeletionBlocked = "DeletionBlocked"

	ReasonAvailable    = "Available"
	ReasonInUse        = "InUse"
	ReasonProvisioning = "Provisioning"
	// ReasonAllMembersReady and ReasonMembersUnavailable are MembersReady's.
	ReasonAllMembersReady    = "AllMembersReady"
	ReasonMembersUnavailable = "MembersUnavailable"

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
	// Namespaces, when set, are the only namespaces the operator works in.
	Namespaces []string
	// ClusterDomain is the management cluster's DNS domain (managed etcd
	// member names).
	ClusterDomain string
	// ImageRepository replaces registry.k8s.io in the etcd image.
	ImageRepository string
	// Now is the clock.
	Now func() time.Time
	// NetworkPolicy, when set, confines each managed etcd's members.
	NetworkPolicy *render.PolicyInputs

	statuses statusMemo[apiary.DataStoreStatus]
	peers    byUID[peerProbeMark]
}

// +kubebuilder:rbac:groups=apiary.dev,resources=datastores,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=apiary.dev,resources=datastores/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=apiary.dev,resources=datastores/finalizers,verbs=update
// +kubebuilder:rbac:groups=apps,resources=statefulsets,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=policy,resources=poddisruptionbudgets,verbs=get;list;watch;create;update;patch;delete

// SetupWithManager registers the controller; tenants binding or leaving
// re-count their DataStore.
func (r *DataStoreReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if err := IndexTenantsByDataStore(context.Background(), mgr); err != nil {
		return err
	}
	return ctrl.NewControllerManagedBy(mgr).
		For(&apiary.DataStore{}).
		Owns(&appsv1.StatefulSet{}).
		// The host Service's address (spec.hostAccess).
		Owns(&corev1.Service{}).
		// Control-plane Hosts are admitted to the client port by address.
		Watches(&apiary.Host{}, handler.EnqueueRequestsFromMapFunc(r.dataStoreOfHost), builder.WithPredicates(hostChangesAdmission())).
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

// ReasonNamespaceNotManaged: what a DataStore needs lies in a namespace
// the operator does not work in (--tenant-namespaces).
const ReasonNamespaceNotManaged = "NamespaceNotManaged"

// outsideNamespaces says why a DataStore needs a namespace the operator
// may not work in, or "".
func (r *DataStoreReconciler) outsideNamespaces(ds *apiary.DataStore) string {
	if len(r.Namespaces) == 0 {
		return ""
	}
	var need []string
	if m := ds.Spec.Managed; m != nil {
		need = append(need, m.Namespace)
	}
	if t := ds.Spec.TLS; t != nil {
		need = append(need, t.CASecretRef.Namespace, t.ClientSecretRef.Namespace)
	}
	for _, ns := range need {
		if !slices.Contains(r.Namespaces, ns) {
			return fmt.Sprintf("the operator works in namespaces %v only (--tenant-namespaces and its own), and this DataStore needs namespace %s (its managed members or its Secrets)", r.Namespaces, ns)
		}
	}
	return ""
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
	// The last status written, not the cache's (which may lag behind it):
	// a reconcile that fails part-way must not write back older members.
	base := r.statuses.base(orig.UID, orig.ResourceVersion, orig.Status)
	base.DeepCopyInto(&ds.Status)

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

	if why := r.outsideNamespaces(ds); why != "" {
		r.set(ds, apiary.ConditionReady, metav1.ConditionFalse, ReasonNamespaceNotManaged, why)
		return ctrl.Result{}, r.writeStatus(ctx, &orig, ds)
	}
	ds.Status.Endpoints, _ = connection(ds, r.ClusterDomain)
	if ds.Spec.Managed == nil {
		r.externalHostAccess(ds)
	}
	interval := r.CheckInterval
	if interval == 0 {
		interval = DefaultDataStoreCheckInterval
	}
	rolling := false
	if ds.Spec.Managed != nil {
		var waiting string
		waiting, rolling, err = r.reconcileManaged(ctx, ds)
		if err != nil || waiting != "" {
			reason, msg := ReasonProvisioning, waiting
			if err != nil {
				reason, msg = datastore.ReasonOf(err), err.Error()
			}
			if errors.Is(err, errCacheBehind) {
				err = nil
			}
			r.set(ds, apiary.ConditionReady, metav1.ConditionFalse, reason, msg)
			// The StatefulSet's status changes trigger the next reconcile.
			return ctrl.Result{RequeueAfter: interval}, errors.Join(err, r.writeStatus(ctx, &orig, ds))
		}
	}

	checkErr := r.check(ctx, ds)
	if checkErr != nil {
		r.set(ds, apiary.ConditionReady, metav1.ConditionFalse, datastore.ReasonOf(checkErr), checkErr.Error())
		r.set(ds, apiary.ConditionSpaceAvailable, metav1.ConditionUnknown, datastore.ReasonOf(checkErr), "not checked while the DataStore is not Ready")
	} else {
		r.set(ds, apiary.ConditionReady, metav1.ConditionTrue, ReasonAvailable,
			fmt.Sprintf("etcd answers at %s with authentication enabled", strings.Join(ds.Status.Endpoints, ",")))
		// A defragmentation blocks a member: not while another restarts.
		if !rolling {
			r.reclaimSpace(ctx, ds)
		}
		r.checkPeerPorts(ctx, ds)
	}
	if err := r.writeStatus(ctx, &orig, ds); err != nil {
		return ctrl.Result{}, err
	}
	if rolling {
		interval = min(interval, rollRequeue)
	}
	return ctrl.Result{RequeueAfter: interval}, nil
}

func (r *DataStoreReconciler) client(ctx context.Context, ds *apiary.DataStore) (*datastore.Client, error) {
	cfg, err := dataStoreConfig(ctx, r.APIReader, ds, r.ClusterDomain)
	if err != nil {
		return nil, err
	}
	return r.DataStores.Get(ctx, ds.Name, cfg)
}

func (r *DataStoreReconciler) check(ctx context.Context, ds *apiary.DataStore) error {
	callCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	dc, err := r.client(callCtx, ds)
	if err != nil {
		return err
	}
	return dc.Check(callCtx)
}

// reconcileManaged runs the etcd of a managed DataStore: its TLS material,
// headless Service, PodDisruptionBudget and StatefulSet, then enables
// authentication once the members answer. It returns why the DataStore is
// not usable yet, or "".
func (r *DataStoreReconciler) reconcileManaged(ctx context.Context, ds *apiary.DataStore) (waiting string, rolling bool, err error) {
	cr, err := newCredentials(ctx, r.Client, r.APIReader, etcdSecrets{ds}, r.now())
	if err != nil {
		return "", false, err
	}
	ca, err := cr.ca(ctx, managedetcd.SecretCA, managedetcd.CACommonName(ds))
	if err != nil {
		return "", false, err
	}
	// Registered-mode hosts dial the client port at the host Service's
	// address: the serving certificate names it (a new address reissues
	// it, and the members restart one at a time, etcd_roll.go).
	hosts, err := r.reconcileHostAccess(ctx, ds)
	if err != nil {
		return "", false, err
	}
	for _, leaf := range []struct {
		kind render.SecretKind
		req  pki.Request
	}{
		{managedetcd.SecretServer, managedetcd.ServingCertRequest(ds, r.ClusterDomain, false, hosts.ips...)},
		{managedetcd.SecretRoot, managedetcd.RootCertRequest()},
	} {
		if err := cr.leaf(ctx, leaf.kind, ca, leaf.req, nil); err != nil {
			return "", false, err
		}
	}
	peerCAOnly, err := r.peerCredentials(ctx, ds, cr, ca)
	if err != nil {
		return "", false, err
	}
	for _, ev := range cr.issuedEvents() {
		r.Recorder.Eventf(ds, nil, corev1.EventTypeNormal, ev[0], "IssueCredentials", "%s", ev[1])
	}
	apply := func(obj runtime.ApplyConfiguration, what string) error {
		if err := r.Client.Apply(ctx, obj, client.FieldOwner(FieldOwner), client.ForceOwnership); err != nil {
			return fmt.Errorf("applying %s: %w", what, err)
		}
		return nil
	}
	if err := apply(managedetcd.Service(ds), "etcd Service"); err != nil {
		return "", false, err
	}
	if err := apply(managedetcd.PodDisruptionBudget(ds), "etcd PodDisruptionBudget"); err != nil {
		return "", false, err
	}
	if r.NetworkPolicy != nil {
		if err := apply(render.EtcdNetworkPolicy(ds, *r.NetworkPolicy, hosts.sources), "etcd NetworkPolicy"); err != nil {
			return "", false, err
		}
	}
	// Until etcd was first listed the members are the bootstrap ones: as
	// many as the StatefulSet already runs (a spec changed before the
	// cluster formed waits for it to form).
	listed := ds.Status.Members
	bootstrap := ds.Spec.Managed.Replicas
	if len(listed) == 0 {
		listed = nil
		var existing appsv1.StatefulSet
		err := r.Client.Get(ctx, client.ObjectKey{Namespace: ds.Spec.Managed.Namespace, Name: managedetcd.Name(ds)}, &existing)
		if err == nil && existing.Spec.Replicas != nil {
			bootstrap = *existing.Spec.Replicas
		} else if client.IgnoreNotFound(err) != nil {
			return "", false, fmt.Errorf("reading the etcd StatefulSet: %w", err)
		}
	}
	var sts *appsv1ac.StatefulSetApplyConfiguration
	applyMembers := func(members []apiary.EtcdMember) error {
		if err := apply(managedetcd.MembersConfigMap(ds, r.ClusterDomain, members, bootstrap), "etcd members ConfigMap"); err != nil {
			return err
		}
		sts = managedetcd.StatefulSet(managedetcd.Inputs{
			DataStore: ds, ClusterDomain: r.ClusterDomain, ConfigHash: etcdConfigHash(cr.data), ImageRepository: r.ImageRepository,
			PeerCAOnly: peerCAOnly, Pods: managedetcd.Pods(ds, members, bootstrap),
		})
		return apply(sts, "etcd StatefulSet")
	}
	if err := applyMembers(listed); err != nil {
		return "", false, err
	}
	var ready int32
	if sts.Status != nil && sts.Status.ReadyReplicas != nil {
		ready = *sts.Status.ReadyReplicas
	}
	ds.Status.ReadyMembers = ready
	want := ds.Spec.Managed.Replicas
	// A new cluster serves once a quorum of its bootstrap members is up;
	// enabling auth needs one. Once etcd was listed, etcd's own answers
	// decide (a just-promoted member's pod may not be Ready yet).
	if listed == nil && ready < bootstrap/2+1 {
		r.set(ds, apiary.ConditionMembersReady, metav1.ConditionFalse, ReasonMembersUnavailable, fmt.Sprintf("%d of %d etcd members ready (StatefulSet %s/%s)", ready, bootstrap, ds.Spec.Managed.Namespace, managedetcd.Name(ds)))
		return fmt.Sprintf("%d of %d etcd members ready in namespace %s (StatefulSet %s)", ready, bootstrap, ds.Spec.Managed.Namespace, managedetcd.Name(ds)), false, nil
	}
	callCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	dc, err := r.client(callCtx, ds)
	if err != nil {
		return "", false, err
	}
	enabled, err := dc.EnableAuth(callCtx)
	if err != nil {
		return "", false, err
	}
	if enabled {
		r.Recorder.Eventf(ds, nil, corev1.EventTypeNormal, "AuthEnabled", "EnableAuth", "created etcd root user and enabled authentication")
	}
	// Read once for the membership and the roll.
	var rev string
	if sts.Status != nil {
		rev = deref(sts.Status.UpdateRevision)
	}
	pods, err := r.memberPods(callCtx, ds, rev)
	if err != nil {
		return "", false, err
	}
	states := r.memberStates(callCtx, ds, dc)
	done, err := r.reconcileMembership(callCtx, ds, dc, pods, states)
	if err != nil {
		log.FromContext(ctx).Error(err, "changing the etcd membership")
	}
	// The ConfigMap and the pod count follow etcd's list, so that a new
	// learner's pod starts (into "existing") and a removed one goes.
	if !equality.Semantic.DeepEqual(listed, ds.Status.Members) && len(ds.Status.Members) > 0 {
		if err := applyMembers(ds.Status.Members); err != nil {
			return "", true, err
		}
	}
	ds.Status.Endpoints, _ = connection(ds, r.ClusterDomain)
	if !done {
		return "", true, nil
	}
	if ready == want {
		r.set(ds, apiary.ConditionMembersReady, metav1.ConditionTrue, ReasonAllMembersReady, fmt.Sprintf("%d of %d etcd members ready", ready, want))
	} else {
		r.set(ds, apiary.ConditionMembersReady, metav1.ConditionFalse, ReasonMembersUnavailable, fmt.Sprintf("%d of %d etcd members ready (StatefulSet %s/%s)", ready, want, ds.Spec.Managed.Namespace, managedetcd.Name(ds)))
	}
	return "", r.rollMembers(callCtx, ds, sts, dc, pods, states), nil
}

// deleteManaged removes a managed etcd (its claims go with the StatefulSet)
// and its Secrets, rather than leaving credentials to the garbage collector.
func (r *DataStoreReconciler) deleteManaged(ctx context.Context, ds *apiary.DataStore) error {
	ns, name := ds.Spec.Managed.Namespace, managedetcd.Name(ds)
	objs := []client.Object{
		&appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}},
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}},
		&policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}},
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: managedetcd.MembersConfigMapName(ds)}},
		&networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: render.NetworkPolicyName(name)}},
	}
	for _, kind := range managedetcd.SecretKinds {
		objs = append(objs, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: managedetcd.SecretName(ds, kind)}})
	}
	for _, obj := range objs {
		if err := deleteOwnedBy(ctx, r.APIReader, r.Client, ds.UID, obj); err != nil {
			return err
		}
	}
	return nil
}

func (r *DataStoreReconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
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
	if ds.Spec.Managed != nil {
		if err := r.deleteManaged(ctx, ds); err != nil {
			return ctrl.Result{}, err
		}
	}
	r.statuses.forget(ds.UID)
	r.peers.forget(ds.UID)
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
	// DeletionBlocked is bad news when True; the others when not True,
	// but for a roll or a scale of the members, which are routine.
	recordTransitions(r.Recorder, ds, base.Conditions, ds.Status.Conditions, func(c metav1.Condition) bool {
		if c.Reason == ReasonRolling || c.Reason == ReasonScaling {
			return false
		}
		return (c.Type == ConditionDeletionBlocked) == (c.Status == metav1.ConditionTrue)
	})
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
