//go:build e2e

package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/apiaryhq/apiary/e2e/cluster"
	"github.com/apiaryhq/apiary/e2e/framework"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/operator/controllers"
	"github.com/apiaryhq/apiary/operator/render"
	"github.com/apiaryhq/apiary/operator/render/managedetcd"
)

// testProtectedArgs: the installed webhook refuses every spelling of a flag
// that carries the tenant boundary, naming it, and the tenant is unchanged.
func (e *env) testProtectedArgs(t *testing.T) {
	for _, tc := range []struct {
		set  func(*apiary.TenantControlPlane)
		path string
		flag string
	}{
		{func(p *apiary.TenantControlPlane) {
			p.Spec.APIServer.ExtraArgs = map[string]string{"etcd_servers": "https://127.0.0.1:2379"}
		}, "spec.apiServer.extraArgs[etcd_servers]", "--etcd-servers"},
		{func(p *apiary.TenantControlPlane) {
			p.Spec.APIServer.ExtraArgs = map[string]string{"--authorization-mode=AlwaysAllow": ""}
		}, "spec.apiServer.extraArgs[--authorization-mode=AlwaysAllow]", "--authorization-mode"},
		{func(p *apiary.TenantControlPlane) {
			p.Spec.APIServer.ExtraArgs = map[string]string{"egress-selector-config-file": "/dev/null"}
		}, "spec.apiServer.extraArgs[egress-selector-config-file]", "--egress-selector-config-file"},
		{func(p *apiary.TenantControlPlane) {
			p.Spec.APIServer.ExtraArgs = map[string]string{"Anonymous-Auth": "true"}
		}, "spec.apiServer.extraArgs[Anonymous-Auth]", "--anonymous-auth"},
		{func(p *apiary.TenantControlPlane) {
			p.Spec.ControllerManager.ExtraArgs = map[string]string{"kubeconfig": "/etc/kubernetes/scheduler.conf"}
		}, "spec.controllerManager.extraArgs[kubeconfig]", "--kubeconfig"},
	} {
		t.Run(tc.flag, func(t *testing.T) {
			// The operator writes alpha's status meanwhile: a conflict is
			// read again, not taken for the answer.
			var before *apiary.TenantControlPlane
			var err error
			for range 10 {
				before = e.TCP(t, "alpha")
				changed := before.DeepCopy()
				tc.set(changed)
				if err = e.C.Update(e.Ctx, changed); !apierrors.IsConflict(err) {
					break
				}
			}
			if err == nil || !strings.Contains(err.Error(), tc.path) || !strings.Contains(err.Error(), tc.flag+" cannot be set in extraArgs") {
				t.Fatalf("update not refused on %s naming %s: %v", tc.path, tc.flag, err)
			}
			if e.TCP(t, "alpha").Generation != before.Generation {
				t.Errorf("refused update changed the spec")
			}
		})
	}
}

