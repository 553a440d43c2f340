package controllers

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/operator/render"
	"github.com/apiaryhq/apiary/pki"
)

// A tenant's mode moves by one path, host by host, and every step is
// journaled in status before a host is touched:
//
//	to registered: StartingHosts (the Host agent joins each control-plane
//	Host, in Standby while the tenant was standalone; each then gets the static
//	Pods; once its kube-apiserver answers /readyz it joins the tenant
//	Service through the operator's EndpointSlice) → ScalingDown (the
//	Deployment goes to 0: each pod leaves the Service as it terminates and
//	serves for --shutdown-delay-duration meanwhile, as in any scale-down)
//	→ status.mode registered.
//
//	to standalone: ScalingUp (the Deployment comes back, every replica
//	ready) → HandingBack (the endpoint slice controller lists every ready
//	pod behind the Service) → StoppingHosts (each host leaves
//	the slice, drains, and its static Pods and files are removed) →
//	status.mode standalone. The Host agent then takes each host off the
//	tenant (Node drained and deleted, kubeadm reset, software kept): a
//	standalone tenant has no control-plane Nodes.
//
// At every moment at least one ready API server is behind the tenant's
// address, so a client sees no failed request. The Service keeps its
// selector throughout: kube-proxy merges the endpoint slice controller's
// slice (the hosted pods, none in registered mode) with the operator's
// (the hosts). Removing the selector instead would leave the pods behind
// it: neither the endpoint slice controller nor the Endpoints controller
// cleans up after a Service that loses its selector, and the mirroring
// controller keeps the old Endpoints' pods as ready backends (found on a
// real cluster: 167 refused requests once the pods were gone). A changed spec.mode
// mid-switch starts the other direction from where things are; a restarted
// operator continues from the journal, and every step is idempotent.

const (
	// endpointSliceController is the endpoint slice controller's
	// managed-by value: its slices list the pods the Service selects.
	endpointSliceController = "endpointslice-controller.k8s.io"
	// drainFor is how long a backend keeps running after it left the
	// Service: kube-proxy on every node stops sending it new connections,
	// and requests in flight finish.
	drainFor = 10 * time.Second
	// hostStartTimeout bounds how long a host's kube-apiserver may take to
	// answer /readyz before its step fails.
	hostStartTimeout = 3 * time.Minute
	// hostRetryAfter is how long a failed host step waits before it is
	// tried again.
	hostRetryAfter = 30 * time.Second
	// hostProbeEvery is how often serving hosts are probed; one that
	// fails leaves the slice until it answers again.
	hostProbeEvery = 10 * time.Second
	// hostRemoveWait bounds how long control-plane processes may take to
	// exit once their manifests are gone (seconds).
	hostRemoveWait = 60
)

// slicesRefresh bounds how long unchanged EndpointSlices go without being
// applied again.
const slicesRefresh = 5 * time.Minute

// appliedSlices is what applySlices last sent for a tenant, and when.
type appliedSlices struct {
	backends string
	at       time.Time
}

// Reasons of ModeSwitched.
const (
	ReasonModeInEffect                = "InEffect"
	ReasonWaitingForControlPlaneHosts = "WaitingForControlPlaneHosts"
	ReasonHostAccessNotReady          = "DataStoreNotReachableFromHosts"
	ReasonHostStepFailed              = "HostStepFailed"
	ReasonWaitingForAPI               = "WaitingForTenantAPI"
)

// Results of a host step (as the Host journal's).
const (
	resultRunning   = StepRunning
	resultSucceeded = StepSucceeded
	resultFailed    = StepFailed
)

// modeInputs is what the mode step takes from the steps before it.
type modeInputs struct {
	cr       *credentials
	ca       *pki.KeyPair
	ds       *apiary.DataStore
	ep       render.Endpoint
	exceeded *render.QuotaExceeded
	// authn is the AuthenticationConfiguration file (render.Inputs).
	authn string
}

// hostsOnly: the hosted pods are not wanted (the Deployment at 0
// replicas): registered mode in effect, or a switch to it past the hand
// over.
func hostsOnly(st *apiary.TenantControlPlaneStatus) bool {
	if st.Switching() {
		p := st.ModeSwitch.Phase
		return p == apiary.SwitchScalingDown
	}
	return st.Mode == apiary.ModeRegistered
}

