//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/apiaryhq/apiary/e2e/framework"
	"github.com/apiaryhq/apiary/e2e/sshhost"
	"github.com/apiaryhq/apiary/internal/testenv"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

// cniManifest is the CNI a user installs into a tenant (kube-router, router
// only); tests run in the package directory.
const cniManifest = "../hack/cni/kube-router.yaml"

// busyboxImage is the e2e workload: httpd, wget, nslookup and sh. (Debian's
// static busybox 1.35 crashes on wget -T: timeouts come from timeout(1).)
const busyboxImage = "docker.io/library/busybox:1.35.0"

// installCNI applies the CNI manifest to a tenant with kubectl, as a user
// does after creating it.
func installCNI(t *testing.T, kubeconfig string) {
	t.Helper()
	framework.Kubectl(t, kubeconfig, "apply", "-f", cniManifest)
}

// testPodNetwork joins a second host to tenant alpha (the first, name, is
// joined already) and checks the pod network kube-router gives them: both
// Hosts Ready, a Deployment spread over both nodes, pod-to-pod and
// pod-to-Service traffic across the hosts, Service names through CoreDNS,
// and logs, exec and port-forward to those pods through konnectivity while
// the management cluster has no route to them.
func (e *env) testPodNetwork(t *testing.T, d *sshhost.Docker, image, first string) {
	h := e.startHost(t, d, image, "e2e-host-net")
	kc := e.ExportKubeconfig(t, "alpha")
	cs := e.tenantClient(t, kc)
	host := e.newHostFor(t, "net", h, "alpha")
	created := time.Now()
	if err := e.C.Create(e.Ctx, host); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteHostAndWait(t, e, host) })
	for _, name := range []string{first, "net"} {
		e.waitHostReady(t, name)
	}
	t.Logf("FIGURE second Host created → both Hosts Ready (Nodes Ready with kube-router's pod network) in %s", time.Since(created).Round(time.Millisecond))

	// CoreDNS runs on the pod network: it is Ready once that exists.
	framework.Eventually(t, "CoreDNS available", 3*time.Minute, func() error {
		dep, err := cs.AppsV1().Deployments("kube-system").Get(e.Ctx, "coredns", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if dep.Status.AvailableReplicas != *dep.Spec.Replicas || dep.Status.UpdatedReplicas != *dep.Spec.Replicas {
			return fmt.Errorf("%d of %d available", dep.Status.AvailableReplicas, *dep.Spec.Replicas)
		}
		return nil
	})

	// Two web servers, one per node; each serves its pod name.
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "net-e2e"}}
	if _, err := cs.CoreV1().Namespaces().Create(e.Ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cs.CoreV1().Namespaces().Delete(context.Background(), ns.Name, metav1.DeleteOptions{})
	})
	labels := map[string]string{"app": "web"}
	dep := spreadWeb(ns.Name, labels)
	deployed := time.Now()
	if _, err := cs.AppsV1().Deployments(ns.Name).Create(e.Ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "web"},
		Spec:       corev1.ServiceSpec{Selector: labels, Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}},
	}
	svcCreated, err := cs.CoreV1().Services(ns.Name).Create(e.Ctx, svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var pods []corev1.Pod
	framework.Eventually(t, "two web pods ready on two nodes", 3*time.Minute, func() error {
		pods, err = readyPods(e.Ctx, cs, ns.Name, "app=web")
		if err != nil {
			return err
		}
		nodes := map[string]bool{}
		for _, p := range pods {
			nodes[p.Spec.NodeName] = true
		}
		if len(pods) != 2 || len(nodes) != 2 {
			return fmt.Errorf("%d ready pods on nodes %v", len(pods), nodes)
		}
		return nil
	})
	t.Logf("FIGURE Deployment web: 2 pods ready on 2 nodes %s after creation", time.Since(deployed).Round(time.Millisecond))
	a, b := pods[0], pods[1]
	t.Logf("pods: %s on %s (%s), %s on %s (%s)", a.Name, a.Spec.NodeName, a.Status.PodIP, b.Name, b.Spec.NodeName, b.Status.PodIP)

	// Pod to pod across the hosts, both ways.
	for _, pair := range [][2]corev1.Pod{{a, b}, {b, a}} {
		from, to := pair[0], pair[1]
		framework.Eventually(t, fmt.Sprintf("%s → %s (%s) across hosts", from.Name, to.Name, to.Status.PodIP), time.Minute, func() error {
			out, err := framework.KubectlErr(kc, "-n", ns.Name, "exec", from.Name, "--", "timeout", "5", "wget", "-qO-", "http://"+net.JoinHostPort(to.Status.PodIP, "8080"))
			if err != nil || strings.TrimSpace(out) != to.Name {
				return fmt.Errorf("%v: %q", err, out)
			}
			return nil
		})
	}
	// The Service's name resolves through CoreDNS (busybox's nslookup asks
	// the nameserver in the pod's resolv.conf), and the Service reaches
	// every endpoint, the pod on the other host too.
	fqdn := "web." + ns.Name + ".svc.cluster.local"
	framework.Eventually(t, "nslookup "+fqdn, time.Minute, func() error {
		out, err := framework.KubectlErr(kc, "-n", ns.Name, "exec", a.Name, "--", "nslookup", fqdn)
		if err != nil || !strings.Contains(out, svcCreated.Spec.ClusterIP) {
			return fmt.Errorf("%v: %q, want %s", err, out, svcCreated.Spec.ClusterIP)
		}
		return nil
	})
	seen := map[string]int{}
	vip := svcCreated.Spec.ClusterIP
	framework.Eventually(t, "both pods answer through Service "+vip, time.Minute, func() error {
		out, err := framework.KubectlErr(kc, "-n", ns.Name, "exec", a.Name, "--", "sh", "-c",
			"for i in 1 2 3 4 5 6 7 8 9 10; do timeout 5 wget -qO- http://"+vip+"; done")
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		for _, l := range strings.Fields(out) {
			seen[l]++
		}
		if seen[a.Name] == 0 || seen[b.Name] == 0 {
			return fmt.Errorf("answers so far %v", seen)
		}
		return nil
	})
	t.Logf("answers through Service %s: %v", vip, seen)

	// The management cluster has no route to the pods: its node does not
	// route the pod IPs to the hosts' network (ip route get sends nothing).
	// To check that nothing reaches them directly without sending a packet
	// off this machine (its default gateway answers any TCP connection),
	// the tenant's pod range is made unreachable here for the rest of the
	// test: a GET fails at once, and logs, exec and port-forward below can
	// only go through konnectivity.
	podCIDR := e.TCP(t, "alpha").Spec.Network.PodCIDR
	for _, p := range pods {
		route, err := exec.CommandContext(e.Ctx, "ip", "route", "get", p.Status.PodIP).CombinedOutput()
		if err == nil && strings.Contains(string(route), "172.31.250.") {
			t.Errorf("the management node routes %s to the hosts' network: %s", p.Status.PodIP, route)
		}
	}
	if out, err := exec.CommandContext(e.Ctx, "ip", "route", "add", "unreachable", podCIDR).CombinedOutput(); err != nil {
		t.Fatalf("ip route add unreachable %s: %v: %s", podCIDR, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "route", "del", "unreachable", podCIDR).CombinedOutput(); err != nil {
			t.Errorf("ip route del unreachable %s: %v: %s", podCIDR, err, out)
		}
	})
	direct := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{Proxy: nil}}
	for _, p := range pods {
		resp, err := direct.Get("http://" + net.JoinHostPort(p.Status.PodIP, "8080") + "/")
		if err == nil {
			resp.Body.Close()
			t.Errorf("the management node reached %s at %s with its pod range unreachable: HTTP %d", p.Name, p.Status.PodIP, resp.StatusCode)
		} else if !strings.Contains(err.Error(), "no route to host") {
			t.Errorf("GET %s: %v; want no route to host (dropped on this machine)", p.Status.PodIP, err)
		}
	}

	// So logs, exec and port-forward go through konnectivity.
	for _, p := range pods {
		out := framework.Kubectl(t, kc, "-n", ns.Name, "logs", p.Name)
		if !strings.Contains(out, "serving "+p.Name) {
			t.Errorf("kubectl logs %s: %q", p.Name, out)
		}
		out = framework.Kubectl(t, kc, "-n", ns.Name, "exec", p.Name, "--", "cat", "/www/index.html")
		if strings.TrimSpace(out) != p.Name {
			t.Errorf("kubectl exec %s cat: %q", p.Name, out)
		}
		got, err := portForwardGet(e.Ctx, kc, ns.Name, p.Name)
		if err != nil || strings.TrimSpace(got) != p.Name {
			t.Errorf("kubectl port-forward %s: %q, %v", p.Name, got, err)
		}
	}
}