// testNodePortTenant: a tenant exposed through a NodePort turns Ready, its
// endpoint is the API's NodePort (not konnectivity's), and kubectl works
// through it with the exported kubeconfig.
func (e *env) testNodePortTenant(t *testing.T) {
	const name = "nodeport"
	took := e.CreateTenant(t, name, func(p *apiary.TenantControlPlane) { p.Spec.Network.ServiceType = corev1.ServiceTypeNodePort })
	t.Logf("FIGURE tenant %s: create → Ready through its NodePort in %s", name, took.Round(time.Millisecond))
	defer func() {
		if err := e.C.Delete(e.Ctx, e.TCP(t, name)); err != nil {
			t.Errorf("deleting %s: %v", name, err)
		}
		framework.Eventually(t, name+" deleted", 2*time.Minute, func() error {
			if err := e.C.Get(e.Ctx, client.ObjectKey{Namespace: framework.TenantsNS, Name: name}, &apiary.TenantControlPlane{}); !apierrors.IsNotFound(err) {
				return fmt.Errorf("still there: %v", err)
			}
			return nil
		})
	}()
	tcp := e.TCP(t, name)
	var svc corev1.Service
	if err := e.C.Get(e.Ctx, client.ObjectKey{Namespace: framework.TenantsNS, Name: render.ServiceName(tcp)}, &svc); err != nil {
		t.Fatal(err)
	}
	var apiNodePort int32
	for _, p := range svc.Spec.Ports {
		if p.Port == tcp.Spec.Network.Port {
			apiNodePort = p.NodePort
		}
	}
	u, err := url.Parse(tcp.Status.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	if apiNodePort == 0 || u.Port() != strconv.Itoa(int(apiNodePort)) {
		t.Fatalf("endpoint %s, want the NodePort of port %d (%d); Service ports %+v", tcp.Status.Endpoint, tcp.Spec.Network.Port, apiNodePort, svc.Spec.Ports)
	}
	var nodes corev1.NodeList
	if err := e.C.List(e.Ctx, &nodes); err != nil || len(nodes.Items) == 0 {
		t.Fatalf("nodes: %v", err)
	}
	internal := ""
	for _, a := range nodes.Items[0].Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			internal = a.Address
		}
	}
	if host, _, _ := net.SplitHostPort(u.Host); host != internal {
		t.Errorf("endpoint host %s, want the node's InternalIP %s", host, internal)
	}
	kubeconfig := e.ExportKubeconfig(t, name)
	if server := framework.Kubectl(t, kubeconfig, "config", "view", "--minify", "-o", "jsonpath={.clusters[0].cluster.server}"); server != tcp.Status.Endpoint {
		t.Errorf("kubeconfig server %s, want %s", server, tcp.Status.Endpoint)
	}
	framework.Kubectl(t, kubeconfig, "create", "namespace", "through-nodeport")
	if got := framework.Kubectl(t, kubeconfig, "get", "namespace", "through-nodeport", "-o", "jsonpath={.metadata.name}"); got != "through-nodeport" {
		t.Errorf("read back namespace: %q", got)
	}

	// Revocation by RBAC: the exported admin kubeconfig is in
	// kubeadm:cluster-admins, not system:masters. Deleting the binding
	// (say, after the kubeconfig leaked) locks it out, and Apiary's own
	// bootstrap, which sees the deletion at once, does not bring it back.
	if !tcp.Status.AdminBindingCreated {
		t.Errorf("status.adminBindingCreated is false on a Ready tenant")
	}
	framework.Kubectl(t, kubeconfig, "delete", "clusterrolebinding", "kubeadm:cluster-admins")
	forbidden := func() error {
		out, err := framework.KubectlErr(kubeconfig, "get", "namespaces")
		if err == nil || !strings.Contains(out, "forbidden") {
			return fmt.Errorf("the exported kubeconfig still lists namespaces: %v %s", err, out)
		}
		return nil
	}
	framework.Eventually(t, "exported admin kubeconfig forbidden", 30*time.Second, forbidden)
	time.Sleep(15 * time.Second) // the tenant watch re-runs the bootstrap within a second
	if err := forbidden(); err != nil {
		t.Errorf("after the bootstrap re-ran: %v", err)
	}
	if err := framework.ConditionIs(e.TCP(t, name).Status.Conditions, apiary.ConditionTenantBootstrapped, metav1.ConditionTrue, ""); err != nil {
		t.Errorf("bootstrap with the binding revoked: %v", err)
	}
}

