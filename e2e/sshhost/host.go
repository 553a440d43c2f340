package sshhost

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"
)

// HostOptions describe one test host.
type HostOptions struct {
	// Name is the container's name and hostname.
	Name string
	// Network is the Docker network (EnsureNetwork) the host joins.
	Network string
	// Image is EnsureImage's tag.
	Image string
	// IP optionally fixes the host's address on Network.
	IP string
	// RegistryMirror, e.g. "http://192.0.2.2:5000", is where the host's
	// containerd pulls registry.k8s.io, quay.io, ghcr.io and docker.io
	// images from (hosts.toml files under /etc/containerd/certs.d, which
	// the CRI plugin reads at every pull). It must be an address the
	// container can reach: the local registry's 127.0.0.1:5000 is the
	// machine's loopback, not the container's. Empty: no mirror files.
	RegistryMirror string
	// Timeout bounds the wait for systemd, sshd and containerd; default 2m.
	Timeout time.Duration
}

// Host is a running test host.
type Host struct {
	Name    string
	Address string // container IP on the network
	Port    int    // 22
	User    string // "root"
	// PrivateKeyPEM is the OpenSSH private key of the client key that
	// root's authorized_keys holds (fresh for every StartHost).
	PrivateKeyPEM []byte
	// HostKey is the host's own key, read back from the container after
	// it made it at boot: pin it with ssh.FixedHostKey.
	HostKey ssh.PublicKey
	// HostKeyAuthorized is HostKey in authorized_keys format.
	HostKeyAuthorized string
	// SystemState is what `systemctl is-system-running` said once the host
	// was up: "running", or "degraded" with the failed units in FailedUnits.
	SystemState string
	FailedUnits []string
	// StartupTime is how long StartHost took.
	StartupTime time.Duration
}

// Signer parses PrivateKeyPEM.
func (h *Host) Signer() (ssh.Signer, error) { return ssh.ParsePrivateKey(h.PrivateKeyPEM) }

// ClientConfig is an SSH client config for root with the client key and the
// pinned host key.
func (h *Host) ClientConfig() (*ssh.ClientConfig, error) {
	s, err := h.Signer()
	if err != nil {
		return nil, err
	}
	return &ssh.ClientConfig{
		User:              h.User,
		Auth:              []ssh.AuthMethod{ssh.PublicKeys(s)},
		HostKeyCallback:   ssh.FixedHostKey(h.HostKey),
		HostKeyAlgorithms: []string{h.HostKey.Type()},
		Timeout:           10 * time.Second,
	}, nil
}

// Dial opens an SSH connection to the host as root.
func (h *Host) Dial() (*ssh.Client, error) {
	cfg, err := h.ClientConfig()
	if err != nil {
		return nil, err
	}
	return ssh.Dial("tcp", net.JoinHostPort(h.Address, strconv.Itoa(h.Port)), cfg)
}

// EnsureNetwork creates a user-defined bridge network with the given subnet
// unless it exists (then its subnet must match).
func (d *Docker) EnsureNetwork(ctx context.Context, name, subnet string) error {
	gw, err := firstHost(subnet)
	if err != nil {
		return fmt.Errorf("network %s: %w", name, err)
	}
	out, err := d.run(ctx, nil, "network", "inspect", "--format", "{{range .IPAM.Config}}{{.Subnet}} {{end}}", name)
	if err == nil {
		for _, s := range strings.Fields(out) {
			if s == subnet {
				return nil
			}
		}
		return fmt.Errorf("network %s exists with subnet(s) %q, not %s", name, strings.TrimSpace(out), subnet)
	}
	// The gateway is the machine's address on the bridge. Given
	// explicitly, because Docker 20.10 leaves it out of the network's
	// IPAM config otherwise.
	if _, err := d.run(ctx, nil, "network", "create", "--driver", "bridge", "--subnet", subnet, "--gateway", gw,
		"--label", LabelKey+"="+name, name); err != nil {
		return fmt.Errorf("%w (dockerd log: %s)", err, d.LogFile)
	}
	d.mu.Lock()
	d.networks[name] = true
	d.mu.Unlock()
	return nil
}

