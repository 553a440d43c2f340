package controllers

// A control-plane host whose kube-apiserver answers again after a rewrite
// has a new konnectivity-server with no agent: put back in the Service at
// once, its API server fails logs, exec and port-forward with "No agent
// available" until every Node's agent has found it (agents look for the
// servers they miss through the Service, with a back-off). Its agent port
// is in the Service from the moment its control plane is written
// (render.Backend.AgentsReady); its API server port waits, a bounded time,
// until its server has as many agents as the serving hosts' servers.

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/apiaryhq/apiary/konnectivity"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/operator/render"
)

const (
	// agentsWait bounds, from the start of a host's step, how long its
	// API server waits for agents before it serves anyway (agents that
	// cannot connect must not keep a control-plane host out for ever). A
	// host's update takes about 25 s before the wait; the agents usually
	// connect within seconds, yet once, in a CI run, a host's count did
	// not reach the serving host's in 90 s (not understood: the serving
	// server may count agents that went away).
	agentsWait = 40 * time.Second
	// agentsMetric counts the agents connected to a konnectivity-server
	// (its health port's /metrics; one per agent for this strategy).
	agentsMetric   = "konnectivity_network_proxy_server_ready_backends"
	agentsStrategy = "default"
	// metricsLimit and agentsReadTimeout bound a read of a host's
	// /metrics: the host's owner controls what it answers, and the read
	// runs on a reconcile worker.
	metricsLimit      = 1 << 20
	agentsReadTimeout = 2 * time.Second
)

// agentCounter says how many agents the konnectivity-server of a
// control-plane host at address has.
type agentCounter func(ctx context.Context, address string) (int, error)

// agentsBehind says why host h, whose kube-apiserver answers, is not put
// in the Service yet, or "" when it may serve: its konnectivity-server has
// at least as many agents as each serving host's (read on each host's
// health port), or agentsWait has passed since (its step began, or its
// kubelet upgrade ended), or no
// other host serves (nothing to compare with, and nothing better to
// offer clients).
func (r *TenantControlPlaneReconciler) agentsBehind(ctx context.Context, tcp *apiary.TenantControlPlane, h *apiary.ControlPlaneHostStatus, since, now time.Time) string {
	if !render.KonnectivityEnabled(tcp) || now.Sub(since) >= agentsWait {
		return ""
	}
	count := r.agentCounter
	if count == nil {
		count = agentsOnHost
	}
	want := 0
	for _, o := range tcp.Status.ControlPlaneHosts {
		if o.Host == h.Host || !o.Serving || o.Step == apiary.HostStepStop {
			continue
		}
		if n, err := count(ctx, o.Address); err == nil {
			want = max(want, n)
		}
	}
	if want == 0 {
		return ""
	}
	have, err := count(ctx, h.Address)
	// A fixed deadline, not a countdown: the message is status, written
	// only when it changes.
	by := since.Add(agentsWait).UTC().Format(time.RFC3339)
	switch {
	case err != nil:
		return fmt.Sprintf("kube-apiserver answers /readyz; its konnectivity-server's agents cannot be read (%v); in the Service at %s at the latest", err, by)
	case have < want:
		return fmt.Sprintf("kube-apiserver answers /readyz; its konnectivity-server has %d agents, the serving hosts' %d; in the Service once it has as many, at %s at the latest", have, want, by)
	}
	return ""
}

// agentsOnHost reads the agent count of the konnectivity-server at
// address from its health port (plain HTTP, as the kubelet's probes).
func agentsOnHost(ctx context.Context, address string) (int, error) {
	return agentsAt(ctx, "http://"+net.JoinHostPort(address, strconv.Itoa(konnectivity.HealthPort))+"/metrics")
}

// agentsAt reads the agent count from a konnectivity-server's metrics at
// url, in at most agentsReadTimeout and metricsLimit bytes.
func agentsAt(ctx context.Context, url string) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, agentsReadTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
	if err != nil {
		return 0, fmt.Errorf("GET %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return agentsIn(io.LimitReader(resp.Body, metricsLimit))
}

// agentsIn finds the agent count in a konnectivity-server's metrics.
func agentsIn(metrics io.Reader) (int, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(metrics)
	if err != nil {
		return 0, fmt.Errorf("reading konnectivity-server metrics: %w", err)
	}
	if f, ok := families[agentsMetric]; ok {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "proxy_strategy" && l.GetValue() == agentsStrategy && m.GetGauge() != nil {
					return int(m.GetGauge().GetValue()), nil
				}
			}
		}
	}
	return 0, fmt.Errorf("no %s{proxy_strategy=%q} in the konnectivity-server's metrics", agentsMetric, agentsStrategy)
}
