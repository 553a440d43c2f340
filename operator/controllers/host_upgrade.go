package controllers

// A joined Host follows its tenant's version once the control plane runs
// it (the Kubernetes skew policy: a kubelet is never newer than the API
// server): cordoned and drained, the new node bundle installed, `kubeadm
// upgrade node`, the kubelet restarted, the Node back Ready at the new
// version, uncordoned. Each part is a journal step (upgrade-drain,
// upgrade-install, upgrade-node, upgrade-ready), written before the host is
// touched and idempotent, so an operator killed mid-host resumes where it
// was. At most spec.hostUpgrades.maxParallel Hosts of a tenant upgrade at
// once; a Host whose upgrade fails keeps its slot (and its Node stays
// cordoned), which stops the rollout until it succeeds.
//
// A registered tenant's control-plane Host runs the tenant's static Pods,
// which a new kubelet kills (seen in e2e, v1.36 to v1.37): it asks for the
// upgrade (status.upgradingTo) and starts only once the tenant has taken
// it out of its Service (the tenant's host step kubelet) and new
// connections have drained; the tenant brings it back when its
// kube-apiserver answers again. Its upgrade-node step stops the static
// Pods gracefully first (clients on connections made before still reach
// the host) and runs only kubeadm's kubelet-config phase
// (hosts.UpgradeKubelet).

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/client-go/kubernetes"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/apiaryhq/apiary/hosts"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

// The journal steps of a worker upgrade, in order.
const (
	StepUpgradeDrain   = "upgrade-drain"
	StepUpgradeInstall = "upgrade-install"
	StepUpgradeNode    = "upgrade-node"
	StepUpgradeReady   = "upgrade-ready"
)

var upgradeSteps = []string{StepUpgradeDrain, StepUpgradeInstall, StepUpgradeNode, StepUpgradeReady}

// Reasons of a Host's UpToDate condition.
const (
	ReasonAtVersion              = "AtVersion"
	ReasonHostUpgrading          = "Upgrading"
	ReasonUpgradeFailed          = "UpgradeFailed"
	ReasonUpgradePaused          = "Paused"
	ReasonWaitingForControlPlane = "WaitingForControlPlane"
	ReasonWaitingForTurn         = "WaitingForTurn"
)

const (
	// upgradeDrainTimeout bounds a drain that PodDisruptionBudgets hold
	// up: the step then fails (the Node stays cordoned) and is retried
	// with the journal's backoff, which stops the rollout meanwhile.
	upgradeDrainTimeout = 5 * time.Minute
	// upgradeReadyTimeout bounds the wait for the Node to come back Ready
	// at the new version after the kubelet restart.
	upgradeReadyTimeout = 5 * time.Minute
	// installTimeout bounds putting a node bundle on a host, at join and
	// at an upgrade alike; the host's owner controls how fast it goes.
	installTimeout = 10 * time.Minute
	// upgradeTurnPoll is how often a Host waiting for its turn looks
	// again; a Host that ends its upgrade wakes the others at once
	// (upgradeSlotFreed), so this only bounds a missed event.
	upgradeTurnPoll = 10 * time.Second
)

// maxKubeletSkew is how many minors a kubelet may be older than the API
// server (Kubernetes version skew policy).
const maxKubeletSkew = 3