// Gateway is the network's gateway: the machine's own address on it, which
// every container on the network can reach.
func (d *Docker) Gateway(ctx context.Context, network string) (string, error) {
	out, err := d.run(ctx, nil, "network", "inspect", "--format", "{{range .IPAM.Config}}{{.Subnet}}={{.Gateway}} {{end}}", network)
	if err != nil {
		return "", err
	}
	for _, f := range strings.Fields(out) {
		sub, gw, _ := strings.Cut(f, "=")
		if gw != "" {
			return gw, nil
		}
		// Docker's default: the subnet's first address.
		if ip, err := firstHost(sub); err == nil && strings.Contains(sub, ".") {
			return ip, nil
		}
	}
	return "", fmt.Errorf("network %s has no IPv4 gateway (%q)", network, strings.TrimSpace(out))
}

// firstHost is the first address of an IPv4 subnet ("172.31.250.0/24" ->
// "172.31.250.1").
func firstHost(subnet string) (string, error) {
	_, n, err := net.ParseCIDR(subnet)
	if err != nil {
		return "", err
	}
	ip := n.IP.To4()
	if ip == nil {
		return "", fmt.Errorf("%s is not an IPv4 subnet", subnet)
	}
	if ones, _ := n.Mask.Size(); ones > 30 {
		return "", fmt.Errorf("subnet %s is too small", subnet)
	}
	gw := make(net.IP, 4)
	copy(gw, ip)
	gw[3]++
	return gw.String(), nil
}

