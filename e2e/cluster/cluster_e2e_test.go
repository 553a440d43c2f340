//go:build e2e

package cluster

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// testLog sends the cluster's progress lines to the test log.
type testLog struct{ t *testing.T }

func (w testLog) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// wasRunning records, once, whether a healthy devcluster ran when the
// first test of this package started: then it is shared (hack/e2e.sh
// starts it for every e2e package, which run in parallel) and must not be
// taken down here.
var (
	runningOnce sync.Once
	wasRunning  bool
)

func newTestCluster(t *testing.T) *Cluster {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("needs root (kubelet, containerd, iptables): run the e2e tests as root, as make test does")
	}
	c, err := New(Options{Log: testLog{t}, BuildMissing: true})
	if err != nil {
		t.Fatal(err)
	}
	runningOnce.Do(func() { wasRunning = c.Status(context.Background()).Running() })
	return c
}

// TestCluster checks what the management cluster offers, on the running
// devcluster when there is one (else it starts one and takes it down after):
// node Ready at v1.37.2; a web server behind a LoadBalancer Service gets a
// pool address that answers from the host and from another network
// namespace routed through the host (as a Docker container would, with
// FORWARD policy DROP); DNS resolves Service names from a pod; pods reach
// kubernetes.default:443; Up on the running cluster is quick.
//
//	go test -tags e2e -count=1 -timeout 30m -v ./e2e/cluster/
func TestCluster(t *testing.T) {
	ctx := context.Background()
	c := newTestCluster(t)
	if !wasRunning {
		start := time.Now()
		if err := c.Up(ctx); err != nil {
			t.Fatal(err)
		}
		t.Logf("TIMING up (no cluster was running) %s", time.Since(start).Round(time.Millisecond))
		t.Cleanup(func() {
			if t.Failed() {
				t.Log(c.Status(context.Background()))
			}
			if err := c.Down(context.Background()); err != nil {
				t.Errorf("Down: %v", err)
			}
		})
	}
	cs, err := c.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	node, err := cs.CoreV1().Nodes().Get(ctx, c.NodeName(), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ok, why := nodeReady(node); !ok {
		t.Fatalf("node not Ready: %s", why)
	}
	if v := node.Status.NodeInfo.KubeletVersion; v != KubeVersion {
		t.Errorf("kubelet version %s, want %s", v, KubeVersion)
	}

	lbIP, svc := deployHello(ctx, t, c, cs)
	base := "http://" + net.JoinHostPort(lbIP, "80")
	if body := httpGetEventually(t, base+"/", 60*time.Second); !strings.HasPrefix(body, "hello from hello-") {
		t.Errorf("GET %s/ = %q", base, body)
	}
	checkFromNetns(ctx, t, base+"/")
	// DNS from a pod: the server resolves with the pod's resolv.conf.
	for name, want := range map[string]string{
		"hello": svc.Spec.ClusterIP,
		"hello." + svc.Namespace + ".svc." + ClusterDomain: svc.Spec.ClusterIP,
		"kubernetes.default":   KubernetesIP,
		"kube-dns.kube-system": DNSServiceIP,
	} {
		if got := httpGetEventually(t, base+"/lookup?name="+name, 30*time.Second); strings.TrimSpace(got) != want {
			t.Errorf("lookup %s from a pod = %q, want %s", name, got, want)
		}
	}
	// Pods reach the API server through the kubernetes Service.
	if got := httpGetEventually(t, base+"/dial?addr=kubernetes.default:443", 30*time.Second); !strings.HasPrefix(got, "connected") {
		t.Errorf("dial kubernetes.default:443 from a pod: %q", got)
	}

	start := time.Now()
	if err := c.Up(ctx); err != nil {
		t.Fatal(err)
	}
	// How long is a figure, not a pass mark (a loaded machine takes
	// longer). What counts is that the cluster still serves as before.
	t.Logf("TIMING up (on a running cluster) %s", time.Since(start).Round(time.Millisecond))
	if got := httpGetEventually(t, base+"/dial?addr=kubernetes.default:443", 30*time.Second); !strings.HasPrefix(got, "connected") {
		t.Errorf("after a second Up, dial kubernetes.default:443 from a pod: %q", got)
	}
}

// TestLifecycle checks Up from nothing, Down leaving nothing behind (no
// process, link, KUBE-/CNI- chain, mount, cgroup or state; the other
// iptables rules as they were), and Up again after Down. It takes the
// devcluster down, so it is skipped when one was running when the tests
// started (a shared cluster: run it alone, before `devcluster up`).
func TestLifecycle(t *testing.T) {
	ctx := context.Background()
	c := newTestCluster(t)
	if wasRunning {
		// hack/e2e.sh runs this test alone after tearing down the cluster it
		// started, and sets APIARY_E2E_LIFECYCLE: there it must never skip.
		if os.Getenv("APIARY_E2E_LIFECYCLE") != "" {
			t.Fatal("a devcluster is running although hack/e2e.sh took its cluster down")
		}
		t.Skip("a devcluster was running when the tests started: not taking it down (run this test alone)")
	}
	if err := c.Down(ctx); err != nil {
		t.Fatalf("Down before the test: %v", err)
	}
	before, err := IptablesNonOwned(ctx)
	if err != nil {
		t.Fatal(err)
	}
	timings := map[string]time.Duration{}
	timed := func(name string, f func() error) {
		t.Helper()
		start := time.Now()
		if err := f(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		timings[name] = time.Since(start)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(c.Status(context.Background()))
		}
		_ = c.Down(context.Background())
		for _, k := range []string{"up (from nothing)", "up (on a running cluster)", "down", "up (after down)", "down (final)"} {
			if d, ok := timings[k]; ok {
				t.Logf("TIMING %-28s %s", k, d.Round(time.Millisecond))
			}
		}
	})

	timed("up (from nothing)", func() error { return c.Up(ctx) })
	cs, err := c.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	lbIP, _ := deployHello(ctx, t, c, cs)
	httpGetEventually(t, "http://"+net.JoinHostPort(lbIP, "80")+"/", 60*time.Second)
	timed("up (on a running cluster)", func() error { return c.Up(ctx) })

	timed("down", func() error { return c.Down(ctx) })
	checkClean(ctx, t, c, before)

	timed("up (after down)", func() error { return c.Up(ctx) })
	if cs, err = c.Clientset(); err != nil {
		t.Fatal(err)
	}
	if err := c.waitNodeReady(ctx, cs, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	lbIP, _ = deployHello(ctx, t, c, cs)
	if body := httpGetEventually(t, "http://"+net.JoinHostPort(lbIP, "80")+"/", 60*time.Second); !strings.HasPrefix(body, "hello from") {
		t.Errorf("after Down and Up: GET / = %q", body)
	}
	timed("down (final)", func() error { return c.Down(ctx) })
	checkClean(ctx, t, c, before)
}

// deployHello runs the probe image's web server (Deployment hello, port
// 8080, 2 replicas) behind a LoadBalancer Service on port 80 in a fresh
// namespace (deleted when the test ends) and returns the Service's
// address and the Service.
func deployHello(ctx context.Context, t *testing.T, c *Cluster, cs kubernetes.Interface) (string, *corev1.Service) {
	t.Helper()
	image, err := c.ProbeImage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	nsObj, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "devcluster-e2e-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ns := nsObj.Name
	t.Cleanup(func() {
		_ = cs.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{})
	})
	labels := map[string]string{"app": "hello"}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "hello", Namespace: ns},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](2),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					TerminationGracePeriodSeconds: ptr.To[int64](1),
					Containers: []corev1.Container{{
						Name: "hello", Image: image, Args: []string{"serve", ":8080"},
						Ports: []corev1.ContainerPort{{ContainerPort: 8080}},
						ReadinessProbe: &corev1.Probe{
							ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromInt32(8080)}},
							PeriodSeconds: 1,
						},
					}},
				},
			},
		},
	}
	if _, err := cs.AppsV1().Deployments(ns).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "hello", Namespace: ns},
		Spec: corev1.ServiceSpec{
			Type:     corev1.ServiceTypeLoadBalancer,
			Selector: labels,
			Ports:    []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}},
		},
	}
	if _, err := cs.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := WaitDeployment(ctx, cs, ns, "hello", 90*time.Second); err != nil {
		t.Fatal(err)
	}
	t.Logf("hello Deployment available in %s", time.Since(start).Round(time.Millisecond))
	_, pool, _ := net.ParseCIDR(LBPoolCIDR)
	var ip string
	err = poll(ctx, 200*time.Millisecond, 60*time.Second, func(ctx context.Context) (bool, string, error) {
		s, err := cs.CoreV1().Services(ns).Get(ctx, "hello", metav1.GetOptions{})
		if err != nil {
			return false, err.Error(), nil
		}
		if ing := s.Status.LoadBalancer.Ingress; len(ing) > 0 && ing[0].IP != "" {
			ip, svc = ing[0].IP, s
			return true, "", nil
		}
		return false, "no LoadBalancer address yet", nil
	})
	if err != nil {
		t.Fatalf("Service hello: %v (MetalLB: kubectl -n metallb-system logs deploy/controller)", err)
	}
	if !pool.Contains(net.ParseIP(ip)) {
		t.Fatalf("LoadBalancer address %s is not in the pool %s", ip, LBPoolCIDR)
	}
	t.Logf("hello LoadBalancer address %s after %s", ip, time.Since(start).Round(time.Millisecond))
	return ip, svc
}

