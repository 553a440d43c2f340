package controllers

import (
	"sync"

	"k8s.io/apimachinery/pkg/types"
)

// byUID remembers one value per object (tenant, DataStore) across
// reconciles, safe for the controller's concurrent workers.
type byUID[T any] struct {
	mu sync.Mutex
	m  map[types.UID]T
}

func (b *byUID[T]) get(uid types.UID) (T, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	v, ok := b.m[uid]
	return v, ok
}

func (b *byUID[T]) set(uid types.UID, v T) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.m == nil {
		b.m = map[types.UID]T{}
	}
	b.m[uid] = v
}

func (b *byUID[T]) forget(uid types.UID) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.m, uid)
}
