package hosts

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"strings"
)

// What a joined host holds of its tenant's cluster CA, and how a CA
// rotation (operator/controllers/tenant_ca.go) changes it. Variables so
// that tests run the scripts on this machine under a temporary directory
// and with a stand-in for systemd.
var (
	// KubeletCAFile is the CA bundle the kubelet verifies clients (the API
	// server's kubelet-client certificate) against; it reloads it without
	// a restart.
	KubeletCAFile = "/etc/kubernetes/pki/ca.crt"
	// KubeletKubeconfig is the kubelet's kubeconfig: the bundle it
	// verifies the API server against, and its client certificate.
	KubeletKubeconfig = "/etc/kubernetes/kubelet.conf"
	// BootstrapKubeconfig is what a kubelet without a client certificate
	// asks for one with (kubeadm's drop-in names it).
	BootstrapKubeconfig = "/etc/kubernetes/bootstrap-kubelet.conf"
	kubeletPKIDir       = "/var/lib/kubelet/pki"
	// kubeletControl runs systemctl's verbs on the kubelet: "$kubelet restart".
	kubeletControl = "systemctl %s kubelet"
)

// kubeletCredentialsBackup keeps the kubelet's credentials while a new
// client certificate is asked for, to put back on a failure.
func kubeletCredentialsBackup() string { return kubeletPKIDir + "/apiary-previous" }

func kubelet(verb string) string { return fmt.Sprintf(kubeletControl, verb) }

// TrustCA makes the host trust bundle (PEM): the kubelet's client CA
// file and the certificate-authority-data of its kubeconfig, restarting
// the kubelet when the kubeconfig changed (it reads it only at start).
// It reports whether the kubelet restarted; run again it changes nothing.
func TrustCA(ctx context.Context, c *Client, bundle []byte) (bool, error) {
	if err := checkBundle(bundle); err != nil {
		return false, &Error{ReasonInvalidInput, err}
	}
	b64 := base64.StdEncoding.EncodeToString(bundle)
	script := fmt.Sprintf(`set -e
ca=%[1]s
kc=%[2]s
tmp=$(mktemp "$ca.XXXXXX")
trap 'rm -f "$tmp"' EXIT
%[3]sif ! cmp -s "$tmp" "$ca"; then
  # Written over the old file: its mode and owner stay.
  if [ -f "$ca" ]; then cat "$tmp" > "$ca"; else install -m 0644 "$tmp" "$ca"; fi
fi
grep -q '^ *certificate-authority-data:' "$kc" || { echo "$kc has no certificate-authority-data" >&2; exit 1; }
if ! grep -q '^ *certificate-authority-data: %[4]s$' "$kc"; then
  sed -i 's|^\( *certificate-authority-data:\).*|\1 %[4]s|' "$kc"
  %[5]s
  echo APIARY_KUBELET_RESTARTED
fi
`, KubeletCAFile, KubeletKubeconfig, writeFile(`"$tmp"`, string(bundle)), b64, kubelet("restart"))
	out, err := c.RunScript(ctx, script)
	if err != nil {
		return false, fmt.Errorf("trusting the tenant CA bundle: %w\n%s", err, tail(out, 15))
	}
	return strings.Contains(out, "APIARY_KUBELET_RESTARTED"), nil
}

