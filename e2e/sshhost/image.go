package sshhost

import (
	"archive/tar"
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"
)

// Image recipe. Any change to it (packages, files, units, binaries) changes
// the tag, so a stale image is never reused.
const (
	// ImageRepo is the repository of the test-host image; the tag is the
	// recipe's hash.
	ImageRepo = "apiary-testhost"
	// Suite is the Debian release the hosts run.
	Suite = "bookworm"
	// ContainerdVersion is the from-source containerd copied into the image
	// from $APIARY_CACHE/bin/containerd-<version> (hack/build-upstream.sh
	// containerd).
	ContainerdVersion = "v2.4.2"
	// SandboxImage is containerd's pinned pause image (what the management
	// cluster's registry serves).
	SandboxImage = "registry.k8s.io/pause:3.10"
	// recipeVersion is bumped for changes that the hashed inputs below do
	// not show (e.g. how the tar is put together).
	recipeVersion = "1"
	// DefaultMirror is where debootstrap fetches packages; APIARY_DEBIAN_MIRROR
	// overrides it. The mirror is not part of the recipe hash.
	DefaultMirror = "http://deb.debian.org/debian"
)

// Packages are what debootstrap installs on top of the minbase variant
// (which already has bash, coreutils, apt, dpkg, mount, util-linux).
// ethtool and ebtables exist in bookworm; iputils-ping is for the tests'
// reachability checks; openssh-sftp-server is what the host agent copies
// kubelet and kubeadm with.
var Packages = []string{
	"systemd", "systemd-sysv", "dbus",
	"openssh-server", "openssh-sftp-server",
	"runc", "iptables", "conntrack", "ebtables", "ethtool", "iproute2", "kmod",
	"ca-certificates", "socat", "procps", "util-linux", "mount", "iputils-ping",
}

// masked units: each fails or does harm in a container. udev needs a
// writable /sys; binfmt_misc, debugfs, tracefs, configfs and fusectl are
// not namespaced, so mounting or writing them would act on the machine;
// journald's audit socket would read the machine's audit log (audit is not
// namespaced either); modules-load has no /lib/modules here; the timers
// only add load (apt has nothing to fetch from in tests).
var maskedUnits = []string{
	"systemd-udevd.service", "systemd-udevd-control.socket", "systemd-udevd-kernel.socket",
	"systemd-udev-trigger.service", "systemd-udev-settle.service",
	"systemd-binfmt.service", "proc-sys-fs-binfmt_misc.automount", "proc-sys-fs-binfmt_misc.mount",
	"sys-kernel-config.mount", "sys-kernel-debug.mount", "sys-kernel-tracing.mount",
	"sys-fs-fuse-connections.mount",
	"systemd-journald-audit.socket",
	"systemd-modules-load.service",
	"apt-daily.timer", "apt-daily-upgrade.timer", "dpkg-db-backup.timer", "fstrim.timer", "e2scrub_all.timer",
	"getty.target", "console-getty.service",
}

// enabledUnits are linked into multi-user.target.wants.
var enabledUnits = []string{"containerd.service", "apiary-ssh-hostkey.service"}

// removedFromBase are dropped from the debootstrapped tree: the host keys
// that openssh-server's postinst made (every container makes its own at
// boot), the package caches and apt lists (tests install nothing with apt).
func removedFromBase(p string) bool {
	switch {
	case strings.HasPrefix(p, "etc/ssh/ssh_host_"):
		return true
	case strings.HasPrefix(p, "var/cache/apt/archives/") && strings.HasSuffix(p, ".deb"):
		return true
	case strings.HasPrefix(p, "var/lib/apt/lists/") && p != "var/lib/apt/lists/" && !strings.HasSuffix(p, "/lock") && !strings.HasPrefix(p, "var/lib/apt/lists/partial"):
		return true
	case strings.HasPrefix(p, "debootstrap/"), p == "debootstrap":
		return true
	}
	return false
}

// imageFile is one file the recipe puts into the image.
type imageFile struct {
	mode    int64
	content string
	link    string // a symlink to this target instead of a file
	src     string // copied from this host path instead of content
}