// upgradeWorker moves a joined worker Host to the version its tenant's
// control plane runs. It returns busy when an upgrade is under way (the
// caller then does nothing else this reconcile), and otherwise how soon to
// look again (0: no opinion).
func (r *HostReconciler) upgradeWorker(ctx context.Context, orig, h *apiary.Host) (ctrl.Result, bool, error) {
	st := &h.Status
	if st.NodeName == "" {
		return ctrl.Result{}, false, nil
	}
	if join := journalStep(st, StepJoin); join == nil || join.Result != StepSucceeded {
		return ctrl.Result{}, false, nil
	}
	if st.UpgradingTo == "" {
		var tcp apiary.TenantControlPlane
		if err := r.Client.Get(ctx, client.ObjectKey{Namespace: h.Namespace, Name: h.Spec.TenantControlPlane}, &tcp); err != nil {
			return ctrl.Result{}, false, client.IgnoreNotFound(err)
		}
		res, start := r.upgradeWanted(h, &tcp)
		if !start {
			return res, false, nil
		}
		// Taking a slot is checked and recorded under one lock, against
		// the API server (not the cache), so that two workers never both
		// take the last one.
		r.upgradeSlots.Lock()
		defer r.upgradeSlots.Unlock()
		ahead, err := r.upgradingPeers(ctx, h)
		if err != nil {
			return ctrl.Result{}, false, err
		}
		if limit := maxParallel(&tcp); len(ahead) >= limit {
			r.setCondition(h, apiary.HostConditionUpToDate, metav1.ConditionFalse, ReasonWaitingForTurn,
				fmt.Sprintf("runs %s; waits for its turn to move to %s: %s upgrading (spec.hostUpgrades.maxParallel %d)", st.Version, tcp.Status.Version, strings.Join(ahead, ", "), limit))
			return ctrl.Result{RequeueAfter: upgradeTurnPoll}, false, nil
		}
		st.UpgradingTo = tcp.Status.Version
		st.Journal = slices.DeleteFunc(st.Journal, func(s apiary.HostStep) bool { return slices.Contains(upgradeSteps, s.Name) })
		how := "drain, install, kubeadm upgrade node, Node Ready"
		if h.Spec.Role == apiary.HostRoleControlPlane {
			how = "out of the tenant's Service, drain, install, kubeadm's kubelet-config phase, Node Ready, back in the Service"
		}
		r.setCondition(h, apiary.HostConditionUpToDate, metav1.ConditionFalse, ReasonHostUpgrading,
			fmt.Sprintf("upgrading from %s to %s: %s", st.Version, st.UpgradingTo, how))
		r.Recorder.Eventf(h, nil, corev1.EventTypeNormal, "UpgradeStarted", "Upgrade", "Node %s: %s → %s", st.NodeName, st.Version, st.UpgradingTo)
		st.Phase = apiary.HostPhaseUpgrading
		if err := r.writeStatus(ctx, orig, h); err != nil {
			return ctrl.Result{}, false, err
		}
		return ctrl.Result{Requeue: true}, true, nil
	}
	for _, name := range upgradeSteps {
		step := journalStep(st, name)
		if step != nil && step.Result == StepSucceeded {
			continue
		}
		if name == StepUpgradeDrain && step == nil && h.Spec.Role == apiary.HostRoleControlPlane {
			var tcp apiary.TenantControlPlane
			if err := r.Client.Get(ctx, client.ObjectKey{Namespace: h.Namespace, Name: h.Spec.TenantControlPlane}, &tcp); err != nil {
				return ctrl.Result{}, true, client.IgnoreNotFound(err)
			}
			if wait, why := handedOver(&tcp, h.Name, r.Now()); wait > 0 {
				r.setCondition(h, apiary.HostConditionUpToDate, metav1.ConditionFalse, ReasonHostUpgrading,
					fmt.Sprintf("upgrading from %s to %s: %s", st.Version, st.UpgradingTo, why))
				st.Phase = apiary.HostPhaseUpgrading
				return ctrl.Result{RequeueAfter: wait}, true, nil
			}
		}
		wait, start := r.stepDue(h.UID, step)
		if wait > 0 {
			return ctrl.Result{RequeueAfter: wait}, true, nil
		}
		if start {
			r.startStep(h, name)
			st.Phase = apiary.HostPhaseUpgrading
			return ctrl.Result{Requeue: true}, true, nil
		}
		st.Phase = apiary.HostPhaseUpgrading
		var res ctrl.Result
		switch name {
		case StepUpgradeDrain:
			res = r.upgradeDrain(ctx, h, step)
		case StepUpgradeInstall, StepUpgradeNode:
			fn := r.upgradeInstall
			if name == StepUpgradeNode {
				fn = r.upgradeNode
			}
			var ended bool
			if res, ended = r.runStep(ctx, h, step, fn); !ended {
				return res, true, nil
			}
		case StepUpgradeReady:
			res = r.upgradeReady(ctx, h, step)
		}
		if step = journalStep(st, name); step.Result == StepSucceeded {
			return ctrl.Result{Requeue: true}, true, nil
		}
		return res, true, nil
	}
	return ctrl.Result{}, false, nil
}

