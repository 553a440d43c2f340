package cluster

import (
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/apiaryhq/apiary/pki"
)

// leaf is one certificate the cluster uses, stored as <name>.crt/.key.
type leaf struct {
	name string
	req  pki.Request
}

func (c *Cluster) leaves() []leaf {
	node := c.opts.NodeName
	nodeIP := c.opts.NodeIP
	client := []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	server := []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	return []leaf{
		{"apiserver", pki.Request{
			CommonName: "kube-apiserver",
			DNSNames: []string{"localhost", node, "kubernetes", "kubernetes.default", "kubernetes.default.svc",
				"kubernetes.default.svc." + ClusterDomain},
			IPs:    []net.IP{net.IPv4(127, 0, 0, 1), nodeIP, net.ParseIP(KubernetesIP)},
			Usages: server,
		}},
		{"apiserver-kubelet-client", pki.Request{CommonName: "kube-apiserver-kubelet-client", Organization: []string{"system:masters"}, Usages: client}},
		{"admin", pki.Request{CommonName: "apiary-dev-admin", Organization: []string{"system:masters"}, Usages: client}},
		{"controller-manager", pki.Request{CommonName: "system:kube-controller-manager", Usages: client}},
		{"scheduler", pki.Request{CommonName: "system:kube-scheduler", Usages: client}},
		{"kube-proxy", pki.Request{CommonName: "system:kube-proxy", Usages: client}},
		{"kubelet-client", pki.Request{CommonName: "system:node:" + node, Organization: []string{"system:nodes"}, Usages: client}},
		{"kubelet-server", pki.Request{
			CommonName: node,
			DNSNames:   []string{node, "localhost"},
			IPs:        []net.IP{net.IPv4(127, 0, 0, 1), nodeIP},
			Usages:     server,
		}},
	}
}

// ensurePKI keeps the CA, certificates and service-account key that are
// still good and issues the others, then writes the kubeconfigs.
func (c *Cluster) ensurePKI() error {
	if err := os.MkdirAll(c.paths.pki, 0o700); err != nil {
		return err
	}
	now := time.Now()
	ca, err := loadKeyPair(c.paths.pkiFile("ca"))
	if err != nil || pki.CAProblem(ca.Cert, now) != "" {
		if ca, err = pki.NewCA("apiary-devcluster-ca"); err != nil {
			return err
		}
		if err := writeKeyPair(c.paths.pkiFile("ca"), ca); err != nil {
			return err
		}
	}
	for _, l := range c.leaves() {
		kp, err := loadKeyPair(c.paths.pkiFile(l.name))
		if err == nil && pki.Problem(kp.Cert, ca.Cert, l.req, now) == "" {
			continue
		}
		if kp, err = ca.Sign(l.req); err != nil {
			return err
		}
		if err := writeKeyPair(c.paths.pkiFile(l.name), kp); err != nil {
			return err
		}
	}
	priv, _ := os.ReadFile(c.paths.pkiFile("sa.key"))
	pub, _ := os.ReadFile(c.paths.pkiFile("sa.pub"))
	if priv == nil || pub == nil || pki.ServiceAccountKeyProblem(priv, pub) != "" {
		if priv, pub, err = pki.NewServiceAccountKey(); err != nil {
			return err
		}
		if err := writeFileAtomic(c.paths.pkiFile("sa.key"), priv, 0o600); err != nil {
			return err
		}
		if err := writeFileAtomic(c.paths.pkiFile("sa.pub"), pub, 0o644); err != nil {
			return err
		}
	}
	for _, kc := range []struct{ file, cert string }{
		{"admin.kubeconfig", "admin"},
		{"controller-manager.kubeconfig", "controller-manager"},
		{"scheduler.kubeconfig", "scheduler"},
		{"kube-proxy.kubeconfig", "kube-proxy"},
		{"kubelet.kubeconfig", "kubelet-client"},
	} {
		if err := c.writeKubeconfig(c.paths.pkiFile(kc.file), kc.cert); err != nil {
			return err
		}
	}
	b, err := os.ReadFile(c.paths.pkiFile("admin.kubeconfig"))
	if err != nil {
		return err
	}
	return writeFileAtomic(c.paths.adminKubeconfig, b, 0o600)
}

// writeKubeconfig writes a kubeconfig with the certificates embedded, so
// that it can be copied anywhere on this machine.
func (c *Cluster) writeKubeconfig(path, certName string) error {
	caPEM, err := os.ReadFile(c.paths.pkiFile("ca.crt"))
	if err != nil {
		return err
	}
	certPEM, err := os.ReadFile(c.paths.pkiFile(certName + ".crt"))
	if err != nil {
		return err
	}
	keyPEM, err := os.ReadFile(c.paths.pkiFile(certName + ".key"))
	if err != nil {
		return err
	}
	const name = "apiary-dev"
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[name] = &clientcmdapi.Cluster{
		Server:                   fmt.Sprintf("https://127.0.0.1:%d", APIServerPort),
		CertificateAuthorityData: caPEM,
	}
	cfg.AuthInfos[certName] = &clientcmdapi.AuthInfo{ClientCertificateData: certPEM, ClientKeyData: keyPEM}
	cfg.Contexts[name] = &clientcmdapi.Context{Cluster: name, AuthInfo: certName}
	cfg.CurrentContext = name
	b, err := clientcmd.Write(*cfg)
	if err != nil {
		return err
	}
	if old, err := os.ReadFile(path); err == nil && string(old) == string(b) {
		return nil
	}
	return writeFileAtomic(path, b, 0o600)
}

func loadKeyPair(base string) (*pki.KeyPair, error) {
	certPEM, err := os.ReadFile(base + ".crt")
	if err != nil {
		return nil, err
	}
	keyPEM, err := os.ReadFile(base + ".key")
	if err != nil {
		return nil, err
	}
	return pki.ParseKeyPair(certPEM, keyPEM)
}

func writeKeyPair(base string, kp *pki.KeyPair) error {
	keyPEM, err := kp.KeyPEM()
	if err != nil {
		return err
	}
	if err := writeFileAtomic(base+".key", keyPEM, 0o600); err != nil {
		return err
	}
	return writeFileAtomic(base+".crt", kp.CertPEM(), 0o644)
}

// writeFileAtomic writes through a temporary file and a rename.
func writeFileAtomic(path string, data []byte, perm os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, perm); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// writeIfChanged writes a file unless it already has that content and
// reports whether it wrote.
func writeIfChanged(path string, data []byte, perm os.FileMode) (bool, error) {
	if old, err := os.ReadFile(path); err == nil && string(old) == string(data) {
		return false, nil
	}
	return true, writeFileAtomic(path, data, perm)
}
