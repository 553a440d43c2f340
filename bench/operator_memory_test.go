//go:build integration

package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/apiaryhq/apiary/datastore/etcdtest"
	"github.com/apiaryhq/apiary/internal/testenv"
	"github.com/apiaryhq/apiary/operator"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/operator/render"
)

const (
	memTenants   = 100
	memSystemNS  = "apiary-system"
	memTenantsNS = "tenants"
	// memReadyTimeout bounds the wait for all tenants; on 2 busy cores
	// 100 tenants take well under a minute.
	memReadyTimeout = 5 * time.Minute
)

// ran guards against a second run in the same process: controller names
// (and controller-runtime's metrics) are process-global, so a second
// operator.NewManager fails.
var ran atomic.Bool

// BenchmarkOperatorMemoryPerTenant provisions 100 TenantControlPlanes with
// the real operator (in this process) against a real kube-apiserver and a
// real etcd DataStore, and measures how much the operator's memory grows.
//
// Baseline: envtest, the DataStore etcd, the namespaces, the DataStore and
// its Secrets exist; the manager has not been built. Then the manager
// starts, the DataStore turns Ready (the "idle" reading), 100 ClusterIP
// tenants are created and the benchmark waits until every one has
// CertificatesReady=True (its Secrets, Service and Deployment exist; no pod
// runs in envtest) and the operator is quiet. Readings are taken after two
// runtime.GC calls. The manager gets envtest's rest.Config (QPS 1000), not
// the client-go default of 5 QPS that the apiary binary runs with: see
// BenchmarkOperatorProcessRSS for the binary.
//
// Metrics:
//
//	MiB/tcp            HeapInuse growth from baseline / 100 (includes the
//	                   manager's fixed cost, amortised)
//	heapalloc-MiB/tcp  same with HeapAlloc (live objects only)
//	marginal-MiB/tcp   HeapInuse growth from the idle manager / 100: the
//	                   per-tenant cost alone
//	rss-MiB/tcp        VmRSS growth from baseline / 100
//	rss-MiB-total      VmRSS of the whole test process at the end
//	s/100tcp           first create to the 100th CertificatesReady=True
//	cpu-ms/tcp         CPU time of this process (the operator, plus the
//	                   benchmark's creates and watch) until quiet / 100
//	servers-cpu-ms/tcp CPU time of kube-apiserver and both etcds over the
//	                   same window / 100
//	reconciles/tcp     TenantControlPlane reconciles until quiet / 100
//	writes/tcp         operator write requests (POST/PUT/PATCH/DELETE,
//	                   events included) until quiet / 100
//	reconciles-for-101st  TenantControlPlane reconciles caused by creating
//	                   one more tenant once the 100 are quiet (after the
//	                   memory reading)
//
// The ns/op column is s/100tcp in nanoseconds; B/op and allocs/op count
// every allocation of the process in that window (the operator, and the
// benchmark's creates and watch). APIARY_BENCH_HEAPPROFILE=file saves the
// heap at the final reading.
func BenchmarkOperatorMemoryPerTenant(b *testing.B) {
	if !ran.CompareAndSwap(false, true) {
		b.Skip("runs once per process (controller names are process-global): repeat the go test command for more samples")
	}
	if os.Getenv("APIARY_BENCH_HEAPPROFILE") != "" {
		// Sample every 4 KiB rather than every 512 KiB: the growth
		// measured is only ~15 MiB.
		runtime.MemProfileRate = 4096
	}
	// Production logs JSON at info level to stderr; format it, drop it.
	ctrllog.SetLogger(zap.New(zap.WriteTo(io.Discard)))

	ctx := b.Context()
	cfg, scheme, c := startManagementCluster(b)
	base := readMem(b)

	opts := operator.DefaultOptions()
	opts.MetricsAddr, opts.ProbeAddr = "0", "0"
	opts.Webhooks = false
	mgr, cleanup, err := operator.NewManager(cfg, opts)
	if err != nil {
		b.Fatal(err)
	}
	mgrCtx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := mgr.Start(mgrCtx); err != nil {
			b.Errorf("manager: %v", err)
		}
	})
	b.Cleanup(func() { cancel(); wg.Wait(); cleanup() })

	waitDataStoreReady(b, c)
	idle := readMem(b)
	countsBefore := readCounters(b)
	reconcilesBefore, writesBefore := countsBefore.reconciles["tenantcontrolplane"], countsBefore.writes

	w := watchTenants(b, cfg, scheme)

	// What the servers burn with nothing to do, to tell it apart.
	idleStart, idleCPU := time.Now(), childrenCPU(b)
	time.Sleep(2 * time.Second)
	idleServers := sumCPU(childrenCPU(b)) - sumCPU(idleCPU)
	idleRate := float64(idleServers) / float64(time.Since(idleStart))

	cpuBefore, childrenBefore := cpuTime(b), childrenCPU(b)
	windowStart := time.Now()
	b.ResetTimer()
	start := time.Now()
	names := createTenants(b, c, 0, memTenants)
	created := time.Since(start)
	waitCertificatesReady(b, w, names)
	elapsed := time.Since(start)
	b.StopTimer()

	checkOwnedObjects(ctx, b, c)
	quietAfter := waitQuiet(b)
	countsAfter := readCounters(b)
	reconcilesAfter, writesAfter := countsAfter.reconciles["tenantcontrolplane"], countsAfter.writes
	cpu := cpuTime(b) - cpuBefore
	childrenAfter := childrenCPU(b)
	window := time.Since(windowStart)
	after := readMem(b)
	if path := os.Getenv("APIARY_BENCH_HEAPPROFILE"); path != "" {
		writeHeapProfile(b, path)
	}

	// One more tenant on the same DataStore, once the 100 are quiet: how
	// many reconciles does it cause?
	cpuBeforeExtra, countsBeforeExtra := cpuTime(b), readCounters(b)
	waitCertificatesReady(b, w, createTenants(b, c, memTenants, 1))
	waitQuiet(b)
	cpuExtra, countsExtra := cpuTime(b)-cpuBeforeExtra, readCounters(b)
	b.ReportMetric(countsExtra.reconciles["tenantcontrolplane"]-countsBeforeExtra.reconciles["tenantcontrolplane"], "reconciles-for-101st")
	b.Logf("the 101st tenant caused %.0f TenantControlPlane reconciles, %.0f API writes, %.0f API reads and %s of CPU in this process",
		countsExtra.reconciles["tenantcontrolplane"]-countsBeforeExtra.reconciles["tenantcontrolplane"],
		countsExtra.writes-countsBeforeExtra.writes-1, countsExtra.reads-countsBeforeExtra.reads, cpuExtra.Round(time.Millisecond))

	mib := func(bytes int64) float64 { return float64(bytes) / (1 << 20) }
	perTCP := func(bytes int64) float64 { return mib(bytes) / memTenants }
	b.ReportMetric(perTCP(int64(after.heapInuse)-int64(base.heapInuse)), "MiB/tcp")
	b.ReportMetric(perTCP(int64(after.heapAlloc)-int64(base.heapAlloc)), "heapalloc-MiB/tcp")
	b.ReportMetric(perTCP(int64(after.heapInuse)-int64(idle.heapInuse)), "marginal-MiB/tcp")
	b.ReportMetric(perTCP(after.rss-base.rss), "rss-MiB/tcp")
	b.ReportMetric(mib(after.rss), "rss-MiB-total")
	b.ReportMetric(elapsed.Seconds(), "s/100tcp")
	b.ReportMetric(float64(cpu.Milliseconds())/memTenants, "cpu-ms/tcp")
	var childCPU []string
	var childTotal time.Duration
	for _, name := range slices.Sorted(maps.Keys(childrenAfter)) {
		d := childrenAfter[name] - childrenBefore[name]
		childTotal += d
		childCPU = append(childCPU, fmt.Sprintf("%s %s", name, d.Round(10*time.Millisecond)))
	}
	b.ReportMetric(float64(childTotal.Milliseconds())/memTenants, "servers-cpu-ms/tcp")
	b.ReportMetric((reconcilesAfter-reconcilesBefore)/memTenants, "reconciles/tcp")
	// The benchmark itself created the tenants.
	b.ReportMetric((writesAfter-writesBefore-memTenants)/memTenants, "writes/tcp")

	b.Logf("creating %d tenants took %s; all CertificatesReady after %s; quiet after a further %s; this process used %s of CPU meanwhile",
		memTenants, created.Round(time.Millisecond), elapsed.Round(time.Millisecond), quietAfter.Round(time.Millisecond), cpu.Round(time.Millisecond))
	b.Logf("CPU over the %s until quiet: this process %s; %s (idle, the servers use %.0f%% of a core: %s of this)",
		window.Round(10*time.Millisecond), cpu.Round(10*time.Millisecond), strings.Join(childCPU, ", "),
		100*idleRate, time.Duration(idleRate*float64(window)).Round(10*time.Millisecond))
	b.Logf("until quiet: %.0f TenantControlPlane reconciles, %.0f DataStore reconciles, %.0f API writes and %.0f API reads (GET, LIST, WATCH; the benchmark's own included)",
		reconcilesAfter-reconcilesBefore, countsAfter.reconciles["datastore"]-countsBefore.reconciles["datastore"],
		writesAfter-writesBefore, countsAfter.reads-countsBefore.reads)
	for _, r := range []struct {
		name string
		m    memReading
	}{{"baseline", base}, {"idle manager", idle}, {"100 tenants", after}} {
		b.Logf("%-13s HeapInuse %6.1f MiB  HeapAlloc %6.1f MiB  Sys %6.1f MiB  VmRSS %6.1f MiB  goroutines %d",
			r.name, mib(int64(r.m.heapInuse)), mib(int64(r.m.heapAlloc)), mib(int64(r.m.sys)), mib(r.m.rss), r.m.goroutines)
	}
}