// upgradeWanted says whether the worker should start an upgrade now, and
// sets its UpToDate condition when not.
func (r *HostReconciler) upgradeWanted(h *apiary.Host, tcp *apiary.TenantControlPlane) (ctrl.Result, bool) {
	st := &h.Status
	target := tcp.RunningVersion()
	if st.Version == "" || st.Version == target {
		if st.Version != "" {
			r.setCondition(h, apiary.HostConditionUpToDate, metav1.ConditionTrue, ReasonAtVersion, "runs "+target+", as the control plane does")
		}
		return ctrl.Result{}, false
	}
	have, err1 := version.ParseSemantic(st.Version)
	want, err2 := version.ParseSemantic(target)
	if err1 != nil || err2 != nil || !have.LessThan(want) {
		// Never downgrade a kubelet: the webhook refuses downgrades, so
		// this is a Host installed ahead of a cancelled upgrade.
		r.setCondition(h, apiary.HostConditionUpToDate, metav1.ConditionFalse, ReasonAtVersion,
			fmt.Sprintf("runs %s, the control plane %s: a host is never downgraded", st.Version, target))
		return ctrl.Result{}, false
	}
	if tcp.Status.Version != tcp.Spec.Version {
		r.setCondition(h, apiary.HostConditionUpToDate, metav1.ConditionFalse, ReasonWaitingForControlPlane,
			fmt.Sprintf("runs %s; follows once the control plane runs %s (it runs %s)", st.Version, tcp.Spec.Version, tcp.Status.Version))
		return ctrl.Result{}, false
	}
	if h.Spec.Role == apiary.HostRoleControlPlane && tcp.Status.Switching() {
		r.setCondition(h, apiary.HostConditionUpToDate, metav1.ConditionFalse, ReasonWaitingForControlPlane,
			fmt.Sprintf("runs %s; follows to %s once the tenant's switch to %s ends", st.Version, target, tcp.Status.ModeSwitch.Target))
		return ctrl.Result{RequeueAfter: upgradeTurnPoll}, false
	}
	if on := controlPlaneOn(tcp); h.Spec.Role != apiary.HostRoleControlPlane && slices.Contains(on, h.Name) {
		// A control-plane Host just made a worker: the tenant stops its
		// static Pods first (kubeadm would take their manifests for its
		// own control plane).
		r.setCondition(h, apiary.HostConditionUpToDate, metav1.ConditionFalse, ReasonWaitingForControlPlane,
			fmt.Sprintf("runs %s; follows to %s once the tenant's control plane has left this host", st.Version, target))
		return ctrl.Result{RequeueAfter: upgradeTurnPoll}, false
	}
	if tcp.Spec.HostUpgrades != nil && tcp.Spec.HostUpgrades.Paused {
		skew := int(want.Minor()) - int(have.Minor())
		r.setCondition(h, apiary.HostConditionUpToDate, metav1.ConditionFalse, ReasonUpgradePaused,
			fmt.Sprintf("runs %s while the control plane runs %s (%d minor(s) behind; a kubelet may be at most %d): spec.hostUpgrades.paused holds it", st.Version, target, skew, maxKubeletSkew))
		return ctrl.Result{}, false
	}
	return ctrl.Result{}, true
}

func maxParallel(tcp *apiary.TenantControlPlane) int {
	if tcp.Spec.HostUpgrades != nil && tcp.Spec.HostUpgrades.MaxParallel > 0 {
		return int(tcp.Spec.HostUpgrades.MaxParallel)
	}
	return 1
}

