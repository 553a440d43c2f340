package controllers

import (
	"context"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/apiaryhq/apiary/datastore"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

// usages is where the quota step reads a tenant's usage: the tracker in
// the operator, a fake in unit tests.
type usages interface {
	// observe makes sure the tenant's usage is followed on its DataStore
	// and returns the latest figure; ok is false until the first scan is
	// done, err says why following stopped.
	observe(ctx context.Context, tcp *apiary.TenantControlPlane, dataStore string, cfg datastore.Config) (u datastore.Usage, ok bool, err error)
	// decided tells what the quota step decided, so that a change of
	// usage that would decide otherwise enqueues the tenant at once.
	decided(uid types.UID, quota apiary.TenantQuota, exceeded bool)
	// stop stops following the tenant (it is gone).
	stop(uid types.UID)
}

// usageTracker follows each tenant's keys on its DataStore with an etcd
// watch (datastore.WatchUsage), so that usage is known at every write
// rather than at the next scan: a tenant writing fast crosses its quota in
// seconds, and the refusal must not wait for a poll. When usage crosses
// what the last reconcile decided (over the quota, or back under 95 % of
// it) the tenant is enqueued.
type usageTracker struct {
	// connect returns the DataStore's client (the operator's pool).
	connect func(ctx context.Context, name string, cfg datastore.Config) (*datastore.Client, error)
	// events enqueues a tenant; nil in unit tests.
	events chan event.GenericEvent

	mu      sync.Mutex
	tenants map[types.UID]*tracked
}

type tracked struct {
	dataStore string
	client    *datastore.Client
	cancel    context.CancelFunc
	done      chan struct{}
	err       error
	usage     datastore.Usage
	ok        bool
	// What the last reconcile decided, and whether a crossing was
	// already signalled since.
	quota     apiary.TenantQuota
	exceeded  bool
	signalled bool
	ref       *apiary.TenantControlPlane
}

func (u *usageTracker) observe(ctx context.Context, tcp *apiary.TenantControlPlane, dataStore string, cfg datastore.Config) (datastore.Usage, bool, error) {
	callCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	dc, err := u.connect(callCtx, dataStore, cfg)
	if err != nil {
		return datastore.Usage{}, false, err
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	tr := u.tenants[tcp.UID]
	if tr != nil {
		select {
		case <-tr.done:
			// Stopped (etcd unreachable, client replaced): report why
			// once, and start again.
			if tr.err != nil && tr.client == dc {
				err := tr.err
				tr.err = nil
				return tr.usage, false, err
			}
			tr = nil
		default:
			if tr.client != dc || tr.dataStore != dataStore {
				tr.cancel()
				tr = nil
			}
		}
	}
	if tr == nil {
		tr = u.start(tcp, dataStore, dc)
	}
	return tr.usage, tr.ok, nil
}

// start runs WatchUsage for the tenant; u.mu is held.
func (u *usageTracker) start(tcp *apiary.TenantControlPlane, dataStore string, dc *datastore.Client) *tracked {
	ctx, cancel := context.WithCancel(context.Background())
	ref := &apiary.TenantControlPlane{}
	ref.Namespace, ref.Name, ref.UID = tcp.Namespace, tcp.Name, tcp.UID
	tr := &tracked{dataStore: dataStore, client: dc, cancel: cancel, done: make(chan struct{}), ref: ref}
	if old := u.tenants[tcp.UID]; old != nil {
		// Keep the last decision across a restart.
		tr.quota, tr.exceeded = old.quota, old.exceeded
	}
	if u.tenants == nil {
		u.tenants = map[types.UID]*tracked{}
	}
	u.tenants[tcp.UID] = tr
	logger := log.FromContext(ctx).WithValues("tenant", tcp.Namespace+"/"+tcp.Name, "dataStore", dataStore)
	go func() {
		defer close(tr.done)
		err := dc.WatchUsage(ctx, datastore.TenantFor(tcp.UID), func(usage datastore.Usage) { u.report(ctx, tr, usage) })
		if err != nil {
			logger.Error(err, "following the tenant's datastore usage stopped")
		}
		u.mu.Lock()
		tr.err = err
		u.mu.Unlock()
		// The next reconcile restarts it and says why it stopped.
		u.signal(ctx, tr)
	}()
	return tr
}

func (u *usageTracker) report(ctx context.Context, tr *tracked, usage datastore.Usage) {
	u.mu.Lock()
	first := !tr.ok
	tr.usage, tr.ok = usage, true
	over, lifted := overQuota(apiary.DataStoreUsage{Bytes: usage.Bytes, Objects: usage.Objects}, tr.quota)
	crossed := !tr.signalled && ((!tr.exceeded && over) || (tr.exceeded && lifted))
	if crossed {
		tr.signalled = true
	}
	u.mu.Unlock()
	if first || crossed {
		u.signal(ctx, tr)
	}
}

func (u *usageTracker) signal(ctx context.Context, tr *tracked) {
	if u.events == nil {
		return
	}
	select {
	case u.events <- event.GenericEvent{Object: tr.ref}:
	case <-ctx.Done():
	}
}

func (u *usageTracker) decided(uid types.UID, quota apiary.TenantQuota, exceeded bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if tr := u.tenants[uid]; tr != nil {
		tr.quota, tr.exceeded, tr.signalled = quota, exceeded, false
	}
}

func (u *usageTracker) stop(uid types.UID) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if tr := u.tenants[uid]; tr != nil {
		tr.cancel()
		delete(u.tenants, uid)
	}
}