// webContainer serves its pod's name over HTTP on 8080 and logs
// "serving NAME".
// spreadWeb is two web pods in ns, never two on one Node.
func spreadWeb(ns string, labels map[string]string) *appsv1.Deployment {
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web"},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](2),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					Affinity: &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
						RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
							LabelSelector: &metav1.LabelSelector{MatchLabels: labels},
							TopologyKey:   corev1.LabelHostname,
						}},
					}},
					Containers: []corev1.Container{webContainer()},
				},
			},
		},
	}
}

func webContainer() corev1.Container {
	return corev1.Container{
		Name:  "web",
		Image: busyboxImage,
		Command: []string{"sh", "-c",
			"mkdir -p /www && hostname > /www/index.html && echo serving $(hostname) && exec httpd -f -v -p 8080 -h /www"},
		Ports:          []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}},
		ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Port: intstr.FromInt32(8080)}}, PeriodSeconds: 2},
	}
}

// newHostFor is a Host for an sshhost test machine, with its key Secret.
func (e *env) newHostFor(t *testing.T, name string, h *sshhost.Host, tcp string) *apiary.Host {
	t.Helper()
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: framework.TenantsNS, Name: name + "-ssh"}, Type: corev1.SecretTypeSSHAuth,
		Data: map[string][]byte{corev1.SSHAuthPrivateKey: h.PrivateKeyPEM}}
	if err := e.C.Create(e.Ctx, sec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.C.Delete(context.Background(), sec) })
	return &apiary.Host{ObjectMeta: metav1.ObjectMeta{Namespace: framework.TenantsNS, Name: name}, Spec: apiary.HostSpec{
		TenantControlPlane: tcp, Address: h.Address, SSHKeySecretRef: corev1.LocalObjectReference{Name: sec.Name}, HostKey: h.HostKeyAuthorized,
	}}
}