// writeHeapProfile saves the live heap (go tool pprof -sample_index=inuse_space)
// to see what the per-tenant memory is made of.
func writeHeapProfile(b *testing.B, path string) {
	b.Helper()
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		b.Fatal(err)
	}
	b.Logf("heap profile written to %s", path)
}

func must(b *testing.B, err error) {
	b.Helper()
	if err != nil {
		b.Fatal(err)
	}
}

// startManagementCluster starts kube-apiserver with Apiary's CRDs (envtest)
// and a real etcd with TLS and auth as the DataStore "default", and creates
// the namespaces, the DataStore's Secrets and the DataStore.
func startManagementCluster(b *testing.B) (*rest.Config, *k8sruntime.Scheme, client.Client) {
	b.Helper()
	_, cfg := testenv.Start(b, testenv.Options{})
	scheme, err := operator.Scheme()
	if err != nil {
		b.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		b.Fatal(err)
	}
	etcd := etcdtest.Start(b)
	for _, ns := range []string{memSystemNS, memTenantsNS} {
		must(b, c.Create(b.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}))
	}
	createDataStore(b.Context(), b, c, etcd)
	return cfg, scheme, c
}

func waitDataStoreReady(b *testing.B, c client.Client) {
	b.Helper()
	waitFor(b, "DataStore default Ready", time.Minute, func() (bool, string) {
		var ds apiary.DataStore
		if err := c.Get(b.Context(), client.ObjectKey{Name: "default"}, &ds); err != nil {
			return false, err.Error()
		}
		return meta.IsStatusConditionTrue(ds.Status.Conditions, apiary.ConditionReady), fmt.Sprint(ds.Status.Conditions)
	})
}

