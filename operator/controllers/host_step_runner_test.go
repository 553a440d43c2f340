package controllers

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"

	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

func runnerHost(tenant string, i int) *apiary.Host {
	return &apiary.Host{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", tenant, i), Namespace: "tenants", UID: types.UID(fmt.Sprintf("%s-uid-%d", tenant, i))},
		Spec:       apiary.HostSpec{TenantControlPlane: tenant},
		Status: apiary.HostStatus{Journal: []apiary.HostStep{
			{Name: StepInstall, Started: metav1.NewTime(time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)), Result: StepRunning, Attempts: 1},
		}},
	}
}

// blockingStep is a step that runs until released, then succeeds.
func blockingStep(release <-chan struct{}, started chan<- string) stepFunc {
	return func(ctx context.Context, h *apiary.Host, step *apiary.HostStep) ctrl.Result {
		started <- h.Name
		select {
		case <-release:
		case <-ctx.Done():
			step.Result, step.Message = StepFailed, "cancelled"
			return ctrl.Result{}
		}
		step.Result, step.Message = StepSucceeded, "installed"
		h.Status.Version = "v1.37.2"
		h.Status.Conditions = append(h.Status.Conditions, metav1.Condition{Type: apiary.HostConditionInstalled, Status: metav1.ConditionTrue, Reason: ReasonInstalled})
		return ctrl.Result{RequeueAfter: time.Minute}
	}
}