// waitHostReady waits for a Host in phase Ready with NodeReady True.
func (e *env) waitHostReady(t *testing.T, name string) {
	t.Helper()
	var h apiary.Host
	framework.Eventually(t, "Host "+name+" Ready", 5*time.Minute, func() error {
		if err := e.C.Get(e.Ctx, client.ObjectKey{Namespace: framework.TenantsNS, Name: name}, &h); err != nil {
			return err
		}
		if err := framework.ConditionIs(h.Status.Conditions, apiary.HostConditionNodeReady, metav1.ConditionTrue, "KubeletReady"); err != nil {
			return err
		}
		if h.Status.Phase != apiary.HostPhaseReady {
			return fmt.Errorf("phase %s", h.Status.Phase)
		}
		return nil
	})
}

// readyPods lists the pods matching selector that are Ready with an IP,
// sorted by name.
func readyPods(ctx context.Context, cs kubernetes.Interface, ns, selector string) ([]corev1.Pod, error) {
	list, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return nil, err
	}
	var out []corev1.Pod
	for _, p := range list.Items {
		if p.Status.PodIP == "" || p.DeletionTimestamp != nil {
			continue
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
				out = append(out, p)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

var forwardingLine = regexp.MustCompile(`Forwarding from 127\.0\.0\.1:(\d+) ->`)

// portForwardGet runs `kubectl port-forward pod :8080` (a free local port)
// and returns the body of one HTTP GET through it.
func portForwardGet(ctx context.Context, kubeconfig, ns, pod string) (string, error) {
	bin, err := testenv.KubeBinary("kubectl")
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "--kubeconfig", kubeconfig, "-n", ns, "port-forward", "pod/"+pod, ":8080")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return "", err
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return "", err
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	port := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if m := forwardingLine.FindStringSubmatch(sc.Text()); m != nil {
				port <- m[1]
				break
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	select {
	case p := <-port:
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://127.0.0.1:"+p+"/", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return "", fmt.Errorf("GET through port-forward: %w (kubectl: %s)", err, stderr.String())
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return string(b), err
	case <-ctx.Done():
		return "", fmt.Errorf("kubectl port-forward did not start: %s", stderr.String())
	}
}
