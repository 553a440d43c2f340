package controllers

// A standalone tenant has no control-plane Nodes (DESIGN.md, Modes): its
// control-plane Hosts are installed but not joined (phase Standby). One
// joins when its tenant targets registered, and leaves again once the
// switch back has taken the control plane off it: drained, reset with
// kubeadm (the node software stays, so the next join is quick), its Node
// deleted with a UID precondition.

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
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/apiaryhq/apiary/hosts"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

const (
	// StepLeave takes a joined control-plane Host of a standalone tenant
	// back to Standby.
	StepLeave = "leave"
	// ReasonStandby: a control-plane Host of a standalone tenant, not
	// joined.
	ReasonStandby = "Standby"
	// ReasonLeaving: the host is being drained and reset.
	ReasonLeaving = "Leaving"
)

// joinWanted says whether the Host should be a Node of its tenant, and
// when not, why. A worker always; a control-plane Host while its tenant
// targets registered or still runs its control plane there (a switch back
// stops it first). A missing tenant changes nothing here (the join step
// reports it). A tenant being deleted gets no new control-plane Node, and
// keeps those it has: its finalizer takes its control plane off them.
func (r *HostReconciler) joinWanted(ctx context.Context, h *apiary.Host) (bool, string) {
	if h.Spec.Role != apiary.HostRoleControlPlane {
		return true, ""
	}
	var tcp apiary.TenantControlPlane
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: h.Namespace, Name: h.Spec.TenantControlPlane}, &tcp); err != nil {
		return true, ""
	}
	if !tcp.DeletionTimestamp.IsZero() {
		if journalStep(&h.Status, StepJoin) != nil {
			return true, ""
		}
		return false, fmt.Sprintf("role control-plane and tenant %s is being deleted: installed, not joined", tcp.Name)
	}
	tcp.Default()
	if tcp.Spec.Mode == apiary.ModeRegistered || slices.Contains(controlPlaneOn(&tcp), h.Name) {
		return true, ""
	}
	return false, fmt.Sprintf("role control-plane and tenant %s is standalone: installed, not joined (a standalone tenant has no control-plane Nodes); it joins when the tenant switches to registered", tcp.Name)
}

// controlPlaneOn names the Hosts the tenant's control plane may still run
// on: every host in status.controlPlaneHosts but those whose stop
// succeeded.
func controlPlaneOn(tcp *apiary.TenantControlPlane) []string {
	var out []string
	for _, cp := range tcp.Status.ControlPlaneHosts {
		if cp.Step != "" && (cp.Step != apiary.HostStepStop || cp.Result != StepSucceeded) {
			out = append(out, cp.Host)
		}
	}
	slices.Sort(out)
	return out
}

