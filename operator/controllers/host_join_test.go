package controllers

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

func servingCSR(t *testing.T, cn string, dns []string, ips ...string) *certificatesv1.CertificateSigningRequest {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.CertificateRequest{Subject: pkix.Name{CommonName: cn, Organization: []string{"system:nodes"}}, DNSNames: dns}
	for _, ip := range ips {
		tmpl.IPAddresses = append(tmpl.IPAddresses, net.ParseIP(ip))
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	if err != nil {
		t.Fatal(err)
	}
	return &certificatesv1.CertificateSigningRequest{Spec: certificatesv1.CertificateSigningRequestSpec{
		Request:    pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}),
		SignerName: certificatesv1.KubeletServingSignerName,
		Username:   "system:node:node-1",
	}}
}

func TestCheckServingCSR(t *testing.T) {
	names, ips := []string{"node-1"}, []string{"172.31.250.2"}
	for _, tc := range []struct {
		name string
		csr  *certificatesv1.CertificateSigningRequest
		want string
	}{
		{"the node's own", servingCSR(t, "system:node:node-1", []string{"node-1"}, "172.31.250.2"), ""},
		{"another IP", servingCSR(t, "system:node:node-1", []string{"node-1"}, "10.0.0.9"), "IP address 10.0.0.9"},
		{"another name", servingCSR(t, "system:node:node-1", []string{"kubernetes.default"}, "172.31.250.2"), `DNS name "kubernetes.default"`},
		{"another node's CN", servingCSR(t, "system:node:node-2", []string{"node-1"}), "common name"},
		{"an address the kubelet reports but the Host does not have", servingCSR(t, "system:node:node-1", []string{"node-1"}, "172.31.250.2", "192.0.2.7"), "IP address 192.0.2.7 is not the Host's spec.address"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := checkServingCSR(tc.csr, names, ips)
			if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
				t.Fatalf("checkServingCSR = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestReservedServingName(t *testing.T) {
	for name, want := range map[string]bool{
		"node-1": false, "worker.example.com": false, "kubernetes": true, "Kubernetes.default": true,
		"kubernetes.default.svc.cluster.local.": true, "db.prod.svc": true, "x.svc.cluster.local": true,
		"cluster.local": true, "a.cluster.local": true, "kubernetes-worker": false,
	} {
		if got := reservedServingName(name, "cluster.local"); got != want {
			t.Errorf("reservedServingName(%q) = %v, want %v", name, got, want)
		}
	}
}

func TestCACertHashRejectsNonPEM(t *testing.T) {
	if _, err := caCertHash([]byte("not pem")); err == nil {
		t.Fatal("no error for a non-PEM CA")
	}
}

// A joined Node that is not Ready yet is looked at often right after the
// join, less often later, and never in a tight loop.
func TestNodePoll(t *testing.T) {
	joined := time.Date(2026, 12, 1, 7, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		since    time.Duration
		finished bool
		want     time.Duration
	}{
		{0, false, 10 * time.Second},
		{time.Second, true, 2 * time.Second},
		{29 * time.Second, true, 2 * time.Second},
		{30 * time.Second, true, 10 * time.Second},
		{119 * time.Second, true, 10 * time.Second},
		{2 * time.Minute, true, time.Minute},
		{time.Hour, true, time.Minute},
	} {
		h := &apiary.Host{}
		step := apiary.HostStep{Name: StepJoin, Started: metav1.NewTime(joined.Add(-time.Second))}
		if c.finished {
			step.Finished = &metav1.Time{Time: joined}
		}
		h.Status.Journal = []apiary.HostStep{step}
		r := &HostReconciler{Now: func() time.Time { return joined.Add(c.since) }}
		if got := r.nodePoll(h); got != c.want {
			t.Errorf("%s after the join (finished %v): poll %s, want %s", c.since, c.finished, got, c.want)
		}
	}
}

// A control-plane Host's Node carries kubeadm's role label and NoSchedule
// taint; back to worker it loses them, and keeps what the Host's own
// labels and taints and others put there.
func TestNodeMetadata(t *testing.T) {
	h := &apiary.Host{Spec: apiary.HostSpec{Role: apiary.HostRoleControlPlane,
		Labels: map[string]string{"zone": "a"},
		Taints: []corev1.Taint{{Key: "dedicated", Value: "x", Effect: corev1.TaintEffectNoExecute}}}}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"kubernetes.io/hostname": "n"}},
		Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: "other", Effect: corev1.TaintEffectNoSchedule}}}}
	cp, changed := nodeMetadata(h, node)
	if !changed {
		t.Fatal("no change for a new control-plane Node")
	}
	if _, ok := cp.Labels[LabelNodeRoleControlPlane]; !ok || cp.Labels["zone"] != "a" || cp.Labels["kubernetes.io/hostname"] != "n" {
		t.Errorf("labels %v", cp.Labels)
	}
	if !slices.ContainsFunc(cp.Spec.Taints, func(x corev1.Taint) bool {
		return x.Key == LabelNodeRoleControlPlane && x.Effect == corev1.TaintEffectNoSchedule
	}) ||
		len(cp.Spec.Taints) != 3 {
		t.Errorf("taints %v", cp.Spec.Taints)
	}
	if _, again := nodeMetadata(h, cp); again {
		t.Error("an up-to-date Node would be updated again")
	}
	h.Spec.Role = apiary.HostRoleWorker
	w, changed := nodeMetadata(h, cp)
	if !changed {
		t.Fatal("no change back to worker")
	}
	if _, ok := w.Labels[LabelNodeRoleControlPlane]; ok || w.Labels["zone"] != "a" {
		t.Errorf("worker labels %v", w.Labels)
	}
	if len(w.Spec.Taints) != 2 || slices.ContainsFunc(w.Spec.Taints, func(x corev1.Taint) bool { return x.Key == LabelNodeRoleControlPlane }) {
		t.Errorf("worker taints %v", w.Spec.Taints)
	}
	if _, again := nodeMetadata(h, w); again {
		t.Error("an up-to-date worker Node would be updated again")
	}
}
