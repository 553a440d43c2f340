//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/apiaryhq/apiary/e2e/framework"
	"github.com/apiaryhq/apiary/e2e/sshhost"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

const switchRounds = 3

// BenchmarkModeSwitch measures a tenant's switch standalone → registered
// and back with 1 and then 2 control-plane hosts, switchRounds times each,
// while a client sends GET /version through the endpoint every 100 ms on a
// new connection: each switch's duration (spec.mode set → ModeSwitched True
// with the mode in effect), the longest time without a successful request,
// failed requests, and per host, from the journals: install (once), the
// join each switch to registered starts with, and the start step (files
// written → its kube-apiserver answering /readyz).
func BenchmarkModeSwitch(b *testing.B) {
	e := framework.Setup(b)
	d, image := hostDocker(b, e, "apiary-bench-switch", "172.31.252.0/24")
	const tenant = "bench-switch"
	e.CreateTenant(b, tenant, nil)
	kc := e.ExportKubeconfig(b, tenant)
	framework.Kubectl(b, kc, "apply", "-f", "../../hack/cni/kube-router.yaml")

	// Two hosts: a control-plane one (in Standby while the tenant is
	// standalone) and a worker, which becomes the second control-plane
	// one for the second round.
	var names []string
	for i := range 2 {
		name := fmt.Sprintf("bench-cp-%d", i)
		h, err := d.StartHost(e.Ctx, sshhost.HostOptions{Name: name, Network: "apiary-bench-switch", Image: image, RegistryMirror: "http://" + e.RegistryAtNode()})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = d.RemoveHost(context.Background(), name) })
		sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: framework.TenantsNS, Name: name + "-key"}, Type: corev1.SecretTypeSSHAuth,
			Data: map[string][]byte{corev1.SSHAuthPrivateKey: h.PrivateKeyPEM}}
		if err := e.C.Create(e.Ctx, sec); err != nil {
			b.Fatal(err)
		}
		role := apiary.HostRoleControlPlane
		if i > 0 {
			role = apiary.HostRoleWorker
		}
		host := &apiary.Host{ObjectMeta: metav1.ObjectMeta{Namespace: framework.TenantsNS, Name: name}, Spec: apiary.HostSpec{
			TenantControlPlane: tenant, Address: h.Address, SSHKeySecretRef: corev1.LocalObjectReference{Name: sec.Name}, HostKey: h.HostKeyAuthorized, Role: role,
		}}
		if err := e.C.Create(e.Ctx, host); err != nil {
			b.Fatal(err)
		}
		names = append(names, name)
	}
	// Settled while standalone: workers joined, control-plane Hosts
	// installed but not joined (Standby).
	waitHosts := func() time.Duration {
		start := time.Now()
		framework.Eventually(b, "hosts settled", 5*time.Minute, func() error {
			for _, n := range names {
				var h apiary.Host
				if err := e.C.Get(e.Ctx, client.ObjectKey{Namespace: framework.TenantsNS, Name: n}, &h); err != nil {
					return err
				}
				want := apiary.HostPhaseReady
				if h.Spec.Role == apiary.HostRoleControlPlane {
					want = apiary.HostPhaseStandby
				}
				if h.Status.Phase != want {
					return fmt.Errorf("%s phase %s, want %s", n, h.Status.Phase, want)
				}
			}
			return nil
		})
		return time.Since(start)
	}
	waitHosts()
	b.Logf("per host install (node bundle copied and installed, once per Host): %s", list(journalSteps(b, e, names, "install", time.Time{})))

	url, hc := versionClient(b, kc)

	type result struct {
		took, gap time.Duration
		failed    int
		hostStart []time.Duration
		hostJoin  []time.Duration
	}
	switchTo := func(mode apiary.Mode) result {
		ctx, cancel := context.WithCancel(e.Ctx)
		var mu sync.Mutex
		var r result
		last := time.Now()
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				resp, err := hc.Get(url)
				now := time.Now()
				mu.Lock()
				if err == nil && resp.StatusCode == http.StatusOK {
					r.gap = max(r.gap, now.Sub(last))
					last = now
				} else if ctx.Err() == nil {
					r.failed++
				}
				mu.Unlock()
				if resp != nil {
					resp.Body.Close()
				}
				time.Sleep(100 * time.Millisecond)
			}
		}()
		start := time.Now()
		framework.Eventually(b, "spec.mode "+string(mode), 30*time.Second, func() error {
			var tcp apiary.TenantControlPlane
			if err := e.C.Get(e.Ctx, client.ObjectKey{Namespace: framework.TenantsNS, Name: tenant}, &tcp); err != nil {
				return err
			}
			tcp.Spec.Mode = mode
			return e.C.Update(e.Ctx, &tcp)
		})
		var tcp apiary.TenantControlPlane
		framework.Eventually(b, tenant+" in mode "+string(mode), 10*time.Minute, func() error {
			if err := e.C.Get(e.Ctx, client.ObjectKey{Namespace: framework.TenantsNS, Name: tenant}, &tcp); err != nil {
				return err
			}
			if tcp.Status.Mode != mode {
				return fmt.Errorf("status.mode %s", tcp.Status.Mode)
			}
			return framework.ConditionIs(tcp.Status.Conditions, apiary.ConditionModeSwitched, metav1.ConditionTrue, "")
		})
		r.took = time.Since(start)
		time.Sleep(2 * time.Second)
		cancel()
		wg.Wait()
		for _, h := range tcp.Status.ControlPlaneHosts {
			if mode == apiary.ModeRegistered && h.Step == apiary.HostStepStart && h.Finished != nil && !h.Started.Before(&metav1.Time{Time: start.Add(-time.Second)}) {
				r.hostStart = append(r.hostStart, h.Finished.Sub(h.Started.Time))
			}
		}
		if mode == apiary.ModeRegistered {
			// Each control-plane Host joins when the switch starts: its
			// journal's join step (kubeadm join), then its Node Ready.
			r.hostJoin = journalSteps(b, e, names, "join", start)
		}
		return r
	}

	for n := 1; n <= 2; n++ {
		if n == 2 {
			framework.Eventually(b, names[1]+" control-plane", 30*time.Second, func() error {
				var h apiary.Host
				if err := e.C.Get(e.Ctx, client.ObjectKey{Namespace: framework.TenantsNS, Name: names[1]}, &h); err != nil {
					return err
				}
				h.Spec.Role = apiary.HostRoleControlPlane
				return e.C.Update(e.Ctx, &h)
			})
			time.Sleep(2 * time.Second)
			waitHosts()
		}
		var to, back, left, gaps []time.Duration
		var starts, joins []time.Duration
		failed := 0
		for range switchRounds {
			r := switchTo(apiary.ModeRegistered)
			to, gaps, starts, failed = append(to, r.took), append(gaps, r.gap), append(starts, r.hostStart...), failed+r.failed
			joins = append(joins, r.hostJoin...)
			r = switchTo(apiary.ModeStandalone)
			back, gaps, failed = append(back, r.took), append(gaps, r.gap), failed+r.failed
			// The hosts leave the tenant after the switch: the next
			// round starts from Standby, as a real one does.
			left = append(left, waitHosts())
		}
		b.Logf("%d control-plane host(s), %d rounds: standalone→registered (joins included) p50 %s (all %s); registered→standalone p50 %s (all %s), hosts in Standby after it p50 %s (all %s); "+
			"per host join (kubeadm join) p50 %s (all %s), start (write → /readyz) p50 %s (all %s); longest gap between successful GET /version (every 100 ms) %s (all %s); failed requests %d",
			n, switchRounds, p50d(to), list(to), p50d(back), list(back), p50d(left), list(left), p50d(joins), list(joins), p50d(starts), list(starts),
			slices.Max(gaps).Round(10*time.Millisecond), list(gaps), failed)
		b.ReportMetric(p50d(to).Seconds(), fmt.Sprintf("s-to-registered-%dhost-p50", n))
		b.ReportMetric(p50d(back).Seconds(), fmt.Sprintf("s-to-standalone-%dhost-p50", n))
	}
}

// journalSteps are the durations of the named Hosts' journal step name
// that started after since.
func journalSteps(b *testing.B, e *framework.Env, names []string, name string, since time.Time) []time.Duration {
	b.Helper()
	var out []time.Duration
	for _, n := range names {
		var h apiary.Host
		if err := e.C.Get(e.Ctx, client.ObjectKey{Namespace: framework.TenantsNS, Name: n}, &h); err != nil {
			b.Fatal(err)
		}
		for _, s := range h.Status.Journal {
			if s.Name == name && s.Finished != nil && !s.Started.Time.Before(since.Add(-time.Second)) {
				out = append(out, s.Finished.Sub(s.Started.Time))
			}
		}
	}
	return out
}

func p50d(v []time.Duration) time.Duration {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

func list(v []time.Duration) string {
	var out []string
	for _, d := range v {
		out = append(out, d.Round(100*time.Millisecond).String())
	}
	return strings.Join(out, " ")
}