// testDataStoreCertConfined attacks the shared etcd with alpha's own
// datastore client certificate (readable by whoever may read alpha's
// Secrets): the peer port refuses it (raft would be cross-tenant read,
// write and outage), and on the client port it reaches only alpha's prefix.
func (e *env) testDataStoreCertConfined(t *testing.T) {
	secret := func(name string) *corev1.Secret {
		var s corev1.Secret
		ns := framework.SystemNS
		if strings.HasPrefix(name, "alpha-") {
			ns = framework.TenantsNS
		}
		if err := e.C.Get(e.Ctx, client.ObjectKey{Namespace: ns, Name: name}, &s); err != nil {
			t.Fatal(err)
		}
		return &s
	}
	alpha := e.TCP(t, "alpha")
	tenantSecret := secret(render.SecretName(alpha, render.SecretDataStoreClient))
	tenantCert, err := tls.X509KeyPair(tenantSecret.Data["tls.crt"], tenantSecret.Data["tls.key"])
	if err != nil {
		t.Fatal(err)
	}
	rootSecret, peerSecret := secret("default-etcd-root"), secret("default-etcd-peer")
	rootCert, err := tls.X509KeyPair(rootSecret.Data["tls.crt"], rootSecret.Data["tls.key"])
	if err != nil {
		t.Fatal(err)
	}
	peerCert, err := tls.X509KeyPair(peerSecret.Data["tls.crt"], peerSecret.Data["tls.key"])
	if err != nil {
		t.Fatal(err)
	}

	peerPort := e.portForward(t, "default-etcd-0", 2380)
	members := func(cert tls.Certificate) (int, error) {
		hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
			Certificates: []tls.Certificate{cert},
			// What the server accepts is under test, not its name.
			InsecureSkipVerify: true, //nolint:gosec // test of the server's client authentication
		}}}
		resp, err := hc.Get("https://127.0.0.1:" + peerPort + "/members")
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	// The control: a member's own certificate is a peer.
	framework.Eventually(t, "a peer certificate lists the members at 2380", 30*time.Second, func() error {
		code, err := members(peerCert)
		if err != nil || code != http.StatusOK {
			return fmt.Errorf("GET /members with the peer certificate: %d %v", code, err)
		}
		return nil
	})
	for name, cert := range map[string]tls.Certificate{"tenant alpha's datastore certificate": tenantCert, "the root client certificate": rootCert} {
		if code, err := members(cert); err == nil {
			t.Errorf("%s: GET /members at the peer port answered %d; want the TLS handshake refused", name, code)
		} else {
			t.Logf("%s refused at the peer port: %v", name, err)
		}
	}

	// On the client port, alpha's user reads and writes its own prefix
	// only: beta's keys and the root of the keyspace are denied.
	clientPort := e.portForward(t, "default-etcd-0", 2379)
	caSecret := secret("default-etcd-ca")
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caSecret.Data["tls.crt"])
	cli, err := clientv3.New(clientv3.Config{
		Endpoints: []string{"https://127.0.0.1:" + clientPort}, DialTimeout: 10 * time.Second,
		TLS: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{tenantCert}, ServerName: "localhost"},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(e.Ctx, 30*time.Second)
	defer cancel()
	if resp, err := cli.Get(ctx, alpha.Status.DataStore.Prefix+"/", clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil || resp.Count == 0 {
		t.Fatalf("alpha reading its own prefix: %v (the attack checks below would prove nothing)", err)
	}
	beta := e.TCP(t, "beta")
	for what, op := range map[string]func() error{
		"read beta's keys": func() error {
			_, err := cli.Get(ctx, beta.Status.DataStore.Prefix+"/", clientv3.WithPrefix())
			return err
		},
		"write beta's keys": func() error { _, err := cli.Put(ctx, beta.Status.DataStore.Prefix+"/registry/x", "x"); return err },
		"read every key":    func() error { _, err := cli.Get(ctx, "", clientv3.WithFromKey(), clientv3.WithKeysOnly()); return err },
		"list the users":    func() error { _, err := cli.UserList(ctx); return err },
	} {
		if err := op(); !errors.Is(err, rpctypes.ErrPermissionDenied) {
			t.Errorf("alpha's certificate may %s: %v", what, err)
		}
	}
}

// testCompactedContinueToken: the datastore compacts itself (tenants may
// not), and a tenant still answers a list continue token from before the
// compaction with 410 Gone, as upstream does (conformance: "API chunking
// should return 410 Gone when the continue token has been compacted").
func (e *env) testCompactedContinueToken(t *testing.T) {
	kc := e.ExportKubeconfig(t, "alpha")
	framework.Kubectl(t, kc, "create", "namespace", "chunking")
	defer framework.KubectlErr(kc, "delete", "namespace", "chunking", "--wait=false") //nolint:errcheck // best effort
	for i := range 3 {
		framework.Kubectl(t, kc, "-n", "chunking", "create", "configmap", fmt.Sprintf("c%d", i), "--from-literal=k=v")
	}
	var page struct {
		Metadata struct{ Continue string } `json:"metadata"`
		Items    []json.RawMessage         `json:"items"`
	}
	list := "/api/v1/namespaces/chunking/configmaps?limit=1"
	if err := json.Unmarshal([]byte(framework.Kubectl(t, kc, "get", "--raw", list)), &page); err != nil {
		t.Fatal(err)
	}
	if page.Metadata.Continue == "" || len(page.Items) != 1 {
		t.Fatalf("first page: %d items, continue %q", len(page.Items), page.Metadata.Continue)
	}
	next := list + "&continue=" + url.QueryEscape(page.Metadata.Continue)
	if _, err := framework.KubectlErr(kc, "get", "--raw", next); err != nil {
		t.Fatalf("the continue token does not work before compaction (the check below would prove nothing): %v", err)
	}
	// What the DataStore's periodic compaction does, now. A write first:
	// compacting at the token's own revision (nothing written since) would
	// keep that revision readable.
	dc := e.etcdRoot(t)
	ctx, cancel := context.WithTimeout(e.Ctx, 30*time.Second)
	defer cancel()
	resp, err := dc.Etcd().Put(ctx, "/e2e/compaction-probe", "x")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dc.Etcd().Compact(ctx, resp.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	framework.Eventually(t, "410 Gone for the compacted continue token", 30*time.Second, func() error {
		out, err := framework.KubectlErr(kc, "get", "--raw", next)
		if err == nil || !strings.Contains(out, "continue parameter is too old") {
			return fmt.Errorf("continue after compaction: %v: %s", err, out)
		}
		return nil
	})
}

// testOperatorMetrics: the operator's metrics answer only a bearer token
// whose ServiceAccount may get /metrics (the chart's metrics-reader role);
// a tenant's API server steered at the port, or any pod without that
// right, gets 401 or 403.
func (e *env) testOperatorMetrics(t *testing.T) {
	port := e.portForward(t, e.leader(t), 8443)
	get := func(token string) (int, string, error) {
		req, err := http.NewRequestWithContext(e.Ctx, http.MethodGet, "https://127.0.0.1:"+port+"/metrics", nil)
		if err != nil {
			return 0, "", err
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
			TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // self-signed serving certificate; authentication is under test
		}}
		resp, err := hc.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return resp.StatusCode, string(body), nil
	}
	if code, _, err := get(""); err != nil || code != http.StatusUnauthorized {
		t.Errorf("metrics without a token: %d %v, want 401", code, err)
	}
	const sa = "metrics-probe"
	framework.Kubectl(t, e.Kubeconfig, "-n", framework.SystemNS, "create", "serviceaccount", sa)
	t.Cleanup(func() {
		_, _ = framework.KubectlErr(e.Kubeconfig, "-n", framework.SystemNS, "delete", "serviceaccount", sa)
		_, _ = framework.KubectlErr(e.Kubeconfig, "delete", "clusterrolebinding", sa)
	})
	token := framework.Kubectl(t, e.Kubeconfig, "-n", framework.SystemNS, "create", "token", sa)
	if code, _, err := get(token); err != nil || code != http.StatusForbidden {
		t.Errorf("metrics with a token not allowed /metrics: %d %v, want 403", code, err)
	}
	framework.Kubectl(t, e.Kubeconfig, "create", "clusterrolebinding", sa, "--clusterrole=apiary-metrics-reader", "--serviceaccount="+framework.SystemNS+":"+sa)
	var body string
	framework.Eventually(t, "metrics for the metrics-reader", 90*time.Second, func() error {
		code, b, err := get(token)
		if err != nil || code != http.StatusOK || !strings.Contains(b, "controller_runtime_reconcile_total") {
			return fmt.Errorf("%d %v", code, err)
		}
		body = b
		return nil
	})
	// Apiary's own series say what alpha's status says.
	alpha := e.TCP(t, "alpha")
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("parsing /metrics: %v", err)
	}
	series := func(name string, labels map[string]string) (float64, bool) {
		for _, m := range families[name].GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			match := true
			for k, v := range labels {
				match = match && have[k] == v
			}
			if match {
				return m.GetGauge().GetValue(), true
			}
		}
		return 0, false
	}
	ns := framework.TenantsNS
	if v, ok := series("apiary_tenant_info", map[string]string{"namespace": ns, "tenant": "alpha", "version": alpha.Status.Version,
		"desired_version": alpha.Spec.Version, "endpoint": alpha.Status.Endpoint, "datastore": alpha.Status.DataStore.Name, "phase": string(alpha.Status.Phase)}); !ok || v != 1 {
		t.Errorf("apiary_tenant_info for alpha (%s, %s, %s): %v %v", alpha.Status.Version, alpha.Status.Endpoint, alpha.Status.Phase, v, ok)
	}
	ready := strings.ToLower(string(meta.FindStatusCondition(alpha.Status.Conditions, apiary.ConditionReady).Status))
	if v, ok := series("apiary_tenant_condition", map[string]string{"namespace": ns, "tenant": "alpha", "condition": apiary.ConditionReady, "status": ready}); !ok || v != 1 {
		t.Errorf("apiary_tenant_condition Ready=%s for alpha: %v %v", ready, v, ok)
	}
	if v, ok := series("apiary_tenant_ready_replicas", map[string]string{"namespace": ns, "tenant": "alpha"}); !ok || v != float64(alpha.Status.ReadyReplicas) {
		t.Errorf("apiary_tenant_ready_replicas for alpha: %v %v, status says %d", v, ok, alpha.Status.ReadyReplicas)
	}
	if len(alpha.Status.Certificates) == 0 {
		t.Fatal("alpha's status lists no certificates")
	}
	for _, c := range alpha.Status.Certificates {
		v, ok := series("apiary_tenant_certificate_expiry_timestamp_seconds", map[string]string{"namespace": ns, "tenant": "alpha", "certificate": c.Name})
		if !ok || int64(v) != c.NotAfter.Unix() {
			t.Errorf("apiary_tenant_certificate_expiry_timestamp_seconds for alpha's %s: %v %v, status says %d", c.Name, v, ok, c.NotAfter.Unix())
		}
	}
	if v, ok := series("apiary_datastore_tenants", map[string]string{"datastore": alpha.Status.DataStore.Name}); !ok || v < 1 {
		t.Errorf("apiary_datastore_tenants for %s: %v %v", alpha.Status.DataStore.Name, v, ok)
	}
	if alpha.Status.FirstReady == nil {
		t.Error("alpha has no status.firstReady")
	}
	if families["apiary_tenant_first_ready_seconds"].GetMetric()[0].GetHistogram().GetSampleCount() == 0 {
		t.Error("apiary_tenant_first_ready_seconds observed nothing on the leader")
	}
	t.Run("ARealPrometheusScrapesAndAlerts", func(t *testing.T) { e.testPrometheus(t, "127.0.0.1:"+port, token) })
}

