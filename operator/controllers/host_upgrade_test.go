package controllers

import (
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/event"

	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

func TestUpgradeWanted(t *testing.T) {
	r := &HostReconciler{Recorder: events.NewFakeRecorder(10), Now: time.Now}
	tenant := func(spec, running string, paused bool) *apiary.TenantControlPlane {
		tcp := &apiary.TenantControlPlane{}
		tcp.Spec.Version, tcp.Status.Version = spec, running
		if paused {
			tcp.Spec.HostUpgrades = &apiary.HostUpgradePolicy{Paused: true}
		}
		return tcp
	}
	for _, c := range []struct {
		name      string
		host      string
		tcp       *apiary.TenantControlPlane
		start     bool
		reason    string
		inMessage string
	}{
		{"at the version", "v1.37.2", tenant("v1.37.2", "v1.37.2", false), false, ReasonAtVersion, "runs v1.37.2"},
		// At what runs counts, not at what is wanted: the host moves
		// only once the control plane does.
		{"control plane rolling, host at what runs", "v1.36.3", tenant("v1.37.2", "v1.36.3", false), false, ReasonAtVersion, "runs v1.36.3"},
		{"control plane rolling, host behind", "v1.35.4", tenant("v1.37.2", "v1.36.3", false), false, ReasonWaitingForControlPlane, "once the control plane runs v1.37.2"},
		{"control plane done", "v1.36.3", tenant("v1.37.2", "v1.37.2", false), true, "", ""},
		{"paused", "v1.36.3", tenant("v1.37.2", "v1.37.2", true), false, ReasonUpgradePaused, "1 minor(s) behind; a kubelet may be at most 3"},
		{"never downgraded", "v1.37.3", tenant("v1.37.2", "v1.37.2", false), false, ReasonAtVersion, "never downgraded"},
		{"version unknown yet", "", tenant("v1.37.2", "v1.37.2", false), false, "", ""},
	} {
		h := &apiary.Host{}
		h.Status.Version = c.host
		_, start := r.upgradeWanted(h, c.tcp)
		if start != c.start {
			t.Errorf("%s: start %v, want %v", c.name, start, c.start)
		}
		cond := meta.FindStatusCondition(h.Status.Conditions, apiary.HostConditionUpToDate)
		if c.reason == "" {
			if cond != nil {
				t.Errorf("%s: condition %s %s, want none", c.name, cond.Reason, cond.Message)
			}
			continue
		}
		if cond == nil || cond.Reason != c.reason || !strings.Contains(cond.Message, c.inMessage) {
			t.Errorf("%s: condition %+v, want reason %s with %q", c.name, cond, c.reason, c.inMessage)
		}
	}
}

// A control-plane Host just made a worker waits until the tenant's control
// plane has left it before kubeadm runs there.
func TestUpgradeWaitsForTheControlPlaneToLeave(t *testing.T) {
	r := &HostReconciler{Recorder: events.NewFakeRecorder(10), Now: time.Now}
	tcp := &apiary.TenantControlPlane{}
	tcp.Spec.Version, tcp.Status.Version = "v1.37.2", "v1.37.2"
	h := &apiary.Host{ObjectMeta: metav1.ObjectMeta{Name: "cp-2"}}
	h.Status.Version = "v1.36.3"
	for _, c := range []struct {
		step, result string
		start        bool
	}{
		{apiary.HostStepUpdate, StepSucceeded, false},
		{apiary.HostStepStop, StepRunning, false},
		{apiary.HostStepStop, StepSucceeded, true},
	} {
		tcp.Status.ControlPlaneHosts = []apiary.ControlPlaneHostStatus{{Host: "cp-2", Step: c.step, Result: c.result}}
		_, start := r.upgradeWanted(h, tcp)
		if start != c.start {
			t.Errorf("control plane on the host at step %s %s: start %v, want %v", c.step, c.result, start, c.start)
		}
		if cond := meta.FindStatusCondition(h.Status.Conditions, apiary.HostConditionUpToDate); !c.start && (cond == nil || cond.Reason != ReasonWaitingForControlPlane) {
			t.Errorf("step %s %s: condition %+v, want WaitingForControlPlane", c.step, c.result, cond)
		}
	}
}

func TestControlPlaneHostWaitsForTheHandOver(t *testing.T) {
	now := time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC)
	at := func(ago time.Duration) metav1.Time { return metav1.NewTime(now.Add(-ago)) }
	for _, c := range []struct {
		name      string
		hosts     []apiary.ControlPlaneHostStatus
		wait      time.Duration
		inMessage string
	}{
		{"no control plane on the host", nil, 0, ""},
		{"its control plane stopped", []apiary.ControlPlaneHostStatus{{Host: "cp-1", Step: apiary.HostStepStop, Result: StepSucceeded}}, 0, ""},
		{"serving", []apiary.ControlPlaneHostStatus{{Host: "cp-1", Step: apiary.HostStepUpdate, Result: StepSucceeded, Serving: true}},
			upgradeTurnPoll, "waits for the tenant to take it out of its Service"},
		{"another host's kubelet step", []apiary.ControlPlaneHostStatus{
			{Host: "cp-1", Step: apiary.HostStepStart, Result: StepSucceeded, Serving: true},
			{Host: "cp-2", Step: apiary.HostStepKubelet, Result: StepRunning, Started: at(time.Minute)}},
			upgradeTurnPoll, "waits for the tenant"},
		{"out of the Service, draining", []apiary.ControlPlaneHostStatus{{Host: "cp-1", Step: apiary.HostStepKubelet, Result: StepRunning, Started: at(3 * time.Second)}},
			drainFor - 3*time.Second, "connections drain for 7s"},
		{"out of the Service, drained", []apiary.ControlPlaneHostStatus{{Host: "cp-1", Step: apiary.HostStepKubelet, Result: StepRunning, Started: at(drainFor)}}, 0, ""},
		// The tenant's only backend is upgraded in place.
		{"kept serving", []apiary.ControlPlaneHostStatus{{Host: "cp-1", Step: apiary.HostStepKubelet, Result: StepRunning, Serving: true, Started: at(time.Second)}}, 0, ""},
		{"a kubelet step that ended", []apiary.ControlPlaneHostStatus{{Host: "cp-1", Step: apiary.HostStepKubelet, Result: StepSucceeded, Serving: true}},
			upgradeTurnPoll, "waits for the tenant"},
	} {
		t.Run(c.name, func(t *testing.T) {
			tcp := &apiary.TenantControlPlane{}
			tcp.Status.ControlPlaneHosts = c.hosts
			wait, why := handedOver(tcp, "cp-1", now)
			if wait != c.wait || !strings.Contains(why, c.inMessage) {
				t.Errorf("handedOver: %s %q, want %s and %q", wait, why, c.wait, c.inMessage)
			}
		})
	}
}

