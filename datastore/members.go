package datastore

import (
	"context"
	"errors"
	"fmt"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
)

// MemberState is what one member says about itself and the raft log.
type MemberState struct {
	Endpoint string
	ID       uint64
	// Leader is the member this one follows (itself when it leads); 0
	// when it has none.
	Leader uint64
	// RaftIndex is the last log entry it has, AppliedIndex the last it
	// has applied: a member that has just restarted catches up on both.
	RaftIndex, AppliedIndex uint64
	Learner                 bool
	// Errors are the member's own alarms and complaints.
	Errors []string
}

// MemberStates asks every member for its state, in parallel and briefly.
// Members that do not answer are left out; it fails only when none does.
func (c *Client) MemberStates(ctx context.Context) ([]MemberState, error) {
	answered, lastErr := c.statuses(ctx)
	if len(answered) == 0 {
		return nil, c.explain(ctx, lastErr, "reading the etcd members' state")
	}
	out := make([]MemberState, 0, len(answered))
	for _, m := range answered {
		st := m.status
		out = append(out, MemberState{
			Endpoint: m.endpoint, ID: st.Header.MemberId, Leader: st.Leader,
			RaftIndex: st.RaftIndex, AppliedIndex: st.RaftAppliedIndex,
			Learner: st.IsLearner, Errors: st.Errors,
		})
	}
	return out, nil
}

// MoveLeader asks the leader, at its endpoint, to hand the leadership to
// member to. etcd answers once the transfer is done (or failed), so the
// member that led can be restarted without an election: tenants' writes
// pause for one heartbeat rather than an election timeout.
func (c *Client) MoveLeader(ctx context.Context, leaderEndpoint string, to uint64) error {
	// Only the leader can transfer; the balanced connection could reach a
	// follower.
	conn, err := c.etcd.Dial(leaderEndpoint)
	if err != nil {
		return wrapf(err, "dialing the etcd leader %s", leaderEndpoint)
	}
	defer conn.Close()
	if _, err := pb.NewMaintenanceClient(conn).MoveLeader(ctx, &pb.MoveLeaderRequest{TargetID: to}); err != nil {
		return wrapf(err, "moving the etcd leadership from %s to member %x", leaderEndpoint, to)
	}
	return nil
}

// String is for messages.
func (m MemberState) String() string {
	return fmt.Sprintf("%s (member %x, leader %x, index %d, applied %d)", m.Endpoint, m.ID, m.Leader, m.RaftIndex, m.AppliedIndex)
}

// Member is one member as etcd's member list has it.
type Member struct {
	ID uint64
	// Name is empty for a member added but not started yet.
	Name     string
	PeerURLs []string
	Learner  bool
}

// ErrLearnerBehind: etcd refuses to promote a learner that has not caught
// up with the leader's log yet; the caller tries again later.
var ErrLearnerBehind = errors.New("the learner has not caught up with the leader yet")

// Members lists the cluster's members, learners included, as the quorum
// agrees on them (a linearizable read).
func (c *Client) Members(ctx context.Context) ([]Member, error) {
	resp, err := c.etcd.MemberList(ctx)
	if err != nil {
		return nil, c.explain(ctx, err, "listing the etcd members")
	}
	out := make([]Member, 0, len(resp.Members))
	for _, m := range resp.Members {
		out = append(out, Member{ID: m.ID, Name: m.Name, PeerURLs: m.PeerURLs, Learner: m.IsLearner})
	}
	return out, nil
}

// AddLearner adds a member that receives the log but does not vote (and so
// cannot cost the cluster its quorum) until Promote.
func (c *Client) AddLearner(ctx context.Context, peerURL string) (Member, error) {
	resp, err := c.etcd.MemberAddAsLearner(ctx, []string{peerURL})
	if err != nil {
		return Member{}, wrapf(err, "adding etcd learner %s", peerURL)
	}
	return Member{ID: resp.Member.ID, PeerURLs: resp.Member.PeerURLs, Learner: true}, nil
}

// Promote makes a learner a voting member, asking the leader at
// leaderEndpoint. It returns ErrLearnerBehind while etcd finds the learner
// behind, and nil for a member that already votes (a promotion whose answer
// was lost).
//
// Only the leader knows whether a learner has caught up: a follower
// forwards the request over the peer port without the caller's identity,
// and with authentication enabled the leader refuses it ("auth: user name
// is empty", etcd 3.6), which the client sees as a timeout.
func (c *Client) Promote(ctx context.Context, leaderEndpoint string, id uint64) error {
	conn, err := c.etcd.Dial(leaderEndpoint)
	if err != nil {
		return wrapf(err, "dialing the etcd leader %s", leaderEndpoint)
	}
	defer conn.Close()
	_, err = pb.NewClusterClient(conn).MemberPromote(ctx, &pb.MemberPromoteRequest{ID: id})
	switch {
	case err == nil, isEtcd(err, rpctypes.ErrMemberNotLearner):
		return nil
	case isEtcd(err, rpctypes.ErrMemberLearnerNotReady):
		return ErrLearnerBehind
	}
	return wrapf(err, "promoting etcd member %x", id)
}

// RemoveMember removes a member; a member already gone is no error.
func (c *Client) RemoveMember(ctx context.Context, id uint64) error {
	if _, err := c.etcd.MemberRemove(ctx, id); err != nil && !isEtcd(err, rpctypes.ErrMemberNotFound) {
		return wrapf(err, "removing etcd member %x", id)
	}
	return nil
}

// isEtcd tells an etcd server error whether the client passes it on as
// gRPC status or already converted.
func isEtcd(err, target error) bool {
	return errors.Is(err, target) || errors.Is(rpctypes.Error(err), target)
}