// firstPhase is where a switch to target starts.
func firstPhase(target apiary.Mode) string {
	if target == apiary.ModeRegistered {
		return apiary.SwitchStartingHosts
	}
	return apiary.SwitchScalingUp
}

// reconcileMode moves the tenant towards spec.mode and keeps registered
// hosts serving. It returns when to look again (0: no need).
func (r *TenantControlPlaneReconciler) reconcileMode(ctx context.Context, tcp *apiary.TenantControlPlane, in modeInputs) (time.Duration, error) {
	st := &tcp.Status
	now := metav1.NewTime(r.Now())
	target := tcp.Spec.Mode
	switch {
	case !st.Switching() && target != st.Mode:
		if target == apiary.ModeRegistered && !meta.IsStatusConditionTrue(st.Conditions, apiary.ConditionReady) {
			r.setCondition(tcp, apiary.ConditionModeSwitched, metav1.ConditionFalse, ReasonWaitingForAPI,
				"the switch to registered starts once the hosted control plane is Ready")
			// Ready is decided after this step: look again soon.
			return 2 * time.Second, nil
		}
		st.ModeSwitch = &apiary.ModeSwitchStatus{Target: target, From: st.Mode, Started: now, Phase: firstPhase(target), PhaseStarted: now}
		r.Recorder.Eventf(tcp, nil, corev1.EventTypeNormal, "ModeSwitchStarted", "SwitchMode", "switching from %s to %s", st.Mode, target)
	case st.Switching() && st.ModeSwitch.Target != target:
		sw := st.ModeSwitch
		r.Recorder.Eventf(tcp, nil, corev1.EventTypeNormal, "ModeSwitchReversed", "SwitchMode", "spec.mode changed to %s during the %s phase of the switch to %s: going back", target, sw.Phase, sw.Target)
		sw.Target, sw.Reversed = target, sw.Reversed+1
		sw.Phase, sw.PhaseStarted, sw.Finished = firstPhase(target), now, nil
	}

	if !st.Switching() {
		if st.Mode != apiary.ModeRegistered {
			r.setCondition(tcp, apiary.ConditionModeSwitched, metav1.ConditionTrue, ReasonModeInEffect, "the control plane runs hosted (standalone)")
			return 0, nil
		}
		// Registered and steady: day-2 on the hosts (one joining or
		// leaving, renewed credentials), never below one serving host.
		next, why, err := r.driveHosts(ctx, tcp, in, true)
		if err != nil {
			return 0, err
		}
		r.hostsAvailable(tcp)
		if next == 0 && why == "" && failedHost(st) == nil && servingHosts(st) > 0 {
			// Every host runs what the target version renders.
			st.Version = targetVersion(tcp)
		}
		if f := failedHost(st); f != nil {
			why = fmt.Sprintf("Host %s, step %s, attempt %d failed: %s (tried again every %s)", f.Host, f.Step, f.Attempts, f.Message, hostRetryAfter)
		}
		if why != "" {
			r.setCondition(tcp, apiary.ConditionModeSwitched, metav1.ConditionTrue, ReasonModeInEffect, "registered: "+why)
		} else {
			r.setCondition(tcp, apiary.ConditionModeSwitched, metav1.ConditionTrue, ReasonModeInEffect,
				fmt.Sprintf("registered: %d control-plane hosts serving", servingHosts(st)))
		}
		if next == 0 || next > hostProbeEvery {
			next = hostProbeEvery
		}
		return next, nil
	}
	next, err := r.switchStep(ctx, tcp, in)
	r.hostsAvailable(tcp)
	return next, err
}

