package datastore

import (
	"context"
	"fmt"
	"slices"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// disarmBelow is the share of the quota a member's backend must be under
// (after defragmentation) for the NOSPACE alarm to be disarmed: any less
// room and the next writes raise it again at once.
const disarmBelow = 0.9

// fragmentedShare is how much of a member's backend may be free pages
// before it is defragmented without an alarm.
const fragmentedShare = 0.5

// minDefragBytes: smaller backends are not worth blocking a member for.
const minDefragBytes = 64 << 20

// MemberSpace is what one member reports about its backend.
type MemberSpace struct {
	Endpoint string
	MemberID uint64
	// Size is the backend file, InUse the part holding data (the rest is
	// free pages that only defragmentation returns), Quota the
	// --quota-backend-bytes the member runs with.
	Size, InUse, Quota int64
}

// Space is the shared etcd's backend space and its NOSPACE alarm.
type Space struct {
	Members []MemberSpace
	// NoSpace lists the members with an active NOSPACE alarm: while it is
	// raised etcd refuses every write (deletes too go through raft, but
	// are allowed) for every tenant of the DataStore.
	NoSpace []uint64
}

// Space reads every answering member's backend sizes and the alarms.
func (c *Client) Space(ctx context.Context) (Space, error) {
	var sp Space
	// A short call: the client retries an unavailable etcd until the
	// context ends, and the caller's context may be long enough for a
	// defragmentation.
	callCtx, cancel := context.WithTimeout(ctx, statusTimeout)
	alarms, err := c.etcd.AlarmList(callCtx)
	cancel()
	if err != nil {
		return sp, wrapf(err, "listing etcd alarms")
	}
	for _, a := range alarms.Alarms {
		if a.Alarm == pb.AlarmType_NOSPACE {
			sp.NoSpace = append(sp.NoSpace, a.MemberID)
		}
	}
	answered, _ := c.statuses(ctx)
	for _, m := range answered {
		st := m.status
		sp.Members = append(sp.Members, MemberSpace{Endpoint: m.endpoint, MemberID: st.Header.MemberId, Size: st.DbSize, InUse: st.DbSizeInUse, Quota: st.DbSizeQuota})
	}
	return sp, nil
}

// Reclaimed says what ReclaimSpace did.
type Reclaimed struct {
	// Defragmented are the endpoints of the members defragmented.
	Defragmented []string
	// Disarmed: the NOSPACE alarm was raised and is cleared now.
	Disarmed bool
	// StillFull: the alarm stays, because even defragmented the data takes
	// more than 90 % of the quota (a tenant must delete some).
	StillFull bool
}

// ReclaimSpace defragments members one at a time, each only when it needs
// it (NOSPACE raised, or more than half of a large backend free pages), and
// disarms the NOSPACE alarm once every member's backend is below 90 % of
// its quota. A member is blocked while it is defragmented; the others
// keep serving. Compaction stays the members' own (periodic).
func (c *Client) ReclaimSpace(ctx context.Context) (Reclaimed, error) {
	var r Reclaimed
	sp, err := c.Space(ctx)
	if err != nil {
		return r, err
	}
	alarmed := len(sp.NoSpace) > 0
	for i, m := range sp.Members {
		free := m.Size - m.InUse
		if !alarmed && (m.Size < minDefragBytes || float64(free) < fragmentedShare*float64(m.Size)) {
			continue
		}
		if _, err := c.etcd.Defragment(ctx, m.Endpoint); err != nil {
			return r, wrapf(err, "defragmenting etcd member %s", m.Endpoint)
		}
		r.Defragmented = append(r.Defragmented, m.Endpoint)
		callCtx, cancel := context.WithTimeout(ctx, statusTimeout)
		st, err := c.etcd.Status(callCtx, m.Endpoint)
		cancel()
		if err != nil {
			return r, wrapf(err, "reading etcd member %s after defragmentation", m.Endpoint)
		}
		sp.Members[i].Size, sp.Members[i].InUse = st.DbSize, st.DbSizeInUse
	}
	if !alarmed {
		return r, nil
	}
	for _, m := range sp.Members {
		if m.Quota > 0 && float64(m.Size) >= disarmBelow*float64(m.Quota) {
			r.StillFull = true
			return r, nil
		}
	}
	if len(sp.Members) == 0 {
		return r, fmt.Errorf("no etcd member answered Status")
	}
	ids := slices.Compact(slices.Sorted(slices.Values(sp.NoSpace)))
	for _, id := range ids {
		callCtx, cancel := context.WithTimeout(ctx, statusTimeout)
		_, err := c.etcd.AlarmDisarm(callCtx, &clientv3.AlarmMember{MemberID: id, Alarm: pb.AlarmType_NOSPACE})
		cancel()
		if err != nil {
			return r, wrapf(err, "disarming the NOSPACE alarm of etcd member %x", id)
		}
	}
	r.Disarmed = true
	return r, nil
}
