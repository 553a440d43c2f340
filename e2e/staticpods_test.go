//go:build e2e

package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/apiaryhq/apiary/e2e/framework"
	"github.com/apiaryhq/apiary/e2e/sshhost"
	"github.com/apiaryhq/apiary/hosts"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/operator/render"
)

// hostAccessAddress is the default DataStore's address for control-plane
// hosts (framework.installChart asks for it), in the LoadBalancer pool.
const hostAccessAddress = framework.DataStoreHostAddress

// testStaticControlPlane runs a tenant's control plane, rendered as static
// Pods by render.StaticPods (the registered mode's form), on one of its
// joined hosts, written there by hosts.WriteControlPlane: the kubelet
// starts kube-apiserver, kube-controller-manager, kube-scheduler and
// konnectivity-server; kube-apiserver reaches the tenant's slice of the
// DataStore through its host address (spec.hostAccess), past a
// NetworkPolicy that admits only control-plane hosts; the tenant sees the
// mirror Pods. Then hosts.RemoveControlPlane leaves no control-plane
// process on the host. This is the host half of registered mode; the
// operator's switch builds on it.
//
// other is a machine that is no control-plane Host: the DataStore's client
// port refuses it, and the peer port is not exposed to anyone.
//
// failedHostName is a Host at other's address that never joined.
func (e *env) testStaticControlPlane(t *testing.T, d *sshhost.Docker, h, other *sshhost.Host, hostName, failedHostName string) {
	ns := framework.TenantsNS
	// A control-plane Host: the DataStore's NetworkPolicy admits it.
	setRoleOf := func(name string, role apiary.HostRole) {
		t.Helper()
		var host apiary.Host
		if err := e.C.Get(e.Ctx, client.ObjectKey{Namespace: ns, Name: name}, &host); err != nil {
			t.Fatal(err)
		}
		host.Spec.Role = role
		if err := e.C.Update(e.Ctx, &host); err != nil {
			t.Fatal(err)
		}
	}
	setRole := func(role apiary.HostRole) { t.Helper(); setRoleOf(hostName, role) }
	kc := e.ExportKubeconfig(t, "alpha")
	// The Node's role marks, as kubeadm sets them on a control-plane Node.
	nodeMarks := func() string {
		t.Helper()
		out, err := framework.KubectlErr(kc, "get", "node", hostName, "-o",
			`jsonpath={.metadata.labels}|{range .spec.taints[*]}{.key}:{.effect} {end}`)
		if err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		return out
	}
	const cpTaint = "node-role.kubernetes.io/control-plane:NoSchedule"
	setRole(apiary.HostRoleControlPlane)
	restored := false
	t.Cleanup(func() {
		if !restored {
			setRole(apiary.HostRoleWorker)
		}
	})
	framework.Eventually(t, "Node "+hostName+" labelled and tainted as control plane", time.Minute, func() error {
		if labels, taints, _ := strings.Cut(nodeMarks(), "|"); !strings.Contains(labels, `"node-role.kubernetes.io/control-plane"`) || !strings.Contains(taints, cpTaint) {
			return fmt.Errorf("labels %s, taints %q", labels, taints)
		}
		return nil
	})

	tcp := e.TCP(t, "alpha")
	var ds apiary.DataStore
	framework.Eventually(t, "DataStore "+tcp.Status.DataStore.Name+" reachable from the host", 2*time.Minute, func() error {
		if err := e.C.Get(e.Ctx, client.ObjectKey{Name: tcp.Status.DataStore.Name}, &ds); err != nil {
			return err
		}
		if err := framework.ConditionIs(ds.Status.Conditions, apiary.ConditionHostAccessReady, metav1.ConditionTrue, ""); err != nil {
			return err
		}
		c := framework.FindCondition(ds.Status.Conditions, apiary.ConditionHostAccessReady)
		if !strings.Contains(c.Message, h.Address+"/32") {
			return fmt.Errorf("the NetworkPolicy does not admit %s yet: %s", h.Address, c.Message)
		}
		return nil
	})
	if !slices.Contains(ds.Status.HostEndpoints, "https://"+net.JoinHostPort(hostAccessAddress, "2379")) {
		t.Fatalf("status.hostEndpoints %v, want the address asked for", ds.Status.HostEndpoints)
	}
	// Who reaches the DataStore from outside, checked from the hosts
	// themselves as a switch's preflight does (SSH-forwarded connections,
	// TLS end to end with the tenant's etcd credentials): the
	// control-plane host, on the client port only.
	sshTo := func(host *sshhost.Host) *hosts.Client {
		t.Helper()
		c, err := hosts.Dial(e.Ctx, hosts.Target{Address: host.Address, Port: host.Port, User: host.User, PrivateKey: host.PrivateKeyPEM, HostKey: host.HostKeyAuthorized})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	c, co := sshTo(h), sshTo(other)
	dsClient := tenantSecret(t, e, tcp, render.SecretDataStoreClient)
	etcdCert, err := tls.X509KeyPair(dsClient[render.KeyTLSCert], dsClient[render.KeyTLSKey])
	if err != nil {
		t.Fatal(err)
	}
	etcdCA := x509.NewCertPool()
	etcdCA.AppendCertsFromPEM(dsClient[render.KeyCACert])
	etcdTLS := &tls.Config{RootCAs: etcdCA, Certificates: []tls.Certificate{etcdCert}, MinVersion: tls.VersionTLS12}
	health := ds.Status.HostEndpoints[0] + "/health"
	framework.Eventually(t, "the control-plane host reaches the DataStore with the tenant's certificate", time.Minute, func() error {
		code, err := c.GetFromHost(e.Ctx, health, etcdTLS)
		if err != nil || code != http.StatusOK {
			return fmt.Errorf("GET %s from %s: %d %v", health, h.Name, code, err)
		}
		return nil
	})
	short := func() context.Context {
		ctx, cancel := context.WithTimeout(e.Ctx, 3*time.Second)
		t.Cleanup(cancel)
		return ctx
	}
	if code, err := co.GetFromHost(short(), health, etcdTLS); err == nil {
		t.Errorf("%s, no control-plane Host, reached the DataStore's client port: %d", other.Name, code)
	}
	// A tenant names the other machine in a control-plane Host it cannot
	// join (Host wrong-ssh-key: the agent is refused there): writing the
	// object does not open the client port to that address.
	setRoleOf(failedHostName, apiary.HostRoleControlPlane)
	for range 5 {
		time.Sleep(2 * time.Second)
		if code, err := co.GetFromHost(short(), health, etcdTLS); err == nil {
			t.Fatalf("%s, named by a control-plane Host that never joined, reached the DataStore's client port: %d", other.Name, code)
		}
	}
	setRoleOf(failedHostName, apiary.HostRoleWorker)
	// And the tenant's endpoint, as the host's kubelet and a second API
	// server there would, with a client certificate of the tenant's CA.
	kcl := tenantSecret(t, e, tcp, render.SecretAPIServerKubeletClient)
	kubeletCert, err := tls.X509KeyPair(kcl[render.KeyTLSCert], kcl[render.KeyTLSKey])
	if err != nil {
		t.Fatal(err)
	}
	tenantCA := x509.NewCertPool()
	tenantCA.AppendCertsFromPEM(tenantSecret(t, e, tcp, render.SecretCA)[render.KeyTLSCert])
	if code, err := c.GetFromHost(e.Ctx, tcp.Status.Endpoint+"/readyz", &tls.Config{RootCAs: tenantCA, Certificates: []tls.Certificate{kubeletCert}, MinVersion: tls.VersionTLS12}); err != nil || code != http.StatusOK {
		t.Errorf("GET %s/readyz from %s: %d %v", tcp.Status.Endpoint, h.Name, code, err)
	}
	if conn, err := c.DialFromHost(short(), net.JoinHostPort(hostAccessAddress, "2380")); err == nil {
		conn.Close()
		t.Errorf("the control-plane host connected to the DataStore's peer port at %s", hostAccessAddress)
	}

	// Render what a registered host runs, from the tenant's own Secrets.
	secrets := map[render.SecretKind]map[string][]byte{}
	for _, kind := range render.AllSecretKinds {
		secrets[kind] = tenantSecret(t, e, tcp, kind)
	}
	ep, err := url.Parse(tcp.Status.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	port, _ := strconv.Atoi(ep.Port())
	var svc corev1.Service
	if err := e.C.Get(e.Ctx, client.ObjectKey{Namespace: ns, Name: render.ServiceName(tcp)}, &svc); err != nil {
		t.Fatal(err)
	}
	tcp.Default()
	in := render.Inputs{
		TCP: tcp, Version: tcp.Spec.Version,
		Endpoint:    render.Endpoint{Host: ep.Hostname(), Port: int32(port), ClusterIP: svc.Spec.ClusterIP},
		EtcdServers: ds.Status.HostEndpoints, EtcdPrefix: tcp.Status.DataStore.Prefix,
		Secrets: secrets,
	}
	files, manifests, err := render.StaticPods(in, nil)
	if err != nil {
		t.Fatal(err)
	}
	toHost := func(fs []render.HostFile) []hosts.File {
		var out []hosts.File
		for _, f := range fs {
			out = append(out, hosts.File{Path: f.Path, Data: f.Data})
		}
		return out
	}
	ports := render.StaticPodPorts(in)
	if used, err := hosts.PortsInUse(e.Ctx, c, ports); err != nil || len(used) > 0 {
		t.Fatalf("before the control plane, ports %v in use on %s (%v)", used, h.Name, err)
	}
	start := time.Now()
	n, err := hosts.WriteControlPlane(e.Ctx, c, toHost(files), toHost(manifests))
	if err != nil {
		t.Fatal(err)
	}
	written := time.Since(start)
	var paths, manifestPaths []string
	for _, f := range files {
		paths = append(paths, f.Path)
	}
	for _, f := range manifests {
		manifestPaths = append(manifestPaths, f.Path)
	}
	removed := false
	remove := func() error {
		return hosts.RemoveControlPlane(e.Ctx, c, manifestPaths, paths, []string{"/etc/kubernetes/pki/ca.crt"}, 60)
	}
	t.Cleanup(func() {
		if !removed {
			_ = remove()
		}
	})
	// Every file root's alone.
	out, err := d.Exec(e.Ctx, h.Name, "sh", "-c", "stat -c '%a %U %n' "+strings.Join(append(paths, manifestPaths...), " "))
	if err != nil {
		t.Fatalf("stat: %v: %s", err, out)
	}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if !strings.HasPrefix(line, "600 root ") {
			t.Errorf("on the host: %s, want 600 root", line)
		}
	}

	// kube-apiserver on the host answers /readyz with the tenant's
	// certificate: it reads the tenant's slice through the host address.
	ca := x509.NewCertPool()
	ca.AppendCertsFromPEM(secrets[render.SecretCA][render.KeyTLSCert])
	hc := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
		RootCAs: ca, ServerName: ep.Hostname(), MinVersion: tls.VersionTLS12}}}
	hostURL := "https://" + net.JoinHostPort(h.Address, ep.Port()) + "/readyz"
	framework.Eventually(t, "kube-apiserver on "+h.Name+" ready", 4*time.Minute, func() error {
		resp, err := hc.Get(hostURL)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET %s: %s", hostURL, resp.Status)
		}
		return nil
	})
	ready := time.Since(start)
	// Its ports are taken now, as the preflight of a second copy would see.
	// The static Pods' logs, when something does not come up.
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := d.Exec(e.Ctx, h.Name, "sh", "-c", "for f in /var/log/pods/kube-system_*/*/*.log; do echo \"== $f\"; tail -n 20 \"$f\"; done")
			t.Logf("static Pods' logs on %s:\n%s", h.Name, out)
		}
	})
	framework.Eventually(t, "every control-plane port in use on "+h.Name, time.Minute, func() error {
		if used, err := hosts.PortsInUse(e.Ctx, c, ports); err != nil || !slices.Equal(used, ports) {
			return fmt.Errorf("ports in use %v (%v), want %v", used, err, ports)
		}
		return nil
	})
	t.Logf("FIGURE static control plane on %s: %d files written in %s, kube-apiserver /readyz at %s", h.Name, n, written.Round(time.Millisecond), ready.Round(time.Millisecond))

	// The tenant sees the mirror Pods of its node.
	node := framework.Kubectl(t, kc, "get", "nodes", "-o", "jsonpath={.items[0].metadata.name}")
	framework.Eventually(t, "mirror Pods in the tenant", 2*time.Minute, func() error {
		out, err := framework.KubectlErr(kc, "-n", "kube-system", "get", "pods", "-l", "tier=control-plane", "-o", "jsonpath={range .items[*]}{.metadata.name}={.status.phase} {end}")
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		for _, comp := range render.StaticPodComponents(in) {
			if !strings.Contains(out, comp+"-") {
				return fmt.Errorf("no mirror Pod of %s: %s", comp, out)
			}
		}
		return nil
	})
	t.Logf("mirror Pods on node %s", node)

	// Removed: no control-plane process, no manifest, no key; the
	// kubelet's CA stays.
	start = time.Now()
	if err := remove(); err != nil {
		t.Fatal(err)
	}
	removed = true
	t.Logf("FIGURE static control plane removed from %s in %s", h.Name, time.Since(start).Round(time.Millisecond))
	out, err = d.Exec(e.Ctx, h.Name, "sh", "-c", "pgrep -l -x 'kube-apiserver|kube-controller|kube-scheduler|proxy-server'; ls /etc/kubernetes/manifests /etc/kubernetes/pki")
	if err != nil && !strings.Contains(out, "ca.crt") {
		t.Fatalf("listing the host: %v: %s", err, out)
	}
	if strings.Contains(out, "kube-apiserver") || strings.Contains(out, "proxy-server") || strings.Contains(out, ".yaml") || strings.Contains(out, "apiserver.key") || !strings.Contains(out, "ca.crt") {
		t.Errorf("after removal the host has:\n%s", out)
	}
	// A worker again: the Node loses the role's label and taint (the
	// next tests schedule pods on it).
	setRole(apiary.HostRoleWorker)
	restored = true
	framework.Eventually(t, "Node "+hostName+" a worker again", time.Minute, func() error {
		if labels, taints, _ := strings.Cut(nodeMarks(), "|"); strings.Contains(labels, `"node-role.kubernetes.io/control-plane"`) || strings.Contains(taints, cpTaint) {
			return fmt.Errorf("labels %s, taints %q", labels, taints)
		}
		return nil
	})
}

// tenantSecret is the data of one of the tenant's Secrets.
func tenantSecret(t *testing.T, e *env, tcp *apiary.TenantControlPlane, kind render.SecretKind) map[string][]byte {
	t.Helper()
	var s corev1.Secret
	if err := e.C.Get(e.Ctx, client.ObjectKey{Namespace: tcp.Namespace, Name: render.SecretName(tcp, kind)}, &s); err != nil {
		t.Fatal(err)
	}
	return s.Data
}