// StartHost runs one host container on the network and waits until systemd
// is up, sshd accepts the client key with the pinned host key and containerd
// answers. Every call makes a fresh ed25519 client key (authorized for root);
// the container makes its own host key at boot, which is read back and
// returned for callers to pin. A container of the same name is replaced.
func (d *Docker) StartHost(ctx context.Context, opts HostOptions) (*Host, error) {
	start := time.Now()
	if opts.Name == "" || opts.Network == "" || opts.Image == "" {
		return nil, errors.New("StartHost: Name, Network and Image are required")
	}
	if opts.Timeout == 0 {
		opts.Timeout = 2 * time.Minute
	}
	mirror, err := mirrorFiles(opts.RegistryMirror)
	if err != nil {
		return nil, err
	}
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	sshPub, err := ssh.NewPublicKey(pub)
	if err != nil {
		return nil, err
	}
	block, err := ssh.MarshalPrivateKey(priv, "apiary-e2e@"+opts.Name)
	if err != nil {
		return nil, err
	}
	keyPEM := pem.EncodeToMemory(block)

	if err := d.RemoveHost(ctx, opts.Name); err != nil {
		return nil, err
	}
	args := []string{"create",
		"--name", opts.Name, "--hostname", opts.Name,
		"--network", opts.Network,
		"--label", LabelKey + "=" + opts.Name,
		// What a kubelet needs from its machine, as kind's nodes get it
		// from --privileged: every capability, every device, no seccomp
		// or AppArmor filter, writable /proc/sys. Not --privileged itself:
		// Docker 20.10 then asks runc for every capability it knows,
		// ignoring --cap-drop, and runc fails ("unable to apply caps:
		// operation not permitted") because this machine's bounding set
		// lacks CAP_SYS_RESOURCE. So: all capabilities minus the ones the
		// machine lacks, all devices allowed, and no masked or read-only
		// /proc paths. What --privileged would also do, a writable
		// /sys/fs/cgroup, the entrypoint does (the cgroup namespace below
		// keeps that to the container's own cgroups).
		"--cap-add", "ALL",
	}
	for _, c := range missingCaps() {
		args = append(args, "--cap-drop", c)
	}
	args = append(args,
		"--device-cgroup-rule", "a *:* rwm",
		"--security-opt", "systempaths=unconfined",
		"--security-opt", "seccomp=unconfined",
		"--security-opt", "apparmor=unconfined",
		// The container's cgroups appear as the root of every hierarchy
		// (cgroup v1 here): systemd manages them as its own, and the
		// kubelet's paths match /proc/self/cgroup.
		"--cgroupns", "private",
		// systemd expects tmpfs on /run and /tmp; exec is allowed as on a
		// machine (Docker's --tmpfs default is noexec).
		"--tmpfs", "/run:rw,exec,nosuid,nodev,mode=755",
		"--tmpfs", "/tmp:rw,exec,nosuid,nodev,mode=1777",
		// containerd's overlayfs snapshots cannot sit on the container's
		// overlayfs root: /var is a volume on the machine's filesystem.
		"--volume", "/var",
		"--env", "container=docker",
		// systemd shuts down cleanly on SIGRTMIN+3 (SIGTERM would make it
		// re-execute); `docker import` cannot set STOPSIGNAL.
		"--stop-signal", "SIGRTMIN+3",
		"--stop-timeout", "10",
	)
	// The kubelet's OOM watcher reads /dev/kmsg; a container that is not
	// --privileged only gets the devices it is given.
	if _, err := os.Stat("/dev/kmsg"); err == nil {
		args = append(args, "--device", "/dev/kmsg")
	}
	if fi, err := os.Stat("/lib/modules"); err == nil && fi.IsDir() {
		args = append(args, "--volume", "/lib/modules:/lib/modules:ro")
	}
	if opts.IP != "" {
		args = append(args, "--ip", opts.IP)
	}
	args = append(args, opts.Image)
	if _, err := d.run(ctx, nil, args...); err != nil {
		return nil, fmt.Errorf("%w (dockerd log: %s)", err, d.LogFile)
	}
	d.mu.Lock()
	d.containers[opts.Name] = true
	d.mu.Unlock()

	files := map[string][]byte{"root/.ssh/authorized_keys": ssh.MarshalAuthorizedKey(sshPub)}
	for p, c := range mirror {
		files[p] = c
	}
	tarball, err := tarOf(files)
	if err != nil {
		return nil, err
	}
	if _, err := d.run(ctx, bytes.NewReader(tarball), "cp", "-", opts.Name+":/"); err != nil {
		return nil, err
	}
	if _, err := d.run(ctx, nil, "start", opts.Name); err != nil {
		return nil, fmt.Errorf("%w (dockerd log: %s)", err, d.LogFile)
	}

	h := &Host{Name: opts.Name, Port: 22, User: "root", PrivateKeyPEM: keyPEM}
	wctx, cancel := context.WithTimeout(ctx, opts.Timeout)
	defer cancel()
	if err := d.waitHost(wctx, h, opts.Network); err != nil {
		return nil, fmt.Errorf("host %s: %w\n%s", opts.Name, err, d.diagnose(ctx, opts.Name))
	}
	// Docker points a container on a user-defined network at its embedded
	// DNS server, 127.0.0.11. A loopback nameserver in a node's
	// resolv.conf makes the tenant's CoreDNS (dnsPolicy Default: the
	// node's resolv.conf) forward to itself; its loop plugin detects that
	// and exits. A real host has its upstream nameservers there (or
	// systemd-resolved, which kubeadm detects): so does this one.
	ns, err := d.upstreamNameservers(ctx, opts.Network)
	if err != nil {
		return nil, err
	}
	var conf strings.Builder
	for _, n := range ns {
		fmt.Fprintf(&conf, "nameserver %s\n", n)
	}
	if _, err := d.run(ctx, strings.NewReader(conf.String()), "exec", "-i", opts.Name, "sh", "-c", "cat > /etc/resolv.conf"); err != nil {
		return nil, fmt.Errorf("host %s: writing /etc/resolv.conf: %w", opts.Name, err)
	}
	h.StartupTime = time.Since(start)
	return h, nil
}

// upstreamNameservers are this machine's non-loopback nameservers, else the
// network's gateway (this machine).
func (d *Docker) upstreamNameservers(ctx context.Context, network string) ([]string, error) {
	var out []string
	if b, err := os.ReadFile("/etc/resolv.conf"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			f := strings.Fields(l)
			if len(f) < 2 || f[0] != "nameserver" {
				continue
			}
			if ip := net.ParseIP(f[1]); ip != nil && !ip.IsLoopback() {
				out = append(out, f[1])
			}
		}
	}
	if len(out) > 0 {
		return out, nil
	}
	gw, err := d.Gateway(ctx, network)
	if err != nil {
		return nil, err
	}
	return []string{gw}, nil
}

