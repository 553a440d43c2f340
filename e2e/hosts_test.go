//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/apiaryhq/apiary/cli"
	"github.com/apiaryhq/apiary/e2e/framework"
	"github.com/apiaryhq/apiary/e2e/sshhost"
	"github.com/apiaryhq/apiary/hosts"
	"github.com/apiaryhq/apiary/konnectivity"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/operator/controllers"
	"github.com/apiaryhq/apiary/operator/render"
)

const (
	hostNetwork = "apiary-e2e-hosts"
	hostSubnet  = "172.31.250.0/24"
	// Nothing listens there: the network's last address.
	unreachableAddress = "172.31.250.254"
)

// testHostPreflight runs the SSH host agent against real sshd hosts: a good
// host passes preflight with its facts recorded and gets the node bundle
// installed; a wrong SSH key, a wrong pinned host key and an unreachable
// address each fail with their reason, change nothing on their host, and
// are retried with backoff, not in a loop.
func (e *env) testHostPreflight(t *testing.T) {
	e.TCP(t, "alpha") // the tenant the hosts are for
	// The user's CNI, installed before any host joins: without it the
	// Nodes stay NotReady and the Hosts in phase Joining.
	installCNI(t, e.ExportKubeconfig(t, "alpha"))
	d, err := sshhost.EnsureDocker(e.Ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Stop(e.Ctx) })
	start := time.Now()
	image, err := d.EnsureImage(e.Ctx, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("test host image %s ready in %s", image, time.Since(start).Round(time.Millisecond))
	if err := d.EnsureNetwork(e.Ctx, hostNetwork, hostSubnet); err != nil {
		t.Fatal(err)
	}
	// h is installed; h2 only ever sees failing connections.
	h, h2 := e.startHost(t, d, image, "e2e-host-1"), e.startHost(t, d, image, "e2e-host-2")
	before := hostSnapshot(t, e, d, h2.Name)

	ns := framework.TenantsNS
	keySecret := func(name string, key []byte) {
		t.Helper()
		sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Type: corev1.SecretTypeSSHAuth,
			Data: map[string][]byte{corev1.SSHAuthPrivateKey: key}}
		if err := e.C.Create(e.Ctx, sec); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.C.Delete(e.Ctx, sec) })
	}
	keySecret("e2e-host-key", h.PrivateKeyPEM)
	keySecret("e2e-host-2-key", h2.PrivateKeyPEM)
	keySecret("e2e-host-2-wrong-key", newPrivateKeyPEM(t))
	otherHostKey := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(newPublicKey(t))))

	newHost := func(name, address, secret, hostKey string) *apiary.Host {
		return &apiary.Host{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: apiary.HostSpec{
			TenantControlPlane: "alpha", Address: address, SSHKeySecretRef: corev1.LocalObjectReference{Name: secret}, HostKey: hostKey,
		}}
	}
	cases := []struct {
		host             *apiary.Host
		condition        string
		status           metav1.ConditionStatus
		reason, contains string
	}{
		{newHost("good", h.Address, "e2e-host-key", h.HostKeyAuthorized), apiary.HostConditionInstalled, metav1.ConditionTrue, controllers.ReasonInstalled, "@sha256:"},
		{newHost("wrong-ssh-key", h2.Address, "e2e-host-2-wrong-key", h2.HostKeyAuthorized), apiary.HostConditionReachable, metav1.ConditionFalse, hosts.ReasonAuthenticationFailed, "refused the SSH key"},
		{newHost("wrong-host-key", h2.Address, "e2e-host-2-key", otherHostKey), apiary.HostConditionReachable, metav1.ConditionFalse, hosts.ReasonHostKeyMismatch, ssh.FingerprintSHA256(h2.HostKey)},
		{newHost("unreachable", unreachableAddress, "e2e-host-key", h.HostKeyAuthorized), apiary.HostConditionReachable, metav1.ConditionFalse, hosts.ReasonUnreachable, unreachableAddress},
	}
	created := time.Now()
	for _, c := range cases {
		if err := e.C.Create(e.Ctx, c.host); err != nil {
			t.Fatalf("creating Host %s: %v", c.host.Name, err)
		}
		t.Cleanup(func() { deleteHostAndWait(t, e, c.host) })
	}
	for _, c := range cases {
		var got apiary.Host
		framework.Eventually(t, "Host "+c.host.Name+" "+c.condition+" "+c.reason, 2*time.Minute, func() error {
			if err := e.C.Get(e.Ctx, client.ObjectKeyFromObject(c.host), &got); err != nil {
				return err
			}
			cond := meta.FindStatusCondition(got.Status.Conditions, c.condition)
			if cond == nil || cond.Status != c.status || cond.Reason != c.reason {
				return fmt.Errorf("conditions %+v", got.Status.Conditions)
			}
			if !strings.Contains(cond.Message, c.contains) {
				return fmt.Errorf("%s message %q does not contain %q", c.condition, cond.Message, c.contains)
			}
			return nil
		})
		t.Logf("Host %s: %s=%s %s after %s", c.host.Name, c.condition, c.status, c.reason, time.Since(created).Round(time.Millisecond))
	}

	var good apiary.Host
	if err := e.C.Get(e.Ctx, client.ObjectKey{Namespace: ns, Name: "good"}, &good); err != nil {
		t.Fatal(err)
	}
	f := good.Status.Facts
	if f == nil || f.Arch != "amd64" || f.ContainerRuntime != "containerd" || !strings.HasPrefix(f.ContainerRuntimeVersion, "v2.") || f.Kernel == "" || !strings.Contains(f.OS, "Debian") {
		t.Errorf("facts %+v", f)
	}
	if good.Status.HostKeyCheck != "pinned" {
		t.Errorf("hostKeyCheck %q", good.Status.HostKeyCheck)
	}
	if err := framework.ConditionIs(good.Status.Conditions, apiary.HostConditionPreflightPassed, metav1.ConditionTrue, controllers.ReasonPreflightPassed); err != nil {
		t.Error(err)
	}
	j := good.Status.Journal
	if len(j) < 2 || j[0].Name != controllers.StepPreflight || j[0].Result != controllers.StepSucceeded ||
		j[1].Name != controllers.StepInstall || j[1].Result != controllers.StepSucceeded || j[1].Finished == nil || j[0].Finished == nil {
		t.Fatalf("journal %+v", j)
	}
	t.Logf("FIGURE Host good: preflight %s, install %s (%s)", j[0].Finished.Sub(j[0].Started.Time).Round(time.Millisecond),
		j[1].Finished.Sub(j[1].Started.Time).Round(time.Millisecond), j[1].Message)
	// What install put on the host.
	for cmd, want := range map[string]string{
		"/usr/bin/kubelet --version":         "Kubernetes v1.37.2",
		"kubeadm version -o short":           "v1.37.2",
		"systemctl is-enabled kubelet":       "enabled",
		"/opt/cni/bin/bridge 2>&1 | head -1": "CNI",
		"cat /var/lib/apiary/installed":      "/usr/bin/kubelet",
	} {
		out, err := d.Exec(e.Ctx, h.Name, "sh", "-c", cmd)
		if err != nil || !strings.Contains(out, want) {
			t.Errorf("on the installed host, %s: %q (%v), want %q", cmd, out, err, want)
		}
	}

	// Failing hosts are retried with backoff (10 s, 20 s, 40 s ...), not
	// in a loop: count their attempts over a window of at least 45 s,
	// which the good one's join fills.
	e.testHostJoin(t, d, h, "good")
	if w := time.Since(created); w < 45*time.Second {
		time.Sleep(45*time.Second - w)
	}
	window := time.Since(created)
	// Attempt k+1 starts at least 10 s × (2^k - 1) after the first.
	most := int32(1)
	for 10*time.Second*time.Duration(1<<most-1) <= window {
		most++
	}
	for _, name := range []string{"wrong-ssh-key", "wrong-host-key", "unreachable"} {
		var got apiary.Host
		if err := e.C.Get(e.Ctx, client.ObjectKey{Namespace: ns, Name: name}, &got); err != nil {
			t.Fatal(err)
		}
		if got.Status.Phase != apiary.HostPhaseFailed || len(got.Status.Journal) != 1 {
			t.Errorf("%s: phase %s, journal %+v", name, got.Status.Phase, got.Status.Journal)
			continue
		}
		attempts := got.Status.Journal[0].Attempts
		t.Logf("FIGURE Host %s: %d preflight attempts in %s", name, attempts, window.Round(time.Second))
		if attempts < 2 || attempts > most+1 {
			t.Errorf("%s: %d attempts in %s, want 2..%d (backoff from 10 s)", name, attempts, window.Round(time.Second), most+1)
		}
	}

	// Nothing changed on the host the failing Hosts point at.
	if after := hostSnapshot(t, e, d, h2.Name); after != before {
		t.Errorf("the host changed during preflight:\nbefore:\n%s\nafter:\n%s", before, after)
	}

	t.Run("StandaloneControlPlaneHostStandsBy", func(t *testing.T) { e.testStandbyHost(t, d, h, h2, "good", "wrong-ssh-key") })
	t.Run("SwitchModeBothWays", func(t *testing.T) { e.testSwitchBothWays(t, d, h, "good") })
	t.Run("PodNetworkAcrossHosts", func(t *testing.T) { e.testPodNetwork(t, d, image, "good") })
	t.Run("PlainKubeadmJoin", func(t *testing.T) { e.testHandJoin(t, d, image) })
	t.Run("OperatorKilledWhileInstalling", func(t *testing.T) { e.testHostAcrossOperatorKill(t, d, image) })
	t.Run("HostAddListRemoveCLI", func(t *testing.T) { e.testHostCLI(t, d, image) })
	t.Run("StalledHostsHoldNoOtherTenant", func(t *testing.T) { e.testStalledHostsHoldNoOtherTenant(t, d, image) })
	t.Run("TenantUpgradesAMinorWithItsHosts", func(t *testing.T) { e.testMinorUpgrade(t, d, image) })
	t.Run("RegisteredTenant", func(t *testing.T) { e.testRegisteredTenant(t, d, image) })

	// Bad input is refused at admission, naming the field.
	bad := newHost("bad-key", h.Address, "e2e-host-key", "ssh-ed25519 not-a-key")
	if err := e.C.Create(e.Ctx, bad); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.hostKey") {
		t.Errorf("creating a Host with an unparsable host key: %v, want Invalid naming spec.hostKey", err)
	}
	unpinned := newHost("unpinned", h.Address, "e2e-host-key", "")
	if err := e.C.Create(e.Ctx, unpinned); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.hostKey") {
		t.Errorf("creating a Host without a host key: %v, want Invalid naming spec.hostKey", err)
	}
}

