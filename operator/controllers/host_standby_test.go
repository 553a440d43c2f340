package controllers

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/event"

	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

// A control-plane Host is joined while its tenant targets registered or
// still runs its control plane there, and not otherwise; a worker always.
func TestJoinWanted(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := apiary.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	tenant := func(name string, mode apiary.Mode, cp ...apiary.ControlPlaneHostStatus) *apiary.TenantControlPlane {
		return &apiary.TenantControlPlane{ObjectMeta: metav1.ObjectMeta{Namespace: "t", Name: name},
			Spec: apiary.TenantControlPlaneSpec{Mode: mode}, Status: apiary.TenantControlPlaneStatus{ControlPlaneHosts: cp}}
	}
	deleting := tenant("deleting", apiary.ModeRegistered)
	now := metav1.Now()
	deleting.DeletionTimestamp, deleting.Finalizers = &now, []string{"apiary.dev/test"}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(
		deleting,
		tenant("standalone", ""),
		tenant("registered", apiary.ModeRegistered),
		tenant("going-back", apiary.ModeStandalone, apiary.ControlPlaneHostStatus{Host: "h", Step: apiary.HostStepStart, Result: StepSucceeded}),
		tenant("stop-failed", apiary.ModeStandalone, apiary.ControlPlaneHostStatus{Host: "h", Step: apiary.HostStepStop, Result: StepFailed}),
		tenant("stopped", apiary.ModeStandalone, apiary.ControlPlaneHostStatus{Host: "h", Step: apiary.HostStepStop, Result: StepSucceeded},
			apiary.ControlPlaneHostStatus{Host: "other", Step: apiary.HostStepStart, Result: StepRunning}),
	).Build()
	r := &HostReconciler{Client: c}
	for _, tc := range []struct {
		tenant string
		role   apiary.HostRole
		joined bool
		want   bool
	}{
		{"deleting", apiary.HostRoleControlPlane, false, false},
		{"deleting", apiary.HostRoleControlPlane, true, true},
		{"standalone", apiary.HostRoleWorker, false, true},
		{"standalone", apiary.HostRoleControlPlane, false, false},
		{"registered", apiary.HostRoleControlPlane, false, true},
		{"going-back", apiary.HostRoleControlPlane, false, true},
		{"stop-failed", apiary.HostRoleControlPlane, false, true},
		{"stopped", apiary.HostRoleControlPlane, false, false},
		{"missing", apiary.HostRoleControlPlane, false, true},
	} {
		h := &apiary.Host{ObjectMeta: metav1.ObjectMeta{Namespace: "t", Name: "h"},
			Spec: apiary.HostSpec{TenantControlPlane: tc.tenant, Role: tc.role}}
		if tc.joined {
			h.Status.Journal = []apiary.HostStep{{Name: StepJoin, Result: StepSucceeded}}
		}
		got, why := r.joinWanted(t.Context(), h)
		if got != tc.want || got != (why == "") {
			t.Errorf("%s, %s, joined %v: joinWanted %v (%q), want %v", tc.tenant, tc.role, tc.joined, got, why, tc.want)
		}
	}
}

func TestTenantChangesJoins(t *testing.T) {
	tcp := func(mode apiary.Mode, cp ...apiary.ControlPlaneHostStatus) *apiary.TenantControlPlane {
		return &apiary.TenantControlPlane{Spec: apiary.TenantControlPlaneSpec{Mode: mode}, Status: apiary.TenantControlPlaneStatus{ControlPlaneHosts: cp}}
	}
	running := apiary.ControlPlaneHostStatus{Host: "h", Step: apiary.HostStepStop, Result: StepRunning}
	stopped := apiary.ControlPlaneHostStatus{Host: "h", Step: apiary.HostStepStop, Result: StepSucceeded}
	serving := apiary.ControlPlaneHostStatus{Host: "h", Step: apiary.HostStepStart, Result: StepSucceeded, Serving: true}
	notServing := serving
	notServing.Serving = false
	p := tenantChangesJoins()
	for _, c := range []struct {
		name     string
		old, new *apiary.TenantControlPlane
		want     bool
	}{
		{"spec.mode", tcp(apiary.ModeStandalone), tcp(apiary.ModeRegistered), true},
		{"a host's stop done", tcp(apiary.ModeStandalone, running), tcp(apiary.ModeStandalone, stopped), true},
		{"a probe", tcp(apiary.ModeRegistered, serving), tcp(apiary.ModeRegistered, notServing), false},
		{"nothing", tcp(apiary.ModeStandalone), tcp(apiary.ModeStandalone), false},
	} {
		if got := p.Update(event.UpdateEvent{ObjectOld: c.old, ObjectNew: c.new}); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}
