package controllers

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/apiaryhq/apiary/datastore"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/operator/render/managedetcd"
)

const testDomain = "cluster.local"

func scaleFixture(replicas int32) *apiary.DataStore {
	return &apiary.DataStore{
		ObjectMeta: metav1.ObjectMeta{Name: "d", UID: "uid-d"},
		Spec:       apiary.DataStoreSpec{Managed: &apiary.ManagedEtcd{Namespace: "apiary-system", Replicas: replicas}},
	}
}

// fakeEtcd is a cluster as the planner sees it: members by ordinal, their
// pods, claims and raft states.
type fakeEtcd struct {
	ds      *apiary.DataStore
	members []datastore.Member
	lost    map[int32]bool
	down    map[int32]bool
	leader  int32
	nextID  uint64
}

func newFakeEtcd(ds *apiary.DataStore, voters ...int32) *fakeEtcd {
	f := &fakeEtcd{ds: ds, lost: map[int32]bool{}, down: map[int32]bool{}, nextID: 100}
	for _, i := range voters {
		f.add(i, false)
	}
	f.leader = voters[0]
	return f
}

func (f *fakeEtcd) add(i int32, learner bool) {
	f.nextID++
	f.members = append(f.members, datastore.Member{ID: f.nextID, PeerURLs: []string{managedetcd.PeerURL(f.ds, i, testDomain)}, Learner: learner})
}

func (f *fakeEtcd) id(i int32) uint64 {
	for _, m := range f.members {
		if memberOf(f.ds, m, testDomain) == managedetcd.MemberName(f.ds, i) {
			return m.ID
		}
	}
	return 0
}

func (f *fakeEtcd) plan() memberStep {
	var pods []memberPod
	states := map[string]datastore.MemberState{}
	for _, m := range f.members {
		name := memberOf(f.ds, m, testDomain)
		i := managedetcd.MemberOrdinal(f.ds, name)
		pods = append(pods, memberPod{Name: name, UID: types.UID("uid-" + name), Ready: !f.down[i] && !f.lost[i], LostData: f.lost[i]})
		if !f.down[i] && !f.lost[i] && !m.Learner {
			states[name] = datastore.MemberState{
				Endpoint: "https://" + name + ":2379", ID: m.ID, Leader: f.id(f.leader), AppliedIndex: uint64(10 + i),
			}
		}
	}
	return planMembership(f.ds, testDomain, f.members, pods, nil, states)
}

func (f *fakeEtcd) voters() []int32 {
	var out []int32
	for _, m := range f.members {
		if !m.Learner {
			out = append(out, managedetcd.MemberOrdinal(f.ds, memberOf(f.ds, m, testDomain)))
		}
	}
	slices.Sort(out)
	return out
}

// apply carries out a step the way etcd would.
func (f *fakeEtcd) apply(t *testing.T, s memberStep) {
	t.Helper()
	remove := func(id uint64) {
		f.members = slices.DeleteFunc(f.members, func(m datastore.Member) bool { return m.ID == id })
	}
	switch {
	case s.Replace != nil:
		remove(s.Replace.ID)
		f.add(s.Replace.Ordinal, true)
		f.lost[s.Replace.Ordinal] = false
	case s.Promote != nil:
		for i := range f.members {
			if f.members[i].ID == s.Promote.ID {
				f.members[i].Learner = false
			}
		}
	case s.Add != nil:
		f.add(*s.Add, true)
	case s.MoveLeader != nil:
		for _, m := range f.members {
			if m.ID == s.MoveLeader.To {
				f.leader = managedetcd.MemberOrdinal(f.ds, memberOf(f.ds, m, testDomain))
			}
		}
	case s.Remove != nil:
		if s.Remove.ID == f.id(f.leader) {
			t.Fatalf("removed the leader %s without moving the leadership", s.Remove.Name)
		}
		remove(s.Remove.ID)
	default:
		t.Fatalf("no step to apply: %+v", s)
	}
}

