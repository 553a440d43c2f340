//go:build integration

package images

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// needBinaries skips the test when binaries that hack/build-upstream.sh
// makes are not in the cache (make integration builds only Kubernetes and
// etcd).
func needBinaries(t *testing.T, images []Image, more ...string) {
	t.Helper()
	if err := Check(images); err != nil {
		t.Fatal(err)
	}
	for _, p := range more {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%s is not built: run hack/build-upstream.sh %s", p, filepath.Base(p))
		}
	}
}

// startRegistry runs the from-source distribution registry on a free
// loopback port with its storage in a temporary directory, until the test
// ends, and returns its address.
func startRegistry(t *testing.T, registry string) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.yml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: %s
  delete:
    enabled: true
http:
  addr: %s
`, filepath.Join(dir, "data"), addr)), 0o644); err != nil {
		t.Fatal(err)
	}
	startLogged(t, filepath.Join(dir, "registry.log"), exec.Command(registry, "serve", cfg))
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/v2/")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return addr
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("registry at %s not ready: %v", addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestPushToRegistry(t *testing.T) {
	cache := DefaultCacheDir()
	registry := filepath.Join(cache, "bin", "registry-v3.1.2", "registry")
	all := All(cache, "v0.0.0-test")
	imgs, err := Select(all, "pause", "coredns")
	if err != nil {
		t.Fatal(err)
	}
	needBinaries(t, imgs, registry)
	// Layers are compressed into a cache of the test's own, so the timings
	// include building them once.
	for i := range imgs {
		imgs[i].Cache = filepath.Join(t.TempDir(), "layers")
	}
	addr := startRegistry(t, registry)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	start := time.Now()
	first, err := PushResults(ctx, addr, imgs, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("first push: %s", time.Since(start).Round(time.Millisecond))
	for _, r := range first {
		if r.Skipped {
			t.Errorf("%s skipped on an empty registry", r.Ref)
		}
	}

	// Pull each back by its mirrored name: same digest, same layers.
	for i, r := range first {
		ref, err := name.ParseReference(r.Target, name.Insecure)
		if err != nil {
			t.Fatal(err)
		}
		desc, err := remote.Head(ref, remote.WithContext(ctx))
		if err != nil {
			t.Fatal(err)
		}
		if desc.Digest != r.Digest {
			t.Errorf("%s: registry has %s, pushed %s", r.Target, desc.Digest, r.Digest)
		}
		pulled, err := remote.Image(ref, remote.WithContext(ctx))
		if err != nil {
			t.Fatal(err)
		}
		if d, _ := pulled.Digest(); d != r.Digest {
			t.Errorf("%s: pulled %s, pushed %s", r.Target, d, r.Digest)
		}
		built, err := Build(ctx, imgs[i], nil)
		if err != nil {
			t.Fatal(err)
		}
		if d, _ := built.Digest(); d != r.Digest {
			t.Errorf("%s: rebuilt digest %s, pushed %s", r.Ref, d, r.Digest)
		}
		cf, err := pulled.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if strings.Join(cf.Config.Entrypoint, " ") != strings.Join(imgs[i].Entrypoint, " ") || cf.Config.User != imgs[i].User {
			t.Errorf("%s: pulled config %+v", r.Target, cf.Config)
		}
		// The pulled image has the binary, with its mode and (coredns) the
		// capability to bind :53 as nonroot.
		entry := strings.TrimPrefix(imgs[i].Entrypoint[0], "/")
		hdr := findFile(t, pulled, entry)
		if hdr == nil || hdr.Mode != 0o755 || hdr.Uid != 0 || hdr.Size < 100000 {
			t.Errorf("%s: %s in the pulled image: %+v", r.Target, entry, hdr)
		} else if strings.Contains(r.Ref, "coredns") && hdr.PAXRecords["SCHILY.xattr.security.capability"] == "" {
			t.Errorf("%s: /coredns has no file capability", r.Target)
		}
	}

	// Again: nothing to do.
	start = time.Now()
	second, err := PushResults(ctx, addr, imgs, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	t.Logf("second push: %s", took.Round(time.Millisecond))
	for i, r := range second {
		if !r.Skipped || r.Digest != first[i].Digest {
			t.Errorf("second push of %s: skipped %v, digest %s (first %s)", r.Ref, r.Skipped, r.Digest, first[i].Digest)
		}
	}
	if took > 10*time.Second {
		t.Errorf("second push took %s", took)
	}
}

// findFile returns the tar header of path in img's flattened filesystem.
func findFile(t *testing.T, img v1.Image, path string) *tar.Header {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			t.Fatal(err)
		}
		if hdr.Name == path {
			return hdr
		}
	}
}

// extract writes img's flattened filesystem into dir (as root: owners and
// modes as in the image).
func extract(t *testing.T, img v1.Image, dir string) {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, hdr.Name)
		if !strings.HasPrefix(p, dir+string(os.PathSeparator)) {
			t.Fatalf("tar entry %q escapes", hdr.Name)
		}
		mode := os.FileMode(hdr.Mode).Perm()
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
			os.Chmod(p, mode)
		case tar.TypeSymlink:
			os.MkdirAll(filepath.Dir(p), 0o755)
			if err := os.Symlink(hdr.Linkname, p); err != nil {
				t.Fatal(err)
			}
		case tar.TypeReg:
			os.MkdirAll(filepath.Dir(p), 0o755)
			f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := io.Copy(f, tr); err != nil {
				t.Fatal(err)
			}
			f.Close()
		default:
			t.Fatalf("unexpected tar entry %s type %c", hdr.Name, hdr.Typeflag)
		}
		os.Lchown(p, hdr.Uid, hdr.Gid)
	}
}

// The kube-proxy image's iptables runs: chroot into its filesystem, check
// the versions, then load and read back rules that need extensions (comment,
// conntrack, tcp) in a network namespace of the test's own.
func TestKubeProxyImageIPTables(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("chroot needs root: the image tests run as root, as make test does")
	}
	imgs, err := Select(All(DefaultCacheDir(), "v0.0.0-test"), "kube-proxy")
	if err != nil {
		t.Fatal(err)
	}
	needBinaries(t, imgs)
	if _, err := os.Stat("/usr/sbin/xtables-nft-multi"); err != nil {
		t.Fatal("iptables is not installed here: run make deps (apt-get install iptables conntrack)")
	}
	ctx := context.Background()
	img, err := Build(ctx, imgs[0], t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	extract(t, img, root)

	run := func(stdin string, args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(ctx, args[0], args[1:]...)
		cmd.Stdin = strings.NewReader(stdin)
		// As the kubelet would start it: the image's PATH, nothing of ours.
		cmd.Env = []string{defaultPath}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	for cmd, want := range map[string]string{
		"iptables":         "(nf_tables)",
		"ip6tables":        "(nf_tables)",
		"iptables-save":    "(nf_tables)",
		"iptables-restore": "(nf_tables)",
		"iptables-legacy":  "(legacy)",
		"conntrack":        "conntrack v",
	} {
		out := run("", "chroot", root, cmd, "--version")
		if !strings.Contains(out, want) {
			t.Errorf("%s --version: %q, want %q", cmd, out, want)
		}
		t.Logf("%s --version: %s", cmd, strings.TrimSpace(out))
	}
	if out := run("", "chroot", root, "/usr/local/bin/kube-proxy", "--version"); !strings.Contains(out, KubeVersion) {
		t.Errorf("kube-proxy --version: %q", out)
	}
	// iptables-restore then iptables-save in one new network namespace
	// (unshare -n): the host's rules are not touched.
	rules := "*filter\n:APIARY-TEST - [0:0]\n" +
		"-A APIARY-TEST -p tcp -m comment --comment \"apiary test\" -m conntrack --ctstate NEW -m tcp --dport 80 -j ACCEPT\n" +
		"COMMIT\n*nat\n:APIARY-NAT - [0:0]\n-A APIARY-NAT -p tcp -m tcp --dport 80 -j DNAT --to-destination 10.0.0.1:8080\nCOMMIT\n"
	out := run(rules, "unshare", "-n", "sh", "-c",
		fmt.Sprintf("chroot %s iptables-restore --noflush && chroot %s iptables-save", root, root))
	for _, want := range []string{`-A APIARY-TEST -p tcp -m comment --comment "apiary test" -m conntrack --ctstate NEW -m tcp --dport 80 -j ACCEPT`,
		"-A APIARY-NAT -p tcp -m tcp --dport 80 -j DNAT --to-destination 10.0.0.1:8080"} {
		if !strings.Contains(out, want) {
			t.Errorf("iptables-save in the image does not show %q:\n%s", want, out)
		}
	}
}

// extractImage builds the image named name (see Select) and unpacks its
// filesystem into a temporary directory, for chroot runs as root.
func extractImage(t *testing.T, name string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("chroot needs root: the image tests run as root, as make test does")
	}
	imgs, err := Select(All(DefaultCacheDir(), "v0.0.0-test"), name)
	if err != nil {
		t.Fatal(err)
	}
	needBinaries(t, imgs)
	img, err := Build(context.Background(), imgs[0], t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	extract(t, img, root)
	d, _ := img.Digest()
	size, _ := imageSize(img)
	t.Logf("%s %s (%.1f MB)", imgs[0].Ref, d, float64(size)/1e6)
	return root
}

// What kube-router executes runs in its image: ipset, ip, iptables, and the
// busybox sh, cp and mv of its CNI-config init container at the /bin/sh path
// upstream's manifests use.
func TestKubeRouterImageTools(t *testing.T) {
	root := extractImage(t, "cloudnativelabs/kube-router")
	// Run directly, as kube-router execs them (busybox's sh would prefer
	// its own applets, e.g. its ip).
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"ipset", "version"}, "ipset v"},
		{[]string{"ip", "-V"}, "iproute2"},
		{[]string{"iptables", "--version"}, "(nf_tables)"},
		{[]string{"cat", "/etc/iproute2/rt_tables"}, "main"},
		{[]string{"/bin/sh", "-c", "echo '{}' > /tmp/a && cp /tmp/a /tmp/b && mv /tmp/b /etc/c && cat /etc/c && rm /etc/c && [ ! -f /etc/c ] && echo gone"}, "{}\ngone"},
	} {
		cmd := exec.Command("unshare", append([]string{"-n", "chroot", root}, c.args...)...)
		cmd.Env = []string{defaultPath}
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), c.want) {
			t.Errorf("%s in the kube-router image: %v\n%s\nwant %q", strings.Join(c.args, " "), err, out, c.want)
		}
	}
}

// Every image whose binaries are built runs its entrypoint in a chroot of
// its own filesystem, as the image's user: static binaries that need nothing
// from the host, version-stamped.
func TestImagesRun(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("chroot needs root: the image tests run as root, as make test does")
	}
	checks := map[string]struct {
		args []string
		want string
	}{
		"kube-apiserver":          {[]string{"--version"}, "Kubernetes " + KubeVersion},
		"kube-controller-manager": {[]string{"--version"}, "Kubernetes " + KubeVersion},
		"kube-scheduler":          {[]string{"--version"}, "Kubernetes " + KubeVersion},
		"kube-proxy":              {[]string{"--version"}, "Kubernetes " + KubeVersion},
		"etcd":                    {[]string{"--version"}, "etcd Version: " + strings.TrimPrefix(EtcdVersion, "v")},
		"pause":                   {[]string{"-v"}, "pause"},
		"coredns":                 {[]string{"-version"}, "CoreDNS-" + strings.TrimPrefix(CoreDNSVersion, "v")},
		"proxy-server":            {[]string{"--help"}, "Usage:"},
		"proxy-agent":             {[]string{"--help"}, "Usage:"},
		"controller":              {[]string{"--help"}, "Usage"},
		"apiary":                  {[]string{"--version"}, "apiary version v0.0.0-test"},
		"kube-router":             {[]string{"--version"}, KubeRouterVersion},
		"busybox":                 {[]string{"-c", "busybox | head -1"}, "BusyBox v" + BusyboxVersion},
	}
	ctx := context.Background()
	for _, im := range All(DefaultCacheDir(), "v0.0.0-test") {
		short := im.Name()[strings.LastIndex(im.Name(), "/")+1:]
		entry := append(im.Entrypoint, im.Cmd...)
		if len(entry) == 0 {
			continue // the node bundle is never run: TestNodeBundle
		}
		t.Run(short, func(t *testing.T) {
			c, ok := checks[short]
			if !ok {
				t.Fatalf("no check for %s", im.Ref)
			}
			needBinaries(t, []Image{im})
			img, err := Build(ctx, im, t.Logf)
			if err != nil {
				t.Fatal(err)
			}
			root := t.TempDir()
			extract(t, img, root)
			user := im.User
			if user == "" {
				user = "0"
			}
			if !strings.Contains(user, ":") {
				user += ":" + user
			}
			args := append([]string{"--userspec=" + user, root}, entry...)
			cmd := exec.CommandContext(ctx, "chroot", append(args, c.args...)...)
			cmd.Env = []string{defaultPath, "HOME=/"}
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("chroot %s: %v\n%s", strings.Join(args, " "), err, out)
			}
			if !strings.Contains(string(out), c.want) {
				t.Fatalf("%s %s: %q, want %q", entry[0], strings.Join(c.args, " "), out, c.want)
			}
			first, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
			d, _ := img.Digest()
			size, _ := imageSize(img)
			t.Logf("%s %s (%.1f MB) as %s: %s", im.Ref, d, float64(size)/1e6, user, first)
		})
	}
}

// containerd v2 (from source, static) takes the images both ways the local
// cluster can give them: pulled by their upstream names through a hosts.toml
// mirror to the local registry (the digest is the one pushed, and coredns
// keeps its file capability when unpacked), and imported from Save's
// tarballs.
func TestContainerdPullsAndImports(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("containerd needs root: the image tests run as root, as make test does")
	}
	cache := DefaultCacheDir()
	cdDir := filepath.Join(cache, "bin", "containerd-v2.4.2")
	registry := filepath.Join(cache, "bin", "registry-v3.1.2", "registry")
	imgs, err := Select(All(cache, "v0.0.0-test"), "pause", "coredns")
	if err != nil {
		t.Fatal(err)
	}
	needBinaries(t, imgs, registry, filepath.Join(cdDir, "containerd"), filepath.Join(cdDir, "ctr"))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	addr := startRegistry(t, registry)
	pushed, err := PushResults(ctx, addr, imgs, t.Logf)
	if err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	sock := filepath.Join(dir, "containerd.sock")
	hosts := filepath.Join(dir, "hosts")
	// Every host, the server too, is the local registry: nothing leaves the
	// machine even if the mirror failed.
	for _, upstream := range []string{"registry.k8s.io", "quay.io", "ghcr.io"} {
		if err := os.MkdirAll(filepath.Join(hosts, upstream), 0o755); err != nil {
			t.Fatal(err)
		}
		toml := fmt.Sprintf("server = \"http://%s\"\n\n[host.\"http://%s\"]\n  capabilities = [\"pull\", \"resolve\"]\n", addr, addr)
		if err := os.WriteFile(filepath.Join(hosts, upstream, "hosts.toml"), []byte(toml), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cfg := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`version = 3
