//go:build e2e

// Package e2e benchmarks Apiary on the local management cluster: how long a
// new tenant takes to answer through its LoadBalancer, where that time goes,
// and what idle tenants and the operator cost. Run with the cluster up:
//
//	go run ./hack/devcluster up
//	go test -tags e2e -run '^$' -bench . -benchtime=1x -timeout 90m ./bench/e2e/
package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/apiaryhq/apiary/e2e/framework"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/operator/render"
)

const tenants = 10

// milestones a new tenant passes, in order, as seen from a watch cache.
var milestones = []string{"service address", "deployment", "pod scheduled", "containers running", "pod ready", "API answers", "Ready condition"}

type timeline map[string]time.Duration

func BenchmarkTenantReady(b *testing.B) {
	e := framework.Setup(b)
	c, err := cache.New(e.Cfg, cache.Options{Scheme: e.C.Scheme(), DefaultNamespaces: map[string]cache.Config{framework.TenantsNS: {}}})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(b.Context())
	defer cancel()
	go func() { _ = c.Start(ctx) }()
	for _, obj := range []client.Object{&apiary.TenantControlPlane{}, &corev1.Service{}, &appsv1.Deployment{}, &corev1.Pod{}, &corev1.Secret{}} {
		if _, err := c.GetInformer(ctx, obj); err != nil {
			b.Fatal(err)
		}
	}
	c.WaitForCacheSync(ctx)

	run := func(b *testing.B, prefix string, concurrent bool) []timeline {
		var mu sync.Mutex
		var out []timeline
		var wg sync.WaitGroup
		for i := range tenants {
			name := fmt.Sprintf("%s-%d", prefix, i)
			f := func() {
				tl := measure(b, e, c, name)
				mu.Lock()
				out = append(out, tl)
				mu.Unlock()
			}
			if concurrent {
				wg.Go(f)
			} else {
				f()
			}
		}
		wg.Wait()
		return out
	}
	report := func(b *testing.B, tls []timeline) {
		var lines []string
		for _, m := range milestones {
			var ds []time.Duration
			for _, tl := range tls {
				ds = append(ds, tl[m])
			}
			p50, p95 := percentile(ds, 50), percentile(ds, 95)
			lines = append(lines, fmt.Sprintf("  %-20s p50 %6.2fs  p95 %6.2fs  max %6.2fs", m, p50.Seconds(), p95.Seconds(), slices.Max(ds).Seconds()))
			if m == "API answers" {
				b.ReportMetric(p50.Seconds(), "p50-s-to-API")
				b.ReportMetric(p95.Seconds(), "p95-s-to-API")
			}
		}
		b.Logf("create → milestone over %d tenants:\n%s", len(tls), strings.Join(lines, "\n"))
	}
	b.Run("sequential", func(b *testing.B) { report(b, run(b, "seq", false)) })
	// The concurrent ones start on an empty cluster too, and stay for the
	// idle measurements.
	deleteTenants(b, e, "seq-")
	b.Run("concurrent", func(b *testing.B) { report(b, run(b, "par", true)) })

	// Idle costs, with the tenants above running and untouched.
	time.Sleep(30 * time.Second)
	b.Run("idle", func(b *testing.B) {
		var pods corev1.PodList
		if err := e.C.List(e.Ctx, &pods, client.InNamespace(framework.TenantsNS), client.MatchingLabels{render.LabelTenant: "par-0"}); err != nil || len(pods.Items) == 0 {
			b.Fatalf("pods of par-0: %v", err)
		}
		for name, kib := range containerRSS(b, &pods.Items[0]) {
			b.ReportMetric(float64(kib)/1024, name+"-MiB")
		}
		var ops corev1.PodList
		if err := e.C.List(e.Ctx, &ops, client.InNamespace(framework.SystemNS), client.MatchingLabels{"app.kubernetes.io/component": "operator"}); err != nil {
			b.Fatal(err)
		}
		var rss, cpu float64
		for _, p := range ops.Items {
			pid := mainPID(b, &p, "operator")
			r, c := processUsage(b, pid, 30*time.Second)
			b.Logf("operator pod %s: RSS %.1f MiB, CPU %.2f%% of a core over 30 s with %d idle tenants", p.Name, float64(r)/1024, c, tenants)
			rss += float64(r) / 1024
			cpu += c
		}
		b.ReportMetric(rss, "operator-MiB-all-replicas")
		b.ReportMetric(cpu, "operator-cpu-%core")
	})
}

// deleteTenants deletes the tenants whose names start with prefix and waits
// until they and their pods are gone.
func deleteTenants(b *testing.B, e *framework.Env, prefix string) {
	var list apiary.TenantControlPlaneList
	if err := e.C.List(e.Ctx, &list, client.InNamespace(framework.TenantsNS)); err != nil {
		b.Fatal(err)
	}
	for i := range list.Items {
		if strings.HasPrefix(list.Items[i].Name, prefix) {
			if err := e.C.Delete(e.Ctx, &list.Items[i]); err != nil {
				b.Fatal(err)
			}
		}
	}
	framework.Eventually(b, "tenants "+prefix+"* gone", 5*time.Minute, func() error {
		var pods corev1.PodList
		if err := e.C.List(e.Ctx, &pods, client.InNamespace(framework.TenantsNS)); err != nil {
			return err
		}
		for _, p := range pods.Items {
			if strings.HasPrefix(p.Name, prefix) {
				return fmt.Errorf("pod %s still there", p.Name)
			}
		}
		return nil
	})
}

