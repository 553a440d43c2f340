package controllers

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/operator/render"
)

func TestTargetVersion(t *testing.T) {
	tcp := &apiary.TenantControlPlane{}
	tcp.Spec.Version, tcp.Status.Version = "v1.37.3", "v1.37.2"
	if got := targetVersion(tcp); got != "v1.37.3" {
		t.Errorf("no switch: target %s, want spec.version v1.37.3", got)
	}
	tcp.Status.ModeSwitch = &apiary.ModeSwitchStatus{Target: apiary.ModeRegistered, Phase: apiary.SwitchStartingHosts}
	if got := targetVersion(tcp); got != "v1.37.2" {
		t.Errorf("during a switch: target %s, want what runs, v1.37.2", got)
	}
	tcp.Status.ModeSwitch.Phase = apiary.SwitchCompleted
	if got := targetVersion(tcp); got != "v1.37.3" {
		t.Errorf("after a switch: target %s, want v1.37.3", got)
	}
	tcp.Status.ModeSwitch.Phase, tcp.Status.Version = apiary.SwitchScalingUp, ""
	if got := targetVersion(tcp); got != "v1.37.3" {
		t.Errorf("during a switch before anything ran: target %s, want spec.version", got)
	}
}

func TestRollProgress(t *testing.T) {
	pod := func(name, version string, ready bool, waiting *corev1.ContainerStateWaiting) corev1.Pod {
		p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}}
		p.Spec.Containers = []corev1.Container{
			{Name: "konnectivity-server", Image: "registry.k8s.io/kas-network-proxy/proxy-server:v0.36.0"},
			{Name: render.ContainerAPIServer, Image: "registry.k8s.io/kube-apiserver:" + version},
		}
		status := corev1.ConditionFalse
		if ready {
			status = corev1.ConditionTrue
		}
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: status}}
		p.Status.ContainerStatuses = []corev1.ContainerStatus{
			{Name: render.ContainerAPIServer, Image: "registry.k8s.io/kube-apiserver:" + version, State: corev1.ContainerState{Waiting: waiting}, RestartCount: 4,
				LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, Message: "unknown flag: --bogus"}}},
		}
		return p
	}
	pull := &corev1.ContainerStateWaiting{Reason: "ImagePullBackOff", Message: `Back-off pulling image "registry.k8s.io/kube-apiserver:v1.37.3"`}
	crash := &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff", Message: "back-off 40s"}
	deleting := pod("old-going", "v1.37.3", true, nil)
	now := metav1.Now()
	deleting.DeletionTimestamp = &now

	tests := []struct {
		name     string
		pods     []corev1.Pod
		running  int
		reason   string
		stuckHas []string
	}{
		{"old pods only", []corev1.Pod{pod("a", "v1.37.2", true, nil), pod("b", "v1.37.2", true, nil)}, 0, "", nil},
		{"one of two moved", []corev1.Pod{pod("a", "v1.37.2", true, nil), pod("b", "v1.37.3", true, nil)}, 1, "", nil},
		{"new pod starting", []corev1.Pod{pod("a", "v1.37.2", true, nil), pod("b", "v1.37.3", false, &corev1.ContainerStateWaiting{Reason: "ContainerCreating"})}, 0, "", nil},
		{"image cannot be pulled", []corev1.Pod{pod("a", "v1.37.2", true, nil), pod("b", "v1.37.3", false, pull)}, 0, ReasonImagePullFailed,
			[]string{"pod b cannot pull registry.k8s.io/kube-apiserver:v1.37.3", "ImagePullBackOff", "Back-off pulling"}},
		{"new version crashes", []corev1.Pod{pod("a", "v1.37.3", true, nil), pod("b", "v1.37.3", false, crash)}, 1, ReasonNewVersionFailing,
			[]string{"container kube-apiserver of pod b restarts", "4 restarts", "last exit 1: unknown flag: --bogus"}},
		{"a deleted pod does not count", []corev1.Pod{deleting}, 0, "", nil},
		{"old pods are not the new version's failures", []corev1.Pod{pod("a", "v1.37.2", false, pull)}, 0, "", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := rollProgress(tt.pods, "v1.37.3")
			if p.running != tt.running || p.reason != tt.reason {
				t.Errorf("running %d reason %q (%s), want %d %q", p.running, p.reason, p.stuck, tt.running, tt.reason)
			}
			for _, s := range tt.stuckHas {
				if !strings.Contains(p.stuck, s) {
					t.Errorf("stuck %q does not say %q", p.stuck, s)
				}
			}
		})
	}
}

func TestRolledOutDeployment(t *testing.T) {
	for _, c := range []struct {
		name                     string
		observed, generation     int64
		replicas, updated, ready int32
		want                     bool
	}{
		{"all new and ready", 3, 3, 2, 2, 2, true},
		// The moment the e2e upgrade test caught: both new pods exist,
		// one is ready, and an old one still serves.
		{"an old pod still serves", 3, 3, 3, 2, 2, false},
		{"a new pod not ready", 3, 3, 2, 2, 1, false},
		{"template not observed yet", 2, 3, 2, 2, 2, false},
		{"scaling up", 3, 3, 1, 1, 1, false},
	} {
		if got := rolledOutDeployment(c.observed, c.generation, c.replicas, c.updated, c.ready, 2); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}