// standBy keeps a control-plane Host of a standalone tenant installed but
// not joined: a joined one leaves (journaled as step leave, written before
// the host is touched), one that never joined waits in phase Standby. A
// leave once started finishes before any new join, so that a host is
// never joined on top of half a reset.
func (r *HostReconciler) standBy(ctx context.Context, h *apiary.Host, why string) ctrl.Result {
	st := &h.Status
	step := journalStep(st, StepLeave)
	leaving := step != nil && step.Result != StepSucceeded
	if !leaving && journalStep(st, StepJoin) == nil {
		st.Phase = apiary.HostPhaseStandby
		r.setCondition(h, apiary.HostConditionJoined, metav1.ConditionFalse, ReasonStandby, why)
		meta.RemoveStatusCondition(&st.Conditions, apiary.HostConditionNodeReady)
		return ctrl.Result{}
	}
	if !leaving {
		// The join is undone from here on: a join wanted again waits
		// for the leave to finish. An upgrade under way (a worker made
		// control-plane in a standalone tenant) ends here too, giving
		// up its turn: the leave resets the kubelet, and a later join
		// installs the version that runs then.
		if st.UpgradingTo != "" {
			r.Recorder.Eventf(h, nil, corev1.EventTypeNormal, "UpgradeAbandoned", "Leave", "Node %s leaves the tenant: its upgrade to %s ends unfinished", st.NodeName, st.UpgradingTo)
			st.UpgradingTo = ""
		}
		meta.RemoveStatusCondition(&st.Conditions, apiary.HostConditionUpToDate)
		st.Journal = slices.DeleteFunc(st.Journal, func(s apiary.HostStep) bool {
			return s.Name == StepJoin || s.Name == StepDrain || slices.Contains(upgradeSteps, s.Name)
		})
		r.setCondition(h, apiary.HostConditionJoined, metav1.ConditionFalse, ReasonLeaving, "leaving: "+why)
		return r.startLeave(h)
	}
	// A failed leave waits for its backoff (a spec change sends it back
	// Pending, without one); one left Running by an earlier operator is
	// resumed as another attempt (every part of a leave is idempotent).
	switch wait, start := r.stepDue(h.UID, step); {
	case wait > 0:
		return ctrl.Result{RequeueAfter: wait}
	case start:
		return r.startLeave(h)
	}
	res, _ := r.runStep(ctx, h, step, func(ctx context.Context, h *apiary.Host, step *apiary.HostStep) ctrl.Result {
		return r.leave(ctx, h, step, why)
	})
	return res
}

// startLeave journals an attempt at the leave; the next reconcile runs it.
func (r *HostReconciler) startLeave(h *apiary.Host) ctrl.Result {
	r.startStep(h, StepLeave)
	h.Status.Phase = apiary.HostPhaseDraining
	return ctrl.Result{Requeue: true}
}

// leave drains the host's Node (a pass per reconcile, up to drainTimeout),
// resets the host keeping its software, deletes the Node with a UID
// precondition and any leftover join token.
func (r *HostReconciler) leave(ctx context.Context, h *apiary.Host, step *apiary.HostStep, why string) ctrl.Result {
	st := &h.Status
	fail := func(msg string) ctrl.Result {
		return r.failStep(ctx, h, step, apiary.HostConditionJoined, ReasonCleanupFailed, "leaving: "+msg)
	}
	ta, reason, err := r.tenant(ctx, h)
	if err != nil {
		// The Node and token are in the tenant: without it, wait.
		return r.failStep(ctx, h, step, apiary.HostConditionJoined, reason, "leaving: "+err.Error())
	}
	if st.NodeName != "" && st.Phase != apiary.HostPhaseResetting {
		remaining, err := r.drainOnce(ctx, ta, st.NodeName, nil)
		switch {
		case err == nil && remaining == 0:
		case r.Now().Sub(step.Started.Time) >= drainTimeout:
			r.Recorder.Eventf(h, nil, corev1.EventTypeWarning, "DrainIncomplete", "Leave",
				"gave up draining Node %s after %s: %d pods left (%v); resetting anyway", st.NodeName, drainTimeout, remaining, err)
		default:
			step.Message = fmt.Sprintf("%d pods still on Node %s (evictions respect PodDisruptionBudgets; %v)", remaining, st.NodeName, err)
			return ctrl.Result{RequeueAfter: drainPoll}
		}
	}
	st.Phase = apiary.HostPhaseResetting
	c, _, err := r.connect(ctx, h)
	if err != nil {
		return fail(err.Error())
	}
	resetCtx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	_, err = hosts.Leave(resetCtx, c)
	cancel()
	c.Close()
	if err != nil {
		return fail(err.Error())
	}
	if err := r.deleteNode(ctx, h, ta); err != nil {
		return fail(err.Error())
	}
	msg := "kubeadm reset, node software kept"
	if st.NodeName != "" {
		msg = fmt.Sprintf("Node %s drained and deleted, %s", st.NodeName, msg)
	}
	r.succeedStep(step, msg)
	r.Recorder.Eventf(h, nil, corev1.EventTypeNormal, "Left", "Leave", "%s: %s", msg, why)
	st.NodeName, st.NodeUID = "", ""
	st.Phase = apiary.HostPhaseStandby
	r.setCondition(h, apiary.HostConditionJoined, metav1.ConditionFalse, ReasonStandby, why)
	meta.RemoveStatusCondition(&st.Conditions, apiary.HostConditionNodeReady)
	return ctrl.Result{}
}

