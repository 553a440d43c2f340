package controllers

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/operator/render"
)

// Reasons of VersionRolledOut.
const (
	ReasonRolledOut         = "RolledOut"
	ReasonUpgrading         = "Upgrading"
	ReasonImagePullFailed   = "ImagePullFailed"
	ReasonNewVersionFailing = "NewVersionFailing"
	ReasonHeldForModeSwitch = "HeldForModeSwitch"
)

// upgradeCheckEvery is how often a rolling upgrade's pods are looked at:
// a pod that cannot pull its image changes nothing the operator watches.
const upgradeCheckEvery = 5 * time.Second

// targetVersion is the version the control plane is rendered at:
// spec.version, except that a mode switch in progress holds what runs, so
// that a switch never moves the version as well. The webhook refuses a
// version change during a switch; this is the controller's own check.
func targetVersion(tcp *apiary.TenantControlPlane) string {
	if tcp.Status.Switching() && tcp.Status.Version != "" {
		return tcp.Status.Version
	}
	return tcp.Spec.Version
}

// observeVersion sets VersionRolledOut from status.version (which moves
// only once every replica runs the new version) and, while a hosted
// control plane upgrades, from its pods: how many run the new version and
// what stops the others. It returns when to look again.
func (r *TenantControlPlaneReconciler) observeVersion(ctx context.Context, tcp *apiary.TenantControlPlane) (time.Duration, error) {
	st := &tcp.Status
	want := tcp.Spec.Version
	switch {
	case st.Version == "":
		// Not rolled out yet: nothing to upgrade from.
		return 0, nil
	case st.Version == want:
		r.setCondition(tcp, apiary.ConditionVersionRolledOut, metav1.ConditionTrue, ReasonRolledOut, "the control plane runs "+want)
		return 0, nil
	case targetVersion(tcp) != want:
		r.setCondition(tcp, apiary.ConditionVersionRolledOut, metav1.ConditionFalse, ReasonHeldForModeSwitch,
			fmt.Sprintf("spec.version %s waits until the switch to %s completes; the control plane runs %s", want, st.ModeSwitch.Target, st.Version))
		return 0, nil
	case st.Mode == apiary.ModeRegistered:
		r.setCondition(tcp, apiary.ConditionVersionRolledOut, metav1.ConditionFalse, ReasonUpgrading,
			fmt.Sprintf("the control-plane Hosts move from %s to %s one at a time (status.controlPlaneHosts); status.version stays %s until all run it", st.Version, want, st.Version))
		return hostProbeEvery, nil
	}
	var pods corev1.PodList
	if err := r.APIReader.List(ctx, &pods, client.InNamespace(tcp.Namespace), client.MatchingLabels(render.SelectorLabels(tcp))); err != nil {
		return 0, fmt.Errorf("listing the control-plane pods: %w", err)
	}
	p := rollProgress(pods.Items, want)
	msg := fmt.Sprintf("rolling out %s: %d of %d replicas run it; status.version stays %s until all do", want, p.running, *tcp.Spec.Replicas, st.Version)
	if p.reason != "" {
		r.setCondition(tcp, apiary.ConditionVersionRolledOut, metav1.ConditionFalse, p.reason,
			fmt.Sprintf("%s. Stopped: %s. The replicas of %s keep serving; set spec.version back to %s to cancel", msg, p.stuck, st.Version, st.Version))
	} else {
		r.setCondition(tcp, apiary.ConditionVersionRolledOut, metav1.ConditionFalse, ReasonUpgrading, msg)
	}
	return upgradeCheckEvery, nil
}

// progress is what the pods of a rolling upgrade say.
type progress struct {
	// running counts the ready pods at the new version.
	running int
	// reason and stuck say why a pod at the new version does not start.
	reason, stuck string
}