// startHost starts a test host on the e2e hosts' network, pulling images
// through the local registry, removed when the test ends.
func (e *env) startHost(t *testing.T, d *sshhost.Docker, image, name string) *sshhost.Host {
	t.Helper()
	start := time.Now()
	h, err := d.StartHost(e.Ctx, sshhost.HostOptions{Name: name, Network: hostNetwork, Image: image, RegistryMirror: "http://" + e.RegistryAtNode()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.RemoveHost(e.Ctx, h.Name) })
	t.Logf("FIGURE test host %s (systemd, sshd, containerd) up in %s", name, time.Since(start).Round(time.Millisecond))
	return h
}

// hostSnapshot lists what an install would change on a host.
func hostSnapshot(t *testing.T, e *env, d *sshhost.Docker, name string) string {
	t.Helper()
	out, err := d.Exec(e.Ctx, name, "sh", "-c",
		"ls -la /etc/kubernetes /usr/local/bin /usr/bin/kubelet /etc/systemd/system /opt/cni/bin 2>&1; systemctl list-units --no-legend --plain --type=service | awk '{print $1, $3, $4}'")
	if err != nil {
		t.Fatalf("snapshot of %s: %v: %s", name, err, out)
	}
	return out
}

func newPrivateKeyPEM(t *testing.T) []byte {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	block, err := ssh.MarshalPrivateKey(priv, "")
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(block)
}

