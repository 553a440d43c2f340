package datastore

import (
	"context"
	"errors"
	"sync"
	"time"
)

// Pool caches one Client per DataStore name and replaces it when the
// DataStore's Config changes (new endpoints, rotated certificates). It is
// safe for concurrent use.
//
// A Client returned by Get belongs to the pool: callers must not Close it.
// It stays usable for ReplacedGrace after the pool replaces it (Get with
// another Config), and until Forget or Close; calls in flight then fail and
// are retried by the next reconcile.
type Pool struct {
	mu      sync.Mutex
	clients map[string]*pooled
	closed  bool
	grace   time.Duration
}

// ReplacedGrace is how long a replaced client stays open. A managed etcd's
// endpoints change with every membership step, while other reconciles may
// still hold the previous client: closing it at once would fail their
// calls with "canceled" (and flap a Ready condition).
const ReplacedGrace = time.Minute

type pooled struct {
	hash   string
	client *Client
}

// NewPool returns an empty pool.
func NewPool() *Pool { return NewPoolWithGrace(ReplacedGrace) }

// NewPoolWithGrace returns an empty pool that closes a replaced client
// after grace.
func NewPoolWithGrace(grace time.Duration) *Pool {
	return &Pool{clients: map[string]*pooled{}, grace: grace}
}

// Get returns the client of the named DataStore, connecting when there is
// none or when cfg differs from the one the cached client was built with.
func (p *Pool) Get(ctx context.Context, name string, cfg Config) (*Client, error) {
	hash := cfg.Hash()
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, errors.New("datastore client pool is closed")
	}
	if e, ok := p.clients[name]; ok && e.hash == hash {
		p.mu.Unlock()
		return e.client, nil
	}
	p.mu.Unlock()

	// Connect outside the lock: other DataStores need not wait for it.
	c, err := Connect(ctx, cfg)
	if err != nil {
		return nil, err
	}

	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		_ = c.Close()
		return nil, errors.New("datastore client pool is closed")
	}
	if e, ok := p.clients[name]; ok {
		if e.hash == hash {
			// Another caller connected with the same config meanwhile.
			_ = c.Close()
			return e.client, nil
		}
		old := e.client
		time.AfterFunc(p.grace, func() { _ = old.Close() })
	}
	p.clients[name] = &pooled{hash: hash, client: c}
	return c, nil
}

// Forget closes and drops the client of the named DataStore, e.g. when the
// DataStore is deleted.
func (p *Pool) Forget(name string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if e, ok := p.clients[name]; ok {
		_ = e.client.Close()
		delete(p.clients, name)
	}
}

// Close closes every client; Get fails afterwards.
func (p *Pool) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for name, e := range p.clients {
		_ = e.client.Close()
		delete(p.clients, name)
	}
	p.closed = true
}