// watchTenants watches the tenants' namespace. Watch rather than poll:
// listing 100 tenants every 100 ms would cost this process more CPU and
// allocations than it measures.
func watchTenants(b *testing.B, cfg *rest.Config, scheme *k8sruntime.Scheme) watch.Interface {
	b.Helper()
	wc, err := client.NewWithWatch(cfg, client.Options{Scheme: scheme})
	if err != nil {
		b.Fatal(err)
	}
	w, err := wc.Watch(b.Context(), &apiary.TenantControlPlaneList{}, client.InNamespace(memTenantsNS))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(w.Stop)
	return w
}

// createTenants creates n ClusterIP tenants on the DataStore "default",
// numbered from first, and returns their names.
func createTenants(b *testing.B, c client.Client, first, n int) map[string]bool {
	b.Helper()
	names := map[string]bool{}
	for i := first; i < first+n; i++ {
		tcp := &apiary.TenantControlPlane{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("bench-%03d", i), Namespace: memTenantsNS},
			Spec: apiary.TenantControlPlaneSpec{
				DataStore: "default",
				Network:   apiary.NetworkSpec{ServiceType: corev1.ServiceTypeClusterIP},
			},
		}
		must(b, c.Create(b.Context(), tcp))
		names[tcp.Name] = true
	}
	return names
}