// upgradingPeers names the other Hosts of h's tenant with an upgrade under
// way (or failed), read from the API server.
func (r *HostReconciler) upgradingPeers(ctx context.Context, h *apiary.Host) ([]string, error) {
	var list apiary.HostList
	if err := r.APIReader.List(ctx, &list, client.InNamespace(h.Namespace)); err != nil {
		return nil, fmt.Errorf("listing the tenant's Hosts: %w", err)
	}
	var out []string
	for _, o := range list.Items {
		if o.UID != h.UID && o.Spec.TenantControlPlane == h.Spec.TenantControlPlane && o.Status.UpgradingTo != "" && o.DeletionTimestamp.IsZero() {
			out = append(out, o.Name)
		}
	}
	return out, nil
}

// failUpgrade ends an upgrade step as failed: the Host's UpToDate names
// the step, the Node stays cordoned, and the step is tried again after the
// backoff. The Host keeps its slot, which holds the tenant's other Hosts.
func (r *HostReconciler) failUpgrade(ctx context.Context, h *apiary.Host, step *apiary.HostStep, msg string) ctrl.Result {
	return r.failStep(ctx, h, step, apiary.HostConditionUpToDate, ReasonUpgradeFailed,
		fmt.Sprintf("upgrade to %s failed at step %s: %s. Node %s stays cordoned and the tenant's other Hosts wait; the step is tried again", h.Status.UpgradingTo, step.Name, msg, h.Status.NodeName))
}

// upgradeDrain cordons the Node and evicts its pods, a pass per reconcile
// (PodDisruptionBudgets are respected, no worker is held waiting). A cordon
// made here is marked on the Node, so that upgradeReady lifts only that.
func (r *HostReconciler) upgradeDrain(ctx context.Context, h *apiary.Host, step *apiary.HostStep) ctrl.Result {
	ta, _, err := r.tenant(ctx, h)
	if err != nil {
		return r.failUpgrade(ctx, h, step, err.Error())
	}
	remaining, err := r.drainOnce(ctx, ta, h.Status.NodeName, map[string]string{apiary.AnnotationCordonedForUpgrade: h.Status.UpgradingTo})
	if err == nil && remaining == 0 {
		r.succeedStep(step, fmt.Sprintf("Node %s cordoned and drained", h.Status.NodeName))
		return ctrl.Result{}
	}
	if r.Now().Sub(step.Started.Time) >= upgradeDrainTimeout {
		return r.failUpgrade(ctx, h, step, fmt.Sprintf("%d pods still on the Node after %s (evictions respect PodDisruptionBudgets; %v)", remaining, upgradeDrainTimeout, err))
	}
	step.Message = fmt.Sprintf("%d pods still on Node %s (evictions respect PodDisruptionBudgets; %v)", remaining, h.Status.NodeName, err)
	return ctrl.Result{RequeueAfter: drainPoll}
}

// upgradeInstall puts the node bundle of the new version on the host; the
// running kubelet keeps its old binary until the restart.
func (r *HostReconciler) upgradeInstall(ctx context.Context, h *apiary.Host, step *apiary.HostStep) ctrl.Result {
	installCtx, cancel := context.WithTimeout(ctx, installTimeout)
	defer cancel()
	bundle, err := hosts.ResolveBundle(installCtx, r.nodeBundleRepository()+":"+h.Status.UpgradingTo, r.NodeBundleInsecure)
	if err != nil {
		return r.failUpgrade(ctx, h, step, err.Error())
	}
	c, _, err := r.connect(ctx, h)
	if err != nil {
		return r.failUpgrade(ctx, h, step, err.Error())
	}
	defer c.Close()
	if err := hosts.Install(installCtx, c, bundle); err != nil {
		return r.failUpgrade(ctx, h, step, err.Error())
	}
	r.succeedStep(step, fmt.Sprintf("kubelet, kubeadm, kubectl %s and CNI plugins from %s", h.Status.UpgradingTo, bundle.Ref))
	return ctrl.Result{}
}

