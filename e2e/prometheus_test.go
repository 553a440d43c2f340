//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/util/retry"

	"github.com/apiaryhq/apiary/e2e/framework"
	"github.com/apiaryhq/apiary/internal/testenv"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

// prometheus is a Prometheus server (built from source by make tools) on
// this machine, with its HTTP API.
type prometheus struct {
	url string
	hc  *http.Client
}

// startPrometheus runs Prometheus scraping the operator at target (HTTPS,
// with the bearer token; the operator's serving certificate is self-signed,
// as the chart's ServiceMonitor assumes) every second, with the chart's
// alert rules, each for: cut to forSeconds.
func (e *env) startPrometheus(t *testing.T, target, token string, forSeconds int) *prometheus {
	t.Helper()
	bin, err := testenv.PrometheusBinary()
	if err != nil {
		t.Fatal(err)
	}
	rules, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "charts", "apiary", "files", "alerts.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	forLine := regexp.MustCompile(`(?m)^(\s+)for: \S+$`)
	if !forLine.Match(rules) {
		t.Fatal("the chart's alerts have no for: to shorten")
	}
	rules = forLine.ReplaceAll(rules, []byte(fmt.Sprintf("${1}for: %ds", forSeconds)))
	dir := t.TempDir()
	config := fmt.Sprintf(`global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: [alerts.yaml]
scrape_configs:
  - job_name: apiary
    scheme: https
    authorization:
      credentials_file: %s
    tls_config:
      insecure_skip_verify: true
    static_configs:
      - targets: [%q]
`, filepath.Join(dir, "token"), target)
	for name, content := range map[string][]byte{"token": []byte(token), "alerts.yaml": rules, "prometheus.yml": []byte(config)} {
		if err := os.WriteFile(filepath.Join(dir, name), content, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	logPath := filepath.Join(dir, "prometheus.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config.file="+filepath.Join(dir, "prometheus.yml"), "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		_ = logFile.Close()
		if t.Failed() {
			if b, err := os.ReadFile(logPath); err == nil {
				t.Logf("prometheus log:\n%s", lastLines(string(b), 40))
			}
		}
	})
	p := &prometheus{url: "http://" + addr, hc: &http.Client{Timeout: 10 * time.Second}}
	framework.Eventually(t, "prometheus ready", time.Minute, func() error {
		resp, err := p.hc.Get(p.url + "/-/ready")
		if err != nil {
			return err
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("/-/ready: %s", resp.Status)
		}
		return nil
	})
	return p
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// get reads one API path into out's data.
func (p *prometheus) get(path string, out any) error {
	resp, err := p.hc.Get(p.url + path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var body struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return fmt.Errorf("%s: %s: %w", path, resp.Status, err)
	}
	if body.Status != "success" {
		return fmt.Errorf("%s: %s %s", path, body.Status, body.Error)
	}
	return json.Unmarshal(body.Data, out)
}

type promSample struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
}

// query runs an instant query and returns each series' labels and value.
func (p *prometheus) query(q string) ([]promSample, error) {
	var data struct {
		Result []promSample `json:"result"`
	}
	if err := p.get("/api/v1/query?query="+url.QueryEscape(q), &data); err != nil {
		return nil, err
	}
	return data.Result, nil
}

// value is the single series q returns.
func (p *prometheus) value(q string) (float64, error) {
	res, err := p.query(q)
	if err != nil {
		return 0, err
	}
	if len(res) != 1 {
		return 0, fmt.Errorf("%s: %d series, want 1", q, len(res))
	}
	s, _ := res[0].Value[1].(string)
	return strconv.ParseFloat(s, 64)
}

type promAlert struct {
	Labels map[string]string `json:"labels"`
	State  string            `json:"state"`
}

// alert is the state (pending, firing; "" when inactive) of alertname for
// the series with these labels.
func (p *prometheus) alert(name string, labels map[string]string) (string, error) {
	var data struct {
		Alerts []promAlert `json:"alerts"`
	}
	if err := p.get("/api/v1/alerts", &data); err != nil {
		return "", err
	}
	for _, a := range data.Alerts {
		match := a.Labels["alertname"] == name
		for k, v := range labels {
			match = match && a.Labels[k] == v
		}
		if match {
			return a.State, nil
		}
	}
	return "", nil
}

// testPrometheus: a real Prometheus scrapes the operator's leader with the
// token allowed /metrics, stores alpha's series with the values its status
// has, and the chart's alert rules act on them: a quota set just above
// alpha's usage makes ApiaryTenantDataStoreQuotaNearlyFull go pending,
// then firing after its (shortened) for:, and resolve once the quota is
// lifted; the healthy alpha raises no ApiaryTenantNotReady.
func (e *env) testPrometheus(t *testing.T, target, token string) {
	const forSeconds = 5
	p := e.startPrometheus(t, target, token, forSeconds)
	ns := framework.TenantsNS
	tenant := map[string]string{"namespace": ns, "tenant": "alpha"}
	sel := fmt.Sprintf(`namespace=%q, tenant="alpha"`, ns)
	framework.Eventually(t, "prometheus scraping the operator", time.Minute, func() error {
		up, err := p.value(`up{job="apiary"}`)
		if err != nil || up != 1 {
			return fmt.Errorf("up=%v: %v", up, err)
		}
		return nil
	})
	framework.Eventually(t, "alpha's series in prometheus as its status says", time.Minute, func() error {
		alpha := e.TCP(t, "alpha")
		ready, err := p.value("apiary_tenant_ready_replicas{" + sel + "}")
		if err != nil || ready != float64(alpha.Status.ReadyReplicas) {
			return fmt.Errorf("apiary_tenant_ready_replicas %v (%v), status says %d", ready, err, alpha.Status.ReadyReplicas)
		}
		info, err := p.value(fmt.Sprintf("apiary_tenant_info{%s, version=%q, endpoint=%q}", sel, alpha.Status.Version, alpha.Status.Endpoint))
		if err != nil || info != 1 {
			return fmt.Errorf("apiary_tenant_info at %s %s: %v (%v)", alpha.Status.Version, alpha.Status.Endpoint, info, err)
		}
		return nil
	})

	// A quota alpha nearly fills: its measured keys are 93 % of it.
	var objects, quota int64
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		tcp := e.TCP(t, "alpha")
		u := tcp.Status.DataStore.Usage
		if u == nil || u.Objects == 0 {
			return fmt.Errorf("alpha's usage is not measured: %+v", u)
		}
		objects = u.Objects
		quota = int64(math.Ceil(float64(objects) / 0.93))
		tcp.Spec.DataStoreQuota = &apiary.TenantQuota{Objects: &quota}
		return e.C.Update(e.Ctx, tcp)
	})
	if err != nil {
		t.Fatal(err)
	}
	set := time.Now()
	lift := func() {
		t.Helper()
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			tcp := e.TCP(t, "alpha")
			tcp.Spec.DataStoreQuota = nil
			return e.C.Update(e.Ctx, tcp)
		})
		if err != nil {
			t.Errorf("lifting alpha's quota: %v", err)
		}
	}
	lifted := false
	defer func() {
		if !lifted {
			lift()
		}
	}()
	t.Logf("alpha stores %d keys: quota set to %d", objects, quota)
	const alert = "ApiaryTenantDataStoreQuotaNearlyFull"
	var pending, firing time.Duration
	framework.Eventually(t, alert+" firing for alpha", 2*time.Minute, func() error {
		state, err := p.alert(alert, tenant)
		if err != nil {
			return err
		}
		switch {
		case state == "pending" && pending == 0:
			pending = time.Since(set)
		case state == "firing":
			firing = time.Since(set)
			return nil
		}
		return fmt.Errorf("%s is %q", alert, state)
	})
	if pending == 0 {
		t.Errorf("%s was never seen pending before firing (for: %ds, polled every second)", alert, forSeconds)
	}
	t.Logf("FIGURE real Prometheus: %s pending %s and firing %s after alpha's quota was set (for: %ds, scrape and evaluation every 1s)",
		alert, pending.Round(100*time.Millisecond), firing.Round(100*time.Millisecond), forSeconds)
	if state, err := p.alert("ApiaryTenantNotReady", tenant); err != nil || state != "" {
		t.Errorf("ApiaryTenantNotReady for the Ready alpha: %q %v", state, err)
	}

	lift()
	lifted = true
	framework.Eventually(t, alert+" resolved once the quota is lifted", time.Minute, func() error {
		state, err := p.alert(alert, tenant)
		if err != nil || state != "" {
			return fmt.Errorf("%s is %q (%v)", alert, state, err)
		}
		return nil
	})
}