// entrypoint runs before systemd in every container. What it does is what a
// machine has and a container lacks; kind's node entrypoint does the same.
const entrypoint = `#!/bin/bash
# apiary test host: container fix-ups, then exec systemd as PID 1.
set -o errexit -o nounset -o pipefail

# The kubelet's OOM watcher reads /dev/kmsg.
if [[ ! -e /dev/kmsg ]]; then
  ln -s /dev/console /dev/kmsg || true
fi

# systemd treats a read-only /sys as "container: leave devices alone"
# (Docker mounts it read-only; this makes sure). /sys/fs/cgroup is a mount
# of its own.
mount -o remount,ro /sys

# systemd and the kubelet write cgroups; Docker mounts them read-only in a
# container that is not --privileged. The container has its own cgroup
# namespace: what is mounted here is its own subtree, not the machine's.
findmnt -rn -o TARGET,FSTYPE -R /sys/fs/cgroup | while read -r target fstype; do
  case $fstype in
    tmpfs) mount -o remount,rw "$target" ;;
    cgroup|cgroup2) mount -o remount,bind,rw "$target" ;;
  esac
done

# Mount propagation: the kubelet and containerd need shared mounts
# (Bidirectional volume mounts, netns and sandbox mounts).
mount --make-rshared /

# Every host gets its own machine-id (the kubelet reports it; two nodes
# with one machine-id confuse Kubernetes).
rm -f /etc/machine-id
systemd-machine-id-setup >/dev/null

# Distinct product_uuid per host (kubeadm and the kubelet read it; all
# containers would otherwise share the machine's).
uuid=/etc/apiary-product_uuid
[[ -s $uuid ]] || cat /proc/sys/kernel/random/uuid > "$uuid"
for f in /sys/class/dmi/id/product_uuid /sys/devices/virtual/dmi/id/product_uuid; do
  if [[ -f $f ]]; then mount -o ro,bind "$uuid" "$f" || true; fi
done

exec "$@"
`

// containerdConfig is /etc/containerd/config.toml. restrict_oom_score_adj:
// the machine lacks CAP_SYS_RESOURCE (so does a privileged container on it),
// and without it every sandbox fails ("runc create failed: ... can't get
// final child's PID from pipe: EOF") when the kubelet asks for -998.
// SystemdCgroup: the host runs systemd, so the kubelet will use kubeadm's
// default cgroupDriver systemd, and runc must match it. config_path: the
// per-registry mirror files StartHost writes (HostOptions.RegistryMirror).
var containerdConfig = fmt.Sprintf(`version = 3
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.erofs", "io.containerd.differ.v1.erofs"]

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = %q
  [plugins."io.containerd.cri.v1.images".registry]
    config_path = "/etc/containerd/certs.d"

[plugins."io.containerd.cri.v1.runtime"]
  enable_selinux = false
  restrict_oom_score_adj = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "/usr/sbin/runc"
        SystemdCgroup = true
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["/opt/cni/bin"]
    conf_dir = "/etc/cni/net.d"
`, SandboxImage)

// containerdUnit is upstream's containerd.service without OOMScoreAdjust
// (lowering it needs CAP_SYS_RESOURCE, which the machine lacks).
const containerdUnit = `[Unit]
Description=containerd container runtime
Documentation=https://containerd.io
After=network.target local-fs.target dbus.service

[Service]
ExecStartPre=-/sbin/modprobe overlay
ExecStart=/usr/local/bin/containerd
Type=notify
Delegate=yes
KillMode=process
Restart=always
RestartSec=2
LimitNPROC=infinity
LimitCORE=infinity
TasksMax=infinity

[Install]
WantedBy=multi-user.target
`

// hostKeyUnit makes this container's SSH host keys at first boot, so that
// no two hosts (nor two runs) share one; StartHost reads the ed25519 public
// key back for callers to pin. All three types, as a stock Debian or Ubuntu
// host has them: a client must negotiate the pinned one among them.
const hostKeyUnit = `[Unit]
Description=Generate this host's SSH host keys
Before=ssh.service
ConditionPathExists=!/etc/ssh/ssh_host_ed25519_key

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/bin/ssh-keygen -A

[Install]
WantedBy=multi-user.target
`

