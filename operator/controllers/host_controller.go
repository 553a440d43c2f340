package controllers

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/apiaryhq/apiary/hosts"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/operator/metrics"
	"github.com/apiaryhq/apiary/operator/tenantcluster"
)

// Host step names and results in status.journal.
const (
	StepPreflight = "preflight"
	StepInstall   = "install"

	StepPending   = apiary.HostStepPending
	StepRunning   = apiary.HostStepRunning
	StepSucceeded = apiary.HostStepSucceeded
	StepFailed    = apiary.HostStepFailed
)

// Reasons of Host conditions besides those of package hosts.
const (
	ReasonConnected      = "Connected"
	ReasonSecretNotFound = hosts.ReasonSecretNotFound
	// ReasonControlPlaneOnHost: a Host being deleted waits for its tenant
	// to take the control plane off it.
	ReasonControlPlaneOnHost = "ControlPlaneOnHost"
	ReasonPreflightPassed    = "Passed"
	ReasonPreflightFailed    = "PreflightFailed"
	ReasonNotConnected       = "NotConnected"
	ReasonTenantNotFound     = "TenantNotFound"
	ReasonInstalled          = "Installed"
	ReasonInstallFailed      = "InstallFailed"
)

// DefaultNodeBundleRepository is where node bundles are pulled from, tagged
// by Kubernetes version.
const DefaultNodeBundleRepository = "ghcr.io/apiaryhq/node-bundle"

// Host retries back off from hostRetryBase, doubling to hostRetryMax: a
// host that is down or misconfigured is tried a few times a minute at
// first, then every few minutes, never in a hot loop.
const (
	hostRetryBase = 10 * time.Second
	hostRetryMax  = 5 * time.Minute
)

// HostReconciler is the SSH host agent: it connects to each Host with its
// pinned host key and runs the steps that turn it into a Node, journaling
// each in status so that it resumes after a restart.
type HostReconciler struct {
	Client client.Client
	// APIReader reads the users' SSH key Secrets, which the operator does
	// not cache.
	APIReader client.Reader
	Recorder  events.EventRecorder
	// NodeBundleRepository (DefaultNodeBundleRepository if empty) and
	// NodeBundleInsecure locate the node bundles.
	NodeBundleRepository string
	NodeBundleInsecure   bool
	// MaxConcurrentReconciles bounds the hosts worked on at once (4 if 0).
	MaxConcurrentReconciles int
	// Now is the clock.
	Now func() time.Time

	// Tenants reaches tenant clusters (shared with the TenantControlPlane
	// controller); SetupWithManager makes one when nil.
	Tenants *tenantcluster.Cache

	statuses statusMemo[apiary.HostStatus]
	// started remembers the steps this process started (Host UID and step
	// → start second): a Running step it did not start was left by an
	// earlier operator, which may have died of it.
	started sync.Map
	// upgradeSlots serialises the start of worker upgrades, so that a
	// tenant's maxParallel holds across concurrent reconciles.
	upgradeSlots sync.Mutex
	// steps runs the steps that reach the host over SSH off the workers
	// (stepRunnerOf makes it).
	steps     *stepRunner
	stepsOnce sync.Once
}

// +kubebuilder:rbac:groups=apiary.dev,resources=hosts,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=apiary.dev,resources=hosts/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=apiary.dev,resources=hosts/finalizers,verbs=update

