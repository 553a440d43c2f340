package hosts

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"unicode"
)

const (
	patchesDir = stateDir + "/kubeadm-patches"
	// CRISocket is containerd's, which preflight checked.
	CRISocket = "unix:///run/containerd/containerd.sock"
)

// JoinRequest is what `kubeadm join` needs.
type JoinRequest struct {
	// Endpoint is host:port of the tenant API.
	Endpoint string
	// Token is "<id>.<secret>".
	Token string
	// CACertHash is "sha256:<hex>" of the tenant CA's public key.
	CACertHash string
	NodeName   string
}

// JoinResult says whether kubeadm join ran or had run before.
type JoinResult struct {
	AlreadyJoined bool
	Output        string
}

// Join runs kubeadm join on the host, unless the host already has a kubelet
// kubeconfig (an earlier join that the operator did not see finish). On a
// cgroup v1 host it patches the KubeletConfiguration with failCgroupV1:
// false (kubelet 1.35+ refuses cgroup v1 otherwise) for this node only.
func Join(ctx context.Context, c *Client, r JoinRequest) (JoinResult, error) {
	if err := r.Validate(); err != nil {
		return JoinResult{}, &Error{ReasonInvalidInput, err}
	}
	script := fmt.Sprintf(`set -e
if [ -f /etc/kubernetes/kubelet.conf ]; then echo APIARY_ALREADY_JOINED; exit 0; fi
rm -rf %[1]s
mkdir -p %[1]s
if [ ! -f /sys/fs/cgroup/cgroup.controllers ]; then
  printf 'apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nfailCgroupV1: false\n' > %[1]s/kubeletconfiguration+merge.yaml
fi
kubeadm join %[2]s --token %[3]s --discovery-token-ca-cert-hash %[4]s --node-name %[5]s \
  --cri-socket %[6]s --patches %[1]s --ignore-preflight-errors=SystemVerification 2>&1
`, patchesDir, Quote(r.Endpoint), Quote(r.Token), Quote(r.CACertHash), Quote(r.NodeName), CRISocket)
	out, err := c.RunScript(ctx, script)
	res := JoinResult{AlreadyJoined: strings.Contains(out, "APIARY_ALREADY_JOINED"), Output: out}
	if err != nil {
		return res, fmt.Errorf("kubeadm join: %w\n%s", err, tail(out, 15))
	}
	return res, nil
}

// Leave undoes join and keeps install: kubeadm reset, the kubelet
// stopped, then the pod network state the tenant's CNI left (which kubeadm
// reset leaves to the user): the CNI config and IPAM state, and the
// bridges of the bridge plugin (cni0, kube-router's kube-bridge), whose
// addresses would otherwise route the old podCIDR to this host after a
// join with another one. The node software stays: the host can join
// again at once. Other iptables rules and routes are the CNI's to remove
// (kube-router and kube-proxy rewrite their own chains on the next join).
func Leave(ctx context.Context, c *Client) (string, error) {
	out, err := c.RunScript(ctx, leaveScript())
	if err != nil {
		return out, fmt.Errorf("leave: %w\n%s", err, tail(out, 15))
	}
	return out, nil
}

// Reset undoes join and install: Leave, then everything the agent put on
// the host. The host can then be joined again, to any tenant.
func Reset(ctx context.Context, c *Client) (string, error) {
	out, err := c.RunScript(ctx, leaveScript()+UninstallScript())
	if err != nil {
		return out, fmt.Errorf("reset: %w\n%s", err, tail(out, 15))
	}
	return out, nil
}

func leaveScript() string {
	return fmt.Sprintf(`set +e
if command -v kubeadm >/dev/null 2>&1; then kubeadm reset -f --cri-socket %s 2>&1; fi
systemctl stop kubelet >/dev/null 2>&1
rm -rf /etc/kubernetes /var/lib/kubelet %s
rm -rf /etc/cni/net.d/* /var/lib/cni
for br in cni0 kube-bridge; do ip link delete "$br" >/dev/null 2>&1; done
true
`, CRISocket, patchesDir)
}

// maxTail bounds what tail keeps, in bytes: its result goes into a Host's
// conditions and journal, and the host's owner controls the output (a
// condition message over 32 KiB would make every status write fail).
const maxTail = 4 << 10

