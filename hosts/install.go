package hosts

import (
	"context"
	"fmt"
	"io"
	"path"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/pkg/sftp"
)

// Paths on a host. Everything the agent puts there is listed here, so that
// reset removes exactly that.
const (
	stateDir   = "/var/lib/apiary"
	bundleDir  = stateDir + "/bundle"
	stagingDir = stateDir + "/staging"
	// installedList names every file Install put on the host, one per line.
	installedList = stateDir + "/installed"

	kubeletUnitPath   = "/etc/systemd/system/kubelet.service"
	kubeletDropInDir  = "/etc/systemd/system/kubelet.service.d"
	kubeletDropInPath = kubeletDropInDir + "/10-kubeadm.conf"
	sysctlPath        = "/etc/sysctl.d/99-apiary-kubernetes.conf"
	modulesPath       = "/etc/modules-load.d/apiary-kubernetes.conf"
)

// NodeBinaries are installed from the bundle, at the same paths as in it.
var NodeBinaries = []string{"/usr/bin/kubelet", "/usr/bin/kubeadm", "/usr/bin/kubectl"}

// CNIPluginDir holds the CNI plugins of the bundle on the host.
const CNIPluginDir = "/opt/cni/bin"

// kubeletUnit and kubeletDropIn are kubeadm's: the kubelet runs from the
// configuration kubeadm join writes (config.yaml, kubeadm-flags.env).
const kubeletUnit = `[Unit]
Description=kubelet: The Kubernetes Node Agent (installed by Apiary)
Documentation=https://kubernetes.io/docs/
Wants=network-online.target
After=network-online.target containerd.service

[Service]
ExecStart=/usr/bin/kubelet
Restart=always
StartLimitInterval=0
RestartSec=10

[Install]
WantedBy=multi-user.target
`

const kubeletDropIn = `[Service]
Environment="KUBELET_KUBECONFIG_ARGS=--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf --kubeconfig=/etc/kubernetes/kubelet.conf"
Environment="KUBELET_CONFIG_ARGS=--config=/var/lib/kubelet/config.yaml"
EnvironmentFile=-/var/lib/kubelet/kubeadm-flags.env
EnvironmentFile=-/etc/default/kubelet
ExecStart=
ExecStart=/usr/bin/kubelet $KUBELET_KUBECONFIG_ARGS $KUBELET_CONFIG_ARGS $KUBELET_KUBEADM_ARGS $KUBELET_EXTRA_ARGS
`

// Bundle is a node bundle image resolved to its digest: nothing changes
// under the agent while it installs, even if the tag moves.
type Bundle struct {
	// Ref is the reference with the digest (repo@sha256:...).
	Ref    string
	Digest string
	layers []v1.Layer
}

// ResolveBundle reads a node bundle's manifest from its registry.
func ResolveBundle(ctx context.Context, ref string, insecure bool) (*Bundle, error) {
	var opts []name.Option
	if insecure {
		opts = append(opts, name.Insecure)
	}
	r, err := name.ParseReference(ref, opts...)
	if err != nil {
		return nil, fmt.Errorf("node bundle reference %q: %w", ref, err)
	}
	img, err := remote.Image(r, remote.WithContext(ctx))
	if err != nil {
		return nil, fmt.Errorf("reading node bundle %s: %w", ref, err)
	}
	d, err := img.Digest()
	if err != nil {
		return nil, fmt.Errorf("node bundle %s: %w", ref, err)
	}
	layers, err := img.Layers()
	if err != nil {
		return nil, fmt.Errorf("node bundle %s layers: %w", ref, err)
	}
	return &Bundle{Ref: r.Context().Name() + "@" + d.String(), Digest: d.String(), layers: layers}, nil
}

// Install copies the bundle's layers to the host over SFTP, verifies each
// against its digest on the host, installs the node binaries, the CNI
// plugins and kubeadm's kubelet unit, and enables (does not start) the
// kubelet. It is idempotent: a layer already on the host with the right
// digest is not copied again, so an interrupted install resumes. When ctx
// ends during the copy, c's connection is closed (see sftp).
func Install(ctx context.Context, c *Client, b *Bundle) error {
	if _, err := c.RunScript(ctx, fmt.Sprintf("set -e\nmkdir -p %s %s\nchmod 0700 %s\n", bundleDir, stagingDir, stateDir)); err != nil {
		return fmt.Errorf("install: %w", err)
	}
	sc, err := c.sftp(ctx)
	if err != nil {
		return err
	}
	defer sc.Close()

	var verify, extract strings.Builder
	for _, l := range b.layers {
		d, err := l.Digest()
		if err != nil {
			return fmt.Errorf("install: %w", err)
		}
		file := path.Join(bundleDir, d.Hex+".tar.gz")
		if err := upload(ctx, c, sc, l, file, d.Hex); err != nil {
			return fmt.Errorf("install: copying layer %s: %w", d, err)
		}
		fmt.Fprintf(&verify, "echo '%s  %s' | sha256sum -c --quiet -\n", d.Hex, file)
		fmt.Fprintf(&extract, "tar -xzf %s -C %s\n", file, stagingDir)
	}
	var install strings.Builder
	fmt.Fprintf(&install, ": > %s\n", installedList)
	for _, bin := range NodeBinaries {
		fmt.Fprintf(&install, "install -m 0755 %s%s %s\necho %s >> %s\n", stagingDir, bin, bin, bin, installedList)
	}
	fmt.Fprintf(&install, "mkdir -p %s\nfor p in %s%s/*; do install -m 0755 \"$p\" %s/; echo %s/\"$(basename \"$p\")\" >> %s; done\n",
		CNIPluginDir, stagingDir, CNIPluginDir, CNIPluginDir, CNIPluginDir, installedList)
	script := "set -e\n" + verify.String() +
		fmt.Sprintf("rm -rf %s\nmkdir -p %s\n", stagingDir, stagingDir) + extract.String() + install.String() +
		fmt.Sprintf("rm -rf %s\n", stagingDir) +
		writeFile(kubeletUnitPath, kubeletUnit) +
		fmt.Sprintf("mkdir -p %s\n", kubeletDropInDir) + writeFile(kubeletDropInPath, kubeletDropIn) +
		writeFile(modulesPath, "overlay\nbr_netfilter\n") +
		writeFile(sysctlPath, "net.ipv4.ip_forward = 1\nnet.bridge.bridge-nf-call-iptables = 1\nnet.bridge.bridge-nf-call-ip6tables = 1\n") +
		// In a container some of these are read-only; what a kubelet
		// needs was checked by preflight.
		fmt.Sprintf("sysctl -p %s >/dev/null 2>&1 || true\n", sysctlPath) +
		"mkdir -p /etc/kubernetes/manifests\n" +
		"systemctl daemon-reload\nsystemctl enable kubelet >/dev/null 2>&1\n" +
		"/usr/bin/kubelet --version\n"
	if _, err := c.RunScript(ctx, script); err != nil {
		return fmt.Errorf("install: %w", err)
	}
	return nil
}