// createDataStore stores the etcd's TLS material in Secrets and creates the
// DataStore, as operator/integration_test.go does.
func createDataStore(ctx context.Context, b *testing.B, c client.Client, etcd *etcdtest.Server) {
	b.Helper()
	cfg := etcd.Config()
	ca := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "default-etcd-ca", Namespace: memSystemNS}, Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{corev1.TLSCertKey: cfg.CACert, corev1.TLSPrivateKeyKey: cfg.CAKey}}
	root := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "default-etcd-root", Namespace: memSystemNS}, Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{corev1.TLSCertKey: cfg.ClientCert, corev1.TLSPrivateKeyKey: cfg.ClientKey}}
	for _, s := range []*corev1.Secret{ca, root} {
		must(b, c.Create(ctx, s))
	}
	must(b, c.Create(ctx, &apiary.DataStore{
		ObjectMeta: metav1.ObjectMeta{Name: "default"},
		Spec: apiary.DataStoreSpec{
			Endpoints: cfg.Endpoints,
			TLS: &apiary.DataStoreTLS{
				CASecretRef:     apiary.SecretReference{Name: ca.Name, Namespace: memSystemNS},
				ClientSecretRef: apiary.SecretReference{Name: root.Name, Namespace: memSystemNS},
			},
		},
	}))
}

// checkOwnedObjects makes sure every tenant really was provisioned: ten
// Secrets, a Service and a Deployment each.
func checkOwnedObjects(ctx context.Context, b *testing.B, c client.Client) {
	b.Helper()
	owned := client.MatchingLabels{render.LabelManagedBy: render.ManagedBy}
	var secrets corev1.SecretList
	var services corev1.ServiceList
	var deployments appsv1.DeploymentList
	for _, l := range []client.ObjectList{&secrets, &services, &deployments} {
		must(b, c.List(ctx, l, client.InNamespace(memTenantsNS), owned))
	}
	want := [3]int{memTenants * len(render.AllSecretKinds), memTenants, memTenants}
	if got := [3]int{len(secrets.Items), len(services.Items), len(deployments.Items)}; got != want {
		b.Fatalf("Secrets, Services, Deployments: got %v, want %v", got, want)
	}
}

// waitCertificatesReady follows the tenants' watch until every named one
// has CertificatesReady=True.
func waitCertificatesReady(b *testing.B, w watch.Interface, names map[string]bool) {
	b.Helper()
	ready := map[string]bool{}
	last := map[string]string{}
	timeout := time.After(memReadyTimeout)
	for len(ready) < len(names) {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				b.Fatalf("the watch of tenants ended with %d/%d CertificatesReady", len(ready), len(names))
			}
			tcp, isTCP := ev.Object.(*apiary.TenantControlPlane)
			if !isTCP || ev.Type == watch.Deleted || !names[tcp.Name] {
				continue
			}
			if meta.IsStatusConditionTrue(tcp.Status.Conditions, apiary.ConditionCertificatesReady) {
				ready[tcp.Name] = true
			} else {
				delete(ready, tcp.Name)
				last[tcp.Name] = fmt.Sprint(tcp.Status.Conditions)
			}
		case <-timeout:
			var notReady []string
			for name, conds := range last {
				if !ready[name] {
					notReady = append(notReady, name+": "+conds)
				}
			}
			b.Fatalf("%d/%d tenants CertificatesReady after %s; not ready: %.2000s", len(ready), len(names), memReadyTimeout, strings.Join(notReady, "; "))
		}
	}
}