// upgradeNode runs kubeadm upgrade node and restarts the kubelet. On a
// registered tenant's control-plane Host, out of the tenant's Service, it
// stops the static Pods gracefully first and runs kubeadm's kubelet-config
// phase alone (hosts.UpgradeKubelet).
func (r *HostReconciler) upgradeNode(ctx context.Context, h *apiary.Host, step *apiary.HostStep) ctrl.Result {
	c, _, err := r.connect(ctx, h)
	if err != nil {
		return r.failUpgrade(ctx, h, step, err.Error())
	}
	defer c.Close()
	runCtx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	did := "kubeadm upgrade node, kubelet restarted"
	if h.Spec.Role == apiary.HostRoleControlPlane {
		_, err = hosts.UpgradeKubelet(runCtx, c, hostRemoveWait)
		did = "static Pods stopped, kubeadm upgrade node phase kubelet-config, kubelet restarted, static Pods back"
	} else {
		_, err = hosts.UpgradeNode(runCtx, c)
	}
	if err != nil {
		return r.failUpgrade(ctx, h, step, err.Error())
	}
	r.succeedStep(step, did)
	return ctrl.Result{}
}

// handedOver says how long a control-plane Host waits before its upgrade
// starts, and why (0: it may start). It may when none of the tenant's
// control plane runs on it, or once the tenant has taken it out of its
// Service for the upgrade (its host step kubelet) and connections have
// drained; a host the tenant keeps serving (its only backend) starts at
// once, restarted in place.
func handedOver(tcp *apiary.TenantControlPlane, name string, now time.Time) (time.Duration, string) {
	if !slices.Contains(controlPlaneOn(tcp), name) {
		return 0, ""
	}
	for _, cp := range tcp.Status.ControlPlaneHosts {
		if cp.Host != name || cp.Step != apiary.HostStepKubelet || cp.Result != resultRunning {
			continue
		}
		if left := drainFor - now.Sub(cp.Started.Time); !cp.Serving && left > 0 {
			return left, fmt.Sprintf("out of the tenant's Service; connections drain for %s", left.Round(time.Second))
		}
		return 0, ""
	}
	return upgradeTurnPoll, "waits for the tenant to take it out of its Service (the tenant's control plane runs here)"
}

// upgradeReady waits for the Node to be Ready with the new kubelet, then
// uncordons it and ends the upgrade.
func (r *HostReconciler) upgradeReady(ctx context.Context, h *apiary.Host, step *apiary.HostStep) ctrl.Result {
	st := &h.Status
	ta, _, err := r.tenant(ctx, h)
	if err != nil {
		return r.failUpgrade(ctx, h, step, err.Error())
	}
	node, err := ta.cs.CoreV1().Nodes().Get(ctx, st.NodeName, metav1.GetOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return r.failUpgrade(ctx, h, step, err.Error())
	}
	ready, kubelet := false, ""
	if err == nil {
		kubelet = node.Status.NodeInfo.KubeletVersion
		for _, c := range node.Status.Conditions {
			if c.Type == corev1.NodeReady {
				ready = c.Status == corev1.ConditionTrue
			}
		}
	}
	if !ready || kubelet != st.UpgradingTo {
		if r.Now().Sub(step.Started.Time) >= upgradeReadyTimeout {
			return r.failUpgrade(ctx, h, step, fmt.Sprintf("Node %s not back Ready at %s after %s (kubelet %q, Ready %v)", st.NodeName, st.UpgradingTo, upgradeReadyTimeout, kubelet, ready))
		}
		step.Message = fmt.Sprintf("waiting for Node %s Ready at %s (kubelet %q, Ready %v)", st.NodeName, st.UpgradingTo, kubelet, ready)
		return ctrl.Result{RequeueAfter: 2 * time.Second}
	}
	done := fmt.Sprintf("Node %s Ready at %s, uncordoned", st.NodeName, st.UpgradingTo)
	if liftUpgradeCordon(node) {
		stale, err := writeLiftedCordon(ctx, ta.cs, node)
		if stale {
			step.Message = fmt.Sprintf("Node %s changed while being uncordoned; trying again", st.NodeName)
			return ctrl.Result{RequeueAfter: time.Second}
		}
		if err != nil {
			return r.failUpgrade(ctx, h, step, fmt.Sprintf("uncordoning %s: %v", st.NodeName, err))
		}
	} else if node.Spec.Unschedulable {
		done = fmt.Sprintf("Node %s Ready at %s; left cordoned, as it was before the upgrade", st.NodeName, st.UpgradingTo)
	}
	r.succeedStep(step, done)
	var took []string
	for _, name := range upgradeSteps {
		if s := journalStep(st, name); s != nil && s.Finished != nil {
			took = append(took, fmt.Sprintf("%s %s", strings.TrimPrefix(name, "upgrade-"), s.Finished.Sub(s.Started.Time).Round(100*time.Millisecond)))
		}
	}
	r.Recorder.Eventf(h, nil, corev1.EventTypeNormal, "Upgraded", "Upgrade", "Node %s: %s → %s (%s)", st.NodeName, st.Version, st.UpgradingTo, strings.Join(took, ", "))
	st.Version, st.UpgradingTo = st.UpgradingTo, ""
	r.setCondition(h, apiary.HostConditionUpToDate, metav1.ConditionTrue, ReasonAtVersion, "runs "+st.Version+", as the control plane does")
	return ctrl.Result{}
}