func TestControlPlaneHostWaitsForAModeSwitch(t *testing.T) {
	r := &HostReconciler{Recorder: events.NewFakeRecorder(10), Now: time.Now}
	tcp := &apiary.TenantControlPlane{}
	tcp.Spec.Version, tcp.Status.Version = "v1.37.2", "v1.37.2"
	tcp.Status.ControlPlaneHosts = []apiary.ControlPlaneHostStatus{{Host: "cp-1", Step: apiary.HostStepStart, Result: StepSucceeded, Serving: true}}
	h := &apiary.Host{ObjectMeta: metav1.ObjectMeta{Name: "cp-1"}, Spec: apiary.HostSpec{Role: apiary.HostRoleControlPlane}}
	h.Status.Version = "v1.36.3"
	// Its control plane on it is no reason to wait: the tenant takes it
	// out of the Service once it asks.
	if _, start := r.upgradeWanted(h, tcp); !start {
		t.Fatalf("a control-plane Host serving a registered tenant does not start its upgrade: %+v", h.Status.Conditions)
	}
	tcp.Status.ModeSwitch = &apiary.ModeSwitchStatus{Target: apiary.ModeStandalone, Phase: apiary.SwitchScalingUp}
	if _, start := r.upgradeWanted(h, tcp); start {
		t.Fatal("a control-plane Host starts its upgrade during a mode switch")
	}
	if cond := meta.FindStatusCondition(h.Status.Conditions, apiary.HostConditionUpToDate); cond == nil || cond.Reason != ReasonWaitingForControlPlane || !strings.Contains(cond.Message, "switch to standalone ends") {
		t.Errorf("condition %+v, want WaitingForControlPlane naming the switch", cond)
	}
}

