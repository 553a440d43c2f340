package datastore

import (
	"context"
	"fmt"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
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