// SetupWithManager registers the controller. Only spec changes trigger it,
// and its tenant's changes that join or leave a control-plane Host;
// retries are timed by the journal's backoff.
func (r *HostReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Now == nil {
		r.Now = time.Now
	}
	if r.Tenants == nil {
		r.Tenants = tenantcluster.New()
		if err := mgr.Add(r.Tenants); err != nil {
			return fmt.Errorf("adding the tenant cluster cache: %w", err)
		}
	}
	n := r.MaxConcurrentReconciles
	if n <= 0 {
		n = 4
	}
	steps := r.stepRunnerOf()
	return ctrl.NewControllerManagedBy(mgr).
		For(&apiary.Host{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&apiary.TenantControlPlane{}, handler.EnqueueRequestsFromMapFunc(r.controlPlaneHostsOf), builder.WithPredicates(tenantChangesJoins())).
		Watches(&apiary.TenantControlPlane{}, handler.EnqueueRequestsFromMapFunc(r.allHostsOf), builder.WithPredicates(tenantChangesHostVersion())).
		Watches(&apiary.Host{}, handler.EnqueueRequestsFromMapFunc(r.siblingsOf), builder.WithPredicates(predicate.Or(upgradeSlotFreed(), caStepFreed()))).
		Watches(&apiary.TenantControlPlane{}, handler.EnqueueRequestsFromMapFunc(r.allHostsOf), builder.WithPredicates(tenantChangesCA())).
		// A step that ran off the worker has ended.
		WatchesRawSource(source.Channel(steps.wake, &handler.EnqueueRequestForObject{})).
		WithOptions(controller.Options{MaxConcurrentReconciles: n}).
		Complete(r)
}

// Reconcile advances one Host by at most one step.
func (r *HostReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var orig apiary.Host
	if err := r.Client.Get(ctx, req.NamespacedName, &orig); err != nil {
		if apierrors.IsNotFound(err) {
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, err
	}
	h := orig.DeepCopy()
	// Work from the status this operator last wrote: the cache may lag.
	base := r.statuses.base(h.UID, orig.ResourceVersion, orig.Status)
	h.Status = *base.DeepCopy()
	if !orig.DeletionTimestamp.IsZero() {
		if !controllerutil.ContainsFinalizer(&orig, HostFinalizer) {
			r.statuses.forget(orig.UID)
			return ctrl.Result{}, nil
		}
		// A step still at the host ends first (cancelled): the reset
		// must not race an install or a join.
		if r.stepRunnerOf().stop(h, StepReset) {
			return ctrl.Result{RequeueAfter: time.Second}, nil
		}
		done, res := r.cleanup(ctx, h)
		if !done {
			return res, r.writeStatus(ctx, &orig, h)
		}
		patch := client.MergeFrom(orig.DeepCopy())
		controllerutil.RemoveFinalizer(&orig, HostFinalizer)
		r.statuses.forget(orig.UID)
		return ctrl.Result{}, client.IgnoreNotFound(r.Client.Patch(ctx, &orig, patch, client.FieldOwner(FieldOwner)))
	}
	// The finalizer comes before anything touches the host.
	if !controllerutil.ContainsFinalizer(&orig, HostFinalizer) {
		patch := client.MergeFrom(orig.DeepCopy())
		controllerutil.AddFinalizer(&orig, HostFinalizer)
		if err := r.Client.Patch(ctx, &orig, patch, client.FieldOwner(FieldOwner)); err != nil {
			return ctrl.Result{}, fmt.Errorf("adding finalizer: %w", err)
		}
		h.Finalizers, h.ResourceVersion = orig.Finalizers, orig.ResourceVersion
	}
	st := &h.Status
	st.HostKeyCheck = "pinned"
	if h.Spec.InsecureSkipHostKeyCheck {
		st.HostKeyCheck = "skipped (insecureSkipHostKeyCheck)"
	}

	// A changed spec (a fixed key, another port) re-runs the steps now.
	specChanged := st.ObservedGeneration != h.Generation
	st.ObservedGeneration = h.Generation
	if specChanged {
		// Failed steps are tried again at once, with a fresh backoff.
		for i := range st.Journal {
			if st.Journal[i].Result == StepFailed {
				st.Journal[i].Attempts, st.Journal[i].Result = 0, StepPending
			}
		}
		// Connection settings may have changed: check again, unless the
		// host is past preflight (our own kubelet would now fail it).
		if step := journalStep(st, StepPreflight); step != nil && journalStep(st, StepInstall) == nil {
			step.Result = StepPending
		}
	}

	// One step per reconcile, in order; a step that succeeded is not
	// repeated (the journal survives operator restarts).
	for _, s := range []struct {
		name  string
		phase apiary.HostPhase
		run   func(context.Context, *apiary.Host, *apiary.HostStep) ctrl.Result
	}{
		{StepPreflight, apiary.HostPhasePreflight, r.preflight},
		{StepInstall, apiary.HostPhaseInstalling, r.install},
		{StepJoin, apiary.HostPhaseJoining, r.join},
	} {
		if s.name == StepJoin {
			// A control-plane Host of a standalone tenant is not joined;
			// a leave under way finishes before a join starts.
			want, why := r.joinWanted(ctx, h)
			if leave := journalStep(st, StepLeave); !want || leave != nil && leave.Result != StepSucceeded {
				if want {
					why = "finishing the leave before joining again"
				}
				res := r.standBy(ctx, h, why)
				return res, r.writeStatus(ctx, &orig, h)
			}
		}
		step := journalStep(st, s.name)
		if step != nil && step.Result == StepSucceeded {
			continue
		}
		wait, start := r.stepDue(h.UID, step)
		if wait > 0 {
			if step.Result == StepRunning {
				st.Phase = s.phase
			}
			return ctrl.Result{RequeueAfter: wait}, r.writeStatus(ctx, &orig, h)
		}
		if start {
			// Journal the start before touching the host: a step found
			// Running after a restart is resumed (every step is
			// idempotent). A join starts afresh: the last leave is done.
			if s.name == StepJoin {
				st.Journal = slices.DeleteFunc(st.Journal, func(s apiary.HostStep) bool { return s.Name == StepLeave })
			}
			r.startStep(h, s.name)
			st.Phase = s.phase
			return ctrl.Result{Requeue: true}, r.writeStatus(ctx, &orig, h)
		}
		res, ended := r.runStep(ctx, h, step, s.run)
		if !ended {
			st.Phase = s.phase
			return res, r.writeStatus(ctx, &orig, h)
		}
		if err := r.writeStatus(ctx, &orig, h); err != nil {
			return ctrl.Result{}, err
		}
		if step = journalStep(st, s.name); step != nil && step.Result == StepSucceeded {
			// Next step right away.
			return ctrl.Result{Requeue: true}, nil
		}
		return res, nil
	}
	res, busy, err := r.upgradeWorker(ctx, &orig, h)
	if err != nil {
		return ctrl.Result{}, err
	}
	if !busy {
		// A CA rotation's steps wait for an upgrade to end.
		if res, busy, err = r.caWorker(ctx, &orig, h); err != nil {
			return ctrl.Result{}, err
		}
	}
	if !busy {
		observed := r.observeNode(ctx, h)
		if res.RequeueAfter == 0 || observed.RequeueAfter > 0 && observed.RequeueAfter < res.RequeueAfter {
			res = observed
		}
	}
	return res, r.writeStatus(ctx, &orig, h)
}

// stepRunnerOf is the reconciler's step runner, made on first use.
func (r *HostReconciler) stepRunnerOf() *stepRunner {
	r.stepsOnce.Do(func() { r.steps = newStepRunner() })
	return r.steps
}

// runStep runs a Running step that reaches the host off the worker (see
// stepRunner). Until it has ended, the step's message says whether it
// waits for its tenant's turn; once ended, h holds what it did.
func (r *HostReconciler) runStep(ctx context.Context, h *apiary.Host, step *apiary.HostStep, fn stepFunc) (ctrl.Result, bool) {
	res, ended, queued := r.stepRunnerOf().step(ctx, h, step.Name, fn)
	switch {
	case ended:
	case queued:
		step.Message = fmt.Sprintf("%s: the Hosts of tenant %s run at most %d steps at a time", StepWaitsForTurn, h.Spec.TenantControlPlane, maxStepsPerTenant)
	case strings.HasPrefix(step.Message, StepWaitsForTurn):
		step.Message = ""
	}
	return res, ended
}

// preflight connects and checks the host, recording the step.
func (r *HostReconciler) preflight(ctx context.Context, h *apiary.Host, step *apiary.HostStep) ctrl.Result {
	st := &h.Status

	fail := func(cond, reason, msg string) ctrl.Result {
		return r.failStep(ctx, h, step, cond, reason, msg)
	}
	c, reason, err := r.connect(ctx, h)
	if err != nil {
		r.setCondition(h, apiary.HostConditionPreflightPassed, metav1.ConditionFalse, ReasonNotConnected, "preflight needs an SSH connection")
		return fail(apiary.HostConditionReachable, reason, err.Error())
	}
	defer c.Close()

	runCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	report, err := hosts.Preflight(runCtx, c)
	if err != nil {
		return fail(apiary.HostConditionPreflightPassed, ReasonPreflightFailed, err.Error())
	}
	st.Facts = &report.Facts
	if len(report.Problems) > 0 {
		return fail(apiary.HostConditionPreflightPassed, ReasonPreflightFailed, strings.Join(report.Problems, "; "))
	}
	r.succeedStep(step, fmt.Sprintf("%s, %s, kernel %s, %s %s", report.Facts.OS, report.Facts.Arch, report.Facts.Kernel,
		report.Facts.ContainerRuntime, report.Facts.ContainerRuntimeVersion))
	r.setCondition(h, apiary.HostConditionPreflightPassed, metav1.ConditionTrue, ReasonPreflightPassed, "the host can run a kubelet: "+step.Message)
	// Installing and joining come next; until then the host waits here.
	st.Phase = apiary.HostPhasePreflight
	return ctrl.Result{}
}

// connect dials the host and sets Reachable.
func (r *HostReconciler) connect(ctx context.Context, h *apiary.Host) (*hosts.Client, string, error) {
	target, reason, err := r.target(ctx, h)
	if err == nil {
		var c *hosts.Client
		if c, err = hosts.Dial(ctx, target); err == nil {
			r.setCondition(h, apiary.HostConditionReachable, metav1.ConditionTrue, ReasonConnected,
				fmt.Sprintf("%s@%s:%d over SSH, host key %s", target.User, target.Address, target.Port, h.Status.HostKeyCheck))
			return c, "", nil
		}
		reason = hosts.ReasonOf(err)
	}
	r.setCondition(h, apiary.HostConditionReachable, metav1.ConditionFalse, reason, err.Error())
	return nil, reason, err
}

// failStep ends a step as failed: its condition says why, and the next
// attempt waits for the backoff. A tenant that is merely not Ready yet does
// not make the Host Failed.
func (r *HostReconciler) failStep(ctx context.Context, h *apiary.Host, step *apiary.HostStep, cond, reason, msg string) ctrl.Result {
	finished := metav1.NewTime(r.Now())
	step.Finished, step.Result, step.Message = &finished, StepFailed, msg
	metrics.HostStepEnded(step.Name, StepFailed, reason, finished.Sub(step.Started.Time))
	if reason != ReasonTenantNotReady {
		h.Status.Phase = apiary.HostPhaseFailed
	}
	r.setCondition(h, cond, metav1.ConditionFalse, reason, msg)
	log.FromContext(ctx).Info("host step failed", "step", step.Name, "reason", reason, "message", msg, "attempt", step.Attempts)
	return ctrl.Result{RequeueAfter: r.retryAfter(step)}
}

// succeedStep ends a step.
func (r *HostReconciler) succeedStep(step *apiary.HostStep, msg string) {
	finished := metav1.NewTime(r.Now())
	step.Finished, step.Result, step.Message = &finished, StepSucceeded, msg
	metrics.HostStepEnded(step.Name, StepSucceeded, "", finished.Sub(step.Started.Time))
}

// stepDue says what a journal step that has not succeeded needs now: a
// wait (the backoff after a failure; or, for a step left Running by an
// earlier operator or leader, which may have died of it, the backoff of
// one more attempt, so that a step that kills the operator does not run
// in a loop), a start (journal a new attempt), or neither: it runs.
func (r *HostReconciler) stepDue(uid types.UID, step *apiary.HostStep) (wait time.Duration, start bool) {
	switch {
	case step == nil:
		return 0, true
	case step.Result == StepFailed && step.Finished != nil:
		wait = r.retryAfter(step)
	case step.Result == StepRunning && !r.startedHere(uid, step):
		wait = r.resumeAfter(step)
	case step.Result == StepRunning:
		return 0, false
	}
	return wait, wait == 0
}

// startStep records that a step begins (again), and that this process
// started it.
func (r *HostReconciler) startStep(h *apiary.Host, name string) *apiary.HostStep {
	st := &h.Status
	step := journalStep(st, name)
	if step == nil {
		st.Journal = append(st.Journal, apiary.HostStep{Name: name})
		step = &st.Journal[len(st.Journal)-1]
	}
	step.Started, step.Finished, step.Result, step.Message = metav1.NewTime(r.Now()), nil, StepRunning, ""
	step.Attempts++
	r.started.Store(startKey(h.UID, name), step.Started.Unix())
	return step
}

func startKey(uid types.UID, step string) string { return string(uid) + "/" + step }

// startedHere says whether this process started the Running step (status
// keeps its start to the second).
func (r *HostReconciler) startedHere(uid types.UID, step *apiary.HostStep) bool {
	v, ok := r.started.Load(startKey(uid, step.Name))
	return ok && v.(int64) == step.Started.Unix()
}

// resumeAfter is how long a step left Running waits before it is tried
// again: the backoff of its attempts, from its start.
func (r *HostReconciler) resumeAfter(step *apiary.HostStep) time.Duration {
	s := *step
	s.Finished = &s.Started
	return r.retryAfter(&s)
}

// install copies the node bundle of the tenant's version to the host and
// installs it.
func (r *HostReconciler) install(ctx context.Context, h *apiary.Host, step *apiary.HostStep) ctrl.Result {
	fail := func(reason, msg string) ctrl.Result {
		return r.failStep(ctx, h, step, apiary.HostConditionInstalled, reason, msg)
	}
	var tcp apiary.TenantControlPlane
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: h.Namespace, Name: h.Spec.TenantControlPlane}, &tcp); err != nil {
		if apierrors.IsNotFound(err) {
			return fail(ReasonTenantNotFound, fmt.Sprintf("spec.tenantControlPlane: TenantControlPlane %s/%s not found", h.Namespace, h.Spec.TenantControlPlane))
		}
		return fail(ReasonInstallFailed, err.Error())
	}
	tcp.Default()
	installCtx, cancel := context.WithTimeout(ctx, installTimeout)
	defer cancel()
	// The version the tenant runs, not spec.version: a host installed while
	// an upgrade rolls must not run a kubelet newer than a kube-apiserver.
	version := tcp.RunningVersion()
	bundle, err := hosts.ResolveBundle(installCtx, r.nodeBundleRepository()+":"+version, r.NodeBundleInsecure)
	if err != nil {
		return fail(ReasonInstallFailed, err.Error())
	}
	c, _, err := r.connect(ctx, h)
	if err != nil {
		return fail(ReasonInstallFailed, err.Error())
	}
	defer c.Close()
	if err := hosts.Install(installCtx, c, bundle); err != nil {
		return fail(ReasonInstallFailed, err.Error())
	}
	r.succeedStep(step, fmt.Sprintf("kubelet, kubeadm, kubectl %s and CNI plugins from %s", version, bundle.Ref))
	h.Status.Version = version
	r.setCondition(h, apiary.HostConditionInstalled, metav1.ConditionTrue, ReasonInstalled, step.Message)
	return ctrl.Result{}
}