// sftp opens an SFTP session that obeys ctx. SFTP calls, the handshake
// included, take no context: a host that stops answering would hold the
// step forever, so when ctx ends the whole SSH connection is closed, which
// fails whatever call waits on it (the Client is unusable afterwards).
// Closing only the session is not enough: OpenSSH answers a session's
// close once its subsystem has exited, and an sftp-server that is stopped
// (SIGSTOP, a hung disk) never exits, so reads and writes on the session
// would wait forever (measured on the e2e hosts; x/crypto/ssh's own server
// answers at once, which hid it).
func (c *Client) sftp(ctx context.Context) (*sftp.Client, error) {
	s, err := c.c.NewSession()
	if err != nil {
		return nil, &Error{ReasonUnreachable, fmt.Errorf("install: opening an SSH session for SFTP: %w", err)}
	}
	stop := context.AfterFunc(ctx, func() {
		_ = s.Close()
		_ = c.c.Close()
	})
	fail := func(what string, err error) (*sftp.Client, error) {
		stop()
		_ = s.Close()
		if ctx.Err() != nil {
			err = context.Cause(ctx)
		}
		return nil, &Error{ReasonCommandFailed, fmt.Errorf("install: %s: %w", what, err)}
	}
	w, err := s.StdinPipe()
	if err != nil {
		return fail("starting SFTP", err)
	}
	r, err := s.StdoutPipe()
	if err != nil {
		return fail("starting SFTP", err)
	}
	if err := s.RequestSubsystem("sftp"); err != nil {
		return fail("starting SFTP", err)
	}
	sc, err := sftp.NewClientPipe(r, w)
	if err != nil {
		return fail("starting SFTP (handshake)", err)
	}
	go func() {
		_ = sc.Wait()
		stop()
		_ = s.Close()
	}()
	return sc, nil
}

// upload copies one layer unless the host has it with the right digest.
func upload(ctx context.Context, c *Client, sc *sftp.Client, l v1.Layer, file, hex string) error {
	if out, err := c.RunScript(ctx, fmt.Sprintf("sha256sum %s 2>/dev/null | cut -d' ' -f1\n", file)); err == nil && strings.TrimSpace(out) == hex {
		return nil
	}
	rc, err := l.Compressed()
	if err != nil {
		return err
	}
	defer rc.Close()
	tmp := file + ".part"
	f, err := sc.Create(tmp)
	if err != nil {
		return &Error{ReasonCommandFailed, fmt.Errorf("creating %s: %w", tmp, err)}
	}
	if _, err := io.Copy(f, rc); err != nil {
		f.Close()
		if ctx.Err() != nil {
			return fmt.Errorf("writing %s: %w", tmp, context.Cause(ctx))
		}
		return &Error{ReasonCommandFailed, fmt.Errorf("writing %s: %w", tmp, err)}
	}
	if err := f.Close(); err != nil {
		return &Error{ReasonCommandFailed, err}
	}
	_ = sc.Remove(file)
	if err := sc.Rename(tmp, file); err != nil {
		return &Error{ReasonCommandFailed, fmt.Errorf("renaming %s: %w", tmp, err)}
	}
	return nil
}

// writeFile is a script line that writes content to p (content must not
// contain the heredoc marker).
func writeFile(p, content string) string {
	return fmt.Sprintf("cat > %s <<'APIARY_EOF'\n%sAPIARY_EOF\n", p, content)
}

// UninstallScript removes everything Install put on the host.
func UninstallScript() string {
	var b strings.Builder
	b.WriteString("systemctl disable --now kubelet >/dev/null 2>&1 || true\n")
	fmt.Fprintf(&b, "[ -f %s ] && xargs -r rm -f < %s\n", installedList, installedList)
	fmt.Fprintf(&b, "rm -f %s %s %s %s\n", kubeletUnitPath, kubeletDropInPath, sysctlPath, modulesPath)
	fmt.Fprintf(&b, "rmdir %s 2>/dev/null || true\nrm -rf %s\n", kubeletDropInDir, stateDir)
	b.WriteString("systemctl daemon-reload\n")
	return b.String()
}
