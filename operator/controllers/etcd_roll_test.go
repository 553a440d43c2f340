package controllers

import (
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/apiaryhq/apiary/datastore"
)

func TestPlanRoll(t *testing.T) {
	now := time.Date(2026, 12, 2, 7, 0, 0, 0, time.UTC)
	settled := now.Add(-time.Minute)
	pod := func(name string, updated bool) memberPod {
		return memberPod{Name: name, UID: types.UID("uid-" + name), Updated: updated, Ready: true, ReadySince: settled}
	}
	member := func(id, leader, index, applied uint64) datastore.MemberState {
		return datastore.MemberState{Endpoint: "https://m" + string(rune('0'+id)) + ":2379", ID: id, Leader: leader, RaftIndex: index, AppliedIndex: applied}
	}
	// m-0 leads (ID 1); everyone caught up.
	healthy := map[string]datastore.MemberState{
		"m-0": member(1, 1, 5000, 5000), "m-1": member(2, 1, 5000, 4999), "m-2": member(3, 1, 5000, 5000),
	}
	with := func(name string, m datastore.MemberState) map[string]datastore.MemberState {
		out := map[string]datastore.MemberState{}
		for k, v := range healthy {
			out[k] = v
		}
		out[name] = m
		return out
	}
	without := func(name string) map[string]datastore.MemberState {
		out := with(name, datastore.MemberState{})
		delete(out, name)
		return out
	}
	notReady := pod("m-1", true)
	notReady.Ready = false
	fresh := pod("m-2", true)
	fresh.ReadySince = now.Add(-3 * time.Second)
	stopping := pod("m-1", false)
	stopping.Deleting = true

	tests := []struct {
		name    string
		pods    []memberPod
		members map[string]datastore.MemberState
		want    int
		// One of: done, a wait containing waitFor, the pod restarted, the
		// pod given the leadership.
		done      bool
		waitFor   string
		restart   string
		leaderTo  string
		updatedOf int
	}{
		{"all updated", []memberPod{pod("m-0", true), pod("m-1", true), pod("m-2", true)}, healthy, 3, true, "", "", "", 3},
		{"followers first, highest ordinal first", []memberPod{pod("m-0", false), pod("m-1", false), pod("m-2", false)}, healthy, 3, false, "", "m-2", "", 0},
		{"the next follower", []memberPod{pod("m-0", false), pod("m-1", false), pod("m-2", true)}, healthy, 3, false, "", "m-1", "", 1},
		{"the leader hands over first", []memberPod{pod("m-0", false), pod("m-1", true), pod("m-2", true)}, healthy, 3, false, "", "", "m-2", 2},
		{"then the old leader restarts", []memberPod{pod("m-0", false), pod("m-1", true), pod("m-2", true)},
			map[string]datastore.MemberState{"m-0": member(1, 3, 5000, 5000), "m-1": member(2, 3, 5000, 5000), "m-2": member(3, 3, 5000, 5000)}, 3, false, "", "", "", 2},
		{"a pod missing", []memberPod{pod("m-0", false), pod("m-1", true)}, healthy, 3, false, "2 of 3 member pods exist", "", "", 1},
		{"a member not Ready", []memberPod{pod("m-0", false), notReady, pod("m-2", true)}, healthy, 3, false, "m-1 is not Ready", "", "", 2},
		{"a member just back", []memberPod{pod("m-0", false), pod("m-1", false), fresh}, healthy, 3, false, "m-2 turned Ready less than", "", "", 1},
		{"a member stopping", []memberPod{pod("m-0", false), stopping, pod("m-2", true)}, healthy, 3, false, "m-1 is stopping", "", "", 1},
		{"a member silent", []memberPod{pod("m-0", false), pod("m-1", false), pod("m-2", true)}, without("m-1"), 3, false, "m-1 does not answer", "", "", 1},
		{"a member without leader", []memberPod{pod("m-0", false), pod("m-1", false), pod("m-2", true)}, with("m-2", member(3, 0, 5000, 5000)), 3, false, "m-2 has no leader", "", "", 1},
		{"members disagree", []memberPod{pod("m-0", false), pod("m-1", false), pod("m-2", true)}, with("m-2", member(3, 2, 5000, 5000)), 3, false, "disagree", "", "", 1},
		{"a member behind", []memberPod{pod("m-0", false), pod("m-1", false), pod("m-2", true)}, with("m-2", member(3, 1, 5000, 5000-rollMaxLag-1)), 3, false, "entries behind", "", "", 1},
		{"no leader at all", []memberPod{pod("m-0", false)}, map[string]datastore.MemberState{"m-0": member(1, 2, 5, 5)}, 1, false, "no member says it leads", "", "", 0},
		{"a lone member restarts", []memberPod{pod("m-0", false)}, map[string]datastore.MemberState{"m-0": member(1, 1, 5, 5)}, 1, false, "", "m-0", "", 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := planRoll(tc.pods, tc.members, tc.want, now)
			if got.Done != tc.done || got.Updated != tc.updatedOf {
				t.Fatalf("done %t, updated %d; want %t, %d (%+v)", got.Done, got.Updated, tc.done, tc.updatedOf, got)
			}
			if tc.done {
				return
			}
			switch {
			case tc.waitFor != "":
				if !strings.Contains(got.Wait, tc.waitFor) || got.Restart != nil || got.MoveLeader != nil {
					t.Fatalf("want a wait for %q, got %+v", tc.waitFor, got)
				}
			case tc.leaderTo != "":
				if got.MoveLeader == nil || got.MoveLeader.ToPod != tc.leaderTo || got.MoveLeader.From != healthy["m-0"].Endpoint || got.Restart != nil {
					t.Fatalf("want the leadership moved to %s, got %+v (move %+v)", tc.leaderTo, got, got.MoveLeader)
				}
			case tc.restart != "":
				if got.Restart == nil || got.Restart.Name != tc.restart || got.Wait != "" {
					t.Fatalf("want %s restarted, got %+v", tc.restart, got)
				}
			default:
				// The old leader, now a follower.
				if got.Restart == nil || got.Restart.Name != "m-0" {
					t.Fatalf("want m-0 restarted, got %+v", got)
				}
			}
		})
	}
}

func TestOrdinal(t *testing.T) {
	for in, want := range map[string]int{"trio-etcd-0": 0, "trio-etcd-12": 12, "etcd": -1, "etcd-": -1, "etcd-x1": -1} {
		if got := ordinal(in); got != want {
			t.Errorf("ordinal(%q) = %d, want %d", in, got, want)
		}
	}
}