// sshdConfig comes before the rest of Debian's sshd_config (it Includes
// sshd_config.d/*.conf first, and the first value of a keyword wins).
const sshdConfig = `# apiary test host: key-only root login, the stock host key set.
HostKey /etc/ssh/ssh_host_rsa_key
HostKey /etc/ssh/ssh_host_ecdsa_key
HostKey /etc/ssh/ssh_host_ed25519_key
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
UseDNS no
`

// kubeletDefaults sets KUBELET_EXTRA_ARGS: eviction only when a filesystem
// is nearly full, image garbage collection late.
const kubeletDefaults = `KUBELET_EXTRA_ARGS=--eviction-hard=memory.available<100Mi,nodefs.available<2%,nodefs.inodesFree<2%,imagefs.available<2% --image-gc-high-threshold=95 --image-gc-low-threshold=90
`

// imageFiles are written over the debootstrapped tree.
func imageFiles(cache string) map[string]imageFile {
	cbin := filepath.Join(cache, "bin", "containerd-"+ContainerdVersion)
	f := map[string]imageFile{
		"usr/local/sbin/apiary-entrypoint":                     {mode: 0o755, content: entrypoint},
		"etc/containerd/config.toml":                           {mode: 0o644, content: containerdConfig},
		"etc/containerd/certs.d/":                              {mode: 0o755},
		"etc/systemd/system/containerd.service":                {mode: 0o644, content: containerdUnit},
		"etc/systemd/system/apiary-ssh-hostkey.service":        {mode: 0o644, content: hostKeyUnit},
		"etc/ssh/sshd_config.d/00-apiary.conf":                 {mode: 0o644, content: sshdConfig},
		"etc/crictl.yaml":                                      {mode: 0o644, content: "runtime-endpoint: unix:///run/containerd/containerd.sock\nimage-endpoint: unix:///run/containerd/containerd.sock\n"},
		"etc/cni/net.d/":                                       {mode: 0o755},
		"opt/cni/bin/":                                         {mode: 0o755},
		"etc/systemd/system/default.target":                    {link: "/lib/systemd/system/multi-user.target"},
		"etc/systemd/journald.conf.d/00-apiary-container.conf": {mode: 0o644, content: "# The kernel log is the machine's, not this host's.\n[Journal]\nReadKMsg=no\n"},
		// ip_forward is per network namespace and starts at 0 in a
		// container's; kubeadm's preflight wants it on. The bridge
		// netfilter switches are per namespace too (and may be missing).
		"etc/sysctl.d/90-apiary-kubernetes.conf": {mode: 0o644, content: "net.ipv4.ip_forward = 1\n-net.bridge.bridge-nf-call-iptables = 1\n-net.bridge.bridge-nf-call-ip6tables = 1\n"},
		// Empty: the entrypoint makes a fresh one per container.
		"etc/machine-id": {mode: 0o444, content: ""},
		"etc/hostname":   {mode: 0o644, content: "apiary-testhost\n"},
		// pam_env reads it at every SSH login (and warns when missing).
		"etc/default/locale": {mode: 0o644, content: "LANG=C.UTF-8\n"},
		// The host owner's kubelet flags (the unit the host agent installs
		// reads this file). The hosts' /var is this machine's disk, which
		// Go's build cache keeps well below kubeadm's default imagefs
		// threshold (15 % free): the kubelet would taint every Node with
		// disk-pressure and evict the tests' pods. These are the management
		// cluster's own kubelet thresholds (e2e/cluster).
		"etc/default/kubelet": {mode: 0o644, content: kubeletDefaults},
	}
	for _, b := range []string{"containerd", "containerd-shim-runc-v2", "ctr"} {
		f["usr/local/bin/"+b] = imageFile{mode: 0o755, src: filepath.Join(cbin, b)}
	}
	for _, u := range maskedUnits {
		f["etc/systemd/system/"+u] = imageFile{link: "/dev/null"}
	}
	for _, u := range enabledUnits {
		f["etc/systemd/system/multi-user.target.wants/"+u] = imageFile{link: "/etc/systemd/system/" + u}
	}
	return f
}

// editBase changes files of the debootstrapped tree in place.
// pam_loginuid: a container may not write /proc/self/loginuid, and a
// "required" failure there ends every SSH session at once.
var editBase = map[string]func(string) string{
	"etc/pam.d/sshd": func(s string) string {
		return strings.ReplaceAll(s, "session    required     pam_loginuid.so", "session    optional     pam_loginuid.so")
	},
}

