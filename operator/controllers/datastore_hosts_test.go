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

// Only joined control-plane Hosts of tenants bound to the DataStore, by IP,
// are admitted to its client port: a Host object naming an address is not
// enough.
func TestControlPlaneHostSources(t *testing.T) {
	host := func(ns, name, tenant, address string, role apiary.HostRole, phase apiary.HostPhase) *apiary.Host {
		return &apiary.Host{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec:   apiary.HostSpec{TenantControlPlane: tenant, Address: address, Role: role},
			Status: apiary.HostStatus{Phase: phase}}
	}
	scheme := runtime.NewScheme()
	if err := apiary.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(
		host("t", "cp", "a", "192.0.2.10", apiary.HostRoleControlPlane, apiary.HostPhaseReady),
		host("t", "cp6", "a", "2001:db8::10", apiary.HostRoleControlPlane, apiary.HostPhaseReady),
		host("t", "cp-dup", "a", "192.0.2.10", apiary.HostRoleControlPlane, apiary.HostPhaseReady),
		host("t", "not-joined", "a", "10.200.0.5", apiary.HostRoleControlPlane, apiary.HostPhaseInstalling),
		host("t", "worker", "a", "192.0.2.11", apiary.HostRoleWorker, apiary.HostPhaseReady),
		host("t", "by-name", "a", "cp.example.com", apiary.HostRoleControlPlane, apiary.HostPhaseReady),
		host("t", "other-datastore", "b", "192.0.2.12", apiary.HostRoleControlPlane, apiary.HostPhaseReady),
		host("u", "other-namespace", "a", "192.0.2.13", apiary.HostRoleControlPlane, apiary.HostPhaseReady),
	).Build()
	r := &DataStoreReconciler{Client: c}
	ds := &apiary.DataStore{Status: apiary.DataStoreStatus{UsedBy: []string{"t/a"}}}
	got, err := r.controlPlaneHostSources(t.Context(), ds)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"192.0.2.10/32", "2001:db8::10/128"}; !slices.Equal(got, want) {
		t.Errorf("sources %v, want %v", got, want)
	}
}

func TestHostChangesAdmission(t *testing.T) {
	h := func(role apiary.HostRole, phase apiary.HostPhase, journal int) *apiary.Host {
		return &apiary.Host{Spec: apiary.HostSpec{Role: role}, Status: apiary.HostStatus{Phase: phase, Journal: make([]apiary.HostStep, journal)}}
	}
	p := hostChangesAdmission()
	for _, c := range []struct {
		name     string
		old, new *apiary.Host
		want     bool
	}{
		{"joined as control plane", h(apiary.HostRoleControlPlane, apiary.HostPhaseJoining, 2), h(apiary.HostRoleControlPlane, apiary.HostPhaseReady, 3), true},
		{"back to worker", h(apiary.HostRoleControlPlane, apiary.HostPhaseReady, 3), h(apiary.HostRoleWorker, apiary.HostPhaseReady, 3), true},
		{"a journal write while installing", h(apiary.HostRoleControlPlane, apiary.HostPhaseInstalling, 1), h(apiary.HostRoleControlPlane, apiary.HostPhaseInstalling, 2), false},
		{"a worker joins", h(apiary.HostRoleWorker, apiary.HostPhaseJoining, 2), h(apiary.HostRoleWorker, apiary.HostPhaseReady, 3), false},
	} {
		if got := p.Update(event.UpdateEvent{ObjectOld: c.old, ObjectNew: c.new}); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}
