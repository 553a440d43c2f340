package hosts

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// caHost is this machine behind an SSH server with a shell, with the
// kubelet's files under a temporary directory and a stand-in for
// systemctl that logs each verb (a test may replace it with one that also
// acts as the kubelet would).
func caHost(t *testing.T) (*Client, string) {
	t.Helper()
	c := dialTestServer(t, serverOptions{shell: true})
	dir := t.TempDir()
	for _, d := range []string{"etc/kubernetes/pki", "var/lib/kubelet/pki"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	ctl := filepath.Join(dir, "systemctl")
	script := "#!/bin/sh\necho \"$1\" >> " + dir + "/kubelet.log\n"
	if err := os.WriteFile(ctl, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	saved := []string{KubeletCAFile, KubeletKubeconfig, BootstrapKubeconfig, kubeletPKIDir, kubeletControl}
	KubeletCAFile = dir + "/etc/kubernetes/pki/ca.crt"
	KubeletKubeconfig = dir + "/etc/kubernetes/kubelet.conf"
	BootstrapKubeconfig = dir + "/etc/kubernetes/bootstrap-kubelet.conf"
	kubeletPKIDir = dir + "/var/lib/kubelet/pki"
	kubeletControl = ctl + " %s"
	t.Cleanup(func() {
		KubeletCAFile, KubeletKubeconfig, BootstrapKubeconfig, kubeletPKIDir, kubeletControl = saved[0], saved[1], saved[2], saved[3], saved[4]
	})
	return c, dir
}

func testCert(t *testing.T, cn string) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn}, NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func kubeconfigWithCA(caData string) string {
	return "apiVersion: v1\nclusters:\n- cluster:\n    certificate-authority-data: " + caData + "\n    server: https://10.0.0.1:6443\n  name: default-cluster\nkind: Config\n"
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestTrustCA(t *testing.T) {
	c, dir := caHost(t)
	old := testCert(t, "old")
	if err := os.WriteFile(KubeletCAFile, old, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(KubeletKubeconfig, []byte(kubeconfigWithCA(base64.StdEncoding.EncodeToString(old))), 0o600); err != nil {
		t.Fatal(err)
	}
	bundle := append(old, testCert(t, "new")...)
	restarted, err := TrustCA(t.Context(), c, bundle)
	if err != nil || !restarted {
		t.Fatalf("first: restarted %v, %v", restarted, err)
	}
	if got := readFile(t, KubeletCAFile); got != string(bundle) {
		t.Errorf("ca.crt holds %d certificates, want the bundle of 2", strings.Count(got, "BEGIN"))
	}
	if st, _ := os.Stat(KubeletCAFile); st.Mode().Perm() != 0o600 {
		t.Errorf("ca.crt mode %v: the file's own mode must stay", st.Mode().Perm())
	}
	if got := readFile(t, KubeletKubeconfig); !strings.Contains(got, "certificate-authority-data: "+base64.StdEncoding.EncodeToString(bundle)+"\n") || !strings.Contains(got, "server: https://10.0.0.1:6443") {
		t.Errorf("kubelet.conf:\n%s", got)
	}
	// Again: nothing changes, the kubelet is not restarted.
	if restarted, err := TrustCA(t.Context(), c, bundle); err != nil || restarted {
		t.Errorf("second: restarted %v, %v; want no restart", restarted, err)
	}
	if got := readFile(t, dir+"/kubelet.log"); got != "restart\n" {
		t.Errorf("kubelet verbs %q, want one restart", got)
	}
	// A kubeconfig without inline CA data is not silently left as is.
	if err := os.WriteFile(KubeletKubeconfig, []byte("apiVersion: v1\nkind: Config\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := TrustCA(t.Context(), c, old); err == nil || !strings.Contains(err.Error(), "certificate-authority-data") {
		t.Errorf("kubeconfig without CA data: %v", err)
	}
	if _, err := TrustCA(t.Context(), c, []byte("APIARY_EOF\n")); err == nil {
		t.Error("a bundle that is not PEM was written")
	}
}

func TestRenewKubeletCredentials(t *testing.T) {
	ca := testCert(t, "new")
	b64 := base64.StdEncoding.EncodeToString(ca)
	// The kubelet stand-in bootstraps as the real one does: from the
	// bootstrap kubeconfig, a new kubeconfig and client certificate.
	bootstraps := `if [ -f "` + "$BOOT" + `" ]; then
  grep -q 'token: abcdef.0123456789abcdef' "$BOOT" || exit 1
  grep -q 'server: https://10.0.0.1:6443' "$BOOT" || exit 1
  cp "$BOOT" "$KC"
  printf 'NEW CERT\n' > "$PKI/kubelet-client-current.pem"
fi`
	c, dir := caHost(t)
	script := strings.NewReplacer("$BOOT", BootstrapKubeconfig, "$KC", KubeletKubeconfig, "$PKI", kubeletPKIDir).Replace(bootstraps)
	ctl := dir + "/systemctl"
	if err := os.WriteFile(ctl, []byte("#!/bin/sh\necho \"$1\" >> "+dir+"/kubelet.log\nif [ \"$1\" = restart ]; then\n"+script+"\nfi\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	setup := func() {
		t.Helper()
		_ = os.RemoveAll(kubeletCredentialsBackup())
		if err := os.WriteFile(KubeletKubeconfig, []byte(kubeconfigWithCA("T0xE")), 0o600); err != nil {
			t.Fatal(err)
		}
		for _, f := range []string{"kubelet-client-current.pem", "kubelet-server-current.pem"} {
			_ = os.Remove(kubeletPKIDir + "/" + f)
			if err := os.WriteFile(kubeletPKIDir+"/"+f, []byte("OLD "+f+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	setup()
	if err := RenewKubeletCredentials(t.Context(), c, ca, "abcdef.0123456789abcdef", 5); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, kubeletPKIDir+"/kubelet-client-current.pem"); got != "NEW CERT\n" {
		t.Errorf("client certificate %q", got)
	}
	if _, err := os.Stat(kubeletPKIDir + "/kubelet-server-current.pem"); !os.IsNotExist(err) {
		t.Errorf("the old serving certificate is still current: %v", err)
	}
	if got := readFile(t, KubeletKubeconfig); !strings.Contains(got, "certificate-authority-data: "+b64) {
		t.Errorf("kubelet.conf does not trust the new CA:\n%s", got)
	}
	if _, err := os.Stat(BootstrapKubeconfig); !os.IsNotExist(err) {
		t.Error("the bootstrap kubeconfig (with its token) was left on the host")
	}

	// A kubelet that gets no certificate: its old credentials come back.
	if err := os.WriteFile(ctl, []byte("#!/bin/sh\necho \"$1\" >> "+dir+"/kubelet.log\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	setup()
	err := RenewKubeletCredentials(t.Context(), c, ca, "abcdef.0123456789abcdef", 1)
	if err == nil || !strings.Contains(err.Error(), "previous credentials are put back") {
		t.Fatalf("no certificate came: %v", err)
	}
	for _, f := range []string{"kubelet-client-current.pem", "kubelet-server-current.pem"} {
		if got := readFile(t, kubeletPKIDir+"/"+f); got != "OLD "+f+"\n" {
			t.Errorf("%s after the failure: %q", f, got)
		}
	}
	if got := readFile(t, KubeletKubeconfig); got != kubeconfigWithCA("T0xE") {
		t.Errorf("kubelet.conf after the failure:\n%s", got)
	}
	if _, err := os.Stat(BootstrapKubeconfig); !os.IsNotExist(err) {
		t.Error("the bootstrap kubeconfig was left on the host after the failure")
	}
	if got := readFile(t, dir+"/kubelet.log"); !strings.HasSuffix(got, "restart\nstop\nstart\n") {
		t.Errorf("kubelet verbs %q", got)
	}
	if err := RenewKubeletCredentials(t.Context(), c, ca, "not-a-token", 1); err == nil {
		t.Error("a malformed token reached the host")
	}
}

func TestKubeletCertificatesLeaveTheKeys(t *testing.T) {
	c, _ := caHost(t)
	cert := testCert(t, "system:node:w1")
	key := "-----BEGIN EC PRIVATE KEY-----\nc2VjcmV0\n-----END EC PRIVATE KEY-----\n"
	if err := os.WriteFile(kubeletPKIDir+"/kubelet-client-current.pem", append(cert, key...), 0o600); err != nil {
		t.Fatal(err)
	}
	client, serving, err := KubeletCertificates(t.Context(), c)
	if err != nil {
		t.Fatal(err)
	}
	if string(client) != strings.TrimSpace(string(cert)) || serving != nil {
		t.Errorf("client %q, serving %q", client, serving)
	}
	if strings.Contains(string(client), "PRIVATE KEY") || strings.Contains(string(client), "c2VjcmV0") {
		t.Error("the private key left the host")
	}
}