// A step that never returns (a stalled host) does not hold the caller:
// step returns at once, again while it runs, and once it has ended hands
// over what it did, with a wake-up for the controller.
func TestStepRunnerReturnsWhileTheStepRuns(t *testing.T) {
	s := newStepRunner()
	release, started := make(chan struct{}), make(chan string, 1)
	h := runnerHost("acme", 1)
	fn := blockingStep(release, started)

	for range 2 {
		begun := time.Now()
		res, ended, queued := s.step(context.Background(), h, StepInstall, fn)
		if ended || queued || res.RequeueAfter != stepPoll || time.Since(begun) > time.Second {
			t.Fatalf("while the step runs: res %+v, ended %v, queued %v after %s", res, ended, queued, time.Since(begun))
		}
	}
	<-started
	if h.Status.Version != "" || h.Status.Journal[0].Result != StepRunning {
		t.Fatalf("the Host changed before the step ended: %+v", h.Status)
	}
	close(release)
	select {
	case ev := <-s.wake:
		if ev.Object.GetName() != h.Name {
			t.Fatalf("woke %s", ev.Object.GetName())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no wake-up when the step ended")
	}
	res, ended, _ := s.step(context.Background(), h, StepInstall, fn)
	if !ended || res.RequeueAfter != time.Minute {
		t.Fatalf("after the step: res %+v, ended %v", res, ended)
	}
	if h.Status.Version != "v1.37.2" || h.Status.Journal[0].Result != StepSucceeded || len(h.Status.Conditions) != 1 {
		t.Fatalf("the step's result was not taken: %+v", h.Status)
	}
	if len(s.runs) != 0 || len(s.byTenant) != 0 {
		t.Fatalf("left behind: runs %v, tenants %v", s.runs, s.byTenant)
	}
}

// A tenant with more stalled Hosts than its share queues the rest; another
// tenant's Host runs at once.
func TestStepRunnerTenantsTakeTurns(t *testing.T) {
	s := newStepRunner()
	release, started := make(chan struct{}), make(chan string, 10)
	defer close(release)
	fn := blockingStep(release, started)
	for i := range maxStepsPerTenant {
		if _, ended, queued := s.step(context.Background(), runnerHost("hostile", i), StepInstall, fn); ended || queued {
			t.Fatalf("hostile-%d: ended %v, queued %v", i, ended, queued)
		}
	}
	for range maxStepsPerTenant {
		<-started
	}
	fifth := runnerHost("hostile", maxStepsPerTenant)
	res, _, queued := s.step(context.Background(), fifth, StepInstall, fn)
	if !queued || res.RequeueAfter != stepPoll {
		t.Fatalf("a Host past the tenant's share: queued %v, res %+v", queued, res)
	}
	// One of the four ends: the waiting Host is woken (not left to its
	// poll) and takes the turn.
	release <- struct{}{}
	woken := map[string]bool{}
	for len(woken) < 2 {
		select {
		case ev := <-s.wake:
			woken[ev.Object.GetName()] = true
		case <-time.After(10 * time.Second):
			t.Fatalf("woken %v, want the ended Host and %s", woken, fifth.Name)
		}
	}
	if !woken[fifth.Name] {
		t.Fatalf("woken %v, not the waiting %s", woken, fifth.Name)
	}
	if _, _, queued := s.step(context.Background(), fifth, StepInstall, fn); queued {
		t.Fatalf("%s still waits after a turn was freed", fifth.Name)
	}
	if name := <-started; name != fifth.Name {
		t.Fatalf("started %s, want %s", name, fifth.Name)
	}
	if _, _, queued := s.step(context.Background(), runnerHost("other", 0), StepInstall, fn); queued {
		t.Fatal("another tenant's Host waits for the stalled tenant")
	}
	select {
	case name := <-started:
		if name != "other-0" {
			t.Fatalf("started %s", name)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the other tenant's step did not start")
	}
}

// stop cancels a Host's running step; the step sees its context end.
func TestStepRunnerStopCancels(t *testing.T) {
	s := newStepRunner()
	release, started := make(chan struct{}), make(chan string, 1)
	h := runnerHost("acme", 1)
	fn := blockingStep(release, started)
	s.step(context.Background(), h, StepInstall, fn)
	<-started
	if !s.stop(h) {
		t.Fatal("stop found nothing running")
	}
	deadline := time.Now().Add(10 * time.Second)
	for s.stop(h) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if s.stop(h) || len(s.byTenant) != 0 {
		t.Fatalf("still running after a cancel: %v", s.byTenant)
	}
}

// A Host being deleted stops its steps but its reset, which runs on to
// its end and is taken into the status.
func TestStepRunnerStopKeepsTheReset(t *testing.T) {
	s := newStepRunner()
	release, started := make(chan struct{}), make(chan string, 1)
	h := runnerHost("acme", 1)
	h.Status.Journal = append(h.Status.Journal, apiary.HostStep{Name: StepReset, Started: h.Status.Journal[0].Started, Result: StepRunning, Attempts: 1})
	s.step(context.Background(), h, StepReset, blockingStep(release, started))
	<-started
	if s.stop(h, StepReset) {
		t.Fatal("stop counts the kept reset as a step to wait for")
	}
	close(release)
	deadline := time.Now().Add(10 * time.Second)
	for {
		res, ended, _ := s.step(context.Background(), h, StepReset, nil)
		if ended {
			if step := journalStep(&h.Status, StepReset); step.Result != StepSucceeded || res.RequeueAfter != time.Minute {
				t.Fatalf("the reset ended %s (%s), %+v: the stop cancelled it", step.Result, step.Message, res)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the reset did not end")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// What else changed in the status while the step ran stays; what the step
// changed is taken.
func TestMergeStepResult(t *testing.T) {
	at := metav1.NewTime(time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC))
	before := apiary.HostStatus{
		ObservedGeneration: 1, Phase: apiary.HostPhaseInstalling,
		Conditions: []metav1.Condition{
			{Type: apiary.HostConditionReachable, Status: metav1.ConditionTrue, Reason: "Connected"},
			{Type: apiary.HostConditionInstalled, Status: metav1.ConditionFalse, Reason: "InstallFailed", Message: "first attempt"},
			{Type: apiary.HostConditionNodeReady, Status: metav1.ConditionFalse, Reason: "NodeNotFound"},
		},
		Journal: []apiary.HostStep{
			{Name: StepPreflight, Result: StepSucceeded, Started: at},
			{Name: StepInstall, Result: StepRunning, Started: at, Attempts: 2},
		},
	}
	after := *before.DeepCopy()
	after.Phase, after.Version = apiary.HostPhaseJoining, "v1.37.2"
	after.Conditions[1] = metav1.Condition{Type: apiary.HostConditionInstalled, Status: metav1.ConditionTrue, Reason: ReasonInstalled}
	after.Journal[1].Result = StepSucceeded
	after.Conditions = after.Conditions[:2] // the step removed NodeReady
	// Meanwhile a spec change was observed.
	cur := *before.DeepCopy()
	cur.ObservedGeneration = 2
	cur.Conditions[0].Message = "checked again"

	mergeStepResult(&cur, &before, &after)
	if cur.ObservedGeneration != 2 || cur.Conditions[0].Message != "checked again" {
		t.Errorf("lost what changed meanwhile: %+v", cur)
	}
	if cur.Phase != apiary.HostPhaseJoining || cur.Version != "v1.37.2" || cur.Conditions[1].Reason != ReasonInstalled || cur.Journal[1].Result != StepSucceeded {
		t.Errorf("did not take what the step did: %+v", cur)
	}
	if len(cur.Conditions) != 2 || len(cur.Journal) != 2 || cur.Conditions[0].Type != apiary.HostConditionReachable {
		t.Errorf("conditions or journal reordered, duplicated or not removed: %+v", cur)
	}
}

// Every HostStatus field is either taken from a step's result or owned by
// the reconcile that runs the step: a field added to HostStatus must be
// placed here, or a step's change to it would be lost.
func TestMergeStepResultKnowsEveryField(t *testing.T) {
	merged := []string{"Phase", "Conditions", "NodeName", "NodeUID", "BootstrapTokenID", "Version", "UpgradingTo", "CA", "Facts", "Journal"}
	ownedByReconcile := []string{"ObservedGeneration", "HostKeyCheck"}
	typ := reflect.TypeFor[apiary.HostStatus]()
	for i := range typ.NumField() {
		name := typ.Field(i).Name
		if !slices.Contains(merged, name) && !slices.Contains(ownedByReconcile, name) {
			t.Errorf("HostStatus.%s: neither merged by mergeStepResult nor owned by the reconcile", name)
		}
	}
	// The merged ones are taken: a step that sets each of them.
	var before, cur apiary.HostStatus
	after := apiary.HostStatus{
		Phase: apiary.HostPhaseReady, NodeName: "n", NodeUID: "u", BootstrapTokenID: "t", Version: "v1.37.2", UpgradingTo: "v1.38.0",
		CA:         &apiary.HostCA{Trust: "a", KubeletIssuer: "b"},
		Facts:      &apiary.HostFacts{OS: "Debian"},
		Conditions: []metav1.Condition{{Type: apiary.HostConditionJoined, Status: metav1.ConditionTrue}},
		Journal:    []apiary.HostStep{{Name: StepJoin, Result: StepSucceeded}},
	}
	mergeStepResult(&cur, &before, &after)
	if !equality.Semantic.DeepEqual(cur, after) {
		t.Errorf("merged %+v, want %+v", cur, after)
	}
}