// switchStep runs the current phase of a switch and moves to the next one
// when it is done.
func (r *TenantControlPlaneReconciler) switchStep(ctx context.Context, tcp *apiary.TenantControlPlane, in modeInputs) (time.Duration, error) {
	st := &tcp.Status
	sw := st.ModeSwitch
	now := r.Now()
	progress := func(msg string) {
		r.setCondition(tcp, apiary.ConditionModeSwitched, metav1.ConditionFalse, sw.Phase,
			fmt.Sprintf("switching from %s to %s: %s", sw.From, sw.Target, msg))
	}
	enter := func(phase string) time.Duration {
		sw.Phase, sw.PhaseStarted = phase, metav1.NewTime(now)
		progress("entering " + phase)
		// Written first; the next reconcile acts on it.
		return time.Millisecond
	}
	// A failed host stops the switch where it is, until its step is tried
	// again (that attempt is journaled before it runs).
	if hostPhase := sw.Phase == apiary.SwitchStartingHosts || sw.Phase == apiary.SwitchStoppingHosts; hostPhase && failedHost(st) != nil {
		next, why, err := r.driveHosts(ctx, tcp, in, false)
		if err != nil {
			return 0, err
		}
		if f := failedHost(st); f != nil {
			return r.hostFailed(tcp, f), nil
		}
		progress(why)
		return next, nil
	}
	switch sw.Phase {
	case apiary.SwitchStartingHosts:
		if why := hostAccessMissing(in.ds); why != "" {
			r.setCondition(tcp, apiary.ConditionModeSwitched, metav1.ConditionFalse, ReasonHostAccessNotReady,
				"the switch to registered waits: "+why+"; the control plane keeps running hosted")
			return 15 * time.Second, r.applySlices(ctx, tcp)
		}
		next, why, err := r.driveHosts(ctx, tcp, in, false)
		if err != nil || next > 0 {
			if why != "" {
				progress(why)
			}
			return next, err
		}
		joining, err := r.joiningHosts(ctx, tcp)
		if err != nil {
			return 0, err
		}
		if len(joining) > 0 {
			// The Host agent joins them now that the tenant targets
			// registered; their phase changes wake this reconcile.
			r.setCondition(tcp, apiary.ConditionModeSwitched, metav1.ConditionFalse, ReasonWaitingForControlPlaneHosts,
				fmt.Sprintf("the switch to registered waits for control-plane Hosts to join: %s; %d serving; the control plane keeps running hosted",
					strings.Join(joining, ", "), servingHosts(st)))
			return 5 * time.Second, nil
		}
		if servingHosts(st) == 0 {
			r.setCondition(tcp, apiary.ConditionModeSwitched, metav1.ConditionFalse, ReasonWaitingForControlPlaneHosts,
				"the switch to registered waits for a Host with role control-plane to join (phase Ready); the control plane keeps running hosted")
			return 0, nil
		}
		return enter(apiary.SwitchScalingDown), nil
	case apiary.SwitchScalingDown:
		if st.Replicas > 0 {
			progress(fmt.Sprintf("%d hosted pods still running", st.Replicas))
			return time.Second, nil
		}
		return r.commitMode(tcp), nil
	case apiary.SwitchScalingUp:
		if st.ReadyReplicas < *tcp.Spec.Replicas {
			progress(fmt.Sprintf("%d of %d hosted replicas ready", st.ReadyReplicas, *tcp.Spec.Replicas))
			// The Deployment's status changes wake this reconcile; the
			// first look comes before it was scaled.
			return time.Second, nil
		}
		return enter(apiary.SwitchHandingBack), nil
	case apiary.SwitchHandingBack:
		ready, err := r.podsInService(ctx, tcp)
		if err != nil {
			return 0, err
		}
		if ready < st.ReadyReplicas {
			progress(fmt.Sprintf("%d of %d hosted pods in the Service", ready, st.ReadyReplicas))
			return 500 * time.Millisecond, nil
		}
		return enter(apiary.SwitchStoppingHosts), nil
	case apiary.SwitchStoppingHosts:
		next, why, err := r.driveHosts(ctx, tcp, in, false)
		if err != nil || next > 0 {
			if why != "" {
				progress(why)
			}
			return next, err
		}
		return r.commitMode(tcp), r.applySlices(ctx, tcp)
	}
	return 0, fmt.Errorf("status.modeSwitch.phase %q is unknown", sw.Phase)
}

// commitMode records the target mode in effect.
func (r *TenantControlPlaneReconciler) commitMode(tcp *apiary.TenantControlPlane) time.Duration {
	st := &tcp.Status
	sw := st.ModeSwitch
	now := metav1.NewTime(r.Now())
	st.Mode = sw.Target
	sw.Phase, sw.PhaseStarted, sw.Finished = apiary.SwitchCompleted, now, &now
	took := now.Sub(sw.Started.Time).Round(100 * time.Millisecond)
	r.setCondition(tcp, apiary.ConditionModeSwitched, metav1.ConditionTrue, ReasonModeInEffect,
		fmt.Sprintf("switched from %s to %s in %s", sw.From, sw.Target, took))
	r.Recorder.Eventf(tcp, nil, corev1.EventTypeNormal, "ModeSwitched", "SwitchMode", "switched from %s to %s in %s", sw.From, sw.Target, took)
	return time.Millisecond
}

