//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/apiaryhq/apiary/e2e/framework"
	images "github.com/apiaryhq/apiary/hack/images"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

// upgradeRuns is how many tenants are upgraded, one after another.
const upgradeRuns = 3

// BenchmarkControlPlaneUpgrade measures a hosted control plane (2
// replicas) upgraded from the previous minor to the current one, several
// times, each on a new tenant: spec.version changed → status.version at the
// new version (every replica runs it), while GET /version is sent through
// the LoadBalancer every 100 ms on a new connection; failed requests and
// the longest time between two good answers are counted. b.N is ignored
// (-benchtime=1x). Worker Hosts' per-step times come from the e2e test
// HostsOverSSH/TenantUpgradesAMinorWithItsHosts (its FIGURE lines).
func BenchmarkControlPlaneUpgrade(b *testing.B) {
	e := framework.Setup(b)
	const prefix = "bench-upgrade-"
	deleteTenants(b, e, prefix)
	from, to := images.PreviousKubeVersion, images.KubeVersion
	var took, gaps []time.Duration
	var ok, failed int
	for i := range upgradeRuns {
		name := fmt.Sprintf("%s%d", prefix, i)
		e.CreateTenant(b, name, func(t *apiary.TenantControlPlane) { t.Spec.Version = from })
		framework.Eventually(b, name+" runs "+from+" on both replicas", 2*time.Minute, func() error {
			if st := e.TCP(b, name).Status; st.Version != from || st.ReadyReplicas != 2 {
				return fmt.Errorf("status.version %q, %d ready", st.Version, st.ReadyReplicas)
			}
			return nil
		})
		p := startVersionPoller(b, e, name)
		tcp := e.TCP(b, name)
		tcp.Spec.Version = to
		start := time.Now()
		if err := e.C.Update(e.Ctx, tcp); err != nil {
			b.Fatal(err)
		}
		framework.Eventually(b, name+" at "+to, 5*time.Minute, func() error {
			if v := e.TCP(b, name).Status.Version; v != to {
				return fmt.Errorf("status.version %s", v)
			}
			return nil
		})
		took = append(took, time.Since(start))
		// Polled a little longer: the last old pod is still leaving.
		time.Sleep(5 * time.Second)
		o, f, gap := p.stop()
		ok, failed = ok+o, failed+f
		gaps = append(gaps, gap)
		b.Logf("%s: %s → %s in %s; /version %d OK, %d failed, longest gap %s", name, from, to,
			took[i].Round(100*time.Millisecond), o, f, gap.Round(time.Millisecond))
	}
	b.Logf("control-plane upgrade %s → %s, 2 replicas, %d runs: p50 %s (%s); /version %d OK, %d failed; longest gaps %s",
		from, to, upgradeRuns, p50d(took).Round(100*time.Millisecond), list(took), ok, failed, list(gaps))
	deleteTenants(b, e, prefix)
}

type versionPoller struct {
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	ok     int
	failed int
	gap    time.Duration
}

// startVersionPoller sends GET /version through the tenant's endpoint every
// 100 ms, each on a new connection (a kept-alive one would stay on one pod).
func startVersionPoller(b *testing.B, e *framework.Env, name string) *versionPoller {
	url, hc := versionClient(b, e.ExportKubeconfig(b, name))
	ctx, cancel := context.WithCancel(e.Ctx)
	p := &versionPoller{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		last := time.Now()
		for ctx.Err() == nil {
			resp, err := hc.Get(url)
			good := err == nil && resp.StatusCode == http.StatusOK
			if resp != nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			p.mu.Lock()
			if good {
				p.ok++
				p.gap = max(p.gap, time.Since(last))
				last = time.Now()
			} else if ctx.Err() == nil {
				p.failed++
			}
			p.mu.Unlock()
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	return p
}

// stop ends the poll and returns good and failed answers and the longest
// time between two good ones.
func (p *versionPoller) stop() (int, int, time.Duration) {
	p.cancel()
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ok, p.failed, p.gap
}

// versionClient is the tenant's /version URL and a client that opens a new
// connection for every request: a kept-alive one would stay on one pod and
// hide what the LoadBalancer does.
func versionClient(b *testing.B, kubeconfig string) (string, *http.Client) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		b.Fatal(err)
	}
	tlsCfg, err := rest.TLSConfigFor(cfg)
	if err != nil {
		b.Fatal(err)
	}
	return cfg.Host + "/version", &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: tlsCfg, DisableKeepAlives: true}}
}
