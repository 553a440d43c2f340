//go:build e2e

package e2e

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/apiaryhq/apiary/e2e/framework"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/operator/controllers"
)

// writeRetry is the bounded retry of the tenants' writers while etcd's
// membership changes: a write that fails is tried again for this long.
const writeRetry = 5 * time.Second

// testEtcdScalesAndHeals (issue 12 §3) takes the three-member DataStore
// trio through a lost member and 3→5→3→1→3 while two tenants on it poll
// and write every 100 ms: a member whose claim and pod are deleted comes
// back under a new identity; each scale moves one member at a time (a
// learner first, promoted once caught up; the highest ordinal removed,
// the leader last); no write fails beyond writeRetry and none is lost;
// the tenants' API servers end up on the voting members only.
func (e *env) testEtcdScalesAndHeals(t *testing.T) {
	const second = "on-trio-b"
	t.Cleanup(func() {
		_ = e.C.Delete(e.Ctx, &apiary.TenantControlPlane{ObjectMeta: metav1.ObjectMeta{Namespace: framework.TenantsNS, Name: second}})
	})
	e.CreateTenant(t, second, func(p *apiary.TenantControlPlane) { p.Spec.DataStore = "trio" })
	ca := e.startClientsRetrying(t, "on-trio", "etcd-scale", writeRetry)
	cb := e.startClientsRetrying(t, second, "etcd-scale", writeRetry)
	seq := e.watchMembers(t)

	// A member loses its volume: its claim and pod are deleted. It comes
	// back on an empty volume, which etcd refuses under its old identity;
	// the operator replaces it.
	before := e.dataStore(t)
	oldID := memberID(before, "trio-etcd-2")
	start := time.Now()
	claim := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: framework.SystemNS, Name: "data-trio-etcd-2"}}
	if err := e.C.Delete(e.Ctx, claim); err != nil {
		t.Fatal(err)
	}
	if err := e.C.Delete(e.Ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: framework.SystemNS, Name: "trio-etcd-2"}}); err != nil {
		t.Fatal(err)
	}
	framework.Eventually(t, "trio-etcd-2 replaced", 4*time.Minute, func() error {
		ds := e.dataStore(t)
		if id := memberID(ds, "trio-etcd-2"); id == "" || id == oldID {
			return fmt.Errorf("trio-etcd-2 has ID %q (was %s); members %+v", id, oldID, ds.Status.Members)
		}
		return e.membersSettled(ds, 3)
	})
	t.Logf("FIGURE etcd member whose claim and pod were deleted replaced (new ID, all 3 voting and Ready) in %s", time.Since(start).Round(100*time.Millisecond))
	e.wantEvent(t, controllers.ReasonMemberReplaced, "trio-etcd-2")

	figures := []string{}
	for _, n := range []int32{5, 3, 1, 3} {
		start := time.Now()
		seq.reset()
		e.scaleDataStore(t, n)
		framework.Eventually(t, fmt.Sprintf("trio at %d members", n), 6*time.Minute, func() error {
			return e.membersSettled(e.dataStore(t), n)
		})
		took := time.Since(start)
		steps := seq.steps()
		checkSequence(t, steps, n)
		for _, tenant := range []string{"on-trio", second} {
			e.WaitEtcdServers(t, tenant, int(n), 4*time.Minute)
		}
		figures = append(figures, fmt.Sprintf("→%d %s", n, took.Round(100*time.Millisecond)))
		t.Logf("scaled to %d in %s; voting/learner sequence %v", n, took.Round(100*time.Millisecond), steps)
	}
	time.Sleep(2 * time.Second)
	t.Logf("FIGURE etcd scale steps %s; on-trio %s; %s %s", strings.Join(figures, ", "), ca.check(t), second, cb.check(t))
}

// dataStore reads trio.
func (e *env) dataStore(t *testing.T) *apiary.DataStore {
	t.Helper()
	var ds apiary.DataStore
	if err := e.C.Get(e.Ctx, client.ObjectKey{Name: "trio"}, &ds); err != nil {
		t.Fatal(err)
	}
	return &ds
}

func (e *env) scaleDataStore(t *testing.T, n int32) {
	t.Helper()
	framework.Eventually(t, fmt.Sprintf("trio spec.managed.replicas %d", n), 30*time.Second, func() error {
		ds := e.dataStore(t)
		ds.Spec.Managed.Replicas = n
		return e.C.Update(e.Ctx, ds)
	})
}

