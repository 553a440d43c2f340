package controllers

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/event"

	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

const (
	// StepWaitsForTurn begins the message of a step that waits for its
	// tenant's turn.
	StepWaitsForTurn = "waits for its turn"
	// maxStepsPerTenant bounds the SSH steps one tenant's Hosts run at
	// once (as many as the controller had workers when steps ran on them).
	maxStepsPerTenant = 4
	// stepPoll is how often a Host whose step runs, or waits its turn,
	// looks again should its wake-up be lost (a full channel).
	stepPoll = 30 * time.Second
)

// stepFunc is a Host step: it works on the Host it is given and leaves its
// outcome in that Host's status (the step's journal entry, conditions).
type stepFunc func(context.Context, *apiary.Host, *apiary.HostStep) ctrl.Result

// stepRunner runs the Host steps that talk to the host over SSH off the
// reconcile workers. Such a step may take minutes (installTimeout), and how
// long is up to the host's owner: a stalled sshd or a slow disk holds it to
// its time limit. On a worker, a few such Hosts of one tenant would hold
// every worker of the controller, and so every other tenant's Hosts. Here a
// step runs in its own goroutine on a copy of the Host; the worker returns
// at once and a later reconcile (woken when the step ends) takes the result
// into the Host's status. Each tenant runs at most maxStepsPerTenant steps
// at a time: its other Hosts wait their turn, other tenants do not. A Host
// waiting its turn is woken when one of its tenant's steps ends, not
// polled: a tenant with many Hosts costs no reconciles while it waits.
//
// Only this process's runs are known: a step left Running by an earlier
// operator is resumed by the journal (stepDue), as before.
type stepRunner struct {
	mu       sync.Mutex
	runs     map[string]*stepRun // by runKey
	byTenant map[string]int      // running steps, by tenant key
	// waiting holds the Hosts waiting their turn, by tenant key and Host
	// UID, to wake one when a step of their tenant ends.
	waiting map[string]map[string]*apiary.Host
	// wake receives a Host whose step ended, for the controller's
	// channel source.
	wake chan event.GenericEvent
}

type stepRun struct {
	before apiary.HostStatus // the status the step started from
	after  apiary.HostStatus // the status it left, once done
	res    ctrl.Result
	done   bool
	cancel context.CancelFunc
}

func newStepRunner() *stepRunner {
	return &stepRunner{runs: map[string]*stepRun{}, byTenant: map[string]int{}, waiting: map[string]map[string]*apiary.Host{},
		wake: make(chan event.GenericEvent, 64)}
}

// runKey names one attempt of one step of one Host: a later attempt (its
// own start) is another run.
func runKey(h *apiary.Host, step *apiary.HostStep) string {
	return fmt.Sprintf("%s@%d", startKey(h.UID, step.Name), step.Started.Unix())
}

func tenantKey(h *apiary.Host) string { return h.Namespace + "/" + h.Spec.TenantControlPlane }

// step runs fn for h's journal step name (Running, started by this
// process) off the worker. It says whether the step has ended: then h's
// status holds what the step did and res is the step's result. Until then
// it has started the step, found it running (the controller is woken when
// it ends), or queued it behind its tenant's other steps (queued: res says
// when to look again).
func (s *stepRunner) step(ctx context.Context, h *apiary.Host, name string, fn stepFunc) (res ctrl.Result, ended bool, queued bool) {
	step := journalStep(&h.Status, name)
	key := runKey(h, step)
	s.mu.Lock()
	defer s.mu.Unlock()
	if run, ok := s.runs[key]; ok {
		if !run.done {
			return ctrl.Result{RequeueAfter: stepPoll}, false, false
		}
		delete(s.runs, key)
		mergeStepResult(&h.Status, &run.before, &run.after)
		return run.res, true, false
	}
	tenant := tenantKey(h)
	if s.byTenant[tenant] >= maxStepsPerTenant {
		if s.waiting[tenant] == nil {
			s.waiting[tenant] = map[string]*apiary.Host{}
		}
		s.waiting[tenant][string(h.UID)] = &apiary.Host{ObjectMeta: metav1.ObjectMeta{Namespace: h.Namespace, Name: h.Name}}
		return ctrl.Result{RequeueAfter: stepPoll}, false, true
	}
	s.forgetWaiting(tenant, string(h.UID))
	s.byTenant[tenant]++
	// The controller's context: it ends when the operator stops (or
	// loses its lease), and the step with it.
	runCtx, cancel := context.WithCancel(ctx)
	copied := h.DeepCopy()
	run := &stepRun{before: *h.Status.DeepCopy(), cancel: cancel}
	s.runs[key] = run
	go func() {
		defer cancel()
		res := fn(runCtx, copied, journalStep(&copied.Status, name))
		s.mu.Lock()
		run.after, run.res, run.done = copied.Status, res, true
		s.byTenant[tenant]--
		if s.byTenant[tenant] == 0 {
			delete(s.byTenant, tenant)
		}
		// The freed turn goes to a Host that waits for it (it is
		// forgotten here: should another take the turn first, it waits
		// again and is remembered again).
		var next *apiary.Host
		for uid, w := range s.waiting[tenant] {
			next = w
			s.forgetWaiting(tenant, uid)
			break
		}
		s.mu.Unlock()
		s.send(copied)
		if next != nil {
			s.send(next)
		}
	}()
	return ctrl.Result{RequeueAfter: stepPoll}, false, false
}

