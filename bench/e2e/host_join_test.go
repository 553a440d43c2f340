//go:build e2e

package e2e

import (
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/apiaryhq/apiary/e2e/framework"
	"github.com/apiaryhq/apiary/e2e/sshhost"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

const joins = 5

// BenchmarkHostJoin measures Host created → Node Ready in the tenant (Host
// phase Ready), over 5 fresh SSH hosts one after the other, and how that
// splits into the agent's steps (from the Host's journal: preflight,
// install, join), the Node registering, and the Node turning Ready (the
// CNI, kube-router from hack/cni, starting on it; installed into the tenant
// once, as a user does).
func BenchmarkHostJoin(b *testing.B) {
	e := framework.Setup(b)
	d, image := hostDocker(b, e, "apiary-bench-hosts", "172.31.251.0/24")
	e.CreateTenant(b, "bench-hosts", nil)
	kc := e.ExportKubeconfig(b, "bench-hosts")
	framework.Kubectl(b, kc, "apply", "-f", "../../hack/cni/kube-router.yaml")
	cfg, err := clientcmd.BuildConfigFromFlags("", kc)
	if err != nil {
		b.Fatal(err)
	}
	tenantCS := kubernetes.NewForConfigOrDie(cfg)

	type sample struct{ total, registered, preflight, install, join, ready, nodeReady time.Duration }
	var samples []sample
	for i := range joins {
		name := fmt.Sprintf("bench-host-%d", i)
		h, err := d.StartHost(e.Ctx, sshhost.HostOptions{Name: name, Network: "apiary-bench-hosts", Image: image, RegistryMirror: "http://" + e.RegistryAtNode()})
		if err != nil {
			b.Fatal(err)
		}
		sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: framework.TenantsNS, Name: name + "-key"}, Type: corev1.SecretTypeSSHAuth,
			Data: map[string][]byte{corev1.SSHAuthPrivateKey: h.PrivateKeyPEM}}
		if err := e.C.Create(e.Ctx, sec); err != nil {
			b.Fatal(err)
		}
		host := &apiary.Host{ObjectMeta: metav1.ObjectMeta{Namespace: framework.TenantsNS, Name: name}, Spec: apiary.HostSpec{
			TenantControlPlane: "bench-hosts", Address: h.Address, SSHKeySecretRef: corev1.LocalObjectReference{Name: sec.Name}, HostKey: h.HostKeyAuthorized,
		}}
		start := time.Now()
		if err := e.C.Create(e.Ctx, host); err != nil {
			b.Fatal(err)
		}
		var registered, total time.Duration
		framework.Eventually(b, name+" Ready", 5*time.Minute, func() error {
			if err := e.C.Get(e.Ctx, client.ObjectKeyFromObject(host), host); err != nil {
				return err
			}
			if host.Status.NodeUID != "" && registered == 0 {
				registered = time.Since(start)
			}
			if host.Status.Phase != apiary.HostPhaseReady {
				return fmt.Errorf("phase %s", host.Status.Phase)
			}
			total = time.Since(start)
			return nil
		})
		s := sample{total: total, registered: registered, ready: total - registered}
		// When the Node itself turned Ready (its condition, 1 s
		// resolution), as opposed to when the agent saw it.
		if n, err := tenantCS.CoreV1().Nodes().Get(e.Ctx, name, metav1.GetOptions{}); err == nil {
			for _, c := range n.Status.Conditions {
				if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
					s.nodeReady = c.LastTransitionTime.Sub(start).Round(time.Second)
				}
			}
		}
		for _, st := range host.Status.Journal {
			if st.Finished == nil {
				continue
			}
			took := st.Finished.Sub(st.Started.Time)
			switch st.Name {
			case "preflight":
				s.preflight = took
			case "install":
				s.install = took
			case "join":
				s.join = took
			}
		}
		samples = append(samples, s)
		b.Logf("%s: Host Ready %s after creation (preflight %s, install %s, join %s; Node registered at %s, Ready at ~%s by its condition, Host Ready %s after registration)", name,
			total.Round(time.Millisecond), s.preflight, s.install, s.join, registered.Round(time.Millisecond), s.nodeReady, s.ready.Round(time.Millisecond))
		// Leave the machine as found: removal resets it.
		if err := e.C.Delete(e.Ctx, host); err != nil {
			b.Fatal(err)
		}
		framework.Eventually(b, name+" removed", 3*time.Minute, func() error {
			if err := e.C.Get(e.Ctx, client.ObjectKeyFromObject(host), &apiary.Host{}); err == nil {
				return fmt.Errorf("still there")
			}
			return nil
		})
		_ = e.C.Delete(e.Ctx, sec)
		_ = d.RemoveHost(e.Ctx, name)
	}
	p50 := func(f func(sample) time.Duration) time.Duration {
		v := make([]time.Duration, len(samples))
		for i, s := range samples {
			v[i] = f(s)
		}
		sort.Slice(v, func(i, j int) bool { return v[i] < v[j] })
		return v[len(v)/2]
	}
	var all []string
	for _, s := range samples {
		all = append(all, s.total.Round(10*time.Millisecond).String())
	}
	b.Logf("Host created → Node Ready over %d hosts: p50 %s (all: %s); p50 of the steps (journal, 1 s resolution): preflight %s, install %s, join %s; "+
		"p50 created → Node registered %s, → Node Ready by its condition ~%s, registered → Host Ready %s",
		joins, p50(func(s sample) time.Duration { return s.total }).Round(10*time.Millisecond), strings.Join(all, " "),
		p50(func(s sample) time.Duration { return s.preflight }), p50(func(s sample) time.Duration { return s.install }), p50(func(s sample) time.Duration { return s.join }),
		p50(func(s sample) time.Duration { return s.registered }).Round(10*time.Millisecond), p50(func(s sample) time.Duration { return s.nodeReady }),
		p50(func(s sample) time.Duration { return s.ready }).Round(10*time.Millisecond))
	b.ReportMetric(p50(func(s sample) time.Duration { return s.total }).Seconds(), "s-to-ready-p50")
	b.ReportMetric(p50(func(s sample) time.Duration { return s.registered }).Seconds(), "s-to-node-p50")
}

// hostDocker starts the test hosts' Docker daemon, builds their image and
// makes their network.
func hostDocker(b *testing.B, e *framework.Env, network, cidr string) (*sshhost.Docker, string) {
	d, err := sshhost.EnsureDocker(e.Ctx)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = d.Stop(e.Ctx) })
	image, err := d.EnsureImage(e.Ctx, b.Logf)
	if err != nil {
		b.Fatal(err)
	}
	if err := d.EnsureNetwork(e.Ctx, network, cidr); err != nil {
		b.Fatal(err)
	}
	return d, image
}
