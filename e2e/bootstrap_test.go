//go:build e2e

package e2e

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	bootstrapapi "k8s.io/cluster-bootstrap/token/api"
	"k8s.io/cluster-bootstrap/token/jws"

	"github.com/apiaryhq/apiary/e2e/framework"
	"github.com/apiaryhq/apiary/internal/testenv"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/tenant"
)

var joinCommand = regexp.MustCompile(`kubeadm join (\S+) --token ([a-z0-9]{6})\.([a-z0-9]{16}) --discovery-token-ca-cert-hash sha256:([0-9a-f]{64})`)

// testKubeadmBootstrap walks what `kubeadm join` does against a hosted
// tenant, up to the kubelet's first client certificate: a token from the
// real `kubeadm token create`, discovery through the signed public
// cluster-info, the configuration reads with the bootstrap token, and the
// node client CSR that the tenant approves and signs by itself.
func (e *env) testKubeadmBootstrap(t *testing.T) {
	tcp := e.TCP(t, "alpha")
	if err := framework.ConditionIs(tcp.Status.Conditions, apiary.ConditionTenantBootstrapped, metav1.ConditionTrue, ""); err != nil {
		t.Fatal(err)
	}
	kc := e.ExportKubeconfig(t, "alpha")
	_, m := kubeadmJoinCommand(t, e, kc)
	endpoint, tokenID, tokenSecret, caHash := m[1], m[2], m[3], m[4]
	if "https://"+endpoint != tcp.Status.Endpoint {
		t.Errorf("join command endpoint %s, tenant endpoint %s", endpoint, tcp.Status.Endpoint)
	}

	// Discovery: anonymous, TLS unverified until the CA is pinned by hash.
	anon := kubernetes.NewForConfigOrDie(&rest.Config{Host: tcp.Status.Endpoint, TLSClientConfig: rest.TLSClientConfig{Insecure: true}})
	var info *corev1.ConfigMap
	signed := time.Now()
	framework.Eventually(t, "cluster-info signed for the new token", time.Minute, func() error {
		cm, err := anon.CoreV1().ConfigMaps("kube-public").Get(e.Ctx, bootstrapapi.ConfigMapClusterInfo, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if _, ok := cm.Data[bootstrapapi.JWSSignatureKeyPrefix+tokenID]; !ok {
			return errors.New("no signature for the token yet")
		}
		info = cm
		return nil
	})
	t.Logf("FIGURE cluster-info signed for a new bootstrap token within %s", time.Since(signed).Round(time.Millisecond))
	content := info.Data[bootstrapapi.KubeConfigKey]
	if !jws.DetachedTokenIsValid(info.Data[bootstrapapi.JWSSignatureKeyPrefix+tokenID], content, tokenID, tokenSecret) {
		t.Fatal("cluster-info's signature does not verify with the token")
	}
	cfg, err := clientcmd.Load([]byte(content))
	if err != nil {
		t.Fatal(err)
	}
	cluster := cfg.Clusters[""]
	if cluster == nil || cluster.Server != tcp.Status.Endpoint {
		t.Fatalf("cluster-info cluster %+v", cluster)
	}
	block, _ := pem.Decode(cluster.CertificateAuthorityData)
	if block == nil {
		t.Fatal("cluster-info has no CA")
	}
	ca, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if sum := sha256.Sum256(ca.RawSubjectPublicKeyInfo); hex.EncodeToString(sum[:]) != caHash {
		t.Fatalf("CA hash %x, join command pins %s", sum, caHash)
	}
	tlsCfg := rest.TLSClientConfig{CAData: cluster.CertificateAuthorityData}

	// The bootstrap token reads what kubeadm join reads, and no more.
	boot := kubernetes.NewForConfigOrDie(&rest.Config{Host: tcp.Status.Endpoint, TLSClientConfig: tlsCfg, BearerToken: tokenID + "." + tokenSecret})
	for _, name := range []string{tenant.KubeadmConfigMap, tenant.KubeletConfigMap, "kube-proxy"} {
		if _, err := boot.CoreV1().ConfigMaps("kube-system").Get(e.Ctx, name, metav1.GetOptions{}); err != nil {
			t.Errorf("bootstrap token reading kube-system/%s: %v", name, err)
		}
	}
	if _, err := boot.CoreV1().Nodes().Get(e.Ctx, "e2e-node", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("bootstrap token getting a missing Node: %v, want NotFound", err)
	}
	if _, err := boot.CoreV1().Secrets("kube-system").List(e.Ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("bootstrap token listing Secrets: %v, want Forbidden", err)
	}
	if _, err := anon.CoreV1().ConfigMaps("kube-system").Get(e.Ctx, tenant.KubeadmConfigMap, metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("anonymous reading kubeadm-config: %v, want Forbidden", err)
	}

	// TLS bootstrap: a node client CSR is approved and signed by the
	// tenant's controller-manager.
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	csrDER, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: "system:node:e2e-node", Organization: []string{"system:nodes"}},
	}, key)
	if err != nil {
		t.Fatal(err)
	}
	csr, err := boot.CertificatesV1().CertificateSigningRequests().Create(e.Ctx, &certificatesv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "node-csr-"},
		Spec: certificatesv1.CertificateSigningRequestSpec{
			Request:    pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: csrDER}),
			SignerName: certificatesv1.KubeAPIServerClientKubeletSignerName,
			Usages:     []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("bootstrap token creating a node CSR: %v", err)
	}
	admin := e.tenantClient(t, kc)
	t.Cleanup(func() {
		_ = admin.CertificatesV1().CertificateSigningRequests().Delete(e.Ctx, csr.Name, metav1.DeleteOptions{})
	})
	var certPEM []byte
	framework.Eventually(t, "node CSR approved and signed", time.Minute, func() error {
		got, err := admin.CertificatesV1().CertificateSigningRequests().Get(e.Ctx, csr.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if len(got.Status.Certificate) == 0 {
			return fmt.Errorf("conditions %v, no certificate", got.Status.Conditions)
		}
		certPEM = got.Status.Certificate
		return nil
	})
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	node := kubernetes.NewForConfigOrDie(&rest.Config{Host: tcp.Status.Endpoint, TLSClientConfig: rest.TLSClientConfig{
		CAData: cluster.CertificateAuthorityData, CertData: certPEM, KeyData: pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
	}})
	if _, err := node.CoreV1().ConfigMaps("kube-system").Get(e.Ctx, tenant.KubeletConfigMap, metav1.GetOptions{}); err != nil {
		t.Errorf("the new node credential reading kubelet-config: %v", err)
	}

	// What a tenant user deletes comes back: the operator watches what it
	// applied and re-applies on a deletion, well before its 4-minute
	// resync would.
	for _, del := range []struct {
		what string
		del  func() error
		get  func() error
	}{
		{"ConfigMap kube-system/" + tenant.KubeletConfigMap,
			func() error {
				return admin.CoreV1().ConfigMaps("kube-system").Delete(e.Ctx, tenant.KubeletConfigMap, metav1.DeleteOptions{})
			},
			func() error {
				_, err := admin.CoreV1().ConfigMaps("kube-system").Get(e.Ctx, tenant.KubeletConfigMap, metav1.GetOptions{})
				return err
			}},
		{"Deployment kube-system/coredns",
			func() error {
				return admin.AppsV1().Deployments("kube-system").Delete(e.Ctx, "coredns", metav1.DeleteOptions{})
			},
			func() error {
				_, err := admin.AppsV1().Deployments("kube-system").Get(e.Ctx, "coredns", metav1.GetOptions{})
				return err
			}},
	} {
		if err := del.del(); err != nil {
			t.Fatalf("deleting %s: %v", del.what, err)
		}
		deleted := time.Now()
		framework.Eventually(t, del.what+" re-created", time.Minute, del.get)
		t.Logf("FIGURE %s deleted inside the tenant: re-created after %s", del.what, time.Since(deleted).Round(time.Millisecond))
	}
}

func (e *env) tenantClient(t *testing.T, kubeconfig string) *kubernetes.Clientset {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	// A hostile tenant is not rate limited by its own client.
	cfg.QPS, cfg.Burst = 1000, 1000
	return kubernetes.NewForConfigOrDie(cfg)
}

// kubeadmJoinCommand runs the real `kubeadm token create
// --print-join-command` against a tenant and returns the command and its
// parts (endpoint, token ID, token secret, CA hash).
func kubeadmJoinCommand(t *testing.T, e *env, kubeconfig string) (string, []string) {
	t.Helper()
	kubeadm, err := testenv.KubeBinary("kubeadm")
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(e.Ctx, kubeadm, "token", "create", "--print-join-command", "--kubeconfig", kubeconfig).CombinedOutput()
	if err != nil {
		t.Fatalf("kubeadm token create: %v\n%s", err, out)
	}
	join := strings.TrimSpace(string(out))
	m := joinCommand.FindStringSubmatch(join)
	if m == nil {
		t.Fatalf("no join command in: %s", out)
	}
	return join, m
}