// measure creates one tenant and records when each milestone was first seen.
func measure(b *testing.B, e *framework.Env, c cache.Cache, name string) timeline {
	tcp := &apiary.TenantControlPlane{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: framework.TenantsNS}}
	start := time.Now()
	if err := e.C.Create(e.Ctx, tcp); err != nil {
		b.Fatal(err)
	}
	tl := timeline{}
	mark := func(m string) {
		if _, ok := tl[m]; !ok {
			tl[m] = time.Since(start)
		}
	}
	var hc *http.Client
	deadline := start.Add(framework.ReadyLimit)
	for len(tl) < len(milestones) {
		if time.Now().After(deadline) {
			b.Fatalf("%s: after %s only %v", name, framework.ReadyLimit, tl)
		}
		key := client.ObjectKey{Namespace: framework.TenantsNS, Name: name}
		var svc corev1.Service
		if c.Get(e.Ctx, key, &svc) == nil && len(svc.Status.LoadBalancer.Ingress) > 0 {
			mark("service address")
		}
		var dep appsv1.Deployment
		if c.Get(e.Ctx, key, &dep) == nil {
			mark("deployment")
		}
		var pods corev1.PodList
		if c.List(e.Ctx, &pods, client.InNamespace(framework.TenantsNS), client.MatchingLabels{render.LabelTenant: name}) == nil {
			for _, p := range pods.Items {
				if p.Spec.NodeName != "" {
					mark("pod scheduled")
				}
				running := len(p.Status.ContainerStatuses) > 0
				for _, cs := range p.Status.ContainerStatuses {
					running = running && cs.State.Running != nil
				}
				if running {
					mark("containers running")
				}
				for _, cond := range p.Status.Conditions {
					if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
						mark("pod ready")
					}
				}
			}
		}
		var t apiary.TenantControlPlane
		if c.Get(e.Ctx, key, &t) == nil {
			if meta.IsStatusConditionTrue(t.Status.Conditions, apiary.ConditionReady) {
				mark("Ready condition")
			}
			if hc == nil && t.Status.Endpoint != "" {
				var ca corev1.Secret
				if c.Get(e.Ctx, client.ObjectKey{Namespace: framework.TenantsNS, Name: name + "-ca"}, &ca) == nil {
					pool := x509.NewCertPool()
					pool.AppendCertsFromPEM(ca.Data["tls.crt"])
					hc = &http.Client{Timeout: time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, DisableKeepAlives: true}}
				}
			}
			if hc != nil {
				if resp, err := hc.Get(t.Status.Endpoint + "/version"); err == nil {
					resp.Body.Close()
					if resp.StatusCode == http.StatusOK {
						mark("API answers")
					}
				}
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return tl
}

func percentile(ds []time.Duration, p int) time.Duration {
	s := slices.Clone(ds)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := (len(s)*p + 99) / 100
	return s[max(0, min(len(s)-1, i-1))]
}

// containerRSS reads the VmRSS (KiB) of each container's processes of a pod
// from /proc, finding them by their cgroup (the pod UID and container ID).
func containerRSS(b *testing.B, pod *corev1.Pod) map[string]int64 {
	out := map[string]int64{}
	for _, cs := range pod.Status.ContainerStatuses {
		_, id, _ := strings.Cut(cs.ContainerID, "://")
		for _, pid := range pidsInCgroup(b, id) {
			out[cs.Name] += rssKiB(pid)
		}
	}
	return out
}

func mainPID(b *testing.B, pod *corev1.Pod, container string) int {
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.Name == container {
			_, id, _ := strings.Cut(cs.ContainerID, "://")
			if pids := pidsInCgroup(b, id); len(pids) > 0 {
				return pids[0]
			}
		}
	}
	b.Fatalf("no process for container %s of %s", container, pod.Name)
	return 0
}

func pidsInCgroup(b *testing.B, containerID string) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		b.Fatal(err)
	}
	var pids []int
	for _, en := range entries {
		pid, err := strconv.Atoi(en.Name())
		if err != nil {
			continue
		}
		cg, err := os.ReadFile(filepath.Join("/proc", en.Name(), "cgroup"))
		if err == nil && strings.Contains(string(cg), containerID) {
			pids = append(pids, pid)
		}
	}
	return pids
}

func rssKiB(pid int) int64 {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(raw), "\n") {
		if strings.HasPrefix(l, "VmRSS:") {
			f := strings.Fields(l)
			n, _ := strconv.ParseInt(f[1], 10, 64)
			return n
		}
	}
	return 0
}

// processUsage returns the RSS (KiB) at the end and the CPU use (% of one
// core) of a process over d.
func processUsage(b *testing.B, pid int, d time.Duration) (int64, float64) {
	ticks := func() float64 {
		raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			b.Fatal(err)
		}
		f := strings.Fields(string(raw)[strings.LastIndexByte(string(raw), ')')+2:])
		u, _ := strconv.ParseFloat(f[11], 64)
		s, _ := strconv.ParseFloat(f[12], 64)
		return u + s
	}
	t0 := ticks()
	time.Sleep(d)
	const hz = 100 // USER_HZ on Linux
	return rssKiB(pid), (ticks() - t0) / hz / d.Seconds() * 100
}