// checkFromNetns gets url from a network namespace whose only route is
// the host, as a Docker container (an SSH test host) would, with the
// filter FORWARD policy DROP as Docker sets it.
func checkFromNetns(ctx context.Context, t *testing.T, url string) {
	t.Helper()
	const ns, host, peer = "apiary-e2e-ns", "apiary-e2e-h", "apiary-e2e-n"
	sh := func(args ...string) {
		t.Helper()
		if out, err := run(ctx, args[0], args[1:]...); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
	}
	policy, err := run(ctx, "iptables", "-S", "FORWARD")
	if err != nil {
		t.Fatal(err)
	}
	oldPolicy := "ACCEPT"
	if strings.Contains(policy, "-P FORWARD DROP") {
		oldPolicy = "DROP"
	}
	t.Cleanup(func() {
		_, _ = run(context.Background(), "iptables", "-P", "FORWARD", oldPolicy)
		_, _ = run(context.Background(), "ip", "netns", "del", ns)
		_, _ = run(context.Background(), "ip", "link", "del", host)
	})
	sh("ip", "netns", "add", ns)
	sh("ip", "link", "add", host, "type", "veth", "peer", "name", peer)
	sh("ip", "link", "set", peer, "netns", ns)
	sh("ip", "addr", "add", "10.203.255.1/30", "dev", host)
	sh("ip", "link", "set", host, "up")
	sh("ip", "netns", "exec", ns, "ip", "addr", "add", "10.203.255.2/30", "dev", peer)
	sh("ip", "netns", "exec", ns, "ip", "link", "set", peer, "up")
	sh("ip", "netns", "exec", ns, "ip", "route", "add", "default", "via", "10.203.255.1")
	sh("iptables", "-P", "FORWARD", "DROP")
	curl, err := lookPath("curl")
	if err != nil {
		t.Log("curl not installed: not checking from another network namespace")
		return
	}
	out, err := run(ctx, "ip", "netns", "exec", ns, curl, "-sS", "-m", "10", url)
	if err != nil || !strings.HasPrefix(out, "hello from") {
		t.Errorf("GET %s from another network namespace: %q %v", url, out, err)
	}
	_, _ = run(ctx, "iptables", "-P", "FORWARD", oldPolicy)
	_, _ = run(ctx, "ip", "netns", "del", ns)
}

