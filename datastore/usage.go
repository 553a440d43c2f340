package datastore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// usagePageSize is how many keys one Range of a usage scan returns: large
// enough that a tenant of tens of thousands of objects takes a few round
// trips, small enough that one page (values included, 1.5 MiB at most each)
// stays a bounded response.
const usagePageSize = 500

// usageAttempts: a scan pins the revision of its first page so that the sum
// is one snapshot; a compaction in the middle makes it start again.
const usageAttempts = 3

// Usage is what one tenant stores under its prefix.
type Usage struct {
	// Bytes is the sum of the keys' and values' lengths at their latest
	// revision: what the tenant keeps after compaction (etcd's backend
	// also holds older revisions until then, and its own overhead).
	Bytes int64
	// Objects is the number of keys.
	Objects int64
	// Revision is the etcd revision the scan read.
	Revision int64
}

// Usage measures a tenant's keys and values with a paged scan of its
// range at one revision. Reads are serializable (served by the member the
// client talks to, no quorum round trip): usage is an estimate that is
// refreshed periodically, and must not load the leader.
func (c *Client) Usage(ctx context.Context, t Tenant) (Usage, error) {
	if err := t.Validate(); err != nil {
		return Usage{}, &Error{Reason: ReasonInvalidTenant, Err: err}
	}
	var err error
	for range usageAttempts {
		var u Usage
		u, err = c.scanUsage(ctx, t)
		if !errors.Is(err, rpctypes.ErrCompacted) {
			return u, err
		}
	}
	return Usage{}, err
}

func (c *Client) scanUsage(ctx context.Context, t Tenant) (Usage, error) {
	var u Usage
	key, end := t.KeyRange()
	for {
		opts := []clientv3.OpOption{
			clientv3.WithRange(end), clientv3.WithLimit(usagePageSize),
			clientv3.WithSerializable(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend),
		}
		if u.Revision != 0 {
			opts = append(opts, clientv3.WithRev(u.Revision))
		}
		resp, err := c.etcd.Get(ctx, key, opts...)
		if err != nil {
			if errors.Is(err, rpctypes.ErrCompacted) {
				return Usage{}, err
			}
			return Usage{}, wrapf(err, "measuring the keys of tenant %q under %q", t.User, t.Prefix+"/")
		}
		if u.Revision == 0 {
			u.Revision = resp.Header.Revision
		}
		for _, kv := range resp.Kvs {
			u.Bytes += int64(len(kv.Key) + len(kv.Value))
		}
		u.Objects += int64(len(resp.Kvs))
		if !resp.More || len(resp.Kvs) == 0 {
			return u, nil
		}
		// The next page starts just after the last key read.
		key = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
		if key >= end {
			return u, nil
		}
	}
}

// errRescan: the watch can no longer be applied to the sums (compacted
// past, a previous value missing, the stream ended): scan again.
var errRescan = errors.New("usage watch lost its place")

// rescanPause keeps a watch that keeps failing from scanning in a loop.
const rescanPause = time.Second

// WatchUsage keeps a tenant's usage current until ctx ends: a scan at one
// revision, then a watch of its range from the next revision, each put and
// delete applied to the sums with the previous value etcd sends along
// (nothing is kept per key). report is called after the scan and after
// each batch of events. When the watch loses its place it scans again; it
// returns the scan's error when one fails, and nil when ctx ends.
func (c *Client) WatchUsage(ctx context.Context, t Tenant, report func(Usage)) error {
	for {
		u, err := c.Usage(ctx, t)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		report(u)
		if err := c.followUsage(ctx, t, u, report); !errors.Is(err, errRescan) {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(rescanPause):
		}
	}
}

func (c *Client) followUsage(ctx context.Context, t Tenant, u Usage, report func(Usage)) error {
	key, end := t.KeyRange()
	// Without a leader a member's watch would stall silently; this cancels
	// it, and the next scan finds the new leader.
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	for resp := range c.etcd.Watch(wctx, key, clientv3.WithRange(end), clientv3.WithRev(u.Revision+1), clientv3.WithPrevKV()) {
		if resp.Canceled || resp.CompactRevision != 0 || resp.Err() != nil {
			return errRescan
		}
		for _, ev := range resp.Events {
			if !applyEvent(&u, ev) {
				return errRescan
			}
		}
		if resp.Header.Revision > u.Revision {
			u.Revision = resp.Header.Revision
		}
		if len(resp.Events) > 0 {
			report(u)
		}
	}
	if ctx.Err() != nil {
		return nil
	}
	return errRescan
}

// applyEvent adds one put or delete to the sums; false when it cannot
// (an update or delete without its previous value).
func applyEvent(u *Usage, ev *clientv3.Event) bool {
	k := int64(len(ev.Kv.Key))
	switch {
	case ev.Type == clientv3.EventTypePut && ev.Kv.Version == 1:
		u.Objects++
		u.Bytes += k + int64(len(ev.Kv.Value))
	case ev.PrevKv == nil:
		return false
	case ev.Type == clientv3.EventTypePut:
		u.Bytes += int64(len(ev.Kv.Value) - len(ev.PrevKv.Value))
	default:
		u.Objects--
		u.Bytes -= k + int64(len(ev.PrevKv.Value))
	}
	u.Revision = ev.Kv.ModRevision
	return true
}

// String is for messages: "12.3 MiB in 4567 objects".
func (u Usage) String() string {
	return fmt.Sprintf("%s in %d objects", FormatBytes(u.Bytes), u.Objects)
}

// FormatBytes renders a size with a binary unit, one decimal.
func FormatBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 4; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTP"[exp])
}