func newPublicKey(t *testing.T) ssh.PublicKey {
	t.Helper()
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	k, err := ssh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// testHostJoin follows the installed Host into the tenant: kubeadm join by
// the agent, the Node registered with the Host's UID recorded, the join
// token gone, the Node's serving certificate approved, and the API server
// reaching the node's kubelet through konnectivity (logs and exec of the
// host-network pods that run without a pod network). Then the Host is
// removed (Node gone, host reset) and added again (joins again).
func (e *env) testHostJoin(t *testing.T, d *sshhost.Docker, h *sshhost.Host, name string) {
	// alpha is the earlier tests' too: say so when it is not Ready now,
	// and wait for it (a join needs an answering API).
	if c := meta.FindStatusCondition(e.TCP(t, "alpha").Status.Conditions, apiary.ConditionReady); c == nil || c.Status != metav1.ConditionTrue {
		start := time.Now()
		t.Logf("alpha is not Ready before the join: %+v", c)
		e.WaitReady(t, "alpha")
		t.Logf("alpha Ready again after %s", time.Since(start).Round(time.Millisecond))
	}
	kc := e.ExportKubeconfig(t, "alpha")
	cs := e.tenantClient(t, kc)
	key := client.ObjectKey{Namespace: framework.TenantsNS, Name: name}
	var host apiary.Host
	framework.Eventually(t, "Host "+name+" joined", 5*time.Minute, func() error {
		if err := e.C.Get(e.Ctx, key, &host); err != nil {
			return err
		}
		return framework.ConditionIs(host.Status.Conditions, apiary.HostConditionJoined, metav1.ConditionTrue, controllers.ReasonJoined)
	})
	if step := journal(host, controllers.StepJoin); step == nil || step.Finished == nil {
		t.Fatalf("journal %+v", host.Status.Journal)
	} else {
		t.Logf("FIGURE Host %s: kubeadm join %s", name, step.Finished.Sub(step.Started.Time).Round(time.Second))
	}
	var node *corev1.Node
	framework.Eventually(t, "Node "+name+" with its UID in the Host", time.Minute, func() error {
		n, err := cs.CoreV1().Nodes().Get(e.Ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if err := e.C.Get(e.Ctx, key, &host); err != nil {
			return err
		}
		if host.Status.NodeUID != string(n.UID) {
			return fmt.Errorf("Host nodeUID %q, Node UID %s", host.Status.NodeUID, n.UID)
		}
		node = n
		return nil
	})
	if host.Status.BootstrapTokenID != "" {
		t.Errorf("the join token %s is still recorded", host.Status.BootstrapTokenID)
	}
	noJoinTokenLeft(t, e, cs)
	e.waitHostReady(t, name)
	if err := e.C.Get(e.Ctx, key, &host); err != nil {
		t.Fatal(err)
	}
	if c := meta.FindStatusCondition(host.Status.Conditions, apiary.HostConditionNodeReady); c != nil {
		t.Logf("FIGURE Host %s: Node Ready %s after kubeadm join finished", name,
			c.LastTransitionTime.Sub(journal(host, controllers.StepJoin).Finished.Time).Round(time.Second))
	}
	node, err := cs.CoreV1().Nodes().Get(e.Ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("Node %s: kubelet %s, podCIDR %s, conditions %v", node.Name, node.Status.NodeInfo.KubeletVersion, node.Spec.PodCIDR, nodeConditions(node))
	if node.Status.NodeInfo.KubeletVersion != "v1.37.2" {
		t.Errorf("kubelet version %q", node.Status.NodeInfo.KubeletVersion)
	}

	// Host-network pods (kube-proxy, konnectivity-agent) run even before
	// a pod network exists; the API server reaches their kubelet only
	// through the konnectivity tunnel the agent opened.
	var agentPod string
	framework.Eventually(t, "konnectivity-agent running on "+name, 3*time.Minute, func() error {
		pods, err := cs.CoreV1().Pods("kube-system").List(e.Ctx, metav1.ListOptions{LabelSelector: "k8s-app=konnectivity-agent", FieldSelector: "spec.nodeName=" + name})
		if err != nil {
			return err
		}
		for _, p := range pods.Items {
			if p.Status.Phase == corev1.PodRunning {
				agentPod = p.Name
				return nil
			}
		}
		return fmt.Errorf("%d agent pods, none running", len(pods.Items))
	})
	framework.Eventually(t, "kubectl logs through konnectivity", 2*time.Minute, func() error {
		out, err := framework.KubectlErr(kc, "-n", "kube-system", "logs", agentPod, "--tail=5")
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	})
	framework.Eventually(t, "kubectl exec through konnectivity", time.Minute, func() error {
		// The agent binary prints its flags: proof that the command ran
		// in the pod on the host.
		out, err := framework.KubectlErr(kc, "-n", "kube-system", "exec", agentPod, "--", "/proxy-agent", "--help")
		if !strings.Contains(out, "--proxy-server-host") {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	})

	// A scale-up adds a konnectivity-server; the agent finds it through
	// its lease and connects to every server, without restarting anything.
	e.setReplicas(t, "alpha", 3)
	e.waitReplicas(t, "alpha", 3)
	scaled := time.Now()
	framework.Eventually(t, "every konnectivity-server has an agent", 2*time.Minute, func() error {
		return everyServerHasAgents(e, t)
	})
	t.Logf("FIGURE after a scale 2→3, every konnectivity-server had the agent connected within %s", time.Since(scaled).Round(time.Millisecond))
	e.setReplicas(t, "alpha", 2)
	e.waitReplicas(t, "alpha", 2)

	// The kubelet serves with a certificate the agent approved after
	// checking the CSR against the Host.
	csrs, err := cs.CertificatesV1().CertificateSigningRequests().List(e.Ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	approved := 0
	for _, c := range csrs.Items {
		if c.Spec.SignerName != "kubernetes.io/kubelet-serving" || c.Spec.Username != "system:node:"+name {
			continue
		}
		for _, cond := range c.Status.Conditions {
			if cond.Type == "Approved" && cond.Reason == "ApiaryHostVerified" && len(c.Status.Certificate) > 0 {
				approved++
			}
		}
	}
	if approved == 0 {
		t.Error("no kubelet serving CSR of the Node approved by the agent and signed")
	}

	// Remove the Host: Node gone, host reset.
	removed := time.Now()
	if err := e.C.Delete(e.Ctx, &host); err != nil {
		t.Fatal(err)
	}
	framework.Eventually(t, "Host "+name+" removed", 5*time.Minute, func() error {
		if err := e.C.Get(e.Ctx, key, &apiary.Host{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there: %v", err)
		}
		return nil
	})
	t.Logf("FIGURE Host %s removed (drain, reset, Node deleted) in %s", name, time.Since(removed).Round(time.Millisecond))
	if _, err := cs.CoreV1().Nodes().Get(e.Ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("Node %s after the Host's removal: %v", name, err)
	}
	out, err := d.Exec(e.Ctx, h.Name, "sh", "-c",
		"for f in /usr/bin/kubelet /usr/bin/kubeadm /etc/kubernetes /var/lib/kubelet /var/lib/apiary /etc/systemd/system/kubelet.service /opt/cni/bin/bridge /etc/cni/net.d/10-kuberouter.conflist /var/lib/cni; do test -e $f && echo left: $f; done; "+
			"pgrep -x kubelet && echo kubelet running; ip link show kube-bridge >/dev/null 2>&1 && echo left: kube-bridge; true")
	if err != nil || strings.TrimSpace(out) != "" {
		t.Errorf("host not reset: %s %v", out, err)
	}

	// The reset host joins again.
	again := &apiary.Host{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: name}, Spec: host.Spec}
	rejoin := time.Now()
	if err := e.C.Create(e.Ctx, again); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteHostAndWait(t, e, again) })
	framework.Eventually(t, "Host "+name+" joined again", 5*time.Minute, func() error {
		if err := e.C.Get(e.Ctx, key, again); err != nil {
			return err
		}
		if err := framework.ConditionIs(again.Status.Conditions, apiary.HostConditionJoined, metav1.ConditionTrue, controllers.ReasonJoined); err != nil {
			return err
		}
		if again.Status.NodeUID == "" || again.Status.NodeUID == host.Status.NodeUID {
			return fmt.Errorf("nodeUID %q (first join: %s)", again.Status.NodeUID, host.Status.NodeUID)
		}
		return nil
	})
	t.Logf("FIGURE Host %s re-added: preflight, install and join again in %s", name, time.Since(rejoin).Round(time.Millisecond))
}

func journal(h apiary.Host, name string) *apiary.HostStep {
	for i := range h.Status.Journal {
		if h.Status.Journal[i].Name == name {
			return &h.Status.Journal[i]
		}
	}
	return nil
}

func nodeConditions(n *corev1.Node) []string {
	var out []string
	for _, c := range n.Status.Conditions {
		out = append(out, fmt.Sprintf("%s=%s", c.Type, c.Status))
	}
	return out
}

// deleteHostAndWait removes a Host and waits for its cleanup (which may
// reset the host over SSH, so it must run before the host container goes).
func deleteHostAndWait(t *testing.T, e *env, h *apiary.Host) {
	ctx := context.Background()
	if err := e.C.Delete(ctx, h); apierrors.IsNotFound(err) {
		return
	}
	deadline := time.Now().Add(3 * time.Minute)
	for time.Now().Before(deadline) {
		if err := e.C.Get(ctx, client.ObjectKeyFromObject(h), &apiary.Host{}); apierrors.IsNotFound(err) {
			return
		}
		time.Sleep(time.Second)
	}
	t.Errorf("Host %s/%s not removed within 3 minutes", h.Namespace, h.Name)
}

// testHandJoin joins a machine the way a user does without Apiary's agent:
// node software installed (here from the same bundle), a token from
// `kubeadm token create --print-join-command` run with the exported
// kubeconfig, and that command run on the machine.
func (e *env) testHandJoin(t *testing.T, d *sshhost.Docker, image string) {
	h := e.startHost(t, d, image, "e2e-host-hand")
	kc := e.ExportKubeconfig(t, "alpha")
	cs := e.tenantClient(t, kc)

	// The node software, as a package manager would put it there.
	c, err := hosts.Dial(e.Ctx, hosts.Target{Address: h.Address, Port: h.Port, User: h.User, PrivateKey: h.PrivateKeyPEM, HostKey: h.HostKeyAuthorized})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	bundle, err := hosts.ResolveBundle(e.Ctx, e.RegistryAtNode()+"/apiaryhq/node-bundle:v1.37.2", true)
	if err != nil {
		t.Fatal(err)
	}
	t.Run("MisbehavingHostIsBounded", func(t *testing.T) {
		// Its own connection: a stalled copy closes it.
		c, err := hosts.Dial(e.Ctx, hosts.Target{Address: h.Address, Port: h.Port, User: h.User, PrivateKey: h.PrivateKeyPEM, HostKey: h.HostKeyAuthorized})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		testMisbehavingHost(t, e.Ctx, d, h.Name, c, bundle)
	})
	if err := hosts.Install(e.Ctx, c, bundle); err != nil {
		t.Fatal(err)
	}

	join, _ := kubeadmJoinCommand(t, e, kc)
	// What a user of this (cgroup v1, containerized) machine adds: the
	// kubelet's opt-in for cgroup v1, and skipping the kernel-config check
	// (no /lib/modules in the container).
	script := "mkdir -p /tmp/patches && printf 'apiVersion: kubelet.config.k8s.io/v1beta1\\nkind: KubeletConfiguration\\nfailCgroupV1: false\\n' > /tmp/patches/kubeletconfiguration+merge.yaml && " +
		join + " --node-name hand-joined --patches /tmp/patches --ignore-preflight-errors=SystemVerification"
	start := time.Now()
	if out, err := d.Exec(e.Ctx, h.Name, "sh", "-c", script+" 2>&1"); err != nil {
		t.Fatalf("%s: %v\n%s", join, err, out)
	}
	t.Logf("FIGURE plain kubeadm join by hand: %s", time.Since(start).Round(time.Millisecond))
	t.Cleanup(func() {
		_, _ = d.Exec(context.Background(), h.Name, "kubeadm", "reset", "-f")
		_ = cs.CoreV1().Nodes().Delete(context.Background(), "hand-joined", metav1.DeleteOptions{})
	})
	framework.Eventually(t, "Node hand-joined registered", time.Minute, func() error {
		n, err := cs.CoreV1().Nodes().Get(e.Ctx, "hand-joined", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if n.Status.NodeInfo.KubeletVersion != "v1.37.2" {
			return fmt.Errorf("kubelet %q", n.Status.NodeInfo.KubeletVersion)
		}
		return nil
	})
}

// testHostAcrossOperatorKill kills the operator leader while a Host is being
// installed or joined: the next leader resumes from the journal, and the
// Host ends joined with one Node and no join token left behind.
func (e *env) testHostAcrossOperatorKill(t *testing.T, d *sshhost.Docker, image string) {
	h := e.startHost(t, d, image, "e2e-host-kill")
	host := e.newHostFor(t, "survivor", h, "alpha")
	start := time.Now()
	if err := e.C.Create(e.Ctx, host); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteHostAndWait(t, e, host) })
	// Kill the leader as soon as the install has started (journaled before
	// the agent touches the host; it takes a few seconds).
	var phase apiary.HostPhase
	deadline := time.Now().Add(time.Minute)
	for phase != apiary.HostPhaseInstalling && phase != apiary.HostPhaseJoining {
		if time.Now().After(deadline) {
			t.Fatalf("Host survivor never seen installing or joining (phase %q)", phase)
		}
		if err := e.C.Get(e.Ctx, client.ObjectKeyFromObject(host), host); err != nil {
			t.Fatal(err)
		}
		phase = host.Status.Phase
		time.Sleep(50 * time.Millisecond)
	}
	killed := time.Now()
	leader := e.killLeader(t)
	t.Logf("killed operator leader %s while the Host was %s, %s after its creation", leader, phase, time.Since(start).Round(time.Millisecond))
	framework.Eventually(t, "Host survivor joined after the kill", 5*time.Minute, func() error {
		if err := e.C.Get(e.Ctx, client.ObjectKeyFromObject(host), host); err != nil {
			return err
		}
		if host.Status.NodeUID == "" {
			return fmt.Errorf("phase %s, no Node yet; conditions %v", host.Status.Phase, host.Status.Conditions)
		}
		return framework.ConditionIs(host.Status.Conditions, apiary.HostConditionJoined, metav1.ConditionTrue, controllers.ReasonJoined)
	})
	t.Logf("FIGURE Host survivor joined %s after creation, across an operator leader kill", time.Since(start).Round(time.Millisecond))
	for _, st := range host.Status.Journal {
		resumed := st.Finished != nil && st.Finished.After(killed.Add(2*time.Second))
		t.Logf("journal %s: %s, %d attempt(s), finished by the next leader: %t (%s)", st.Name, st.Result, st.Attempts, resumed, st.Message)
	}
	cs := e.tenantClient(t, e.ExportKubeconfig(t, "alpha"))
	nodes, err := cs.CoreV1().Nodes().List(e.Ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, node := range nodes.Items {
		if node.Name == "survivor" {
			n++
		}
	}
	if n != 1 {
		t.Errorf("%d Nodes named survivor", n)
	}
	noJoinTokenLeft(t, e, cs)

	// Its key Secret deleted first (as a namespace deletion may do), the
	// Host cannot reset the machine: it is let go, with a Warning that
	// says what stays there, and its Node still goes.
	if err := e.C.Delete(e.Ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: framework.TenantsNS, Name: "survivor-ssh"}}); err != nil {
		t.Fatal(err)
	}
	if err := e.C.Delete(e.Ctx, host); err != nil {
		t.Fatal(err)
	}
	framework.Eventually(t, "Host survivor let go without its key", 2*time.Minute, func() error {
		if err := e.C.Get(e.Ctx, client.ObjectKeyFromObject(host), &apiary.Host{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there: %v", err)
		}
		return nil
	})
	framework.Eventually(t, "HostNotReset warning", 30*time.Second, func() error {
		var list eventsv1.EventList
		if err := e.C.List(e.Ctx, &list, client.InNamespace(framework.TenantsNS)); err != nil {
			return err
		}
		for _, ev := range list.Items {
			if ev.Regarding.Name == "survivor" && ev.Reason == controllers.ReasonHostNotReset && ev.Type == corev1.EventTypeWarning {
				return nil
			}
		}
		return fmt.Errorf("no %s event for Host survivor", controllers.ReasonHostNotReset)
	})
	if _, err := cs.CoreV1().Nodes().Get(e.Ctx, "survivor", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("Node survivor after its Host was let go: %v", err)
	}
}

// everyServerHasAgents reads konnectivity-server's metrics (health port,
// /metrics) in every control-plane pod of alpha.
func everyServerHasAgents(e *env, t *testing.T) error {
	var pods corev1.PodList
	if err := e.C.List(e.Ctx, &pods, client.InNamespace(framework.TenantsNS), client.MatchingLabels(render.SelectorLabels(e.TCP(t, "alpha")))); err != nil {
		return err
	}
	n := 0
	for _, p := range pods.Items {
		if p.Status.PodIP == "" || !p.DeletionTimestamp.IsZero() || p.Status.Phase != corev1.PodRunning {
			continue
		}
		n++
		resp, err := http.Get(fmt.Sprintf("http://%s:%d/metrics", p.Status.PodIP, konnectivity.HealthPort))
		if err != nil {
			return err
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return err
		}
		connected := false
		for _, line := range strings.Split(string(body), "\n") {
			if v, ok := strings.CutPrefix(line, "konnectivity_network_proxy_server_ready_backend_connections "); ok && strings.TrimSpace(v) != "0" {
				connected = true
			}
		}
		if !connected {
			return fmt.Errorf("konnectivity-server in %s has no agent", p.Name)
		}
	}
	if n != 3 {
		return fmt.Errorf("%d control-plane pods running, want 3", n)
	}
	return nil
}

// noJoinTokenLeft fails when a bootstrap token the agent made is still in
// the tenant.
func noJoinTokenLeft(t *testing.T, e *env, cs kubernetes.Interface) {
	t.Helper()
	secrets, err := cs.CoreV1().Secrets("kube-system").List(e.Ctx, metav1.ListOptions{FieldSelector: "type=bootstrap.kubernetes.io/token"})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range secrets.Items {
		if strings.Contains(string(s.Data["description"]), "apiary: join of Host") {
			t.Errorf("join token %s left behind", s.Name)
		}
	}
}

// testHostCLI adds a machine with `apiary host add` as a user does (the
// host key read from the machine and pinned with --yes), lists it, and
// removes it with `apiary host remove --wait`.
func (e *env) testHostCLI(t *testing.T, d *sshhost.Docker, image string) {
	h := e.startHost(t, d, image, "e2e-host-cli")
	keyFile := filepath.Join(t.TempDir(), "id_ed25519")
	if err := os.WriteFile(keyFile, h.PrivateKeyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	apiaryCLI := func(args ...string) string {
		t.Helper()
		var out, errOut bytes.Buffer
		cmd := cli.NewHostCommand(&cli.ConfigFlags{Kubeconfig: e.Kubeconfig, Namespace: framework.TenantsNS})
		cmd.SetArgs(args)
		cmd.SetOut(&out)
		cmd.SetErr(&errOut)
		cmd.SetIn(strings.NewReader(""))
		if err := cmd.ExecuteContext(e.Ctx); err != nil {
			t.Fatalf("apiary host %s: %v\n%s%s", strings.Join(args, " "), err, out.String(), errOut.String())
		}
		return out.String()
	}
	out := apiaryCLI("add", "cli-added", "--tenant", "alpha", "--address", h.Address, "--ssh-key-file", keyFile, "--yes")
	if !strings.Contains(out, ssh.FingerprintSHA256(h.HostKey)) {
		t.Errorf("host add did not show the host key's fingerprint %s:\n%s", ssh.FingerprintSHA256(h.HostKey), out)
	}
	var host apiary.Host
	key := client.ObjectKey{Namespace: framework.TenantsNS, Name: "cli-added"}
	if err := e.C.Get(e.Ctx, key, &host); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteHostAndWait(t, e, &host) })
	if host.Spec.HostKey != h.HostKeyAuthorized {
		t.Errorf("pinned %q, the host's key is %q", host.Spec.HostKey, h.HostKeyAuthorized)
	}
	var sec corev1.Secret
	if err := e.C.Get(e.Ctx, client.ObjectKey{Namespace: framework.TenantsNS, Name: "cli-added-ssh"}, &sec); err != nil || sec.Type != corev1.SecretTypeSSHAuth {
		t.Errorf("key Secret: %v (type %s)", err, sec.Type)
	}
	framework.Eventually(t, "cli-added joined", 5*time.Minute, func() error {
		if err := e.C.Get(e.Ctx, key, &host); err != nil {
			return err
		}
		return framework.ConditionIs(host.Status.Conditions, apiary.HostConditionJoined, metav1.ConditionTrue, controllers.ReasonJoined)
	})
	if list := apiaryCLI("list"); !strings.Contains(list, "cli-added") || !strings.Contains(list, "alpha") {
		t.Errorf("host list:\n%s", list)
	}
	if out := apiaryCLI("remove", "cli-added", "--wait", "3m"); !strings.Contains(out, "removed") {
		t.Errorf("host remove: %s", out)
	}
	if err := e.C.Get(e.Ctx, key, &apiary.Host{}); !apierrors.IsNotFound(err) {
		t.Errorf("Host after remove --wait: %v", err)
	}
}

// testMisbehavingHost runs, against a real sshd on a test host, what the
// operator's agent does when the host turns against it: a command that
// prints forever, and an SFTP server that stops answering mid-copy. Both
// must end the step with a bounded message, the first without the
// process's memory growing with the output, the second when the step's
// context ends. The agent's code runs in this test process, as it would in
// the operator.
func testMisbehavingHost(t *testing.T, ctx context.Context, d *sshhost.Docker, host string, c *hosts.Client, bundle *hosts.Bundle) {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	var peak uint64
	sampling, stopSampling := context.WithCancel(ctx)
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for sampling.Err() == nil {
			var m runtime.MemStats
			runtime.ReadMemStats(&m)
			peak = max(peak, m.HeapInuse)
			time.Sleep(20 * time.Millisecond)
		}
	}()
	runCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	start := time.Now()
	out, err := c.RunScript(runCtx, "yes apiary-endless-output-test\n")
	took := time.Since(start)
	deadlineHit := runCtx.Err() != nil
	cancel()
	stopSampling()
	<-sampled
	runtime.ReadMemStats(&after)
	grew := int64(peak) - int64(before.HeapInuse)
	t.Logf("FIGURE endless output from a real sshd: step failed after %s, message %d bytes, heap in use grew by at most %.1f MiB",
		took.Round(time.Millisecond), len(fmt.Sprint(err)), float64(grew)/(1<<20))
	if hosts.ReasonOf(err) != hosts.ReasonCommandFailed || !strings.Contains(fmt.Sprint(err), "stopped after more than 4 MiB of output") {
		t.Errorf("endless output: reason %q, %v", hosts.ReasonOf(err), err)
	}
	if len(out) != 0 || len(fmt.Sprint(err)) > 300 {
		t.Errorf("kept %d bytes of output and a %d byte message", len(out), len(fmt.Sprint(err)))
	}
	if deadlineHit {
		t.Errorf("stopped by the 2 minute deadline, not by the bound")
	}
	// The bound is 4 MiB of output; what the client buffers around it
	// stays within a few times that.
	if grew > 32<<20 {
		t.Errorf("heap in use grew by %d MiB while the host printed forever", grew>>20)
	}
	// Nothing left running on the host.
	if out, _ := d.Exec(ctx, host, "sh", "-c", "pgrep -x yes || true"); strings.TrimSpace(out) != "" {
		t.Errorf("yes still runs on the host: %s", out)
	}

	// An SFTP server that stops (SIGSTOP) as soon as the copy starts.
	stopper := make(chan error, 1)
	go func() {
		_, err := d.Exec(ctx, host, "sh", "-c", "for i in $(seq 1200); do pkill -STOP -x sftp-server && exit 0; sleep 0.05; done; exit 1")
		stopper <- err
	}()
	t.Cleanup(func() { _, _ = d.Exec(context.Background(), host, "pkill", "-CONT", "-x", "sftp-server") })
	const limit = 20 * time.Second
	copyCtx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	start = time.Now()
	err = hosts.Install(copyCtx, c, bundle)
	took = time.Since(start)
	if serr := <-stopper; serr != nil {
		t.Fatalf("the sftp-server was never stopped: %v", serr)
	}
	t.Logf("FIGURE SFTP server stopped mid-install: the install failed after %s (step deadline %s): %v", took.Round(time.Millisecond), limit, err)
	if err == nil {
		t.Fatal("the install succeeded with the host's SFTP server stopped")
	}
	if took > limit+5*time.Second {
		t.Errorf("the install returned %s after its deadline", took-limit)
	}
	if _, err := d.Exec(ctx, host, "pkill", "-CONT", "-x", "sftp-server"); err != nil {
		t.Logf("resuming the sftp-server: %v", err)
	}
}
