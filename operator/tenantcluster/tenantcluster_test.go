package tenantcluster

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
)

func kubeconfig(server, user string) []byte {
	return fmt.Appendf(nil, `apiVersion: v1
kind: Config
clusters:
- name: t
  cluster:
    server: %s
users:
- name: %s
  user:
    token: secret-%s
contexts:
- name: t
  context: {cluster: t, user: %s}
current-context: t
`, server, user, user, user)
}

// apiServer counts the requests it gets and answers every one with 404.
func apiServer(t *testing.T) (*httptest.Server, *atomic.Int64) {
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		n.Add(1)
		http.NotFound(w, nil)
	}))
	t.Cleanup(srv.Close)
	return srv, &n
}

func TestForKeepsOneAccessPerKubeconfig(t *testing.T) {
	srv, _ := apiServer(t)
	c := New()
	const uid = types.UID("u1")
	a1, err := c.For(uid, kubeconfig(srv.URL, "a"))
	if err != nil {
		t.Fatal(err)
	}
	a2, err := c.For(uid, kubeconfig(srv.URL, "a"))
	if err != nil {
		t.Fatal(err)
	}
	if a1 != a2 {
		t.Error("the same kubeconfig built a second Access")
	}
	if a1.Config.UserAgent != UserAgent || a1.Config.Timeout != requestTimeout {
		t.Errorf("user agent %q, timeout %v", a1.Config.UserAgent, a1.Config.Timeout)
	}
	a3, err := c.For(uid, kubeconfig(srv.URL, "renewed"))
	if err != nil {
		t.Fatal(err)
	}
	if a3 == a1 || a3.KubeconfigHash == a1.KubeconfigHash {
		t.Error("a changed kubeconfig kept the old Access")
	}
	other, err := c.For("u2", kubeconfig(srv.URL, "a"))
	if err != nil {
		t.Fatal(err)
	}
	if other == a3 {
		t.Error("two tenants share an Access")
	}
	if _, err := c.For(uid, nil); err == nil {
		t.Error("an empty kubeconfig was accepted")
	}
	if _, err := c.For(uid, []byte("not: [a kubeconfig")); err == nil {
		t.Error("a broken kubeconfig was accepted")
	}
}

// Watches live between Start and Forget (or the manager's end), are
// restarted only when what they watch changes, and list inside the tenant.
func TestWatchLifetime(t *testing.T) {
	srv, requests := apiServer(t)
	c := New()
	const uid = types.UID("u1")
	a, err := c.For(uid, kubeconfig(srv.URL, "a"))
	if err != nil {
		t.Fatal(err)
	}
	w := Watch{
		Name:          "bootstrap",
		Resources:     []schema.GroupVersionResource{{Version: "v1", Resource: "configmaps"}},
		LabelSelector: "app.kubernetes.io/managed-by=apiary",
		OnDelete:      func(context.Context, any) {},
	}
	if err := c.Watch(uid, a, w); !errors.Is(err, ErrNotStarted) {
		t.Fatalf("Watch before Start: %v, want ErrNotStarted", err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		if err := c.Start(ctx); err != nil {
			t.Error(err)
		}
	}()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if err := c.Watch(uid, a, w); err == nil {
			break
		} else if !errors.Is(err, ErrNotStarted) || time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n := c.Watching(uid); n != 1 {
		t.Fatalf("%d watches, want 1", n)
	}
	// The informer lists inside the tenant.
	for requests.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the watch sent no request to the tenant API")
		}
		time.Sleep(10 * time.Millisecond)
	}
	c.mu.Lock()
	first := c.watches[watchKey{uid, "bootstrap"}].key
	c.mu.Unlock()
	if err := c.Watch(uid, a, w); err != nil {
		t.Fatal(err)
	}
	w.Resources = append(w.Resources, schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "daemonsets"})
	if err := c.Watch(uid, a, w); err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	second := c.watches[watchKey{uid, "bootstrap"}].key
	c.mu.Unlock()
	if first == second || c.Watching(uid) != 1 {
		t.Errorf("a changed watch was not restarted in place (%d watches)", c.Watching(uid))
	}
	other := w
	other.Name = "nodes"
	if err := c.Watch(uid, a, other); err != nil {
		t.Fatal(err)
	}
	if n := c.Watching(uid); n != 2 {
		t.Fatalf("%d watches, want 2", n)
	}
	c.Forget(uid)
	if n := c.Watching(uid); n != 0 {
		t.Fatalf("%d watches after Forget, want 0", n)
	}
	if err := c.Watch("u2", a, w); err != nil {
		t.Fatal(err)
	}
	cancel()
	<-stopped
	if n := c.Watching("u2"); n != 0 {
		t.Fatalf("%d watches after the manager stopped, want 0", n)
	}
	if err := c.Watch("u2", a, w); !errors.Is(err, ErrNotStarted) {
		t.Fatalf("Watch after the end: %v, want ErrNotStarted", err)
	}
}