root = "%[1]s/root"
state = "%[1]s/state"
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.erofs", "io.containerd.differ.v1.erofs"]
[grpc]
  address = "%[2]s"
[ttrpc]
  address = "%[2]s.ttrpc"
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "%[1]s/opt"
`, dir, sock)), 0o644); err != nil {
		t.Fatal(err)
	}
	startLogged(t, filepath.Join(dir, "containerd.log"), exec.Command(filepath.Join(cdDir, "containerd"), "--config", cfg))
	ctr := func(args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, filepath.Join(cdDir, "ctr"), append([]string{"-a", sock, "-n", "k8s.io"}, args...)...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := ctr("version"); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("containerd did not answer")
		}
		time.Sleep(100 * time.Millisecond)
	}

	for _, r := range pushed {
		start := time.Now()
		if out, err := ctr("images", "pull", "--hosts-dir", hosts, r.Ref); err != nil {
			t.Fatalf("ctr images pull %s: %v\n%s", r.Ref, err, out)
		}
		out, err := ctr("images", "ls")
		if err != nil {
			t.Fatal(err)
		}
		var line string
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, r.Ref+" ") {
				line = l
			}
		}
		if !strings.Contains(line, r.Digest.String()) {
			t.Errorf("containerd has %s as %q, want digest %s", r.Ref, line, r.Digest)
		}
		t.Logf("containerd pulled %s through the mirror in %s", r.Ref, time.Since(start).Round(time.Millisecond))
	}
	// The unpacked /coredns can bind :53 as nonroot.
	snaps, _ := filepath.Glob(filepath.Join(dir, "root", "io.containerd.snapshotter.v1.overlayfs", "snapshots", "*", "fs", "coredns"))
	if len(snaps) != 1 {
		t.Fatalf("unpacked /coredns: %v", snaps)
	}
	buf := make([]byte, 64)
	n, err := syscall.Getxattr(snaps[0], "security.capability", buf)
	if err != nil || n != 20 || buf[4] != 0 || buf[5] != 0x04 {
		t.Errorf("security.capability of the unpacked /coredns: %x, %v", buf[:max(n, 0)], err)
	}

	// Save's tarball imports under the upstream name.
	saved, err := Save(ctx, filepath.Join(dir, "tarballs"), imgs[:1], t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := ctr("images", "rm", "--sync", imgs[0].Ref); err != nil {
		t.Fatalf("ctr images rm: %v\n%s", err, out)
	}
	tarPath := saved[0].Target
	if out, err := ctr("images", "import", tarPath); err != nil {
		t.Fatalf("ctr images import %s: %v\n%s", tarPath, err, out)
	}
	out, err := ctr("images", "ls", "-q")
	if err != nil || !strings.Contains(out, imgs[0].Ref) {
		t.Errorf("after import, images: %s (%v)", out, err)
	}
}

// The node bundle holds static, version-stamped node binaries and the CNI
// plugins at the paths the host agent installs them to.
func TestNodeBundle(t *testing.T) {
	root := extractImage(t, NodeBundleRepository+":"+KubeVersion)
	run := func(env []string, args ...string) string {
		t.Helper()
		cmd := exec.Command("chroot", append([]string{root}, args...)...)
		cmd.Env = append([]string{defaultPath, "HOME=/"}, env...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("chroot %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	for _, c := range [][]string{{"/usr/bin/kubelet", "--version"}, {"/usr/bin/kubeadm", "version", "-o", "short"}, {"/usr/bin/kubectl", "version", "--client"}} {
		if out := run(nil, c...); !strings.Contains(out, KubeVersion) {
			t.Errorf("%s: %q, want %s", strings.Join(c, " "), out, KubeVersion)
		}
	}
	for _, p := range CNIPlugins {
		if out := run([]string{"CNI_COMMAND=VERSION"}, "/opt/cni/bin/"+p); !strings.Contains(out, "cniVersion") {
			t.Errorf("CNI plugin %s VERSION: %q", p, out)
		}
	}
}

// startLogged starts cmd with its output in logPath, kills it when the test
// ends, and shows the log if the test failed.
func startLogged(t *testing.T, logPath string, cmd *exec.Cmd) {
	t.Helper()
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("%s:\n%s", logPath, b)
		}
	})
}
