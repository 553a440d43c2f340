package controllers

import (
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
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

// recordTransitions emits one event per condition whose status or reason
// changed from before to after. The action names the condition:
// events.k8s.io merges events of the same object, reason and action into one
// series, and distinct conditions must stay distinct events. warning says
// which conditions are worth a Warning.
func recordTransitions(rec events.EventRecorder, obj runtime.Object, before, after []metav1.Condition, warning func(metav1.Condition) bool) {
	for _, c := range after {
		old := meta.FindStatusCondition(before, c.Type)
		if old != nil && old.Status == c.Status && old.Reason == c.Reason {
			continue
		}
		typ := corev1.EventTypeNormal
		if warning(c) {
			typ = corev1.EventTypeWarning
		}
		rec.Eventf(obj, nil, typ, c.Reason, c.Type, "%s=%s: %s", c.Type, c.Status, c.Message)
	}
}
