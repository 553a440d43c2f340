package controllers

import (
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/event"

	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

// installedHost is a Host in phase, with Installed True when installed.
func installedHost(ns, name, tenant, address string, role apiary.HostRole, phase apiary.HostPhase, installed bool) *apiary.Host {
	h := &apiary.Host{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:   apiary.HostSpec{TenantControlPlane: tenant, Address: address, Role: role},
		Status: apiary.HostStatus{Phase: phase}}
	status := metav1.ConditionFalse
	if installed {
		status = metav1.ConditionTrue
	}
	h.Status.Conditions = []metav1.Condition{{Type: apiary.HostConditionInstalled, Status: status, Reason: "Test"}}
	return h
}

// Only installed control-plane Hosts of tenants bound to the DataStore, by
// IP, are admitted to its client port (joined or in Standby): a Host object
// naming an address is not enough.
func TestControlPlaneHostSources(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := apiary.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	deleting := installedHost("t", "deleting", "a", "192.0.2.20", apiary.HostRoleControlPlane, apiary.HostPhaseResetting, true)
	now := metav1.Now()
	deleting.DeletionTimestamp, deleting.Finalizers = &now, []string{HostFinalizer}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(
		installedHost("t", "cp", "a", "192.0.2.10", apiary.HostRoleControlPlane, apiary.HostPhaseReady, true),
		installedHost("t", "cp6", "a", "2001:db8::10", apiary.HostRoleControlPlane, apiary.HostPhaseReady, true),
		installedHost("t", "cp-dup", "a", "192.0.2.10", apiary.HostRoleControlPlane, apiary.HostPhaseReady, true),
		installedHost("t", "standby", "a", "192.0.2.14", apiary.HostRoleControlPlane, apiary.HostPhaseStandby, true),
		installedHost("t", "not-ready", "a", "192.0.2.15", apiary.HostRoleControlPlane, apiary.HostPhaseJoining, true),
		installedHost("t", "installing", "a", "10.200.0.5", apiary.HostRoleControlPlane, apiary.HostPhaseInstalling, false),
		installedHost("t", "refused-key", "a", "10.200.0.6", apiary.HostRoleControlPlane, apiary.HostPhaseFailed, false),
		installedHost("t", "worker", "a", "192.0.2.11", apiary.HostRoleWorker, apiary.HostPhaseReady, true),
		installedHost("t", "by-name", "a", "cp.example.com", apiary.HostRoleControlPlane, apiary.HostPhaseReady, true),
		installedHost("t", "other-datastore", "b", "192.0.2.12", apiary.HostRoleControlPlane, apiary.HostPhaseReady, true),
		installedHost("u", "other-namespace", "a", "192.0.2.13", apiary.HostRoleControlPlane, apiary.HostPhaseReady, true),
		deleting,
	).Build()
	r := &DataStoreReconciler{Client: c}
	ds := &apiary.DataStore{Status: apiary.DataStoreStatus{UsedBy: []string{"t/a"}}}
	got, err := r.controlPlaneHostSources(t.Context(), ds)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"192.0.2.10/32", "192.0.2.14/32", "192.0.2.15/32", "2001:db8::10/128"}; !slices.Equal(got, want) {
		t.Errorf("sources %v, want %v", got, want)
	}
}

func TestHostChangesAdmission(t *testing.T) {
	h := func(role apiary.HostRole, phase apiary.HostPhase, installed bool, journal int) *apiary.Host {
		host := installedHost("t", "h", "a", "192.0.2.10", role, phase, installed)
		host.Status.Journal = make([]apiary.HostStep, journal)
		return host
	}
	const cp, worker = apiary.HostRoleControlPlane, apiary.HostRoleWorker
	p := hostChangesAdmission()
	for _, c := range []struct {
		name     string
		old, new *apiary.Host
		want     bool
	}{
		{"installed as control plane", h(cp, apiary.HostPhaseInstalling, false, 2), h(cp, apiary.HostPhaseStandby, true, 3), true},
		{"back to worker", h(cp, apiary.HostPhaseReady, true, 3), h(worker, apiary.HostPhaseReady, true, 3), true},
		{"joins for the switch", h(cp, apiary.HostPhaseStandby, true, 3), h(cp, apiary.HostPhaseReady, true, 4), false},
		{"a journal write while installing", h(cp, apiary.HostPhaseInstalling, false, 1), h(cp, apiary.HostPhaseInstalling, false, 2), false},
		{"a worker installed", h(worker, apiary.HostPhaseInstalling, false, 2), h(worker, apiary.HostPhaseJoining, true, 3), false},
	} {
		if got := p.Update(event.UpdateEvent{ObjectOld: c.old, ObjectNew: c.new}); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}