// hostFailed stops the switch where it is (the tenant keeps serving as it
// does) and says which host and step failed; the step is tried again after
// hostRetryAfter.
func (r *TenantControlPlaneReconciler) hostFailed(tcp *apiary.TenantControlPlane, h *apiary.ControlPlaneHostStatus) time.Duration {
	sw := tcp.Status.ModeSwitch
	r.setCondition(tcp, apiary.ConditionModeSwitched, metav1.ConditionFalse, ReasonHostStepFailed,
		fmt.Sprintf("switching from %s to %s stopped in phase %s: Host %s, step %s, attempt %d: %s (tried again every %s; the tenant keeps serving as before)",
			sw.From, sw.Target, sw.Phase, h.Host, h.Step, h.Attempts, h.Message, hostRetryAfter))
	left := hostRetryAfter - r.Now().Sub(h.Finished.Time)
	return max(left, time.Millisecond)
}

func failedHost(st *apiary.TenantControlPlaneStatus) *apiary.ControlPlaneHostStatus {
	for i := range st.ControlPlaneHosts {
		if st.ControlPlaneHosts[i].Result == resultFailed {
			return &st.ControlPlaneHosts[i]
		}
	}
	return nil
}

func servingHosts(st *apiary.TenantControlPlaneStatus) int {
	n := 0
	for _, h := range st.ControlPlaneHosts {
		if h.Serving {
			n++
		}
	}
	return n
}

// hostsAvailable counts serving hosts into ControlPlaneAvailable.
func (r *TenantControlPlaneReconciler) hostsAvailable(tcp *apiary.TenantControlPlane) {
	st := &tcp.Status
	hostsRunning := 0
	for _, h := range st.ControlPlaneHosts {
		if h.Step != apiary.HostStepStop {
			hostsRunning++
		}
	}
	if hostsRunning == 0 {
		return
	}
	serving := servingHosts(st)
	msg := fmt.Sprintf("%d of %d control-plane hosts serving, %d hosted replicas ready", serving, hostsRunning, st.ReadyReplicas)
	if serving > 0 || st.ReadyReplicas > 0 {
		r.setCondition(tcp, apiary.ConditionControlPlaneAvailable, metav1.ConditionTrue, ReasonReplicasReady, msg)
	} else {
		r.setCondition(tcp, apiary.ConditionControlPlaneAvailable, metav1.ConditionFalse, ReasonNoReadyReplicas, msg)
	}
}

// hostAccessMissing says why hosts cannot reach the DataStore ("" when
// they can).
func hostAccessMissing(ds *apiary.DataStore) string {
	if len(ds.Status.HostEndpoints) == 0 {
		return fmt.Sprintf("DataStore %s has no address for hosts (spec.hostAccess)", ds.Name)
	}
	if c := meta.FindStatusCondition(ds.Status.Conditions, apiary.ConditionHostAccessReady); c == nil || c.Status != metav1.ConditionTrue {
		msg := "not reported"
		if c != nil {
			msg = c.Message
		}
		return fmt.Sprintf("DataStore %s: %s is not True: %s", ds.Name, apiary.ConditionHostAccessReady, msg)
	}
	return ""
}