// importChanges are the image config `docker import` sets.
var importChanges = []string{
	"ENV container=docker",
	`ENTRYPOINT ["/usr/local/sbin/apiary-entrypoint", "/sbin/init"]`,
}

// baseHash names the debootstrapped tree: it depends on the suite and the
// package list only, so recipe changes elsewhere reuse it.
func baseHash() string {
	h := sha256.New()
	fmt.Fprintf(h, "debootstrap minbase %s\n", Suite)
	pk := append([]string(nil), Packages...)
	sort.Strings(pk)
	fmt.Fprintf(h, "%s\n", strings.Join(pk, ","))
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// recipeHash covers everything that ends up in the image.
func recipeHash(files map[string]imageFile) (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "recipe %s base %s\n", recipeVersion, baseHash())
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		f := files[n]
		fmt.Fprintf(h, "%s %o %q %q\n", n, f.mode, f.link, f.content)
		if f.src != "" {
			sum, err := fileSHA256(f.src)
			if err != nil {
				return "", err
			}
			fmt.Fprintf(h, "src %s\n", sum)
		}
	}
	for _, n := range sortedKeys(editBase) {
		fmt.Fprintf(h, "edit %s %s\n", n, editBase[n]("probe"))
	}
	fmt.Fprintf(h, "changes %q\n", importChanges)
	return hex.EncodeToString(h.Sum(nil))[:12], nil
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func fileSHA256(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// ImageTag is the tag EnsureImage builds: apiary-testhost:<recipe hash>. It
// fails when the containerd binaries are not built yet.
func ImageTag() (string, error) {
	cache, err := CacheDir()
	if err != nil {
		return "", err
	}
	files := imageFiles(cache)
	if err := checkSources(files); err != nil {
		return "", err
	}
	h, err := recipeHash(files)
	if err != nil {
		return "", err
	}
	return ImageRepo + ":" + h, nil
}

func checkSources(files map[string]imageFile) error {
	var missing []string
	for _, f := range files {
		if f.src == "" {
			continue
		}
		if fi, err := os.Stat(f.src); err != nil || fi.Mode()&0o111 == 0 {
			missing = append(missing, f.src)
		}
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		return fmt.Errorf("missing %s: build them with hack/build-upstream.sh containerd", strings.Join(missing, ", "))
	}
	return nil
}

// EnsureImage builds the test-host image once and returns its tag
// (apiary-testhost:<hash of the recipe>). The debootstrapped tree is kept as
// a tar under Dir/rootfs (keyed by suite and packages only), so a change to
// the files or units re-imports in seconds instead of bootstrapping again.
// Debootstrap's progress and the timings go to logf; its whole output to
// Dir/debootstrap.log.
func (d *Docker) EnsureImage(ctx context.Context, logf func(string, ...any)) (string, error) {
	if logf == nil {
		logf = func(string, ...any) {}
	}
	cache, err := CacheDir()
	if err != nil {
		return "", err
	}
	files := imageFiles(cache)
	tag, err := ImageTag()
	if err != nil {
		return "", err
	}
	if _, err := d.run(ctx, nil, "image", "inspect", "--format", "{{.Id}}", tag); err == nil {
		logf("sshhost: image %s is cached", tag)
		return tag, nil
	}
	start := time.Now()
	base := filepath.Join(d.Dir, "rootfs", Suite+"-"+baseHash()+".tar")
	if _, err := os.Stat(base); err != nil {
		if err := d.debootstrap(ctx, base, logf); err != nil {
			return "", err
		}
	} else {
		logf("sshhost: reusing debootstrapped %s", base)
	}
	t := time.Now()
	if err := d.importImage(ctx, base, files, tag); err != nil {
		return "", err
	}
	logf("sshhost: imported %s in %s (image built in %s)", tag, time.Since(t).Round(100*time.Millisecond), time.Since(start).Round(100*time.Millisecond))
	d.pruneImages(ctx, tag, logf)
	return tag, nil
}

// pruneImages removes the images of older recipes (≈250 MB each), except
// those a container still uses.
func (d *Docker) pruneImages(ctx context.Context, keep string, logf func(string, ...any)) {
	out, err := d.run(ctx, nil, "images", "--format", "{{.Repository}}:{{.Tag}}", ImageRepo)
	if err != nil {
		return
	}
	for _, img := range strings.Fields(out) {
		if img == keep {
			continue
		}
		if _, err := d.run(ctx, nil, "rmi", img); err == nil {
			logf("sshhost: removed the old image %s", img)
		}
	}
}

// debootstrap makes the base tree and stores it as a tar at out.
func (d *Docker) debootstrap(ctx context.Context, out string, logf func(string, ...any)) error {
	bin, err := lookSbin("debootstrap")
	if err != nil {
		return errors.New("debootstrap not found (apt-get install debootstrap, or run hack/install-deps.sh)")
	}
	tarBin, err := exec.LookPath("tar")
	if err != nil {
		return err
	}
	mirror := os.Getenv("APIARY_DEBIAN_MIRROR")
	if mirror == "" {
		mirror = DefaultMirror
	}
	build := filepath.Join(d.Dir, "build")
	if err := os.MkdirAll(build, 0o755); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	target, err := os.MkdirTemp(build, "rootfs-")
	if err != nil {
		return err
	}
	defer func() {
		if err := removeTree(target); err != nil {
			logf("sshhost: leaving %s: %v", target, err)
		}
	}()
	logPath := filepath.Join(d.Dir, "debootstrap.log")
	lf, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer lf.Close()

	args := []string{"--variant=minbase", "--include=" + strings.Join(Packages, ","), Suite, target, mirror}
	logf("sshhost: debootstrap %s (log: %s)", strings.Join(args, " "), logPath)
	start := time.Now()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive", "LC_ALL=C")
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	var retrieved int
	go func() {
		defer close(done)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64*1024), 1024*1024)
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(lf, line)
			// Lines per package (five of them): counted, not echoed.
			switch {
			case strings.HasPrefix(line, "I: Retrieving "):
				retrieved++
				continue
			case strings.HasPrefix(line, "I: Validating "), strings.HasPrefix(line, "I: Extracting "),
				strings.HasPrefix(line, "I: Unpacking "), strings.HasPrefix(line, "I: Configuring "):
				continue
			}
			logf("debootstrap: %s", line)
		}
	}()
	werr := cmd.Wait()
	pw.Close()
	<-done
	if werr != nil {
		tail := lastLines(filepath.Join(target, "debootstrap", "debootstrap.log"), 15)
		return fmt.Errorf("debootstrap: %w (log: %s; its last lines: %s)", werr, logPath, tail)
	}
	logf("sshhost: debootstrap done in %s (%d packages retrieved)", time.Since(start).Round(time.Second), retrieved)

	t := time.Now()
	tmp := out + ".tmp"
	tc := exec.CommandContext(ctx, tarBin, "--numeric-owner", "--xattrs", "--xattrs-include=*", "-C", target, "-cf", tmp, ".")
	if b, err := tc.CombinedOutput(); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("tar of the debootstrapped tree: %w: %s", err, strings.TrimSpace(string(b)))
	}
	if err := os.Rename(tmp, out); err != nil {
		return err
	}
	// Trees of other package lists are not used again.
	if old, _ := filepath.Glob(filepath.Join(filepath.Dir(out), Suite+"-*.tar")); len(old) > 0 {
		for _, o := range old {
			if o != out {
				_ = os.Remove(o)
			}
		}
	}
	logf("sshhost: stored %s in %s", out, time.Since(t).Round(100*time.Millisecond))
	return nil
}