// testNetworkPolicy steers a tenant's own kube-apiserver at management pods
// (konnectivity off, so it dials them itself): a Node whose InternalIP is
// the managed etcd's member, then node proxy requests to its ports. The
// client port answers (the TLS handshake wants a client certificate: the
// path is open, as it must be for the tenant's datastore); etcd's metrics
// port, the operator's metrics and another tenant's controller-manager do
// not (the policies drop the packets; the request times out).
func (e *env) testNetworkPolicy(t *testing.T) {
	for _, name := range []string{render.NetworkPolicyName("alpha")} {
		if err := e.C.Get(e.Ctx, client.ObjectKey{Namespace: framework.TenantsNS, Name: name}, &networkingv1.NetworkPolicy{}); err != nil {
			t.Errorf("tenant NetworkPolicy %s: %v", name, err)
		}
	}
	if err := e.C.Get(e.Ctx, client.ObjectKey{Namespace: framework.SystemNS, Name: render.NetworkPolicyName("default-etcd")}, &networkingv1.NetworkPolicy{}); err != nil {
		t.Errorf("etcd NetworkPolicy: %v", err)
	}
	const name = "direct"
	took := e.CreateTenant(t, name, func(p *apiary.TenantControlPlane) { p.Spec.Addons.Konnectivity.Enabled = ptr.To(false) })
	t.Logf("FIGURE tenant %s (konnectivity off) Ready in %s", name, took.Round(time.Millisecond))
	defer func() {
		if err := e.C.Delete(e.Ctx, e.TCP(t, name)); err != nil {
			t.Errorf("deleting %s: %v", name, err)
		}
	}()
	podIP := func(ns string, sel map[string]string) string {
		var pods corev1.PodList
		if err := e.C.List(e.Ctx, &pods, client.InNamespace(ns), client.MatchingLabels(sel)); err != nil || len(pods.Items) == 0 || pods.Items[0].Status.PodIP == "" {
			t.Fatalf("pods %v in %s: %v", sel, ns, err)
		}
		return pods.Items[0].Status.PodIP
	}
	// The ranges the operator found on the cluster (no managementCIDRs
	// given to the chart).
	framework.Eventually(t, "alpha isolated from the management cluster's ranges", 30*time.Second, func() error {
		c := meta.FindStatusCondition(e.TCP(t, "alpha").Status.Conditions, apiary.ConditionNetworkIsolated)
		if c == nil || c.Status != metav1.ConditionTrue || c.Reason != controllers.ReasonPolicyApplied {
			return fmt.Errorf("NetworkIsolated %+v", c)
		}
		for _, want := range []string{cluster.NodePodCIDR, cluster.ServiceCIDR, e.NodeIP + "/32"} {
			if !strings.Contains(c.Message, want) {
				return fmt.Errorf("NetworkIsolated does not name %s: %s", want, c.Message)
			}
		}
		return nil
	})
	etcdIP := podIP(framework.SystemNS, map[string]string{managedetcd.LabelDataStore: "default", render.LabelComponent: "etcd"})
	dnsIP := podIP("kube-system", map[string]string{"k8s-app": "kube-dns"})
	operatorIP := podIP(framework.SystemNS, map[string]string{"app.kubernetes.io/component": "operator"})
	alphaIP := podIP(framework.TenantsNS, render.SelectorLabels(e.TCP(t, "alpha")))

	metadata := fakeMetadataService(t)
	kc := e.ExportKubeconfig(t, name)
	proxy := func(target, scheme string, port int, path string) (string, error) {
		node := "fake-" + strings.ReplaceAll(target, ".", "-")
		manifest := filepath.Join(t.TempDir(), node+".json")
		if err := os.WriteFile(manifest, fmt.Appendf(nil, `{"apiVersion":"v1","kind":"Node","metadata":{"name":%q}}`, node), 0o600); err != nil {
			t.Fatal(err)
		}
		framework.Kubectl(t, kc, "apply", "-f", manifest)
		patch := fmt.Sprintf(`{"status":{"addresses":[{"type":"InternalIP","address":%q}]}}`, target)
		framework.Kubectl(t, kc, "patch", "node", node, "--subresource=status", "--type=merge", "-p", patch)
		return framework.KubectlErr(kc, "get", "--raw", fmt.Sprintf("/api/v1/nodes/%s:%s:%d/proxy%s", scheme, node, port, path))
	}
	// The control: the datastore's client port is reachable from a control
	// plane, and etcd wants a client certificate the proxy does not have.
	framework.Eventually(t, "the etcd client port reached", 30*time.Second, func() error {
		out, err := proxy(etcdIP, "https", 2379, "/health")
		if !strings.Contains(out, "certificate") && !strings.Contains(out, "tls") {
			return fmt.Errorf("node proxy to %s:2379: %v: %s", etcdIP, err, out)
		}
		return nil
	})
	// The control for the targets only the tenant's egress rule guards:
	// this machine connects to them, so a refusal below is the policy's,
	// not a closed port's.
	for _, target := range []string{net.JoinHostPort(dnsIP, "9153"), net.JoinHostPort(e.NodeIP, "10250")} {
		conn, err := net.DialTimeout("tcp", target, 5*time.Second)
		if err != nil {
			t.Fatalf("%s is not open from this machine (the refusals below would prove nothing): %v", target, err)
		}
		conn.Close()
	}
	for _, c := range []struct {
		what, ip, scheme string
		port             int
		path             string
	}{
		{"etcd's metrics port", etcdIP, "http", 2381, "/metrics"},
		{"etcd's peer port", etcdIP, "https", 2380, "/members"},
		{"the operator's metrics", operatorIP, "https", 8443, "/metrics"},
		{"another tenant's controller-manager", alphaIP, "https", 10257, "/healthz"},
		// Guarded by the tenant's own egress rule alone (the ranges the
		// operator found), not by a policy of the target's.
		{"the cluster DNS's metrics", dnsIP, "http", 9153, "/metrics"},
		{"the management node's kubelet", e.NodeIP, "https", 10250, "/healthz"},
	} {
		start := time.Now()
		out, err := proxy(c.ip, c.scheme, c.port, c.path)
		if err == nil || strings.Contains(out, "etcd_") || strings.Contains(out, "certificate") || strings.Contains(out, "tls:") || strings.TrimSpace(out) == "ok" {
			t.Errorf("%s (%s:%d) reached through the tenant's API server: %v: %s", c.what, c.ip, c.port, err, out)
			continue
		}
		if !strings.Contains(out, "dial tcp "+net.JoinHostPort(c.ip, strconv.Itoa(c.port))) {
			t.Errorf("%s (%s:%d): want the API server's connection refused or dropped, got %v: %s", c.what, c.ip, c.port, err, firstLine(out))
			continue
		}
		t.Logf("%s (%s:%d) not reached in %s: %s", c.what, c.ip, c.port, time.Since(start).Round(time.Millisecond), firstLine(out))
	}
	// Link-local is refused whatever the ranges: the cloud metadata service
	// there hands out the node's credentials. kube-apiserver refuses to
	// proxy to link-local addresses itself, but calls a webhook anywhere.
	framework.Kubectl(t, kc, "create", "namespace", "ssrf")
	webhook := fmt.Sprintf(`{"apiVersion":"admissionregistration.k8s.io/v1","kind":"ValidatingWebhookConfiguration","metadata":{"name":"ssrf"},
"webhooks":[{"name":"ssrf.example.com","admissionReviewVersions":["v1"],"sideEffects":"None","failurePolicy":"Fail","timeoutSeconds":5,
"clientConfig":{"url":"https://%s/latest/meta-data/"},
"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"ssrf"}},
"rules":[{"apiGroups":[""],"apiVersions":["v1"],"operations":["CREATE"],"resources":["configmaps"]}]}]}`, metadata.addr)
	manifest := filepath.Join(t.TempDir(), "ssrf.json")
	if err := os.WriteFile(manifest, []byte(webhook), 0o600); err != nil {
		t.Fatal(err)
	}
	framework.Kubectl(t, kc, "apply", "-f", manifest)
	framework.Eventually(t, "the webhook call to the metadata address refused by the network", 30*time.Second, func() error {
		out, err := framework.KubectlErr(kc, "-n", "ssrf", "create", "configmap", "probe", "--from-literal=k=v")
		if err == nil || !strings.Contains(out, "dial tcp "+net.JoinHostPort(metadata.addr, "443")) {
			return fmt.Errorf("create under a webhook at %s: %v: %s", metadata.addr, err, out)
		}
		t.Logf("the cloud metadata address (webhook %s:443) not reached: %s", metadata.addr, firstLine(out))
		return nil
	})
	if n := metadata.hits.Load(); n != 0 {
		t.Errorf("the fake metadata service was reached %d times from the tenant's API server", n)
	}
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return l
}