// liftUpgradeCordon uncordons a Node that the upgrade cordoned (it carries
// AnnotationCordonedForUpgrade) and drops the mark; it reports whether the
// Node changed. A Node cordoned by someone else before the upgrade has no
// mark and stays cordoned.
func liftUpgradeCordon(node *corev1.Node) bool {
	if _, ok := node.Annotations[apiary.AnnotationCordonedForUpgrade]; !ok {
		return false
	}
	delete(node.Annotations, apiary.AnnotationCordonedForUpgrade)
	node.Spec.Unschedulable = false
	return true
}

// writeLiftedCordon writes a Node liftUpgradeCordon changed. stale: the
// Node changed since it was read (the restarted kubelet writes it often),
// so it is read again rather than the upgrade called failed; the write
// carries the read's resourceVersion, so a cordon someone set meanwhile
// is never lifted.
func writeLiftedCordon(ctx context.Context, cs kubernetes.Interface, node *corev1.Node) (stale bool, err error) {
	_, err = cs.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{FieldManager: FieldOwner})
	if apierrors.IsConflict(err) {
		return true, nil
	}
	return false, err
}

// siblingsOf maps a Host to the other Hosts of its tenant.
func (r *HostReconciler) siblingsOf(ctx context.Context, o client.Object) []reconcile.Request {
	h, ok := o.(*apiary.Host)
	if !ok {
		return nil
	}
	var out []reconcile.Request
	for _, req := range r.hostsOf(ctx, &apiary.TenantControlPlane{ObjectMeta: metav1.ObjectMeta{Namespace: h.Namespace, Name: h.Spec.TenantControlPlane}}, func(apiary.HostRole) bool { return true }) {
		if req.Name != h.Name {
			out = append(out, req)
		}
	}
	return out
}

// upgradeSlotFreed passes a Host giving up its upgrade slot (its upgrade
// ended, or it is gone while holding one): the Hosts waiting for their
// turn look again now rather than at their next poll.
func upgradeSlotFreed() predicate.Predicate {
	return predicate.Funcs{
		CreateFunc: func(event.CreateEvent) bool { return false },
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, ok1 := e.ObjectOld.(*apiary.Host)
			n, ok2 := e.ObjectNew.(*apiary.Host)
			return ok1 && ok2 && o.Status.UpgradingTo != "" && n.Status.UpgradingTo == ""
		},
		DeleteFunc: func(e event.DeleteEvent) bool {
			h, ok := e.Object.(*apiary.Host)
			return ok && h.Status.UpgradingTo != ""
		},
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
}