// importImage streams the base tar, with the recipe's removals, edits and
// files applied, into `docker import`.
func (d *Docker) importImage(ctx context.Context, base string, files map[string]imageFile, tag string) error {
	in, err := os.Open(base)
	if err != nil {
		return err
	}
	defer in.Close()
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(rewriteTar(in, pw, files)) }()
	args := []string{"import"}
	for _, c := range importChanges {
		args = append(args, "--change", c)
	}
	args = append(args, "--message", "apiary test host "+tag, "-", tag)
	_, err = d.run(ctx, pr, args...)
	pr.CloseWithError(io.ErrClosedPipe)
	if err != nil {
		return fmt.Errorf("importing %s: %w (dockerd log: %s)", tag, err, d.LogFile)
	}
	return nil
}

// rewriteTar copies the base tar to w, dropping removed entries and the
// ones files replaces, editing editBase's files, then appends files (with
// any parent directory the base lacks).
func rewriteTar(r io.Reader, w io.Writer, files map[string]imageFile) error {
	tr := tar.NewReader(r)
	tw := tar.NewWriter(w)
	dirs := map[string]bool{"": true}
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		name := strings.TrimPrefix(strings.TrimPrefix(hdr.Name, "./"), "/")
		if name == "" || name == "." {
			continue
		}
		clean := strings.TrimSuffix(name, "/")
		if removedFromBase(name) {
			continue
		}
		if _, ok := files[clean]; ok {
			continue
		}
		if hdr.Typeflag == tar.TypeDir {
			dirs[clean] = true
		}
		if edit, ok := editBase[clean]; ok && hdr.Typeflag == tar.TypeReg {
			b, err := io.ReadAll(tr)
			if err != nil {
				return err
			}
			nb := []byte(edit(string(b)))
			hdr.Size = int64(len(nb))
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
			if _, err := tw.Write(nb); err != nil {
				return err
			}
			continue
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if hdr.Typeflag == tar.TypeReg {
			if _, err := io.Copy(tw, tr); err != nil {
				return err
			}
		}
	}
	now := time.Now()
	ensureDir := func(dir string, mode int64) error {
		var missing []string
		for p := dir; !dirs[p]; p = path.Dir(p) {
			if p == "." || p == "/" {
				break
			}
			missing = append(missing, p)
		}
		for i := len(missing) - 1; i >= 0; i-- {
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: missing[i] + "/", Mode: mode, ModTime: now, Format: tar.FormatPAX}); err != nil {
				return err
			}
			dirs[missing[i]] = true
		}
		return nil
	}
	for _, name := range sortedKeys(files) {
		f := files[name]
		if strings.HasSuffix(name, "/") {
			if err := ensureDir(strings.TrimSuffix(name, "/"), f.mode); err != nil {
				return err
			}
			continue
		}
		if err := ensureDir(path.Dir(name), 0o755); err != nil {
			return err
		}
		hdr := &tar.Header{Name: name, Mode: f.mode, ModTime: now, Format: tar.FormatPAX}
		switch {
		case f.link != "":
			hdr.Typeflag, hdr.Linkname, hdr.Mode = tar.TypeSymlink, f.link, 0o777
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
		case f.src != "":
			src, err := os.Open(f.src)
			if err != nil {
				return err
			}
			fi, err := src.Stat()
			if err != nil {
				src.Close()
				return err
			}
			hdr.Typeflag, hdr.Size = tar.TypeReg, fi.Size()
			if err := tw.WriteHeader(hdr); err == nil {
				_, err = io.Copy(tw, src)
			}
			src.Close()
			if err != nil {
				return err
			}
		default:
			hdr.Typeflag, hdr.Size = tar.TypeReg, int64(len(f.content))
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
			if _, err := io.WriteString(tw, f.content); err != nil {
				return err
			}
		}
	}
	return tw.Close()
}

// removeTree removes a debootstrap target after unmounting what debootstrap
// may have left mounted in it (proc, sys, dev when it fails half-way), so
// that the removal never reaches into the machine's /proc or /dev.
func removeTree(dir string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	mounts, err := mountsUnder(abs)
	if err != nil {
		return err
	}
	for i := len(mounts) - 1; i >= 0; i-- {
		if err := syscall.Unmount(mounts[i], syscall.MNT_DETACH); err != nil {
			return fmt.Errorf("unmounting %s: %w", mounts[i], err)
		}
	}
	if left, _ := mountsUnder(abs); len(left) > 0 {
		return fmt.Errorf("mounts left under %s: %v", abs, left)
	}
	return os.RemoveAll(abs)
}

// mountsUnder lists the mount points under dir, in mount order.
func mountsUnder(dir string) ([]string, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		mp := unescapeMount(f[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	return out, nil
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			var v int
			if _, err := fmt.Sscanf(s[i+1:i+4], "%03o", &v); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