// rollProgress reads the control-plane pods of an upgrade to version: a
// pod runs it when its kube-apiserver image is tagged with it (the other
// components' images follow the same version in the same template).
func rollProgress(pods []corev1.Pod, version string) progress {
	var p progress
	for i := range pods {
		pod := &pods[i]
		if !pod.DeletionTimestamp.IsZero() || !atVersion(pod, version) {
			continue
		}
		if podReady(pod) {
			p.running++
			continue
		}
		if p.reason != "" {
			continue
		}
		for _, c := range pod.Status.ContainerStatuses {
			w := c.State.Waiting
			if w == nil {
				continue
			}
			switch w.Reason {
			case "ErrImagePull", "ImagePullBackOff", "InvalidImageName":
				p.reason = ReasonImagePullFailed
				p.stuck = fmt.Sprintf("pod %s cannot pull %s (%s: %s)", pod.Name, c.Image, w.Reason, w.Message)
			case "CrashLoopBackOff":
				p.reason = ReasonNewVersionFailing
				p.stuck = fmt.Sprintf("container %s of pod %s restarts (%d restarts%s)", c.Name, pod.Name, c.RestartCount, lastExit(c))
			default:
				continue
			}
			break
		}
	}
	return p
}

func atVersion(pod *corev1.Pod, version string) bool {
	for _, c := range pod.Spec.Containers {
		if c.Name != render.ContainerAPIServer {
			continue
		}
		return strings.HasSuffix(c.Image, ":"+version)
	}
	return false
}

func podReady(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// lastExit describes a container's last termination, if it has one.
func lastExit(c corev1.ContainerStatus) string {
	t := c.LastTerminationState.Terminated
	if t == nil {
		return ""
	}
	s := fmt.Sprintf(", last exit %d", t.ExitCode)
	if msg := strings.TrimSpace(t.Message); msg != "" {
		if len(msg) > 200 {
			msg = msg[len(msg)-200:]
		}
		s += ": " + msg
	}
	return s
}

// observeHostVersions sets HostsUpToDate from the tenant's joined Hosts
// (workers, and a registered tenant's control-plane Hosts): which run the
// version the control plane runs, which upgrade, which wait or are held,
// and which failed. A tenant without joined Hosts has no such condition.
func (r *TenantControlPlaneReconciler) observeHostVersions(ctx context.Context, tcp *apiary.TenantControlPlane) error {
	var list apiary.HostList
	if err := r.Client.List(ctx, &list, client.InNamespace(tcp.Namespace)); err != nil {
		return fmt.Errorf("listing Hosts: %w", err)
	}
	var workers []apiary.Host
	for _, h := range list.Items {
		if h.Spec.TenantControlPlane == tcp.Name && h.Status.NodeName != "" && h.Status.Version != "" {
			workers = append(workers, h)
		}
	}
	status, reason, msg := hostVersions(workers, tcp.RunningVersion())
	if status == "" {
		meta.RemoveStatusCondition(&tcp.Status.Conditions, apiary.ConditionHostsUpToDate)
		return nil
	}
	r.setCondition(tcp, apiary.ConditionHostsUpToDate, status, reason, msg)
	return nil
}

// hostVersions summarises joined Hosts against the version the control
// plane runs: the most pressing reason first (a failure, then an upgrade
// under way, then a pause), with the lagging Hosts named.
func hostVersions(workers []apiary.Host, running string) (metav1.ConditionStatus, string, string) {
	if len(workers) == 0 {
		return "", "", ""
	}
	slices.SortFunc(workers, func(a, b apiary.Host) int { return strings.Compare(a.Name, b.Name) })
	var lagging []string
	reasons := map[string]bool{}
	at := 0
	for _, h := range workers {
		if h.Status.Version == running && h.Status.UpgradingTo == "" {
			at++
			continue
		}
		c := meta.FindStatusCondition(h.Status.Conditions, apiary.HostConditionUpToDate)
		why := "waiting"
		if c != nil && c.Status == metav1.ConditionFalse {
			why, reasons[c.Reason] = c.Reason, true
		}
		lagging = append(lagging, fmt.Sprintf("%s (%s, %s)", h.Name, h.Status.Version, why))
	}
	if len(lagging) == 0 {
		return metav1.ConditionTrue, ReasonAtVersion, fmt.Sprintf("every joined Host (%d) runs %s", at, running)
	}
	reason := ReasonHostUpgrading
	for _, r := range []string{ReasonUpgradeFailed, ReasonHostUpgrading, ReasonUpgradePaused, ReasonWaitingForControlPlane} {
		if reasons[r] {
			reason = r
			break
		}
	}
	return metav1.ConditionFalse, reason, fmt.Sprintf("%d of %d joined Hosts run %s; lagging: %s", at, len(workers), running, strings.Join(lagging, ", "))
}