// Scaling walks 1→3→5→3→1 one member at a time: the voting count never
// jumps by more than one, an even count lasts one step, learners are
// promoted before anything else, the leader is moved before it is removed.
func TestPlanMembershipWalk(t *testing.T) {
	ds := scaleFixture(1)
	f := newFakeEtcd(ds, 0)
	f.leader = 0
	var counts []int
	for _, want := range []int32{3, 5, 3, 1} {
		ds.Spec.Managed.Replicas = want
		// The highest ordinal leads on the way down, to force a move.
		if want < int32(len(f.voters())) {
			f.leader = f.voters()[len(f.voters())-1]
		}
		for steps := 0; ; steps++ {
			if steps > 20 {
				t.Fatalf("scaling to %d does not converge: voters %v", want, f.voters())
			}
			s := f.plan()
			if s.Done {
				break
			}
			if s.Wait != "" {
				t.Fatalf("scaling to %d waits: %s", want, s.Wait)
			}
			f.apply(t, s)
			if n := len(f.voters()); len(counts) == 0 || counts[len(counts)-1] != n {
				counts = append(counts, n)
			}
		}
		if !slices.Equal(f.voters(), ordinals(want)) {
			t.Fatalf("scaled to %d: voters %v", want, f.voters())
		}
	}
	if want := []int{1, 2, 3, 4, 5, 4, 3, 2, 1}; !slices.Equal(counts, want) {
		t.Errorf("voting counts %v, want %v", counts, want)
	}
}

func ordinals(n int32) []int32 {
	var out []int32
	for i := range n {
		out = append(out, i)
	}
	return out
}

func TestPlanMembership(t *testing.T) {
	t.Run("a member that lost its data is replaced", func(t *testing.T) {
		f := newFakeEtcd(scaleFixture(3), 0, 1, 2)
		f.lost[2] = true
		s := f.plan()
		if s.Replace == nil || s.Replace.Name != "d-etcd-2" || s.Reason != ReasonReplacingMember {
			t.Fatalf("step %+v, want d-etcd-2 replaced", s)
		}
		f.apply(t, s)
		if s := f.plan(); s.Promote == nil || s.Promote.Name != "d-etcd-2" {
			t.Fatalf("after the replacement: %+v, want d-etcd-2 promoted", s)
		}
	})
	t.Run("no replacement without a quorum of the others", func(t *testing.T) {
		f := newFakeEtcd(scaleFixture(3), 0, 1, 2)
		f.lost[2], f.down[1] = true, true
		if s := f.plan(); s.Replace != nil || !strings.Contains(s.Wait, "no quorum") || s.Reason != ReasonMemberLostData {
			t.Fatalf("step %+v, want a wait for quorum", s)
		}
	})
	t.Run("a lone member that lost its data is reported", func(t *testing.T) {
		f := newFakeEtcd(scaleFixture(1), 0)
		f.lost[0] = true
		if s := f.plan(); s.Replace != nil || !strings.Contains(s.Wait, "lost its data") {
			t.Fatalf("step %+v, want a report", s)
		}
	})
	t.Run("no change while a voting member is down", func(t *testing.T) {
		f := newFakeEtcd(scaleFixture(5), 0, 1, 2)
		f.down[1] = true
		if s := f.plan(); s.Add != nil || !strings.Contains(s.Wait, "d-etcd-1") {
			t.Fatalf("step %+v, want a wait for d-etcd-1", s)
		}
	})
	t.Run("an ordinal comes back only once its old pod and claim are gone", func(t *testing.T) {
		ds := scaleFixture(3)
		f := newFakeEtcd(ds, 0, 1)
		pods := []memberPod{{Name: "d-etcd-0", Ready: true}, {Name: "d-etcd-1", Ready: true}}
		states := map[string]datastore.MemberState{
			"d-etcd-0": {ID: f.id(0), Leader: f.id(0)}, "d-etcd-1": {ID: f.id(1), Leader: f.id(0)},
		}
		left := append(slices.Clone(pods), memberPod{Name: "d-etcd-2", Deleting: true})
		if s := planMembership(ds, testDomain, f.members, left, nil, states); s.Add != nil || !strings.Contains(s.Wait, "pod d-etcd-2") {
			t.Errorf("with the old pod: %+v", s)
		}
		if s := planMembership(ds, testDomain, f.members, pods, []string{"data-d-etcd-2"}, states); s.Add != nil || !strings.Contains(s.Wait, "claim data-d-etcd-2") {
			t.Errorf("with the old claim: %+v", s)
		}
		if s := planMembership(ds, testDomain, f.members, pods, nil, states); s.Add == nil || *s.Add != 2 {
			t.Errorf("without them: %+v, want d-etcd-2 added", s)
		}
	})
	t.Run("a learner is promoted by the leader only", func(t *testing.T) {
		f := newFakeEtcd(scaleFixture(3), 0, 1)
		f.leader = 1
		f.add(2, true)
		if s := f.plan(); s.Promote == nil || s.LeaderEndpoint != "https://d-etcd-1:2379" {
			t.Fatalf("step %+v, want d-etcd-2 promoted through the leader d-etcd-1", s)
		}
		f.down[1] = true
		if s := f.plan(); s.Promote != nil || !strings.Contains(s.Wait, "leads") {
			t.Fatalf("with the leader down: %+v, want a wait", s)
		}
	})
	t.Run("a foreign member is reported, not touched", func(t *testing.T) {
		f := newFakeEtcd(scaleFixture(3), 0, 1, 2)
		f.members = append(f.members, datastore.Member{ID: 0xbad, PeerURLs: []string{"https://10.0.0.9:2380"}})
		if s := f.plan(); !strings.Contains(s.Wait, "bad") || s.Remove != nil {
			t.Fatalf("step %+v, want the foreign member reported", s)
		}
	})
	t.Run("members disagreeing on the leader wait", func(t *testing.T) {
		ds := scaleFixture(1)
		f := newFakeEtcd(ds, 0, 1, 2)
		var pods []memberPod
		states := map[string]datastore.MemberState{}
		for i := range int32(3) {
			name := managedetcd.MemberName(ds, i)
			pods = append(pods, memberPod{Name: name, Ready: true})
			states[name] = datastore.MemberState{ID: f.id(i), Leader: f.id(i % 2)}
		}
		if s := planMembership(ds, testDomain, f.members, pods, nil, states); s.Remove != nil || s.MoveLeader != nil || !strings.Contains(s.Wait, "leader") {
			t.Fatalf("step %+v, want a wait", s)
		}
	})
}