// httpGetEventually retries GET url until it answers 200 (kube-proxy may
// not have programmed a new Service yet) and returns the body.
func httpGetEventually(t *testing.T, url string, timeout time.Duration) string {
	t.Helper()
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}
	deadline := time.Now().Add(timeout)
	var last string
	for {
		resp, err := client.Get(url)
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return string(b)
			}
			last = fmt.Sprintf("%s: %s", resp.Status, strings.TrimSpace(string(b)))
		} else {
			last = err.Error()
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET %s: %s", url, last)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// checkClean asserts that Down left no process, link, chain, mount, cgroup
// or rule of the cluster.
func checkClean(ctx context.Context, t *testing.T, c *Cluster, iptablesBefore string) {
	t.Helper()
	if procs := c.strayProcesses(); len(procs) > 0 {
		t.Errorf("processes still running after Down: %v", procs)
	}
	for _, name := range startOrder {
		if p, ok := c.running(name); ok {
			t.Errorf("%s still running (pid %d)", name, p.pid)
		}
	}
	for _, l := range []string{BridgeName, LBInterface} {
		if linkExists(l) {
			t.Errorf("link %s still there", l)
		}
	}
	if chains, err := OwnedChains(ctx); err != nil || len(chains) > 0 {
		t.Errorf("KUBE-/CNI- chains left: %v %v", chains, err)
	}
	after, err := IptablesNonOwned(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if after != iptablesBefore {
		t.Errorf("iptables rules changed:\nbefore:\n%s\nafter:\n%s", iptablesBefore, after)
	}
	if mps, err := mountsUnder(c.StateDir(), "/var/lib/kubelet"); err != nil || len(mps) > 0 {
		t.Errorf("mounts left: %v %v", mps, err)
	}
	for _, root := range cgroupRoots() {
		if _, err := os.Stat(root + "/kubepods"); err == nil {
			t.Errorf("cgroup %s/kubepods left", root)
		}
	}
	ents, _ := os.ReadDir(c.StateDir())
	for _, e := range ents {
		if e.Name() != "pki" && e.Name() != "logs" {
			t.Errorf("state dir still has %s", e.Name())
		}
	}
	if _, err := os.Stat(c.paths.registryStorage); err != nil {
		t.Errorf("registry storage %s removed: %v", c.paths.registryStorage, err)
	}
}
