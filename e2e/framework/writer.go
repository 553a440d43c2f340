package framework

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Writer creates a ConfigMap through a tenant's API and reads it back
// every 100 ms until the context of Run ends, and counts what failed, the
// longest time without a success and which writes were acknowledged.
type Writer struct {
	CS kubernetes.Interface
	NS string
	// Retry, when set, is how long a failed write is tried again (as a
	// client with a bounded retry would) before it counts as failed.
	Retry time.Duration

	// OK and Failed count the writes, Retried the tries again.
	OK, Failed, Retried atomic.Int64

	mu           sync.Mutex
	lastGood     time.Time
	longest      time.Duration
	failures     []string
	acknowledged []string
}

// Run writes until ctx ends.
func (w *Writer) Run(ctx context.Context) {
	w.mu.Lock()
	w.lastGood = time.Now()
	w.mu.Unlock()
	for i := 0; ctx.Err() == nil; i++ {
		name := fmt.Sprintf("w-%05d", i)
		err := w.write(ctx, name)
		for first := time.Now(); err != nil && ctx.Err() == nil && time.Since(first) < w.Retry; {
			w.Retried.Add(1)
			time.Sleep(200 * time.Millisecond)
			err = w.write(ctx, name)
		}
		now := time.Now()
		w.mu.Lock()
		if err == nil {
			w.OK.Add(1)
			w.longest = max(w.longest, now.Sub(w.lastGood))
			w.lastGood = now
			w.acknowledged = append(w.acknowledged, name)
		} else if ctx.Err() == nil {
			w.Failed.Add(1)
			if len(w.failures) < 5 {
				w.failures = append(w.failures, now.Format("15:04:05.000")+" "+err.Error())
			}
		}
		w.mu.Unlock()
		time.Sleep(100 * time.Millisecond)
	}
}

// RequestTimeout is how long one request of a write may take before it
// counts as failed: the same limit as the e2e /version poller's, per
// request. (The create and the read used to share it: on this 2-core
// machine a create that waited 3 s for CPU during a mode switch left the
// read too little, and a write that was served counted as failed.)
const RequestTimeout = 5 * time.Second

// write creates ConfigMap name and reads it back; with Retry, one created
// by an earlier try whose answer was lost counts.
func (w *Writer) write(ctx context.Context, name string) error {
	cctx, cancel := context.WithTimeout(ctx, RequestTimeout)
	defer cancel()
	_, err := w.CS.CoreV1().ConfigMaps(w.NS).Create(cctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"i": name}}, metav1.CreateOptions{})
	if err != nil && (w.Retry == 0 || !apierrors.IsAlreadyExists(err)) {
		return fmt.Errorf("create: %w", err)
	}
	rctx, cancel := context.WithTimeout(ctx, RequestTimeout)
	defer cancel()
	if _, err := w.CS.CoreV1().ConfigMaps(w.NS).Get(rctx, name, metav1.GetOptions{}); err != nil {
		return fmt.Errorf("read back: %w", err)
	}
	return nil
}

// Longest is the longest time between two successful writes (the first
// counted from Run's start).
func (w *Writer) Longest() time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.longest
}

// Failures are the first five failed writes, with their time.
func (w *Writer) Failures() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.failures)
}

// Acknowledged are the names of the ConfigMaps written and read back.
func (w *Writer) Acknowledged() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.acknowledged)
}

// Lost counts the acknowledged writes the tenant no longer has. Call it
// once Run has returned.
func (w *Writer) Lost(ctx context.Context) (int, error) {
	cms, err := w.CS.CoreV1().ConfigMaps(w.NS).List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, err
	}
	have := map[string]bool{}
	for _, cm := range cms.Items {
		have[cm.Name] = true
	}
	lost := 0
	for _, n := range w.Acknowledged() {
		if !have[n] {
			lost++
		}
	}
	return lost, nil
}