func TestLostData(t *testing.T) {
	term := func(code int32, msg string) corev1.ContainerStatus {
		return corev1.ContainerStatus{LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code, Message: msg}}}
	}
	// The tails of etcd 3.6.16's own logs, reproduced with the binary.
	bootstrapped := `{"level":"fatal","msg":"discovery failed","error":"member 8e9e05c52164694d has already been bootstrapped"}`
	truncated := `{"level":"panic","msg":"tocommit(12) is out of range [lastIndex(0)]. Was the raft log corrupted, truncated, or lost?"}`
	for _, tc := range []struct {
		name string
		cs   corev1.ContainerStatus
		want bool
	}{
		{"bootstrapped again", term(1, bootstrapped), true},
		{"log lost", term(2, truncated), true},
		{"clean exit with the words", term(0, truncated), false},
		{"other crash", term(1, `{"level":"fatal","msg":"listen tcp :2379: bind: address already in use"}`), false},
		{"running", corev1.ContainerStatus{State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}, false},
	} {
		p := &corev1.Pod{Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{tc.cs}}}
		if got := lostData(p); got != tc.want {
			t.Errorf("%s: lostData = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestStatusMembers(t *testing.T) {
	ds := scaleFixture(3)
	got := statusMembers(ds, []datastore.Member{
		{ID: 0xb, PeerURLs: []string{managedetcd.PeerURL(ds, 10, testDomain)}, Learner: true},
		{ID: 0xa, PeerURLs: []string{managedetcd.PeerURL(ds, 2, testDomain)}},
		{ID: 0xc, PeerURLs: []string{"https://10.0.0.9:2380"}},
	}, testDomain)
	want := []apiary.EtcdMember{{Name: "d-etcd-2", ID: "a"}, {Name: "d-etcd-10", ID: "b", Learner: true}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("status members %v, want %v", got, want)
	}
}
