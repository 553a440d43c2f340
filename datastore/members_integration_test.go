//go:build integration

package datastore_test

import (
	"errors"
	"net"
	"strconv"
	"strings"
	"testing"

	"github.com/apiaryhq/apiary/datastore"
	"github.com/apiaryhq/apiary/datastore/etcdtest"
)

// unusedPeerURL is a loopback peer URL that nothing listens on: the port was
// free a moment ago and is released again, so a learner added there never
// starts and never catches up.
func unusedPeerURL(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("picking a free port: %v", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return "https://127.0.0.1:" + strconv.Itoa(port)
}

// members lists the members and fails the test unless there are want.
func members(t *testing.T, c *datastore.Client, want int) []datastore.Member {
	t.Helper()
	ms, err := c.Members(testContext(t))
	if err != nil {
		t.Fatalf("Members: %v", err)
	}
	if len(ms) != want {
		t.Fatalf("Members = %+v; want %d members", ms, want)
	}
	return ms
}

// TestMembershipChanges walks a learner through its life on a one-member
// etcd: added, refused promotion while it has not caught up (it never
// starts), removed, and removed again. A learner does not vote, so the
// single voter keeps its quorum throughout and every call is answered.
func TestMembershipChanges(t *testing.T) {
	t.Parallel()
	s := etcdtest.Start(t)
	c := connect(t, s.Config())

	// The one voting member, as etcd lists it and as it says of itself.
	voter := members(t, c, 1)[0]
	if voter.Learner || voter.ID == 0 || voter.Name == "" {
		t.Fatalf("the only member %+v; want a started voter with an ID and a name", voter)
	}
	if len(voter.PeerURLs) != 1 || !strings.HasPrefix(voter.PeerURLs[0], "http://127.0.0.1:") {
		t.Fatalf("the voter's peer URLs %q; want etcdtest's one loopback peer URL", voter.PeerURLs)
	}
	states, err := c.MemberStates(testContext(t))
	if err != nil || len(states) != 1 || states[0].ID != voter.ID {
		t.Fatalf("MemberStates = %v, %v; want the voter %x alone", states, err, voter.ID)
	}

	peerURL := unusedPeerURL(t)
	learner, err := c.AddLearner(testContext(t), peerURL)
	if err != nil {
		t.Fatalf("AddLearner(%s): %v", peerURL, err)
	}
	if learner.ID == 0 || !learner.Learner || learner.ID == voter.ID {
		t.Fatalf("AddLearner(%s) = %+v; want a new learner with an ID", peerURL, learner)
	}
	var listed *datastore.Member
	for _, m := range members(t, c, 2) {
		switch m.ID {
		case voter.ID:
			if m.Learner || m.Name != voter.Name {
				t.Errorf("the voter became %+v after AddLearner; was %+v", m, voter)
			}
		case learner.ID:
			listed = &m
		}
	}
	if listed == nil {
		t.Fatalf("Members does not list the learner %x", learner.ID)
	}
	if !listed.Learner || listed.Name != "" || len(listed.PeerURLs) != 1 || listed.PeerURLs[0] != peerURL {
		t.Fatalf("the learner is listed as %+v; want a learner without a name (not started) at %s", *listed, peerURL)
	}
	// The learner does not count towards the quorum: the voter alone still
	// serves reads that need the quorum.
	if err := c.Check(testContext(t)); err != nil {
		t.Fatalf("Check with an unstarted learner: %v", err)
	}

	// It never started, so it has none of the log: etcd refuses.
	err = c.Promote(testContext(t), states[0].Endpoint, learner.ID)
	if !errors.Is(err, datastore.ErrLearnerBehind) {
		t.Fatalf("Promote of a learner that never started: %v; want %v", err, datastore.ErrLearnerBehind)
	}
	// A member that votes already: a promotion whose answer was lost.
	if err := c.Promote(testContext(t), states[0].Endpoint, voter.ID); err != nil {
		t.Fatalf("Promote of the voter: %v; want nil", err)
	}
	for _, m := range members(t, c, 2) {
		if m.Learner != (m.ID == learner.ID) {
			t.Errorf("after the Promotes, member %+v; want the voter voting and the learner still a learner", m)
		}
	}

	if err := c.RemoveMember(testContext(t), learner.ID); err != nil {
		t.Fatalf("RemoveMember of the learner: %v", err)
	}
	if got := members(t, c, 1)[0]; got.ID != voter.ID || got.Learner {
		t.Fatalf("after RemoveMember, the member is %+v; want the voter %+v", got, voter)
	}
	// Gone already: a removal whose answer was lost.
	if err := c.RemoveMember(testContext(t), learner.ID); err != nil {
		t.Fatalf("RemoveMember of a removed member: %v; want nil", err)
	}
	members(t, c, 1)
}
