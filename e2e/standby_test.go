//go:build e2e

package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"slices"
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
	"github.com/apiaryhq/apiary/operator/controllers"
	"github.com/apiaryhq/apiary/operator/render"
)

// hostAccessAddress is the default DataStore's address for control-plane
// hosts (framework.installChart asks for it), in the LoadBalancer pool.
const hostAccessAddress = framework.DataStoreHostAddress

// testStandbyHost makes a joined worker of the standalone tenant alpha a
// control-plane Host: it leaves the tenant (a standalone tenant has no
// control-plane Nodes: Node drained and deleted, kubeadm reset, the node
// software kept; phase Standby) and, installed, is admitted to the
// DataStore's host address behind a NetworkPolicy that admits only
// installed control-plane Hosts: from the host itself (SSH-forwarded
// connections, TLS end to end with the tenant's etcd credentials), as a
// switch's preflight checks it, it reaches the DataStore's client port and
// the tenant's endpoint, and not the peer port. The host stays a
// control-plane Host for SwitchModeBothWays, which makes it a worker again.
//
// other is a machine that is no control-plane Host: the DataStore's client
// port refuses it, and the peer port is not exposed to anyone.
//
// failedHostName is a Host at other's address the agent is refused at.
func (e *env) testStandbyHost(t *testing.T, d *sshhost.Docker, h, other *sshhost.Host, hostName, failedHostName string) {
	ns := framework.TenantsNS
	setRoleOf := func(name string, role apiary.HostRole) {
		t.Helper()
		e.setHostRole(t, name, role)
	}
	kc := e.ExportKubeconfig(t, "alpha")
	cs := e.tenantClient(t, kc)
	if _, err := cs.CoreV1().Nodes().Get(e.Ctx, hostName, metav1.GetOptions{}); err != nil {
		t.Fatalf("Node %s, a worker, before: %v", hostName, err)
	}
	setRoleOf(hostName, apiary.HostRoleControlPlane)
	t.Cleanup(func() {
		if t.Failed() {
			setRoleOf(hostName, apiary.HostRoleWorker)
		}
	})
	took := e.waitStandby(t, d, h, cs, hostName)
	t.Logf("FIGURE Host %s: worker → control-plane Host of a standalone tenant (drained, Node deleted, reset) in %s", hostName, took.Round(100*time.Millisecond))
	var host apiary.Host
	if err := e.C.Get(e.Ctx, client.ObjectKey{Namespace: ns, Name: hostName}, &host); err != nil {
		t.Fatal(err)
	}
	if c := framework.FindCondition(host.Status.Conditions, apiary.HostConditionJoined); c.Status != metav1.ConditionFalse || c.Reason != controllers.ReasonStandby {
		t.Errorf("Host %s Joined %s %s: %s; want False %s", hostName, c.Status, c.Reason, c.Message, controllers.ReasonStandby)
	}

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
	// install (Host wrong-ssh-key: the agent is refused there): writing the
	// object does not open the client port to that address.
	setRoleOf(failedHostName, apiary.HostRoleControlPlane)
	for range 5 {
		time.Sleep(2 * time.Second)
		if code, err := co.GetFromHost(short(), health, etcdTLS); err == nil {
			t.Fatalf("%s, named by a control-plane Host never installed, reached the DataStore's client port: %d", other.Name, code)
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