// controlPlaneHostsOf maps a tenant to its control-plane Hosts, which join
// or leave with its mode.
func (r *HostReconciler) controlPlaneHostsOf(ctx context.Context, o client.Object) []reconcile.Request {
	return r.hostsOf(ctx, o, func(role apiary.HostRole) bool { return role == apiary.HostRoleControlPlane })
}

// allHostsOf maps a tenant to all its Hosts.
func (r *HostReconciler) allHostsOf(ctx context.Context, o client.Object) []reconcile.Request {
	return r.hostsOf(ctx, o, func(apiary.HostRole) bool { return true })
}

// hostsOf maps a tenant to its Hosts of the roles wanted.
func (r *HostReconciler) hostsOf(ctx context.Context, o client.Object, wanted func(apiary.HostRole) bool) []reconcile.Request {
	var list apiary.HostList
	if err := r.Client.List(ctx, &list, client.InNamespace(o.GetNamespace())); err != nil {
		return nil
	}
	var out []reconcile.Request
	for _, h := range list.Items {
		if h.Spec.TenantControlPlane == o.GetName() && wanted(h.Spec.Role) {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&h)})
		}
	}
	return out
}

// tenantChangesHostVersion passes the tenant changes that start or hold
// its Hosts' upgrades: the version it runs or wants, spec.hostUpgrades, a
// mode switch ending (a control-plane Host waits for it), and its
// control-plane host steps (a control-plane Host waits for the tenant to
// take it out of its Service).
func tenantChangesHostVersion() predicate.Predicate {
	return predicate.Funcs{
		CreateFunc: func(event.CreateEvent) bool { return false },
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, ok1 := e.ObjectOld.(*apiary.TenantControlPlane)
			n, ok2 := e.ObjectNew.(*apiary.TenantControlPlane)
			if !ok1 || !ok2 {
				return false
			}
			return o.Status.Version != n.Status.Version || o.Spec.Version != n.Spec.Version ||
				!equality.Semantic.DeepEqual(o.Spec.HostUpgrades, n.Spec.HostUpgrades) ||
				o.Status.Switching() != n.Status.Switching() || hostSteps(o) != hostSteps(n)
		},
		DeleteFunc:  func(event.DeleteEvent) bool { return false },
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
}

// tenantChangesJoins passes the tenant changes that decide whether its
// control-plane Hosts are joined: spec.mode, the hosts its control plane
// may run on, and its deletion.
func tenantChangesJoins() predicate.Predicate {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, ok1 := e.ObjectOld.(*apiary.TenantControlPlane)
			n, ok2 := e.ObjectNew.(*apiary.TenantControlPlane)
			if !ok1 || !ok2 {
				return false
			}
			return o.Spec.Mode != n.Spec.Mode || o.DeletionTimestamp.IsZero() != n.DeletionTimestamp.IsZero() ||
				strings.Join(controlPlaneOn(o), ",") != strings.Join(controlPlaneOn(n), ",")
		},
		DeleteFunc: func(event.DeleteEvent) bool { return false },
	}
}

// hostSteps is the tenant's control-plane host steps, but their messages
// and times.
func hostSteps(tcp *apiary.TenantControlPlane) string {
	var b strings.Builder
	for _, h := range tcp.Status.ControlPlaneHosts {
		fmt.Fprintf(&b, "%s/%s/%s/%v;", h.Host, h.Step, h.Result, h.Serving)
	}
	return b.String()
}
