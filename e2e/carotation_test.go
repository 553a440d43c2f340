//go:build e2e

package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/apiaryhq/apiary/cli"
	"github.com/apiaryhq/apiary/e2e/framework"
	"github.com/apiaryhq/apiary/internal/testenv"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/operator/controllers"
	"github.com/apiaryhq/apiary/operator/render"
	"github.com/apiaryhq/apiary/pki"
)

// testCARotation (issue 12, CA rotation): "apiary certs rotate --ca" on a
// tenant with joined Hosts and web pods in namespace workload (on its
// workers). Throughout, a
// client that takes the admin kubeconfig again whenever it changes (as a
// user who exports it again) polls /version, and kubectl logs and exec
// reach each web pod (API server → konnectivity → kubelet,
// both ends verified). After it: the tenant, its Hosts and the addons hold
// only the new CA, the Nodes are Ready with kubelet certificates of it, a
// kubeconfig exported before is refused (its CA is not the server's) and
// its client certificate is refused even by a client that trusts the new
// CA (401).
// It returns when the rotation started.
func (e *env) testCARotation(t *testing.T, name, shape string, hostNames []string, kcBefore, workload string) time.Time {
	tcp := e.TCP(t, name)
	caBefore := tenantSecret(t, e, tcp, render.SecretCA)[render.KeyTLSCert]
	adminBefore := tenantSecret(t, e, tcp, render.SecretAdminKubeconfig)[apiary.KubeconfigKey]
	ctx, cancel := context.WithCancel(e.Ctx)
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()

	// The admin kubeconfig as the Secret has it now, in a file for
	// kubectl and a client for the poller.
	follow := newKubeconfigFollower(t, e, name)
	p := &poller{url: tcp.Status.Endpoint + "/version", follow: follow}
	wg.Add(2)
	go func() { defer wg.Done(); follow.run(ctx) }()
	go func() { defer wg.Done(); p.run(ctx) }()

	// logs and exec on each web pod, one after the other.
	tc := e.tenantClient(t, kcBefore)
	pods, err := readyPods(e.Ctx, tc, workload, "app=web")
	if err != nil || len(pods) != 2 {
		t.Fatalf("%d ready web pods in %s (%v), want 2", len(pods), workload, err)
	}
	probe := &kubeletProbe{}
	steps := &caStepWatch{hosts: hostNames}
	wg.Add(2)
	go func() { defer wg.Done(); probe.run(ctx, follow, pods) }()
	go func() { defer wg.Done(); steps.run(ctx, e) }()

	var out, errOut strings.Builder
	cmd := cli.NewCertsCommand(&cli.ConfigFlags{Kubeconfig: e.Kubeconfig, Namespace: framework.TenantsNS})
	cmd.SetArgs([]string{"rotate", name, "--ca", "--yes", "--wait", "15m"})
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	start := time.Now()
	if err := cmd.ExecuteContext(e.Ctx); err != nil {
		tcp := e.TCP(t, name)
		t.Fatalf("apiary certs rotate --ca: %v\n%s%s\nstatus.caRotation: %+v\nstatus.controlPlaneHosts: %+v\nwhat happened since the rotation began:\n%s",
			err, out.String(), errOut.String(), tcp.Status.CARotation, tcp.Status.ControlPlaneHosts, tenantTimeline(e, name, start))
	}
	took := time.Since(start)
	t.Logf("apiary certs rotate %s --ca --yes --wait 15m (%s):\n%s", name, took.Round(time.Second), out.String())
	// A little more polling on the final state.
	time.Sleep(3 * time.Second)
	cancel()
	wg.Wait()

	rot := e.TCP(t, name).Status.CARotation
	t.Logf("FIGURE CA rotation of %s (%s): %s; %s", name, shape, took.Round(time.Second), caPhaseEvents(e, name))
	p.verdict(t, "CA rotation", "during the CA rotation")

	// What holds what now.
	tcp = e.TCP(t, name)
	caAfter := tenantSecret(t, e, tcp, render.SecretCA)[render.KeyTLSCert]
	trust := tenantSecret(t, e, tcp, render.SecretCATrust)[render.KeyCACert]
	if string(caAfter) == string(caBefore) {
		t.Fatal("the tenant CA did not change")
	}
	if pki.Fingerprint(trust) != pki.Fingerprint(caAfter) {
		t.Errorf("the trust bundle holds %d certificates, want the new CA alone", strings.Count(string(trust), "BEGIN CERTIFICATE"))
	}
	if rot.Trust != pki.Fingerprint(caAfter) || rot.KubeletIssuer != pki.Fingerprint(caAfter) || rot.Phase != apiary.CARotationCompleted {
		t.Errorf("status.caRotation %+v, want Completed with trust and kubelet issuer %s", rot, pki.Fingerprint(caAfter))
	}
	for _, hn := range hostNames {
		h := e.host(t, hn)
		if h.Status.CA == nil || h.Status.CA.Trust != rot.Trust || h.Status.CA.KubeletIssuer != rot.KubeletIssuer {
			t.Errorf("Host %s status.ca %+v, want trust and kubelet issuer %s", hn, h.Status.CA, rot.Trust)
		}
		var steps []string
		for _, st := range h.Status.Journal {
			if strings.HasPrefix(st.Name, "ca-") && st.Finished != nil {
				steps = append(steps, fmt.Sprintf("%s %s (%d attempt(s))", st.Name, st.Finished.Sub(st.Started.Time).Round(100*time.Millisecond), st.Attempts))
			}
		}
		t.Logf("FIGURE Host %s, last CA steps: %s", hn, strings.Join(steps, ", "))
	}
	probe.verdict(t, steps.longestPerNode())
	kcAfter := e.ExportKubeconfig(t, name)
	tcAfter := e.tenantClient(t, kcAfter)
	nodes, err := tcAfter.CoreV1().Nodes().List(e.Ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("the new kubeconfig: %v", err)
	}
	for _, n := range nodes.Items {
		if !nodeReady(&n) {
			t.Errorf("Node %s not Ready after the rotation", n.Name)
		}
	}
	// Every kubelet serves a certificate of the new CA: the API server,
	// which trusts the new CA alone, reached both for logs above; and the
	// addons restarted to read the new bundle.
	for _, a := range []struct{ ns, name string }{{"kube-system", "kube-proxy"}, {"kube-system", "konnectivity-agent"}} {
		ds, err := tcAfter.AppsV1().DaemonSets(a.ns).Get(e.Ctx, a.name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got := ds.Spec.Template.Annotations["apiary.dev/root-ca"]; got != rot.Trust {
			t.Errorf("DaemonSet %s/%s's pods carry root CA %q, want %s", a.ns, a.name, got, rot.Trust)
		}
	}
	cm, err := tcAfter.CoreV1().ConfigMaps("kube-system").Get(e.Ctx, "kube-root-ca.crt", metav1.GetOptions{})
	if err != nil || pki.Fingerprint([]byte(cm.Data["ca.crt"])) != rot.Trust {
		t.Errorf("kube-root-ca.crt inside the tenant holds %q (%v), want the new CA alone", pki.Fingerprint([]byte(cm.Data["ca.crt"])), err)
	}
	// The old admin kubeconfig: its CA is not the server's any more.
	if out, err := framework.KubectlErr(kcBefore, "get", "namespaces"); err == nil || !strings.Contains(out, "certificate") {
		t.Errorf("a kubeconfig exported before the rotation still works or fails for another reason: %v: %s", err, out)
	} else {
		t.Logf("the kubeconfig exported before: %s", firstLine(strings.TrimSpace(out)))
	}
	// Its client certificate, presented by a client that trusts the new
	// CA: refused (401), as every certificate of the old CA is.
	if err := oldClientRefused(e.Ctx, adminBefore, caAfter, ""); err != nil {
		t.Error(err)
	}
	if !e.eventNoteContains(t, name, controllers.ReasonCARotated, "completed") {
		t.Error("no CARotated event")
	}
	return start
}

// oldClientRefused checks that the client certificate of kubeconfig
// adminBefore, presented by a client that trusts caAfter, gets 401 from
// the tenant's API server (at server, when set, instead of the endpoint).
func oldClientRefused(ctx context.Context, adminBefore, caAfter []byte, server string) error {
	cfg, err := clientcmd.RESTConfigFromKubeConfig(adminBefore)
	if err != nil {
		return err
	}
	cfg.CAData = caAfter
	if server != "" {
		// The endpoint's name stays the one verified.
		u, err := url.Parse(cfg.Host)
		if err != nil {
			return err
		}
		cfg.TLSClientConfig.ServerName = u.Hostname()
		cfg.Host = server
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	_, err = cs.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	var status interface{ Status() metav1.Status }
	if !errors.As(err, &status) || status.Status().Code != http.StatusUnauthorized {
		return fmt.Errorf("the old admin client certificate, trusting the new CA, at %s: %v, want 401 Unauthorized", cfg.Host, err)
	}
	return nil
}

// caPhaseEvents says when each phase of the last rotation began, from
// the tenant's events, as offsets from its start.
func caPhaseEvents(e *env, name string) string {
	var list eventsv1.EventList
	if err := e.C.List(e.Ctx, &list, client.InNamespace(framework.TenantsNS)); err != nil {
		return err.Error()
	}
	type mark struct {
		at   time.Time
		what string
	}
	var marks []mark
	for _, ev := range list.Items {
		if ev.Regarding.Name != name || !strings.HasPrefix(ev.Reason, "CARotat") {
			continue
		}
		marks = append(marks, mark{ev.EventTime.Time, ev.Reason})
	}
	slices.SortFunc(marks, func(a, b mark) int { return a.at.Compare(b.at) })
	if len(marks) == 0 {
		return "no rotation events"
	}
	var out []string
	for _, m := range marks {
		out = append(out, fmt.Sprintf("%s at %s", m.what, m.at.Sub(marks[0].at).Round(100*time.Millisecond)))
	}
	return strings.Join(out, ", ")
}

// tenantTimeline lists the events of a tenant and of its Hosts since a
// moment, oldest first: which phase, host step or Node condition took the
// time when a rotation overran.
func tenantTimeline(e *env, name string, since time.Time) string {
	var hostList apiary.HostList
	if err := e.C.List(e.Ctx, &hostList, client.InNamespace(framework.TenantsNS)); err != nil {
		return err.Error()
	}
	ours := map[string]bool{}
	for _, h := range hostList.Items {
		if h.Spec.TenantControlPlane == name {
			ours[h.Name] = true
		}
	}
	var list corev1.EventList
	if err := e.C.List(e.Ctx, &list, client.InNamespace(framework.TenantsNS)); err != nil {
		return err.Error()
	}
	type line struct {
		at   time.Time
		text string
	}
	var lines []line
	for _, ev := range list.Items {
		o := ev.InvolvedObject
		if !(o.Kind == "TenantControlPlane" && o.Name == name) && !(o.Kind == "Host" && ours[o.Name]) {
			continue
		}
		at := ev.LastTimestamp.Time
		if at.IsZero() {
			at = ev.EventTime.Time
		}
		if at.Before(since) {
			continue
		}
		lines = append(lines, line{at, fmt.Sprintf("%8s %s %s/%s: %.200s", at.Sub(since).Round(time.Second), ev.Reason, o.Kind, o.Name, ev.Message)})
	}
	slices.SortFunc(lines, func(a, b line) int { return a.at.Compare(b.at) })
	var b strings.Builder
	for _, l := range lines {
		b.WriteString(l.text + "\n")
	}
	return b.String()
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// kubeconfigFollower keeps the tenant's admin kubeconfig as its Secret has
// it now: in a file (for kubectl) and as an HTTP client.
type kubeconfigFollower struct {
	e      *env
	secret string // the admin kubeconfig Secret
	path   string
	mu     sync.Mutex
	raw    []byte
	hc     *http.Client
}

func newKubeconfigFollower(t *testing.T, e *env, name string) *kubeconfigFollower {
	f := &kubeconfigFollower{e: e, secret: e.TCP(t, name).AdminKubeconfigSecretName(), path: filepath.Join(t.TempDir(), name+".kubeconfig")}
	if err := f.refresh(); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *kubeconfigFollower) refresh() error {
	var s corev1.Secret
	if err := f.e.C.Get(f.e.Ctx, client.ObjectKey{Namespace: framework.TenantsNS, Name: f.secret}, &s); err != nil {
		return err
	}
	raw := s.Data[apiary.KubeconfigKey]
	f.mu.Lock()
	defer f.mu.Unlock()
	if string(raw) == string(f.raw) {
		return nil
	}
	cfg, err := clientcmd.RESTConfigFromKubeConfig(raw)
	if err != nil {
		return err
	}
	hc, err := pollerClient(cfg)
	if err != nil {
		return err
	}
	tmp := f.path + ".tmp"
	if err := os.WriteFile(tmp, raw, 0o600); err != nil {
		return err
	}
	if err := os.Rename(tmp, f.path); err != nil {
		return err
	}
	f.raw = raw
	f.hc = hc
	return nil
}

func (f *kubeconfigFollower) client() *http.Client {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.hc
}

// kubeconfig is the path of the kubeconfig file, replaced whole (rename)
// when the Secret changes, so a command reads one version of it.
func (f *kubeconfigFollower) kubeconfig() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.path
}

func (f *kubeconfigFollower) run(ctx context.Context) {
	for ctx.Err() == nil {
		_ = f.refresh()
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// caStepWatch records every CA step its Hosts finish during a rotation
// (a Host's journal keeps only the last of each name, and ca-trust runs
// twice): how long each Node's kubelet was away at most, since a step
// ends only when its kubelet answers through the API server again.
type caStepWatch struct {
	hosts   []string
	mu      sync.Mutex
	node    map[string]string        // Host → Node
	longest map[string]time.Duration // Host → its longest CA step
}

func (w *caStepWatch) run(ctx context.Context, e *env) {
	w.mu.Lock()
	w.node, w.longest = map[string]string{}, map[string]time.Duration{}
	w.mu.Unlock()
	for {
		var list apiary.HostList
		if err := e.C.List(ctx, &list, client.InNamespace(framework.TenantsNS)); err == nil {
			w.mu.Lock()
			for _, h := range list.Items {
				if !slices.Contains(w.hosts, h.Name) {
					continue
				}
				w.node[h.Name] = h.Status.NodeName
				for _, st := range h.Status.Journal {
					if strings.HasPrefix(st.Name, "ca-") && st.Finished != nil {
						w.longest[h.Name] = max(w.longest[h.Name], st.Finished.Sub(st.Started.Time))
					}
				}
			}
			w.mu.Unlock()
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

// longestPerNode maps each Node to its Host's longest CA step.
func (w *caStepWatch) longestPerNode() map[string]time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := map[string]time.Duration{}
	for h, d := range w.longest {
		out[w.node[h]] = d
	}
	return out
}

// kubeletProbe runs kubectl logs and exec on each pod, a loop per pod and
// verb, and keeps per Node the longest time without a success, the failures and
// the slowest call (a call is cut after kubeletCallTimeout).
type kubeletProbe struct {
	mu       sync.Mutex
	ok       int
	failed   int
	noAgent  int // failures an API server gave for want of the Node's konnectivity agent
	longest  map[string]time.Duration
	slowest  map[string]time.Duration
	failures []string
}

// kubeletCallTimeout bounds one kubectl logs or exec.
const kubeletCallTimeout = 10 * time.Second

func (k *kubeletProbe) run(ctx context.Context, f *kubeconfigFollower, pods []corev1.Pod) {
	k.longest, k.slowest = map[string]time.Duration{}, map[string]time.Duration{}
	bin, err := testenv.KubeBinary("kubectl")
	if err != nil {
		k.failures = append(k.failures, err.Error())
		return
	}
	// One loop per pod and verb: an exec cut by an API server's roll
	// hangs until its timeout, and must not keep the Node's logs from
	// being tried meanwhile (the gap is the Node's, not the probe's).
	lastGood := map[string]time.Time{}
	for _, p := range pods {
		lastGood[p.Spec.NodeName] = time.Now()
	}
	var wg sync.WaitGroup
	for _, p := range pods {
		for _, args := range [][]string{
			{"-n", p.Namespace, "logs", p.Name, "--tail=1"},
			{"-n", p.Namespace, "exec", p.Name, "--", "true"},
		} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				node := p.Spec.NodeName
				for ctx.Err() == nil {
					callCtx, cancel := context.WithTimeout(ctx, kubeletCallTimeout)
					sent := time.Now()
					out, err := exec.CommandContext(callCtx, bin, append([]string{"--kubeconfig", f.kubeconfig(), "--request-timeout=10s"}, args...)...).CombinedOutput()
					cancel()
					if ctx.Err() != nil {
						return
					}
					now := time.Now()
					k.mu.Lock()
					k.slowest[node] = max(k.slowest[node], now.Sub(sent))
					if err == nil {
						k.ok++
						k.longest[node] = max(k.longest[node], now.Sub(lastGood[node]))
						lastGood[node] = now
					} else {
						k.failed++
						if strings.Contains(string(out), "No agent available") {
							k.noAgent++
						}
						if len(k.failures) < 12 {
							k.failures = append(k.failures, fmt.Sprintf("%s %s %s after %s: %v: %s", sent.Format("15:04:05.000"), args[2], node,
								now.Sub(sent).Round(10*time.Millisecond), err, firstLine(strings.TrimSpace(string(out)))))
						}
					}
					k.mu.Unlock()
					select {
					case <-ctx.Done():
					case <-time.After(300 * time.Millisecond):
					}
				}
			}()
		}
	}
	wg.Wait()
}

// verdict: a kubelet restart (each Host's CA steps restart it twice) is
// a time in which its Node's logs and exec cannot be served, and a
// replaced API server pod cuts the streams it serves: those failures are
// listed, and the time a Node goes without a working logs or exec is
// bounded by its kubelet's own restarts: the longest CA step of its Host
// (restarts maps Node names to it; the step ends only once the kubelet
// answers through the API server again) plus kubeletGapSlack, and at
// least maxKubeletGap. A gap beyond that is an outage the Host's journal
// does not account for (konnectivity, the API server, two kubelets away
// at once).
func (k *kubeletProbe) verdict(t *testing.T, restarts map[string]time.Duration) {
	t.Helper()
	k.mu.Lock()
	defer k.mu.Unlock()
	t.Logf("FIGURE CA rotation: kubectl logs/exec %d OK, %d failed (%d \"No agent available\"); longest time without a success per Node %v; slowest call per Node %v; longest CA step per Node %v",
		k.ok, k.failed, k.noAgent, k.longest, k.slowest, restarts)
	for _, f := range k.failures {
		t.Logf("kubectl logs/exec failure: %s", f)
	}
	if k.ok == 0 {
		t.Error("no kubectl logs or exec succeeded")
	}
	for node, gap := range k.longest {
		allowed := max(maxKubeletGap, restarts[node]+kubeletGapSlack)
		if gap > allowed {
			t.Errorf("Node %s: kubectl logs/exec failed for %s in a row, want at most %s (its Host's longest CA step %s, plus %s)",
				node, gap.Round(100*time.Millisecond), allowed.Round(100*time.Millisecond), restarts[node].Round(100*time.Millisecond), kubeletGapSlack)
		}
	}
}

const (
	// maxKubeletGap is the least a Node's logs and exec may be allowed
	// to fail in a row.
	maxKubeletGap = 15 * time.Second
	// kubeletGapSlack is what the probe adds to a kubelet's time away:
	// the calls in flight when it comes back (kubeletCallTimeout at
	// worst for a hung one) and the pause between calls.
	kubeletGapSlack = kubeletCallTimeout + 2*time.Second
)