func memberID(ds *apiary.DataStore, name string) string {
	for _, m := range ds.Status.Members {
		if m.Name == name {
			return m.ID
		}
	}
	return ""
}

// membersSettled: n voting members, ordinals 0 to n-1, no learner, all
// Ready, the endpoints theirs, and Ready and MembersReady True.
func (e *env) membersSettled(ds *apiary.DataStore, n int32) error {
	var names []string
	for _, m := range ds.Status.Members {
		if m.Learner {
			return fmt.Errorf("learner %s", m.Name)
		}
		names = append(names, m.Name)
	}
	var want []string
	for i := range n {
		want = append(want, fmt.Sprintf("trio-etcd-%d", i))
	}
	if !slices.Equal(names, want) || len(ds.Status.Endpoints) != int(n) || ds.Status.ReadyMembers != n {
		return fmt.Errorf("members %v, endpoints %d, ready %d; want %v", names, len(ds.Status.Endpoints), ds.Status.ReadyMembers, want)
	}
	if err := framework.ConditionIs(ds.Status.Conditions, apiary.ConditionMembersReady, metav1.ConditionTrue, controllers.ReasonAllMembersReady); err != nil {
		return err
	}
	return framework.ConditionIs(ds.Status.Conditions, apiary.ConditionReady, metav1.ConditionTrue, "")
}

// wantEvent fails unless trio has an event of reason whose note names
// what.
func (e *env) wantEvent(t *testing.T, reason, what string) {
	t.Helper()
	framework.Eventually(t, "event "+reason, 30*time.Second, func() error {
		// Cluster-scoped objects' events land in "default".
		var list eventsv1.EventList
		if err := e.C.List(e.Ctx, &list, client.InNamespace("default")); err != nil {
			return err
		}
		for _, ev := range list.Items {
			if ev.Regarding.Kind == "DataStore" && ev.Regarding.Name == "trio" && ev.Reason == reason && strings.Contains(ev.Note, what) {
				return nil
			}
		}
		return fmt.Errorf("no %s event naming %s among %d", reason, what, len(list.Items))
	})
}

// memberCount is one observed (voting, learners) pair of status.members.
type memberCount struct{ voting, learners int }

func (c memberCount) String() string {
	if c.learners == 0 {
		return fmt.Sprint(c.voting)
	}
	return fmt.Sprintf("%d+%dL", c.voting, c.learners)
}

// memberWatch samples trio's status.members every 200 ms.
type memberWatch struct {
	mu   sync.Mutex
	seen []memberCount
}

func (e *env) watchMembers(t *testing.T) *memberWatch {
	w := &memberWatch{}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Millisecond):
			}
			var ds apiary.DataStore
			if err := e.C.Get(e.Ctx, client.ObjectKey{Name: "trio"}, &ds); err != nil {
				continue
			}
			var c memberCount
			for _, m := range ds.Status.Members {
				if m.Learner {
					c.learners++
				} else {
					c.voting++
				}
			}
			w.mu.Lock()
			if len(w.seen) == 0 || w.seen[len(w.seen)-1] != c {
				w.seen = append(w.seen, c)
			}
			w.mu.Unlock()
		}
	}()
	t.Cleanup(func() { close(stop); <-done })
	return w
}

func (w *memberWatch) reset() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if n := len(w.seen); n > 0 {
		w.seen = w.seen[n-1:]
	}
}

func (w *memberWatch) steps() []memberCount {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.seen)
}

// checkSequence: the voting count moves by one at a time toward want, at
// most one learner at a time and only while growing.
func checkSequence(t *testing.T, steps []memberCount, want int32) {
	t.Helper()
	for i := 1; i < len(steps); i++ {
		a, b := steps[i-1], steps[i]
		if d := b.voting - a.voting; d > 1 || d < -1 {
			t.Errorf("voting members jumped %s → %s in %v", a, b, steps)
		}
		if b.learners > 1 {
			t.Errorf("%d learners at once in %v", b.learners, steps)
		}
	}
	if last := steps[len(steps)-1]; last.voting != int(want) || last.learners != 0 {
		t.Errorf("ended at %s, want %d voting", last, want)
	}
}