// metadataService is a fake cloud metadata service on this machine.
type metadataService struct {
	addr string
	hits atomic.Int64
}

// fakeMetadataService serves the cloud metadata address on this machine
// (169.254.169.254 on the loopback device, HTTPS on 443) for the test's
// duration, counting requests, so that a packet a policy fails to drop
// reaches it here and is counted, never this VM's gateway. The machine
// itself reaching it is the control.
func fakeMetadataService(t *testing.T) *metadataService {
	t.Helper()
	m := &metadataService{addr: "169.254.169.254"}
	if out, err := exec.Command("ip", "addr", "add", m.addr+"/32", "dev", "lo").CombinedOutput(); err != nil && !strings.Contains(string(out), "File exists") {
		t.Fatalf("ip addr add %s dev lo: %v: %s", m.addr, err, out)
	}
	l, err := net.Listen("tcp", net.JoinHostPort(m.addr, "443"))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		m.hits.Add(1)
		fmt.Fprint(w, "fake-node-credentials")
	}))
	srv.Listener = l
	srv.StartTLS()
	t.Cleanup(func() {
		srv.Close()
		if out, err := exec.Command("ip", "addr", "del", m.addr+"/32", "dev", "lo").CombinedOutput(); err != nil {
			t.Errorf("ip addr del %s dev lo: %v: %s", m.addr, err, out)
		}
	})
	// The control: this machine reaches it (its certificate names
	// 127.0.0.1; what is checked is that it answers).
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // the control reaches a server of the test's
	resp, err := hc.Get("https://" + m.addr + "/")
	if err != nil {
		t.Fatalf("the fake metadata service does not answer on this machine: %v", err)
	}
	resp.Body.Close()
	if m.hits.Swap(0) != 1 {
		t.Fatal("the fake metadata service did not count the control request")
	}
	return m
}