func TestHostVersions(t *testing.T) {
	host := func(name, version, upgradingTo, reason string) apiary.Host {
		h := apiary.Host{ObjectMeta: metav1.ObjectMeta{Name: name}}
		h.Status.Version, h.Status.UpgradingTo = version, upgradingTo
		if reason != "" {
			h.Status.Conditions = []metav1.Condition{{Type: apiary.HostConditionUpToDate, Status: metav1.ConditionFalse, Reason: reason}}
		}
		return h
	}
	if s, _, _ := hostVersions(nil, "v1.37.2"); s != "" {
		t.Errorf("no workers: status %q, want no condition", s)
	}
	for _, c := range []struct {
		name    string
		workers []apiary.Host
		status  metav1.ConditionStatus
		reason  string
		message string
	}{
		{"all at the version", []apiary.Host{host("w1", "v1.37.2", "", ""), host("w2", "v1.37.2", "", "")},
			metav1.ConditionTrue, ReasonAtVersion, "every joined Host (2) runs v1.37.2"},
		{"one upgrading, one waiting", []apiary.Host{host("w2", "v1.36.3", "", ReasonWaitingForTurn), host("w1", "v1.36.3", "v1.37.2", ReasonHostUpgrading)},
			metav1.ConditionFalse, ReasonHostUpgrading, "0 of 2 joined Hosts run v1.37.2; lagging: w1 (v1.36.3, Upgrading), w2 (v1.36.3, WaitingForTurn)"},
		{"a failure first", []apiary.Host{host("w1", "v1.37.2", "", ""), host("w2", "v1.36.3", "v1.37.2", ReasonUpgradeFailed), host("w3", "v1.36.3", "", ReasonWaitingForTurn)},
			metav1.ConditionFalse, ReasonUpgradeFailed, "1 of 3 joined Hosts run v1.37.2; lagging: w2 (v1.36.3, UpgradeFailed), w3"},
		{"paused", []apiary.Host{host("w1", "v1.36.3", "", ReasonUpgradePaused)},
			metav1.ConditionFalse, ReasonUpgradePaused, "lagging: w1 (v1.36.3, Paused)"},
	} {
		s, reason, msg := hostVersions(c.workers, "v1.37.2")
		if s != c.status || reason != c.reason || !strings.Contains(msg, c.message) {
			t.Errorf("%s: %s %s %q, want %s %s with %q", c.name, s, reason, msg, c.status, c.reason, c.message)
		}
	}
}

func TestStepDue(t *testing.T) {
	now := time.Date(2026, 12, 4, 0, 0, 0, 0, time.UTC)
	r := &HostReconciler{Now: func() time.Time { return now }}
	at := func(ago time.Duration) *metav1.Time { m := metav1.NewTime(now.Add(-ago)); return &m }
	h := &apiary.Host{}
	h.UID = "u1"
	mine := r.startStep(h, "mine") // started by this process, just now
	for _, c := range []struct {
		name  string
		step  *apiary.HostStep
		wait  time.Duration
		start bool
	}{
		{"never started", nil, 0, true},
		{"pending after a spec change", &apiary.HostStep{Name: "x", Result: StepPending, Attempts: 3}, 0, true},
		{"failed, backoff running", &apiary.HostStep{Name: "x", Result: StepFailed, Attempts: 2, Finished: at(5 * time.Second)}, 15 * time.Second, false},
		{"failed, backoff over", &apiary.HostStep{Name: "x", Result: StepFailed, Attempts: 1, Finished: at(time.Minute)}, 0, true},
		{"running, started here", mine, 0, false},
		{"running, left by another operator, recent", &apiary.HostStep{Name: "x", Result: StepRunning, Attempts: 1, Started: *at(4 * time.Second)}, 6 * time.Second, false},
		{"running, left by another operator, long ago", &apiary.HostStep{Name: "x", Result: StepRunning, Attempts: 1, Started: *at(time.Minute)}, 0, true},
	} {
		wait, start := r.stepDue(h.UID, c.step)
		if wait != c.wait || start != c.start {
			t.Errorf("%s: wait %s, start %v; want %s, %v", c.name, wait, start, c.wait, c.start)
		}
	}
}

func TestUpgradeSlotFreed(t *testing.T) {
	host := func(to string) *apiary.Host {
		h := &apiary.Host{}
		h.Status.UpgradingTo = to
		return h
	}
	p := upgradeSlotFreed()
	for _, c := range []struct {
		name     string
		old, new string
		want     bool
	}{
		{"upgrade ended", "v1.37.2", "", true},
		{"upgrade started", "", "v1.37.2", false},
		{"still upgrading", "v1.37.2", "v1.37.2", false},
		{"no upgrade", "", "", false},
	} {
		if got := p.Update(event.UpdateEvent{ObjectOld: host(c.old), ObjectNew: host(c.new)}); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
	if !p.Delete(event.DeleteEvent{Object: host("v1.37.2")}) || p.Delete(event.DeleteEvent{Object: host("")}) {
		t.Error("a deleted Host frees a slot only when it held one")
	}
}
