package controllers

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

// A host back from a rewrite serves once its konnectivity-server has as
// many agents as the serving hosts' servers, or once agentsWait is over.
func TestAgentsBehind(t *testing.T) {
	started := time.Date(2026, 12, 4, 10, 0, 0, 0, time.UTC)
	tenant := func(konnectivity bool) *apiary.TenantControlPlane {
		tcp := &apiary.TenantControlPlane{}
		tcp.Spec.Addons.Konnectivity.Enabled = ptr.To(konnectivity)
		tcp.Status.ControlPlaneHosts = []apiary.ControlPlaneHostStatus{
			{Host: "cp-1", Address: "192.0.2.1", Step: apiary.HostStepUpdate, Result: resultRunning, Started: metav1.NewTime(started)},
			{Host: "cp-2", Address: "192.0.2.2", Step: apiary.HostStepUpdate, Result: resultSucceeded, Serving: true},
			{Host: "cp-3", Address: "192.0.2.3", Step: apiary.HostStepStop, Result: resultSucceeded},
		}
		return tcp
	}
	for _, c := range []struct {
		name         string
		konnectivity bool
		agents       map[string]int // by address; missing: unreadable
		after        time.Duration
		wait         string // in the message; "" serves
	}{
		{"as many as the serving host", true, map[string]int{"192.0.2.1": 3, "192.0.2.2": 3}, 20 * time.Second, ""},
		{"more than the serving host", true, map[string]int{"192.0.2.1": 4, "192.0.2.2": 3}, 20 * time.Second, ""},
		{"fewer", true, map[string]int{"192.0.2.1": 1, "192.0.2.2": 3}, 20 * time.Second, "has 1 agents, the serving hosts' 3"},
		{"fewer, waited long enough", true, map[string]int{"192.0.2.1": 1, "192.0.2.2": 3}, agentsWait, ""},
		{"its own unreadable", true, map[string]int{"192.0.2.2": 3}, 20 * time.Second, "cannot be read"},
		{"the serving host's unreadable", true, map[string]int{"192.0.2.1": 0}, 20 * time.Second, ""},
		{"no agent anywhere", true, map[string]int{"192.0.2.1": 0, "192.0.2.2": 0}, 20 * time.Second, ""},
		{"a stopped host is no measure", true, map[string]int{"192.0.2.1": 1, "192.0.2.2": 1, "192.0.2.3": 5}, 20 * time.Second, ""},
		{"konnectivity off", false, map[string]int{"192.0.2.1": 0, "192.0.2.2": 3}, 20 * time.Second, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			var asked []string
			r := &TenantControlPlaneReconciler{agentCounter: func(_ context.Context, address string) (int, error) {
				asked = append(asked, address)
				n, ok := c.agents[address]
				if !ok {
					return 0, errors.New("connection refused")
				}
				return n, nil
			}}
			tcp := tenant(c.konnectivity)
			got := r.agentsBehind(context.Background(), tcp, &tcp.Status.ControlPlaneHosts[0], started, started.Add(c.after))
			if c.wait == "" && got != "" || c.wait != "" && !strings.Contains(got, c.wait) {
				t.Errorf("agentsBehind: %q, want %q", got, c.wait)
			}
			if c.wait != "" && !strings.Contains(got, "2026-12-04T10:00:40Z") {
				t.Errorf("the message names no deadline: %q", got)
			}
			for _, a := range asked {
				if a == "192.0.2.3" {
					t.Error("asked the stopped host")
				}
			}
		})
	}
}

// agentsIn reads the count konnectivity-server v0.36.0 exports on its
// health port (the lines below as it serves them, other metrics cut).
func TestAgentsIn(t *testing.T) {
	const served = `# HELP konnectivity_network_proxy_server_ready_backend_connections Number of konnectivity agent connected to the proxy server. DEPRECATED, please use ready_backends
# TYPE konnectivity_network_proxy_server_ready_backend_connections gauge
konnectivity_network_proxy_server_ready_backend_connections 3
# HELP konnectivity_network_proxy_server_ready_backends Number of konnectivity agent connected to the proxy server
# TYPE konnectivity_network_proxy_server_ready_backends gauge
konnectivity_network_proxy_server_ready_backends{proxy_strategy="default"} 3
konnectivity_network_proxy_server_ready_backends{proxy_strategy="destHost"} 2
`
	if n, err := agentsIn(strings.NewReader(served)); err != nil || n != 3 {
		t.Errorf("agentsIn: %d, %v; want 3", n, err)
	}
	for name, bad := range map[string]string{
		"no such metric": "# TYPE other gauge\nother 1\n",
		"not metrics":    "<html>hello</html>",
		"other strategy": "konnectivity_network_proxy_server_ready_backends{proxy_strategy=\"destHost\"} 2\n",
	} {
		if n, err := agentsIn(strings.NewReader(bad)); err == nil {
			t.Errorf("%s: %d, want an error", name, n)
		}
	}
}

// A host's owner controls what its health port answers: an endless body
// or one that never comes costs one bounded read and an error, never a
// worker.
func TestAgentsAtBoundsTheRead(t *testing.T) {
	endless := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		line := []byte("konnectivity_network_proxy_server_ready_backends{proxy_strategy=\"default\"} 3\n")
		for r.Context().Err() == nil {
			if _, err := w.Write(line); err != nil {
				return
			}
		}
	}))
	defer endless.Close()
	silent := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done()
	}))
	defer silent.Close()
	real := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "# TYPE konnectivity_network_proxy_server_ready_backends gauge\nkonnectivity_network_proxy_server_ready_backends{proxy_strategy=\"default\"} 2\n")
	}))
	defer real.Close()
	for name, url := range map[string]string{"endless": endless.URL, "silent": silent.URL} {
		start := time.Now()
		if n, err := agentsAt(context.Background(), url); err == nil {
			t.Errorf("%s: %d agents, want an error", name, n)
		}
		if took := time.Since(start); took > agentsReadTimeout+time.Second {
			t.Errorf("%s: the read took %s", name, took)
		}
	}
	if n, err := agentsAt(context.Background(), real.URL); err != nil || n != 2 {
		t.Errorf("agentsAt: %d, %v; want 2", n, err)
	}
}
