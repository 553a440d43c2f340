package controllers

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/operator/metrics"
)

// status.firstReady is stamped by the write that first makes a tenant
// Ready, which observes the time since its creation once; a tenant Ready
// before the field existed gets its Ready condition's time and no
// observation; later writes keep it.
func TestFirstReadyStampedOnce(t *testing.T) {
	ctx := context.Background()
	created := time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC)
	now := created.Add(42 * time.Second)
	ready := metav1.Condition{Type: apiary.ConditionReady, Status: metav1.ConditionTrue, Reason: "Ready", LastTransitionTime: metav1.NewTime(created.Add(40 * time.Second))}
	fresh := &apiary.TenantControlPlane{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "fresh", UID: "u1", CreationTimestamp: metav1.NewTime(created)},
		Status: apiary.TenantControlPlaneStatus{Version: "v1.37.2", Conditions: []metav1.Condition{{Type: apiary.ConditionReady, Status: metav1.ConditionFalse, Reason: "Waiting", LastTransitionTime: metav1.NewTime(created)}}}}
	old := &apiary.TenantControlPlane{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "old", UID: "u2", CreationTimestamp: metav1.NewTime(created.Add(-time.Hour))},
		Status: apiary.TenantControlPlaneStatus{Version: "v1.37.2", Phase: apiary.PhaseReady, Conditions: []metav1.Condition{ready}}}
	c := fake.NewClientBuilder().WithScheme(builtinAndApiary(t)).WithObjects(fresh, old).WithStatusSubresource(fresh, old).Build()
	r := &TenantControlPlaneReconciler{Client: c, Recorder: events.NewFakeRecorder(10), Now: func() time.Time { return now }}
	countBefore := histogramCount(t)

	write := func(name string) *apiary.TenantControlPlane {
		t.Helper()
		var orig apiary.TenantControlPlane
		if err := c.Get(ctx, client.ObjectKey{Namespace: "ns", Name: name}, &orig); err != nil {
			t.Fatal(err)
		}
		tcp := orig.DeepCopy()
		r.setCondition(tcp, apiary.ConditionReady, metav1.ConditionTrue, "Ready", "")
		if err := r.writeStatus(ctx, &orig, tcp); err != nil {
			t.Fatal(err)
		}
		var got apiary.TenantControlPlane
		if err := c.Get(ctx, client.ObjectKey{Namespace: "ns", Name: name}, &got); err != nil {
			t.Fatal(err)
		}
		return &got
	}
	got := write("fresh")
	if got.Status.FirstReady == nil || !got.Status.FirstReady.Time.Equal(now) {
		t.Errorf("fresh: firstReady %v, want %v", got.Status.FirstReady, now)
	}
	if n := histogramCount(t) - countBefore; n != 1 {
		t.Errorf("fresh: %d first-Ready observations, want 1", n)
	}
	now = now.Add(time.Minute)
	if again := write("fresh"); !again.Status.FirstReady.Equal(got.Status.FirstReady) {
		t.Errorf("fresh: firstReady moved from %v to %v", got.Status.FirstReady, again.Status.FirstReady)
	}
	got = write("old")
	if got.Status.FirstReady == nil || !got.Status.FirstReady.Equal(&ready.LastTransitionTime) {
		t.Errorf("old: firstReady %v, want its Ready condition's %v", got.Status.FirstReady, ready.LastTransitionTime)
	}
	if n := histogramCount(t) - countBefore; n != 1 {
		t.Errorf("%d first-Ready observations after the rewrite and the old tenant, want 1", n)
	}
}

// histogramCount is how many first-Ready times have been observed in this
// process.
func histogramCount(t *testing.T) uint64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	if err := metrics.Register(reg, &metrics.Collector{Reader: fake.NewClientBuilder().WithScheme(builtinAndApiary(t)).Build(), Leading: func() bool { return false }}); err != nil {
		t.Fatal(err)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == "apiary_tenant_first_ready_seconds" {
			return f.GetMetric()[0].GetHistogram().GetSampleCount()
		}
	}
	t.Fatal("no apiary_tenant_first_ready_seconds")
	return 0
}
