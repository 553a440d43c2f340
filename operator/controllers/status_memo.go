package controllers

import (
	"sync"

	"k8s.io/apimachinery/pkg/types"
)

// statusMemo remembers the last status each object was written with.
//
// The informer cache lags behind our own status writes: a reconcile that
// starts right after one (triggered by a Secret or Deployment event) reads
// the previous status. Comparing against that stale copy would write the
// same status again and emit every condition-transition event twice. The
// memo is the base for "did anything change?" and for the merge patch
// instead, until the cache shows the resourceVersion our write produced.
// Only this operator (one leader) writes these statuses, so the memo is
// never older than what the API server holds.
type statusMemo[S any] struct {
	mu   sync.Mutex
	last map[types.UID]memoEntry[S]
}

type memoEntry[S any] struct {
	// resourceVersion our status write produced.
	resourceVersion string
	status          S
}

// base returns the status to compare with: the cached one once the cache
// shows our last write, else the status we wrote.
func (m *statusMemo[S]) base(uid types.UID, cachedRV string, cached S) S {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e, ok := m.last[uid]; ok && e.resourceVersion != cachedRV {
		return e.status
	}
	return cached
}

// remember records a written status and the resourceVersion it produced.
func (m *statusMemo[S]) remember(uid types.UID, writtenRV string, status S) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.last == nil {
		m.last = map[types.UID]memoEntry[S]{}
	}
	m.last[uid] = memoEntry[S]{resourceVersion: writtenRV, status: status}
}

// forget drops an object that is gone.
func (m *statusMemo[S]) forget(uid types.UID) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.last, uid)
}
