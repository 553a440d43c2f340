//go:build integration

package bench

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/apiaryhq/apiary/internal/testenv"
)

// BenchmarkOperatorProcessRSS runs the real `apiary operator` binary, built
// as `make build` builds it, as its own process against envtest and a real
// etcd DataStore, with its metrics endpoint on, and reads its memory from
// /proc/<pid>/status: VmRSS once the DataStore is Ready ("idle") and after
// 100 ClusterIP tenants have CertificatesReady=True and the operator is
// quiet, and VmHWM (peak RSS). This is what a container memory graph
// shows, garbage not yet returned to the OS and the Go runtime included.
//
// Metrics:
//
//	proc-rss-MiB-idle   VmRSS with the DataStore Ready and no tenant
//	proc-rss-MiB-100    VmRSS with 100 tenants
//	proc-MiB/tcp        proc-rss-MiB-100 / 100: total memory per tenant,
//	                    as Kamaji's benchmark divides it
//	proc-delta-MiB/tcp  (proc-rss-MiB-100 - proc-rss-MiB-idle) / 100
//	proc-hwm-MiB        peak VmRSS over the whole run
//	s/100tcp            first create to the 100th CertificatesReady=True
func BenchmarkOperatorProcessRSS(b *testing.B) {
	bin := buildApiary(b)
	cfg, scheme, c := startManagementCluster(b)
	metricsAddr := freeAddr(b)
	dir := b.TempDir()
	logFile, err := os.Create(filepath.Join(dir, "operator.log"))
	if err != nil {
		b.Fatal(err)
	}
	defer logFile.Close()
	cmd := exec.Command(bin, "operator",
		"--kubeconfig", writeKubeconfig(b, cfg, dir),
		"--webhooks=false",
		"--metrics-bind-address", metricsAddr,
		"--health-probe-bind-address=0")
	// Logs go to a file, as a container runtime would take them.
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	b.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if b.Failed() {
			if raw, err := os.ReadFile(logFile.Name()); err == nil {
				b.Logf("operator log (last 4000 bytes):\n%s", raw[max(0, len(raw)-4000):])
			}
		}
	})
	pid := cmd.Process.Pid

	waitDataStoreReady(b, c)
	// Let the informers settle before the idle reading.
	time.Sleep(2 * time.Second)
	idle := procStatus(b, pid)

	w := watchTenants(b, cfg, scheme)
	b.ResetTimer()
	start := time.Now()
	waitCertificatesReady(b, w, createTenants(b, c, 0, memTenants))
	elapsed := time.Since(start)
	b.StopTimer()
	checkOwnedObjects(b.Context(), b, c)
	scrape := func() (float64, error) { return scrapeReconciles(metricsAddr) }
	waitQuietFunc(b, scrape)
	after := procStatus(b, pid)

	mib := func(kb int64) float64 { return float64(kb) / 1024 }
	b.ReportMetric(mib(idle.rss), "proc-rss-MiB-idle")
	b.ReportMetric(mib(after.rss), "proc-rss-MiB-100")
	b.ReportMetric(mib(after.rss)/memTenants, "proc-MiB/tcp")
	b.ReportMetric(mib(after.rss-idle.rss)/memTenants, "proc-delta-MiB/tcp")
	b.ReportMetric(mib(after.hwm), "proc-hwm-MiB")
	b.ReportMetric(elapsed.Seconds(), "s/100tcp")
	b.Logf("apiary operator pid %d: VmRSS idle %.1f MiB, with %d tenants %.1f MiB, peak %.1f MiB; %d threads",
		pid, mib(idle.rss), memTenants, mib(after.rss), mib(after.hwm), after.threads)
}

// buildApiary builds cmd/apiary the way `make build` does.
func buildApiary(b *testing.B) string {
	b.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	}
	bin := filepath.Join(b.TempDir(), "apiary")
	cmd := exec.Command(goBin, "build", "-trimpath", "-o", bin, "./cmd/apiary")
	cmd.Dir = testenv.RepoRoot()
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("building apiary: %v\n%s", err, out)
	}
	return bin
}

func writeKubeconfig(b *testing.B, cfg *rest.Config, dir string) string {
	b.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["envtest"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["envtest"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData, Token: cfg.BearerToken}
	kc.Contexts["envtest"] = &clientcmdapi.Context{Cluster: "envtest", AuthInfo: "envtest"}
	kc.CurrentContext = "envtest"
	path := filepath.Join(dir, "management.kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		b.Fatal(err)
	}
	return path
}

// freeAddr is a loopback address whose port was free a moment ago.
func freeAddr(b *testing.B) string {
	b.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// scrapeReconciles reads controller_runtime_reconcile_total of the
// TenantControlPlane controller from the operator's metrics endpoint.
func scrapeReconciles(addr string) (float64, error) {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	var total float64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "controller_runtime_reconcile_total{") || !strings.Contains(line, `controller="tenantcontrolplane"`) {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			return 0, fmt.Errorf("parsing %q: %w", line, err)
		}
		total += v
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	return total, sc.Err()
}

type procMem struct {
	rss, hwm int64 // kB
	threads  int
}

// procStatus reads VmRSS, VmHWM and Threads of a process.
func procStatus(b *testing.B, pid int) procMem {
	b.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatalf("reading the operator's memory: %v", err)
	}
	var m procMem
	for line := range strings.Lines(string(raw)) {
		key, value, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(value), " kB"), 10, 64)
		switch key {
		case "VmRSS":
			m.rss = n
		case "VmHWM":
			m.hwm = n
		case "Threads":
			m.threads = int(n)
		}
	}
	if m.rss == 0 {
		b.Fatalf("no VmRSS in /proc/%d/status", pid)
	}
	return m
}