// send wakes a Host; a full channel leaves it to its requeue (stepPoll).
func (s *stepRunner) send(h *apiary.Host) {
	select {
	case s.wake <- event.GenericEvent{Object: h}:
	default:
	}
}

// forgetWaiting drops a Host from its tenant's waiting list. Call with mu
// held.
func (s *stepRunner) forgetWaiting(tenant, uid string) {
	delete(s.waiting[tenant], uid)
	if len(s.waiting[tenant]) == 0 {
		delete(s.waiting, tenant)
	}
}

// stop cancels h's running steps but those named in keep, and says
// whether any of them is still running; a Host being deleted waits for
// them before it touches the host (its own reset step is kept).
func (s *stepRunner) stop(h *apiary.Host, keep ...string) (running bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.forgetWaiting(tenantKey(h), string(h.UID))
	prefix := string(h.UID) + "/"
	for key, run := range s.runs {
		rest, ours := strings.CutPrefix(key, prefix)
		step, _, _ := strings.Cut(rest, "@") // runKey: uid/step@start
		switch {
		case !ours || slices.Contains(keep, step):
		case run.done:
			delete(s.runs, key)
		default:
			run.cancel()
			running = true
		}
	}
	return running
}

// mergeStepResult puts into cur what a step changed between before (the
// status it started from) and after (the status it left): scalar fields,
// conditions and journal entries that differ, or that it removed. Whatever else changed in cur
// meanwhile (a spec change resets failed steps) stays.
func mergeStepResult(cur, before, after *apiary.HostStatus) {
	takeChanged(&cur.Phase, before.Phase, after.Phase)
	takeChanged(&cur.NodeName, before.NodeName, after.NodeName)
	takeChanged(&cur.NodeUID, before.NodeUID, after.NodeUID)
	takeChanged(&cur.BootstrapTokenID, before.BootstrapTokenID, after.BootstrapTokenID)
	takeChanged(&cur.Version, before.Version, after.Version)
	takeChanged(&cur.UpgradingTo, before.UpgradingTo, after.UpgradingTo)
	if !equality.Semantic.DeepEqual(after.CA, before.CA) {
		cur.CA = after.CA.DeepCopy()
	}
	if !equality.Semantic.DeepEqual(after.Facts, before.Facts) {
		cur.Facts = after.Facts.DeepCopy()
	}
	for _, c := range after.Conditions {
		if old := meta.FindStatusCondition(before.Conditions, c.Type); old == nil || !equality.Semantic.DeepEqual(*old, c) {
			if i := slices.IndexFunc(cur.Conditions, func(o metav1.Condition) bool { return o.Type == c.Type }); i >= 0 {
				cur.Conditions[i] = c
			} else {
				cur.Conditions = append(cur.Conditions, c)
			}
		}
	}
	for _, c := range before.Conditions {
		if meta.FindStatusCondition(after.Conditions, c.Type) == nil {
			meta.RemoveStatusCondition(&cur.Conditions, c.Type)
		}
	}
	for _, st := range after.Journal {
		if old := journalStep(before, st.Name); old == nil || !equality.Semantic.DeepEqual(*old, st) {
			if i := slices.IndexFunc(cur.Journal, func(o apiary.HostStep) bool { return o.Name == st.Name }); i >= 0 {
				cur.Journal[i] = *st.DeepCopy()
			} else {
				cur.Journal = append(cur.Journal, *st.DeepCopy())
			}
		}
	}
	for _, st := range before.Journal {
		if journalStep(after, st.Name) == nil {
			cur.Journal = slices.DeleteFunc(cur.Journal, func(o apiary.HostStep) bool { return o.Name == st.Name })
		}
	}
}

// takeChanged sets *cur to after when the step changed the field.
func takeChanged[T comparable](cur *T, before, after T) {
	if after != before {
		*cur = after
	}
}