// waitHost waits for, in turn: systemd to finish booting, the host key, the
// address, an SSH session with the pinned key, and containerd.
func (d *Docker) waitHost(ctx context.Context, h *Host, network string) error {
	var last error
	step := func(what string, f func() error) error {
		for {
			err := f()
			if err == nil {
				return nil
			}
			last = err
			if !d.running(ctx, h.Name) {
				return fmt.Errorf("container exited while waiting for %s: %v", what, last)
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("waiting for %s: %v (last: %v)", what, ctx.Err(), last)
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
	err := step("systemd", func() error {
		// Exits non-zero for every state but "running"; the output is
		// what counts. "starting": not done yet. Before dbus is up it
		// prints nothing and fails.
		out, _ := d.Exec(ctx, h.Name, "systemctl", "is-system-running")
		switch st := strings.TrimSpace(out); st {
		case "running", "degraded":
			h.SystemState = st
			return nil
		case "":
			return errors.New("systemd not answering yet")
		default:
			return fmt.Errorf("system state %q", st)
		}
	})
	if err != nil {
		return err
	}
	if h.SystemState == "degraded" {
		out, _ := d.Exec(ctx, h.Name, "systemctl", "list-units", "--failed", "--plain", "--no-legend", "--no-pager")
		for _, l := range strings.Split(out, "\n") {
			if f := strings.Fields(l); len(f) > 0 {
				h.FailedUnits = append(h.FailedUnits, f[0])
			}
		}
	}
	if err := step("the SSH host key", func() error {
		out, err := d.Exec(ctx, h.Name, "cat", "/etc/ssh/ssh_host_ed25519_key.pub")
		if err != nil {
			return err
		}
		k, _, _, _, err := ssh.ParseAuthorizedKey([]byte(out))
		if err != nil {
			return fmt.Errorf("parsing the host key %q: %w", out, err)
		}
		h.HostKey = k
		h.HostKeyAuthorized = strings.TrimSpace(string(ssh.MarshalAuthorizedKey(k)))
		return nil
	}); err != nil {
		return err
	}
	if err := step("the address", func() error {
		ip, err := d.address(ctx, h.Name, network)
		h.Address = ip
		return err
	}); err != nil {
		return err
	}
	if err := step("sshd", func() error {
		c, err := h.Dial()
		if err != nil {
			return err
		}
		defer c.Close()
		s, err := c.NewSession()
		if err != nil {
			return err
		}
		defer s.Close()
		return s.Run("true")
	}); err != nil {
		return err
	}
	return step("containerd", func() error {
		// Both halves: the client's and the daemon's version.
		out, err := d.Exec(ctx, h.Name, "ctr", "--address", "/run/containerd/containerd.sock", "version")
		if err != nil {
			return err
		}
		if !strings.Contains(out, "Server:") {
			return fmt.Errorf("ctr version: %s", out)
		}
		return nil
	})
}

func (d *Docker) running(ctx context.Context, name string) bool {
	out, err := d.run(ctx, nil, "inspect", "--format", "{{.State.Running}}", name)
	return err == nil && strings.TrimSpace(out) == "true"
}

func (d *Docker) address(ctx context.Context, name, network string) (string, error) {
	out, err := d.run(ctx, nil, "inspect", "--format", "{{json .NetworkSettings.Networks}}", name)
	if err != nil {
		return "", err
	}
	var nets map[string]struct{ IPAddress string }
	if err := json.Unmarshal([]byte(out), &nets); err != nil {
		return "", err
	}
	n, ok := nets[network]
	if !ok || n.IPAddress == "" {
		return "", fmt.Errorf("no address on network %s yet", network)
	}
	return n.IPAddress, nil
}

// diagnose gathers what explains a host that did not come up.
func (d *Docker) diagnose(ctx context.Context, name string) string {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 20*time.Second)
	defer cancel()
	var b strings.Builder
	if out, err := d.run(ctx, nil, "logs", "--tail", "30", name); err == nil {
		fmt.Fprintf(&b, "--- docker logs %s (tail)\n%s", name, out)
	}
	if out, err := d.Exec(ctx, name, "systemctl", "list-units", "--failed", "--no-pager"); err == nil || out != "" {
		fmt.Fprintf(&b, "--- systemctl --failed\n%s", out)
	}
	if out, err := d.Exec(ctx, name, "journalctl", "-b", "--no-pager", "-n", "40", "-p", "warning"); err == nil || out != "" {
		fmt.Fprintf(&b, "--- journal warnings (tail)\n%s", out)
	}
	fmt.Fprintf(&b, "--- dockerd log: %s", d.LogFile)
	return b.String()
}

// Exec runs a command inside the container with `docker exec` and returns
// its standard output; on failure the error holds its standard error.
func (d *Docker) Exec(ctx context.Context, name string, args ...string) (string, error) {
	return d.run(ctx, nil, append([]string{"exec", name}, args...)...)
}

// RemoveHost removes the container and its /var volume. A missing container
// is not an error.
func (d *Docker) RemoveHost(ctx context.Context, name string) error {
	_, err := d.run(ctx, nil, "rm", "--force", "--volumes", name)
	if err != nil && !strings.Contains(err.Error(), "No such container") {
		return err
	}
	d.mu.Lock()
	delete(d.containers, name)
	d.mu.Unlock()
	return nil
}

// capNames are the capabilities by number (linux/capability.h).
var capNames = []string{
	"CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID",
	"SETPCAP", "LINUX_IMMUTABLE", "NET_BIND_SERVICE", "NET_BROADCAST", "NET_ADMIN", "NET_RAW",
	"IPC_LOCK", "IPC_OWNER", "SYS_MODULE", "SYS_RAWIO", "SYS_CHROOT", "SYS_PTRACE", "SYS_PACCT",
	"SYS_ADMIN", "SYS_BOOT", "SYS_NICE", "SYS_RESOURCE", "SYS_TIME", "SYS_TTY_CONFIG", "MKNOD",
	"LEASE", "AUDIT_WRITE", "AUDIT_CONTROL", "SETFCAP", "MAC_OVERRIDE", "MAC_ADMIN", "SYSLOG",
	"WAKE_ALARM", "BLOCK_SUSPEND", "AUDIT_READ", "PERFMON", "BPF", "CHECKPOINT_RESTORE",
}

// missingCaps lists the capabilities (up to CHECKPOINT_RESTORE) that this
// process's bounding set lacks, and so no container started from here can
// have.
func missingCaps() []string {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return nil
	}
	for _, l := range strings.Split(string(b), "\n") {
		v, ok := strings.CutPrefix(l, "CapBnd:")
		if !ok {
			continue
		}
		bnd, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
		if err != nil {
			return nil
		}
		var out []string
		for i, n := range capNames {
			if bnd&(1<<uint(i)) == 0 {
				out = append(out, n)
			}
		}
		return out
	}
	return nil
}

// mirrorRegistries are the registries whose pulls go to the mirror.
var mirrorRegistries = []string{"registry.k8s.io", "quay.io", "ghcr.io", "docker.io"}

// mirrorFiles renders the hosts.toml files for a mirror URL: the mirror is
// the "server" itself (no fallback to the upstream registry, which is not
// reachable anyway), plain HTTP. The mirror's own host:port gets one too,
// so that images named by the mirror's address are pulled over HTTP.
func mirrorFiles(mirror string) (map[string][]byte, error) {
	if mirror == "" {
		return nil, nil
	}
	u, err := url.Parse(mirror)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("RegistryMirror %q: want http(s)://host:port", mirror)
	}
	content := fmt.Appendf(nil, "server = %q\ncapabilities = [\"pull\", \"resolve\"]\nskip_verify = true\n", strings.TrimSuffix(mirror, "/"))
	out := map[string][]byte{}
	for _, r := range append(append([]string(nil), mirrorRegistries...), u.Host) {
		out["etc/containerd/certs.d/"+r+"/hosts.toml"] = content
	}
	return out, nil
}

// tarOf packs files (with their parent directories) for `docker cp -`.
// root/.ssh is 0700 and its files 0600, as sshd's StrictModes wants.
func tarOf(files map[string][]byte) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	seen := map[string]bool{}
	now := time.Now()
	for _, name := range sortedKeys(files) {
		parts := strings.Split(name, "/")
		for i := 1; i < len(parts); i++ {
			dir := strings.Join(parts[:i], "/")
			if seen[dir] || dir == "root" || dir == "etc" {
				continue
			}
			seen[dir] = true
			mode := int64(0o755)
			if strings.HasPrefix(dir, "root/") {
				mode = 0o700
			}
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: dir + "/", Mode: mode, ModTime: now}); err != nil {
				return nil, err
			}
		}
		mode := int64(0o644)
		if strings.HasPrefix(name, "root/") {
			mode = 0o600
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(files[name])), ModTime: now}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(files[name]); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
