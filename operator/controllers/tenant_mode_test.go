package controllers

import (
	"testing"

	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

// Whether hosted pods run, at every phase of a switch: they go only once
// the hosts serve, and come back before the hosts stop.
func TestModePhasesKeepABackend(t *testing.T) {
	cases := []struct {
		mode     apiary.Mode
		phase    string // "" no switch
		hostsOff bool
	}{
		{apiary.ModeStandalone, "", false},
		{apiary.ModeRegistered, "", true},
		{apiary.ModeStandalone, apiary.SwitchStartingHosts, false},
		{apiary.ModeStandalone, apiary.SwitchScalingDown, true},
		{apiary.ModeRegistered, apiary.SwitchScalingUp, false},
		{apiary.ModeRegistered, apiary.SwitchHandingBack, false},
		{apiary.ModeRegistered, apiary.SwitchStoppingHosts, false},
		{apiary.ModeRegistered, apiary.SwitchCompleted, true},
		{apiary.ModeStandalone, apiary.SwitchCompleted, false},
	}
	for _, c := range cases {
		st := &apiary.TenantControlPlaneStatus{Mode: c.mode}
		if c.phase != "" {
			st.ModeSwitch = &apiary.ModeSwitchStatus{Phase: c.phase}
		}
		if got := hostsOnly(st); got != c.hostsOff {
			t.Errorf("mode %s phase %q: hostsOnly %v, want %v", c.mode, c.phase, got, c.hostsOff)
		}
	}
}

// A control-plane Host that runs the control plane keeps it through a
// NotReady Node, an upgrade and a failed later step; one that does not
// yet starts only once Ready; one that has left does not (issue 12: a CA
// rotation's NotReady blip stopped a serving host's control plane).
func TestWantsControlPlane(t *testing.T) {
	cases := []struct {
		phase apiary.HostPhase
		node  string
		runs  bool
		want  bool
	}{
		{apiary.HostPhaseReady, "cp-1", false, true},
		{apiary.HostPhaseReady, "cp-1", true, true},
		{apiary.HostPhaseJoining, "", false, false},     // joining for the first time
		{apiary.HostPhaseJoining, "cp-1", false, false}, // joined, Node not Ready yet
		{apiary.HostPhaseJoining, "cp-1", true, true},   // Node NotReady for a while
		{apiary.HostPhaseUpgrading, "cp-1", true, true},
		{apiary.HostPhaseFailed, "cp-1", true, true}, // a CA or upgrade step failed
		{apiary.HostPhaseFailed, "", true, false},
		{apiary.HostPhaseFailed, "cp-1", false, false},
		{apiary.HostPhaseDraining, "cp-1", true, false},
		{apiary.HostPhaseResetting, "cp-1", true, false},
		{apiary.HostPhaseStandby, "", true, false},
		{apiary.HostPhasePreflight, "cp-1", true, false},
	}
	for _, c := range cases {
		h := &apiary.Host{Status: apiary.HostStatus{Phase: c.phase, NodeName: c.node}}
		if got := wantsControlPlane(h, c.runs); got != c.want {
			t.Errorf("phase %s, NodeName %q, runs %v: wantsControlPlane %v, want %v", c.phase, c.node, c.runs, got, c.want)
		}
	}
}