// applySlices lists the serving hosts behind the tenant Service (and the
// ones that started but stopped answering, as not ready), or removes the
// operator's slices when no host runs the control plane. What was last
// applied is remembered per tenant: a reconcile that changes no backend
// sends nothing, but for a re-apply every slicesRefresh (a slice deleted
// behind the operator's back comes back) and after an operator start.
func (r *TenantControlPlaneReconciler) applySlices(ctx context.Context, tcp *apiary.TenantControlPlane) error {
	var backends []render.Backend
	for _, h := range tcp.Status.ControlPlaneHosts {
		switch {
		case h.Step == apiary.HostStepStop || h.Step == "":
		case h.Result == resultRunning && !h.Serving:
			// Being started or rewritten, out of the Service: once it
			// has a control plane written it takes agents, not clients.
			if h.ConfigHash != "" {
				backends = append(backends, render.Backend{Address: h.Address, AgentsReady: true, Hostname: h.Host})
			}
		case h.Step == apiary.HostStepStart && h.Result != resultSucceeded:
		default:
			backends = append(backends, render.Backend{Address: h.Address, Ready: h.Serving, AgentsReady: h.Serving, Hostname: h.Host})
		}
	}
	rendered := render.EndpointSlices(tcp, backends)
	key := fmt.Sprint(backends)
	if last, ok := r.slices.get(tcp.UID); ok && last.backends == key && r.Now().Sub(last.at) < slicesRefresh {
		return nil
	}
	want := map[string]bool{}
	for _, s := range rendered {
		want[*s.Name] = true
		if err := r.Client.Apply(ctx, s, client.FieldOwner(FieldOwner), client.ForceOwnership); err != nil {
			return fmt.Errorf("applying EndpointSlice %s: %w", *s.Name, err)
		}
	}
	for _, family := range []discoveryv1.AddressType{discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6} {
		for _, name := range []string{render.EndpointSliceName(tcp, family), render.AgentEndpointSliceName(tcp, family)} {
			if want[name] {
				continue
			}
			s := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: tcp.Namespace, Name: name}}
			if err := r.Client.Delete(ctx, s); err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("deleting EndpointSlice %s: %w", name, err)
			}
		}
	}
	r.slices.set(tcp.UID, appliedSlices{backends: key, at: r.Now()})
	return nil
}

// controllerSlices are the endpoint slice controller's slices of the
// tenant Service (the hosted pods).
func (r *TenantControlPlaneReconciler) controllerSlices(ctx context.Context, tcp *apiary.TenantControlPlane) ([]discoveryv1.EndpointSlice, error) {
	var list discoveryv1.EndpointSliceList
	if err := r.APIReader.List(ctx, &list, client.InNamespace(tcp.Namespace), client.MatchingLabels{
		discoveryv1.LabelServiceName: render.ServiceName(tcp),
		discoveryv1.LabelManagedBy:   endpointSliceController,
	}); err != nil {
		return nil, fmt.Errorf("listing the EndpointSlices of Service %s: %w", render.ServiceName(tcp), err)
	}
	return list.Items, nil
}

// podsInService counts the ready pods the endpoint slice controller lists
// for the tenant Service.
func (r *TenantControlPlaneReconciler) podsInService(ctx context.Context, tcp *apiary.TenantControlPlane) (int32, error) {
	list, err := r.controllerSlices(ctx, tcp)
	if err != nil {
		return 0, err
	}
	var n int32
	for _, s := range list {
		for _, e := range s.Endpoints {
			if e.Conditions.Ready != nil && *e.Conditions.Ready {
				n++
			}
		}
	}
	return n, nil
}

// conditionReason is a condition's status and reason, or "" without it.
func conditionReason(conds []metav1.Condition, typ string) string {
	if c := meta.FindStatusCondition(conds, typ); c != nil {
		return string(c.Status) + "/" + c.Reason
	}
	return ""
}

// tenantOfHost maps a Host to its tenant.
func tenantOfHost(_ context.Context, o client.Object) []reconcile.Request {
	h, ok := o.(*apiary.Host)
	if !ok || h.Spec.TenantControlPlane == "" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: client.ObjectKey{Namespace: h.Namespace, Name: h.Spec.TenantControlPlane}}}
}

// hostChangesTenant passes the Host changes its tenant's status follows:
// a Host created or deleted, its role, address or phase (the wanted
// control-plane hosts), and a worker's version and upgrade (HostsUpToDate).
func hostChangesTenant() predicate.Predicate {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, ok1 := e.ObjectOld.(*apiary.Host)
			n, ok2 := e.ObjectNew.(*apiary.Host)
			if !ok1 || !ok2 {
				return false
			}
			return o.Spec.Role != n.Spec.Role || o.Spec.Address != n.Spec.Address || o.Status.Phase != n.Status.Phase ||
				o.DeletionTimestamp.IsZero() != n.DeletionTimestamp.IsZero() ||
				o.Status.Version != n.Status.Version || o.Status.UpgradingTo != n.Status.UpgradingTo ||
				conditionReason(o.Status.Conditions, apiary.HostConditionUpToDate) != conditionReason(n.Status.Conditions, apiary.HostConditionUpToDate) ||
				// A CA rotation moves on when its Hosts catch up.
				!equality.Semantic.DeepEqual(o.Status.CA, n.Status.CA)
		},
	}
}