// tail is the last n lines of a command's output for a message: at most
// maxTail bytes, with terminal control sequences and other control
// characters (kubeadm colours its preflight output) left out.
func tail(s string, n int) string {
	s = strings.Map(func(r rune) rune {
		if r == '\n' || r == '\t' || !unicode.IsControl(r) {
			return r
		}
		return -1
	}, ansiEscape.ReplaceAllString(s, ""))
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	out := strings.Join(lines, "\n")
	if len(out) > maxTail {
		out = "…" + strings.ToValidUTF8(out[len(out)-maxTail:], "")
	}
	return out
}

// ansiEscape matches the colour and cursor sequences of a terminal.
var ansiEscape = regexp.MustCompile(`\x1b\[[0-9;?]*[ -/]*[@-~]`)

// UpgradeKubelet is UpgradeNode for a registered tenant's control-plane
// host, taken out of the tenant's Service: the static Pod manifests are
// held aside, so that the kubelet stops the control plane gracefully (a
// new kubelet restarted the old one's static Pods abruptly enough to reset
// a connection a client still held, seen in e2e), and the script
// waits up to wait seconds for the processes to exit. Without a
// kube-apiserver manifest kubeadm takes the host for a worker, so its
// kubelet-config phase runs as on a worker: the whole `kubeadm upgrade
// node` would also upgrade a control plane and addons, which the operator
// owns. The kubelet restarts at the new version, and the manifests go back
// whatever the script's outcome, which starts the control plane again.
// Run again (an interrupted step), it does the same.
func UpgradeKubelet(ctx context.Context, c *Client, wait int) (string, error) {
	script := fmt.Sprintf(`set -e
held=%[1]s
manifests=%[2]s
mkdir -p "$held" && chmod 0700 "$held"
restore() {
  for f in "$held"/*.yaml; do if [ -e "$f" ]; then mv -f "$f" "$manifests"/; fi; done
  rmdir "$held" 2>/dev/null || true
}
trap restore EXIT
for f in "$manifests"/*.yaml; do if [ -e "$f" ]; then mv -f "$f" "$held"/; fi; done
%[3]s
patches=
if [ -d %[4]s ]; then patches="--patches %[4]s"; fi
%[5]s --kubeconfig %[6]s $patches 2>&1
systemctl daemon-reload
systemctl restart kubelet
kubelet --version
`, heldManifestsDir, manifestsDir, waitForNoControlPlane(wait), patchesDir, kubeletConfigPhase, KubeletKubeconfig)
	out, err := c.RunScript(ctx, script)
	if err != nil {
		return out, fmt.Errorf("upgrading the kubelet of a control-plane host: %w\n%s", err, tail(out, 15))
	}
	return out, nil
}

var (
	// manifestsDir is the kubelet's static Pod directory.
	manifestsDir = "/etc/kubernetes/manifests"
	// heldManifestsDir holds the manifests while UpgradeKubelet runs;
	// under /etc/kubernetes, so that a reset removes it too.
	heldManifestsDir = "/etc/kubernetes/manifests-held"
	// kubeletConfigPhase rewrites the kubelet's configuration from the
	// tenant's kubelet-config ConfigMap.
	kubeletConfigPhase = "kubeadm upgrade node phase kubelet-config"
)

// UpgradeNode runs `kubeadm upgrade node` on a joined worker whose new
// node software Install has put in place, then restarts the kubelet on it.
// kubeadm rewrites the kubelet's configuration from the tenant's
// kubelet-config ConfigMap (with this host's patches, as at the join); the
// kubelet reads it and its new binary only on a restart. Run again, it
// does the same: the step is idempotent. SystemVerification is not fatal,
// as at the join: on cgroup v1 it fails unless the kubelet has
// failCgroupV1: false, which the join's patch gives it.
func UpgradeNode(ctx context.Context, c *Client) (string, error) {
	script := fmt.Sprintf(`set -e
patches=
if [ -d %[1]s ]; then patches="--patches %[1]s"; fi
kubeadm upgrade node $patches --ignore-preflight-errors=SystemVerification 2>&1
systemctl daemon-reload
systemctl restart kubelet
kubelet --version
`, patchesDir)
	out, err := c.RunScript(ctx, script)
	if err != nil {
		return out, fmt.Errorf("kubeadm upgrade node: %w\n%s", err, tail(out, 15))
	}
	return out, nil
}
