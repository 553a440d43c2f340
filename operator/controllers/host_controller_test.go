package controllers

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

// A step found Running that this process did not start (the operator that
// started it died, maybe of it) is resumed as another attempt, after the
// backoff of the attempts so far: a step that kills the operator is not
// run in a loop.
func TestResumedStepBacksOff(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := apiary.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	started := metav1.NewTime(now.Add(-time.Second))
	h := &apiary.Host{
		ObjectMeta: metav1.ObjectMeta{Name: "h", Namespace: "tenants", UID: "host-1", Generation: 1, Finalizers: []string{HostFinalizer}},
		Spec:       apiary.HostSpec{TenantControlPlane: "acme", Address: "192.0.2.30", InsecureSkipHostKeyCheck: true},
		Status: apiary.HostStatus{ObservedGeneration: 1, Journal: []apiary.HostStep{
			{Name: StepPreflight, Started: started, Result: StepRunning, Attempts: 2},
		}},
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(h).WithStatusSubresource(h).Build()
	r := &HostReconciler{Client: c, APIReader: c, Recorder: events.NewFakeRecorder(100), Now: func() time.Time { return now }}
	req := ctrl.Request{NamespacedName: client.ObjectKeyFromObject(h)}
	step := func() apiary.HostStep {
		t.Helper()
		var got apiary.Host
		if err := c.Get(context.Background(), req.NamespacedName, &got); err != nil {
			t.Fatal(err)
		}
		return got.Status.Journal[0]
	}

	// Two attempts so far: the third waits 20 s from the last start.
	res, err := r.Reconcile(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if res.RequeueAfter != 19*time.Second || step().Attempts != 2 {
		t.Fatalf("resumed at once: %+v, step %+v", res, step())
	}
	now = now.Add(19 * time.Second)
	res, err = r.Reconcile(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	s := step()
	if !res.Requeue || s.Attempts != 3 || s.Result != StepRunning || !s.Started.Time.Equal(now.Truncate(time.Second)) {
		t.Fatalf("after the backoff: %+v, step %+v", res, s)
	}
	// Started by this process now: the next reconcile runs it (off the
	// worker; with no key Secret, it fails) rather than waiting again,
	// and a later one records the end.
	deadline := time.Now().Add(10 * time.Second)
	for step().Result == StepRunning && time.Now().Before(deadline) {
		if _, err := r.Reconcile(context.Background(), req); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if s := step(); s.Result != StepFailed || s.Attempts != 3 {
		t.Fatalf("the step this process started was not run: %+v", s)
	}
}
