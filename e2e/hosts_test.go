//go:build e2e

package e2e

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"fmt"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/apiaryhq/apiary/e2e/framework"
	"github.com/apiaryhq/apiary/e2e/sshhost"
	"github.com/apiaryhq/apiary/hosts"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/operator/controllers"
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
	startHost := func(name string) *sshhost.Host {
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
	// h is installed; h2 only ever sees failing connections.
	h, h2 := startHost("e2e-host-1"), startHost("e2e-host-2")
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
		t.Cleanup(func() { _ = e.C.Delete(e.Ctx, c.host) })
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
	if len(j) != 2 || j[0].Name != controllers.StepPreflight || j[0].Result != controllers.StepSucceeded ||
		j[1].Name != controllers.StepInstall || j[1].Result != controllers.StepSucceeded || j[1].Finished == nil || j[0].Finished == nil {
		t.Fatalf("journal %+v", j)
	}
	t.Logf("FIGURE Host good: preflight %s, install %s (%s)", j[0].Finished.Sub(j[0].Started.Time).Round(time.Millisecond),
		j[1].Finished.Sub(j[1].Started.Time).Round(time.Millisecond), j[1].Message)
	if good.Status.Phase != apiary.HostPhaseJoining {
		t.Errorf("phase %s, want Joining", good.Status.Phase)
	}
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
	// in a loop: count the attempts over a window.
	time.Sleep(45 * time.Second)
	window := time.Since(created)
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
		if attempts < 2 || attempts > 5 {
			t.Errorf("%s: %d attempts in %s, want 2..5 (backoff from 10 s)", name, attempts, window.Round(time.Second))
		}
	}

	// Nothing changed on the host the failing Hosts point at.
	if after := hostSnapshot(t, e, d, h2.Name); after != before {
		t.Errorf("the host changed during preflight:\nbefore:\n%s\nafter:\n%s", before, after)
	}

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
