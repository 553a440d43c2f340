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