func (r *HostReconciler) nodeBundleRepository() string {
	if r.NodeBundleRepository == "" {
		return DefaultNodeBundleRepository
	}
	return r.NodeBundleRepository
}

// target resolves how to reach the host: its SSH key from the Secret.
func (r *HostReconciler) target(ctx context.Context, h *apiary.Host) (hosts.Target, string, error) {
	return hosts.TargetOf(ctx, r.APIReader, h)
}

// retryAfter is how long after a failed step's end the next attempt
// starts: 10 s, 20 s, 40 s ... up to 5 minutes.
func (r *HostReconciler) retryAfter(step *apiary.HostStep) time.Duration {
	wait := hostRetryBase
	for i := int32(1); i < step.Attempts && wait < hostRetryMax; i++ {
		wait *= 2
	}
	wait = min(wait, hostRetryMax)
	if step.Finished == nil {
		return wait
	}
	return max(step.Finished.Add(wait).Sub(r.Now()), 0)
}

func journalStep(st *apiary.HostStatus, name string) *apiary.HostStep {
	for i := range st.Journal {
		if st.Journal[i].Name == name {
			return &st.Journal[i]
		}
	}
	return nil
}

func (r *HostReconciler) setCondition(h *apiary.Host, typ string, status metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(&h.Status.Conditions, metav1.Condition{
		Type: typ, Status: status, Reason: reason, Message: msg, ObservedGeneration: h.Generation,
	})
}

// writeStatus patches the status when it changed and emits one event per
// condition transition.
func (r *HostReconciler) writeStatus(ctx context.Context, orig, h *apiary.Host) error {
	base := r.statuses.base(orig.UID, orig.ResourceVersion, orig.Status)
	if equality.Semantic.DeepEqual(base, h.Status) {
		return nil
	}
	recordTransitions(r.Recorder, h, base.Conditions, h.Status.Conditions, func(c metav1.Condition) bool {
		// Standing by or leaving is what a standalone tenant's
		// control-plane Host should do, not a warning.
		return c.Status != metav1.ConditionTrue && c.Reason != ReasonStandby && c.Reason != ReasonLeaving
	})
	// Patch from what the API server holds (the memo), not the cache.
	before := orig.DeepCopy()
	before.Status = base
	updated := before.DeepCopy()
	updated.Status = h.Status
	if err := r.Client.Status().Patch(ctx, updated, client.MergeFrom(before), client.FieldOwner(FieldOwner)); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("writing status: %w", err)
	}
	r.statuses.remember(h.UID, updated.ResourceVersion, *h.Status.DeepCopy())
	return nil
}