// testOperatorRights: installed with operator.tenantNamespaces, the
// operator's ServiceAccount may read Secrets in the tenants' namespace and
// its own, and nowhere else (the API server's own answer, a
// SubjectAccessReview); a tenant outside those namespaces is refused.
func (e *env) testOperatorRights(t *testing.T) {
	sa := "system:serviceaccount:" + framework.SystemNS + ":apiary"
	for _, c := range []struct {
		verb, resource, namespace string
		want                      bool
	}{
		{"get", "secrets", framework.TenantsNS, true},
		{"get", "secrets", framework.SystemNS, true},
		{"get", "secrets", "default", false},
		{"get", "secrets", "kube-system", false},
		{"create", "deployments", "kube-system", false},
		{"patch", "pods", "kube-system", false},
		{"list", "nodes", "", true},
	} {
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: sa, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + framework.SystemNS, "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: c.verb, Resource: c.resource, Namespace: c.namespace, Group: groupOf(c.resource)},
		}}
		if err := e.C.Create(e.Ctx, sar); err != nil {
			t.Fatal(err)
		}
		if sar.Status.Allowed != c.want {
			t.Errorf("the operator may %s %s in namespace %q: %t, want %t (%s)", c.verb, c.resource, c.namespace, sar.Status.Allowed, c.want, sar.Status.Reason)
		}
	}
	bad := &apiary.TenantControlPlane{ObjectMeta: metav1.ObjectMeta{Name: "elsewhere", Namespace: "default"}}
	err := e.C.Create(e.Ctx, bad, client.DryRunAll)
	if err == nil || !strings.Contains(err.Error(), "manages TenantControlPlanes in namespaces ["+framework.TenantsNS+" "+framework.DoomedNS+"] only") {
		t.Fatalf("a tenant outside the operator's namespaces: %v", err)
	}

	// Deleting a tenant namespace deletes the operator's Role there as
	// early as anything else; the tenant's finalizer must still run.
	doomed := &apiary.TenantControlPlane{ObjectMeta: metav1.ObjectMeta{Name: "doomed", Namespace: framework.DoomedNS}}
	if err := e.C.Create(e.Ctx, doomed); err != nil {
		t.Fatal(err)
	}
	framework.Eventually(t, "tenant doomed bound to its DataStore", 2*time.Minute, func() error {
		if err := e.C.Get(e.Ctx, client.ObjectKeyFromObject(doomed), doomed); err != nil {
			return err
		}
		return framework.ConditionIs(doomed.Status.Conditions, apiary.ConditionDataStoreReady, metav1.ConditionTrue, "")
	})
	start := time.Now()
	if err := e.C.Delete(e.Ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: framework.DoomedNS}}); err != nil {
		t.Fatal(err)
	}
	framework.Eventually(t, "namespace "+framework.DoomedNS+" deleted with its tenant", 3*time.Minute, func() error {
		var ns corev1.Namespace
		if err := e.C.Get(e.Ctx, client.ObjectKey{Name: framework.DoomedNS}, &ns); !apierrors.IsNotFound(err) {
			return fmt.Errorf("namespace still there (%v): %+v", err, ns.Status.Conditions)
		}
		return nil
	})
	t.Logf("FIGURE a tenant namespace deleted with its tenant in %s", time.Since(start).Round(time.Millisecond))
	// Its slice of the DataStore went with it (the finalizer released it:
	// there is no orphan annotation).
	framework.Eventually(t, "the DataStore no longer lists the tenant", time.Minute, func() error {
		var ds apiary.DataStore
		if err := e.C.Get(e.Ctx, client.ObjectKey{Name: doomed.Status.DataStore.Name}, &ds); err != nil {
			return err
		}
		for _, u := range ds.Status.UsedBy {
			if u == framework.DoomedNS+"/doomed" {
				return fmt.Errorf("DataStore %s still lists the deleted tenant: %v", ds.Name, ds.Status.UsedBy)
			}
		}
		return nil
	})
}

func groupOf(resource string) string {
	switch resource {
	case "deployments":
		return "apps"
	}
	return ""
}