// RenewKubeletCredentials makes the kubelet ask for a new client
// certificate through a CSR, as at a join: a bootstrap kubeconfig (bundle,
// token, the server of its kubeconfig), its kubeconfig and current client
// and serving certificates moved aside, the kubelet restarted. It waits
// until the kubelet has its new client certificate (the tenant approves
// bootstrap CSRs by itself); a kubelet that gets none within the timeout
// gets its previous credentials back. The serving certificate's CSR is
// the operator's to approve (the caller).
func RenewKubeletCredentials(ctx context.Context, c *Client, bundle []byte, token string, waitSeconds int) error {
	if err := checkBundle(bundle); err != nil {
		return &Error{ReasonInvalidInput, err}
	}
	if !tokenPattern.MatchString(token) {
		return &Error{ReasonInvalidInput, fmt.Errorf("bootstrap token is not <id>.<secret>")}
	}
	b64 := base64.StdEncoding.EncodeToString(bundle)
	script := fmt.Sprintf(`set -e
kc=%[1]s
boot=%[2]s
pki=%[3]s
backup=%[4]s
server=$(sed -n 's/^ *server: *//p' "$kc" | head -n1)
[ -n "$server" ] || { echo "$kc names no server" >&2; exit 1; }
umask 077
cat > "$boot" <<APIARY_EOF
apiVersion: v1
kind: Config
clusters:
- cluster:
    certificate-authority-data: %[5]s
    server: $server
  name: default-cluster
contexts:
- context:
    cluster: default-cluster
    user: tls-bootstrap-token-user
  name: tls-bootstrap
current-context: tls-bootstrap
users:
- name: tls-bootstrap-token-user
  user:
    token: %[6]s
APIARY_EOF
rm -rf "$backup"
mkdir -p "$backup"
mv "$kc" "$backup/kubelet.conf"
for f in kubelet-client-current.pem kubelet-server-current.pem; do
  if [ -e "$pki/$f" ] || [ -L "$pki/$f" ]; then mv "$pki/$f" "$backup/$f"; fi
done
%[9]s
i=0
until [ -s "$kc" ] && [ -s "$pki/kubelet-client-current.pem" ]; do
  i=$((i+1))
  if [ "$i" -gt %[7]d ]; then
    echo "the kubelet got no client certificate within %[8]d s; its previous credentials are put back" >&2
    %[10]s
    rm -f "$kc" "$pki/kubelet-client-current.pem" "$pki/kubelet-server-current.pem" "$boot"
    for f in kubelet.conf kubelet-client-current.pem kubelet-server-current.pem; do
      if [ "$f" = kubelet.conf ]; then dst="$kc"; else dst="$pki/$f"; fi
      if [ -e "$backup/$f" ] || [ -L "$backup/$f" ]; then mv "$backup/$f" "$dst"; fi
    done
    %[11]s
    exit 1
  fi
  sleep 0.5
done
rm -f "$boot"
`, KubeletKubeconfig, BootstrapKubeconfig, kubeletPKIDir, kubeletCredentialsBackup(), b64, token, 2*waitSeconds, waitSeconds,
		kubelet("restart"), kubelet("stop"), kubelet("start"))
	out, err := c.RunScript(ctx, script)
	if err != nil {
		return fmt.Errorf("renewing the kubelet's credentials: %w\n%s", err, tail(out, 15))
	}
	return nil
}

// KubeletCertificates returns the certificates (never the keys) the
// kubelet presents: its client certificate and its serving certificate
// (nil while it has none).
func KubeletCertificates(ctx context.Context, c *Client) (client, serving []byte, err error) {
	script := fmt.Sprintf(`set -e
for f in kubelet-client-current.pem kubelet-server-current.pem; do
  echo "APIARY_FILE $f"
  if [ -s %[1]s/$f ]; then sed -n '/-----BEGIN CERTIFICATE-----/,/-----END CERTIFICATE-----/p' %[1]s/$f; fi
done
`, kubeletPKIDir)
	out, err := c.RunScript(ctx, script)
	if err != nil {
		return nil, nil, fmt.Errorf("reading the kubelet's certificates: %w\n%s", err, tail(out, 15))
	}
	_, rest, _ := strings.Cut(out, "APIARY_FILE kubelet-client-current.pem\n")
	clientPart, servingPart, _ := strings.Cut(rest, "APIARY_FILE kubelet-server-current.pem\n")
	if s := bytes.TrimSpace([]byte(clientPart)); len(s) > 0 {
		client = s
	}
	if s := bytes.TrimSpace([]byte(servingPart)); len(s) > 0 {
		serving = s
	}
	return client, serving, nil
}

// checkBundle refuses what would break the heredoc or the kubeconfig.
func checkBundle(bundle []byte) error {
	if !bytes.HasPrefix(bundle, []byte("-----BEGIN CERTIFICATE-----")) || !bytes.HasSuffix(bundle, []byte("\n")) || bytes.Contains(bundle, []byte("APIARY_EOF")) {
		return fmt.Errorf("the CA bundle is not PEM certificates")
	}
	return nil
}