func waitFor(b *testing.B, what string, timeout time.Duration, f func() (bool, string)) {
	b.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, state := f()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("%s: not true after %s: %s", what, timeout, state)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitQuiet waits until the TenantControlPlane controller has not
// reconciled for two seconds, so that the reading is not taken in the
// middle of a reconcile wave.
func waitQuiet(b *testing.B) time.Duration {
	b.Helper()
	return waitQuietFunc(b, func() (float64, error) {
		reconciles, _ := counters(b)
		return reconciles, nil
	})
}

// waitQuietFunc waits until reconciles() has not changed for two seconds.
func waitQuietFunc(b *testing.B, reconciles func() (float64, error)) time.Duration {
	b.Helper()
	start := time.Now()
	read := func() float64 {
		n, err := reconciles()
		if err != nil {
			b.Fatalf("reading the reconcile count: %v", err)
		}
		return n
	}
	last := read()
	stableSince := time.Now()
	for time.Since(stableSince) < 2*time.Second {
		if time.Since(start) > time.Minute {
			b.Logf("the operator still reconciles after a minute; measuring anyway")
			break
		}
		time.Sleep(250 * time.Millisecond)
		if now := read(); now != last {
			last, stableSince = now, time.Now()
		}
	}
	return time.Since(start)
}

// counters reads controller-runtime's TenantControlPlane reconcile counter
// and the number of write requests made through client-go in this process.
func counters(b *testing.B) (reconciles, writes float64) {
	b.Helper()
	c := readCounters(b)
	return c.reconciles["tenantcontrolplane"], c.writes
}

type counterValues struct {
	// reconciles by controller name.
	reconciles map[string]float64
	// writes and reads are client-go requests by this process.
	writes, reads float64
}

func readCounters(b *testing.B) counterValues {
	b.Helper()
	families, err := crmetrics.Registry.Gather()
	if err != nil {
		b.Fatal(err)
	}
	v := counterValues{reconciles: map[string]float64{}}
	for _, f := range families {
		switch f.GetName() {
		case "controller_runtime_reconcile_total":
			for _, m := range f.GetMetric() {
				v.reconciles[label(m, "controller")] += m.GetCounter().GetValue()
			}
		case "rest_client_requests_total":
			for _, m := range f.GetMetric() {
				switch label(m, "method") {
				case "POST", "PUT", "PATCH", "DELETE":
					v.writes += m.GetCounter().GetValue()
				default:
					v.reads += m.GetCounter().GetValue()
				}
			}
		}
	}
	return v
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// cpuTime is the user and system CPU time this process has used.
func cpuTime(b *testing.B) time.Duration {
	b.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// childrenCPU is the CPU time of each child process (kube-apiserver, the
// envtest etcd, the DataStore etcd) by name, from /proc/<pid>/stat; two
// children of the same name (the etcds) are summed.
func childrenCPU(b *testing.B) map[string]time.Duration {
	b.Helper()
	const clockTicks = 100 // USER_HZ on Linux
	self := os.Getpid()
	out := map[string]time.Duration{}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		b.Fatal(err)
	}
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		raw, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // gone meanwhile
		}
		// pid (comm) state ppid ... utime(14) stime(15): comm may hold
		// spaces, so split after its closing parenthesis.
		open, closing := strings.IndexByte(string(raw), '('), strings.LastIndexByte(string(raw), ')')
		if open < 0 || closing < open {
			continue
		}
		fields := strings.Fields(string(raw[closing+1:]))
		if len(fields) < 13 {
			continue
		}
		if ppid, _ := strconv.Atoi(fields[1]); ppid != self {
			continue
		}
		utime, _ := strconv.ParseInt(fields[11], 10, 64)
		stime, _ := strconv.ParseInt(fields[12], 10, 64)
		out[string(raw[open+1:closing])] += time.Duration(utime+stime) * time.Second / clockTicks
	}
	return out
}

func sumCPU(m map[string]time.Duration) time.Duration {
	var total time.Duration
	for _, d := range m {
		total += d
	}
	return total
}

type memReading struct {
	heapInuse, heapAlloc, sys uint64
	rss                       int64
	goroutines                int
}

// readMem collects garbage twice (the second pass frees what finalizers
// released in the first) and reads the heap and the process RSS.
func readMem(b *testing.B) memReading {
	b.Helper()
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return memReading{heapInuse: ms.HeapInuse, heapAlloc: ms.HeapAlloc, sys: ms.Sys, rss: vmRSS(b), goroutines: runtime.NumGoroutine()}
}

// vmRSS is the resident set size of this process from /proc/self/status.
func vmRSS(b *testing.B) int64 {
	b.Helper()
	f, err := os.Open("/proc/self/status")
	if err != nil {
		b.Fatalf("reading RSS: %v", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				b.Fatalf("parsing VmRSS %q: %v", rest, err)
			}
			return kb << 10
		}
	}
	b.Fatal("no VmRSS in /proc/self/status")
	return 0
}
