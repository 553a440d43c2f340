package controllers

import (
	"testing"

	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

// What the Service selects and how many hosted pods run, at every phase of
// a switch: at every moment something ready serves the tenant's address.
func TestModePhasesKeepABackend(t *testing.T) {
	cases := []struct {
		mode              apiary.Mode
		phase             string // "" no switch
		selects, hostsOff bool
	}{
		{apiary.ModeStandalone, "", true, false},
		{apiary.ModeRegistered, "", false, true},
		{apiary.ModeStandalone, apiary.SwitchStartingHosts, true, false},
		{apiary.ModeStandalone, apiary.SwitchHandingOver, false, false},
		{apiary.ModeStandalone, apiary.SwitchScalingDown, false, true},
		{apiary.ModeRegistered, apiary.SwitchScalingUp, true, false},
		{apiary.ModeRegistered, apiary.SwitchHandingBack, true, false},
		{apiary.ModeRegistered, apiary.SwitchStoppingHosts, true, false},
		{apiary.ModeRegistered, apiary.SwitchCompleted, false, true},
		{apiary.ModeStandalone, apiary.SwitchCompleted, true, false},
	}
	for _, c := range cases {
		st := &apiary.TenantControlPlaneStatus{Mode: c.mode}
		if c.phase != "" {
			st.ModeSwitch = &apiary.ModeSwitchStatus{Phase: c.phase}
		}
		if got := selectsPods(st); got != c.selects {
			t.Errorf("mode %s phase %q: selectsPods %v, want %v", c.mode, c.phase, got, c.selects)
		}
		if got := hostsOnly(st); got != c.hostsOff {
			t.Errorf("mode %s phase %q: hostsOnly %v, want %v", c.mode, c.phase, got, c.hostsOff)
		}
	}
}
