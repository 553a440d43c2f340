package images

import (
	"archive/tar"
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// testImage is an image of fake binaries, in the shape of All's.
func testImage(t *testing.T, dir string) Image {
	t.Helper()
	bin := filepath.Join(dir, "bin", "tool-v1", "tool")
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		t.Fatal(err)
	}
	// Host metadata that must not reach the image: mode 0700, a recent mtime.
	if err := os.WriteFile(bin, []byte("#!fake binary\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	return Image{
		Ref:        "registry.k8s.io/sub/tool:v1",
		Entrypoint: []string{"/usr/local/bin/tool"},
		Cmd:        []string{"--help"},
		User:       "65532:65532",
		Layers: []Layer{{Name: "tool", Files: []File{
			{Path: "/usr/local/bin/tool", Src: bin, Mode: 0o755, Caps: CapNetBindService, Missing: "hack/build-upstream.sh tool"},
			{Path: "/usr/local/bin/t", Link: "tool"},
			{Path: "/etc/tool.conf", Data: []byte("x=1\n")},
		}}},
	}
}

func TestBuildIsDeterministic(t *testing.T) {
	dir := t.TempDir()
	im := testImage(t, dir)
	var digests []v1.Hash
	// Two separate layer caches (compressed from scratch each), then the
	// first cache again, after the source's mtime changed.
	for i, cache := range []string{"c1", "c2", "c1"} {
		if i == 2 {
			if err := os.Chtimes(im.Layers[0].Files[0].Src, Epoch, Epoch); err != nil {
				t.Fatal(err)
			}
		}
		im.Cache = filepath.Join(dir, cache)
		img, err := Build(context.Background(), im, t.Logf)
		if err != nil {
			t.Fatal(err)
		}
		d, err := img.Digest()
		if err != nil {
			t.Fatal(err)
		}
		digests = append(digests, d)
	}
	if digests[0] != digests[1] || digests[0] != digests[2] {
		t.Fatalf("digests differ: %v", digests)
	}
	t.Logf("digest %s, three times", digests[0])

	// A content change changes the digest.
	if err := os.WriteFile(im.Layers[0].Files[0].Src, []byte("#!fake binary v2\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	img, err := Build(context.Background(), im, nil)
	if err != nil {
		t.Fatal(err)
	}
	if d, _ := img.Digest(); d == digests[0] {
		t.Fatal("digest did not change with the binary")
	}
}

type entry struct {
	hdr  *tar.Header
	data string
}

func layerEntries(t *testing.T, l v1.Layer) map[string]entry {
	t.Helper()
	rc, err := l.Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	out := map[string]entry{}
	tr := tar.NewReader(rc)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		out[hdr.Name] = entry{hdr, string(b)}
	}
}

func TestImageContent(t *testing.T) {
	dir := t.TempDir()
	im := testImage(t, dir)
	im.Cache = filepath.Join(dir, "cache")
	img, err := Build(context.Background(), im, nil)
	if err != nil {
		t.Fatal(err)
	}
	mt, _ := img.MediaType()
	if mt != types.OCIManifestSchema1 {
		t.Errorf("manifest media type %s", mt)
	}
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	if m.Config.MediaType != types.OCIConfigJSON {
		t.Errorf("config media type %s", m.Config.MediaType)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.OS != "linux" || cf.Architecture != "amd64" || !cf.Created.Time.Equal(Epoch) {
		t.Errorf("os/arch/created: %s/%s/%s", cf.OS, cf.Architecture, cf.Created)
	}
	c := cf.Config
	if strings.Join(c.Entrypoint, " ") != "/usr/local/bin/tool" || strings.Join(c.Cmd, " ") != "--help" ||
		c.User != "65532:65532" || len(c.Env) != 1 || !strings.HasPrefix(c.Env[0], "PATH=/usr/local/sbin:/usr/local/bin:") {
		t.Errorf("config: %+v", c)
	}
	if len(cf.History) != 2 || !cf.History[1].Created.Time.Equal(Epoch) {
		t.Errorf("history: %+v", cf.History)
	}

	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	if len(layers) != 2 {
		t.Fatalf("%d layers, want base + tool", len(layers))
	}
	for _, l := range layers {
		if mt, _ := l.MediaType(); mt != types.OCILayer {
			t.Errorf("layer media type %s", mt)
		}
	}
	base := layerEntries(t, layers[0])
	want := map[string]struct {
		typ      byte
		mode     int64
		uid, gid int
	}{
		"etc/":               {tar.TypeDir, 0o755, 0, 0},
		"etc/passwd":         {tar.TypeReg, 0o644, 0, 0},
		"etc/group":          {tar.TypeReg, 0o644, 0, 0},
		"etc/nsswitch.conf":  {tar.TypeReg, 0o644, 0, 0},
		"tmp/":               {tar.TypeDir, 0o1777, 0, 0},
		"root/":              {tar.TypeDir, 0o700, 0, 0},
		"home/":              {tar.TypeDir, 0o755, 0, 0},
		"home/nonroot/":      {tar.TypeDir, 0o700, 65532, 65532},
		"usr/local/bin/tool": {tar.TypeReg, 0o755, 0, 0},
		"usr/local/bin/t":    {tar.TypeSymlink, 0o644, 0, 0},
		"usr/local/bin/":     {tar.TypeDir, 0o755, 0, 0},
		"usr/local/":         {tar.TypeDir, 0o755, 0, 0},
		"usr/":               {tar.TypeDir, 0o755, 0, 0},
		"etc/tool.conf":      {tar.TypeReg, 0o644, 0, 0},
	}
	app := layerEntries(t, layers[1])
	if len(base) != 8 {
		t.Errorf("base layer has %d entries, want 8", len(base))
	}
	if len(app) != 7 {
		t.Errorf("tool layer has %d entries, want 7", len(app))
	}
	for p, w := range want {
		e, ok := base[p]
		if !ok {
			e, ok = app[p]
		}
		if !ok {
			t.Errorf("%s missing", p)
			continue
		}
		h := e.hdr
		if h.Typeflag != w.typ || h.Mode != w.mode || h.Uid != w.uid || h.Gid != w.gid || !h.ModTime.Equal(Epoch) {
			t.Errorf("%s: type %c mode %o uid %d gid %d mtime %s; want type %c mode %o uid %d gid %d",
				p, h.Typeflag, h.Mode, h.Uid, h.Gid, h.ModTime, w.typ, w.mode, w.uid, w.gid)
		}
		if h.Uname != "" || h.Gname != "" {
			t.Errorf("%s: owner names %q/%q leak from the host", p, h.Uname, h.Gname)
		}
	}
	if !strings.Contains(base["etc/passwd"].data, "nonroot:x:65532:65532:") || !strings.HasPrefix(base["etc/passwd"].data, "root:x:0:0:") {
		t.Errorf("passwd: %q", base["etc/passwd"].data)
	}
	if !strings.Contains(base["etc/group"].data, "nonroot:x:65532:") {
		t.Errorf("group: %q", base["etc/group"].data)
	}
	if !strings.Contains(base["etc/nsswitch.conf"].data, "hosts: files dns") {
		t.Errorf("nsswitch.conf: %q", base["etc/nsswitch.conf"].data)
	}
	tool := app["usr/local/bin/tool"]
	if tool.data != "#!fake binary\n" {
		t.Errorf("tool content %q", tool.data)
	}
	if app["usr/local/bin/t"].hdr.Linkname != "tool" {
		t.Errorf("link target %q", app["usr/local/bin/t"].hdr.Linkname)
	}
	capb := tool.hdr.PAXRecords["SCHILY.xattr.security.capability"]
	if len(capb) != 20 || binary.LittleEndian.Uint32([]byte(capb[0:])) != 0x02000001 ||
		binary.LittleEndian.Uint32([]byte(capb[4:])) != 1<<10 {
		t.Errorf("security.capability xattr %x, want revision 2, effective, cap_net_bind_service", capb)
	}
}

func TestMissingBinaryNamesBuildCommand(t *testing.T) {
	all := All(t.TempDir(), "v0.0.0")
	err := Check(all)
	if err == nil {
		t.Fatal("no error for an empty cache")
	}
	for _, w := range []string{"hack/build-upstream.sh kube-apiserver", "coredns", "proxy-server", "proxy-agent", "controller", "etcdctl"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error does not name %q: %v", w, err)
		}
	}
	coredns, err := Select(all, "coredns")
	if err != nil {
		t.Fatal(err)
	}
	_, err = Build(context.Background(), coredns[0], nil)
	if err == nil || !strings.Contains(err.Error(), "run hack/build-upstream.sh coredns") {
		t.Fatalf("Build error %v", err)
	}
}

// All's binary paths must be where hack/build-upstream.sh puts them.
func TestAllAgreesWithBuildUpstream(t *testing.T) {
	cache := t.TempDir()
	cmd := exec.Command("bash", "../build-upstream.sh", "--list")
	cmd.Env = append(os.Environ(), "APIARY_CACHE="+cache)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("build-upstream.sh --list: %v", err)
	}
	paths := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 2 {
			paths[f[0]] = f[1]
		}
	}
	n := 0
	for _, im := range append(All(cache, "v0.0.0"), Previous(cache)...) {
		for _, l := range im.Layers {
			for _, f := range l.Files {
				if f.Missing == "" {
					continue
				}
				name := strings.TrimPrefix(f.Missing, "hack/build-upstream.sh ")
				if paths[name] != f.Src {
					t.Errorf("%s: images uses %s, build-upstream.sh builds %q", im.Ref, f.Src, paths[name])
				}
				n++
			}
		}
	}
	// 10 in the cluster's images, 8 in the node bundle, kube-router; the
	// previous minor's 4 images, 8 in its node bundle and its CoreDNS.
	if n != 32 {
		t.Errorf("%d upstream binaries in the images, want 32", n)
	}
}

func TestMirrorAndSelect(t *testing.T) {
	for ref, want := range map[string]string{
		"registry.k8s.io/kube-apiserver:v1.37.2":           "127.0.0.1:5000/kube-apiserver:v1.37.2",
		"quay.io/metallb/controller:v0.16.2":               "127.0.0.1:5000/metallb/controller:v0.16.2",
		"ghcr.io/apiaryhq/apiary:v0.1.0":                   "127.0.0.1:5000/apiaryhq/apiary:v0.1.0",
		"registry.k8s.io/coredns/coredns:v1.14.6":          "127.0.0.1:5000/coredns/coredns:v1.14.6",
		"registry.k8s.io/kas-network-proxy/proxy-agent:v1": "127.0.0.1:5000/kas-network-proxy/proxy-agent:v1",
		"localhost:5001/a/b:c":                             "127.0.0.1:5000/a/b:c",
		"library/busybox:1":                                "127.0.0.1:5000/library/busybox:1",
		"docker.io/cloudnativelabs/kube-router:v2.1.0":     "127.0.0.1:5000/cloudnativelabs/kube-router:v2.1.0",
	} {
		got, err := Mirror("127.0.0.1:5000", ref)
		if err != nil || got != want {
			t.Errorf("Mirror(%s) = %s, %v; want %s", ref, got, err, want)
		}
	}
	if _, err := Mirror("127.0.0.1:5000", "registry.k8s.io/pause"); err == nil {
		t.Error("no error for a reference without a tag")
	}
	all := All("/cache", "v9.9.9")
	if len(all) != 14 {
		t.Errorf("%d images, want 14", len(all))
	}
	for _, im := range all {
		if _, err := name.NewTag(im.Ref, name.StrictValidation); err != nil {
			t.Errorf("%s: %v", im.Ref, err)
		}
	}
	sel, err := Select(all, "pause", "kas-network-proxy/proxy-server", "quay.io/metallb/controller:v0.16.2", "apiary")
	if err != nil {
		t.Fatal(err)
	}
	var refs []string
	for _, im := range sel {
		refs = append(refs, im.Ref)
	}
	if got := strings.Join(refs, " "); got != "registry.k8s.io/pause:3.10 registry.k8s.io/kas-network-proxy/proxy-server:v0.36.0 quay.io/metallb/controller:v0.16.2 ghcr.io/apiaryhq/apiary:v9.9.9" {
		t.Errorf("Select: %s", got)
	}
	if _, err := Select(all, "nope"); err == nil {
		t.Error("no error for an unknown name")
	}
}

func TestSaveWritesLoadableTarballsOnce(t *testing.T) {
	dir := t.TempDir()
	im := testImage(t, dir)
	im.Cache = filepath.Join(dir, "cache")
	out := filepath.Join(dir, "out")
	res, err := Save(context.Background(), out, []Image{im}, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 1 || res[0].Skipped {
		t.Fatalf("results %+v", res)
	}
	path := filepath.Join(out, "registry.k8s.io_sub_tool_v1.tar")
	tag, _ := name.NewTag(im.Ref)
	loaded, err := tarball.ImageFromPath(path, &tag)
	if err != nil {
		t.Fatal(err)
	}
	built, _ := Build(context.Background(), im, nil)
	wantCfg, _ := built.ConfigName()
	gotCfg, err := loaded.ConfigName()
	if err != nil || gotCfg != wantCfg {
		t.Errorf("config %s, want %s (%v)", gotCfg, wantCfg, err)
	}
	wl, _ := built.Layers()
	gl, err := loaded.Layers()
	if err != nil || len(gl) != len(wl) {
		t.Fatalf("layers: %d, want %d (%v)", len(gl), len(wl), err)
	}
	for i := range wl {
		w, _ := wl[i].DiffID()
		g, _ := gl[i].DiffID()
		if w != g {
			t.Errorf("layer %d diffID %s, want %s", i, g, w)
		}
	}
	res, err = Save(context.Background(), out, []Image{im}, t.Logf)
	if err != nil || !res[0].Skipped {
		t.Fatalf("second Save: %+v, %v; want skipped", res, err)
	}
}

// The kube-proxy image's iptables comes from this machine: the binaries, their
// names, their libraries and the loader (the chroot run is in the
// integration test).
func TestHostIPTablesFiles(t *testing.T) {
	if _, err := os.Stat("/usr/sbin/xtables-nft-multi"); err != nil {
		t.Fatal("iptables is not installed here: run make deps (apt-get install iptables conntrack)")
	}
	files, byPath := resolved(t, hostIPTables)
	for p, link := range map[string]string{
		"/usr/sbin/iptables":             "xtables-nft-multi",
		"/usr/sbin/ip6tables-restore":    "xtables-nft-multi",
		"/usr/sbin/iptables-legacy-save": "xtables-legacy-multi",
	} {
		if byPath[p].Link != link {
			t.Errorf("%s -> %q, want %s", p, byPath[p].Link, link)
		}
	}
	for _, p := range []string{"/usr/sbin/xtables-nft-multi", "/usr/sbin/xtables-legacy-multi", "/usr/sbin/conntrack",
		xtablesDir + "/libxt_comment.so", xtablesDir + "/libxt_conntrack.so"} {
		if f := byPath[p]; f.Src != p {
			t.Errorf("%s not copied from the host: %+v", p, f)
		}
	}
	var libc, loader, xtables bool
	for p, f := range byPath {
		libc = libc || strings.HasSuffix(p, "/libc.so.6")
		loader = loader || (strings.HasSuffix(p, "/ld-linux-x86-64.so.2") && f.Src != "")
		xtables = xtables || (strings.Contains(p, "/libxtables.so.12") && f.Src != "")
	}
	if !libc || !loader || !xtables {
		t.Errorf("libc %v, loader %v, libxtables %v", libc, loader, xtables)
	}
	t.Logf("%d entries", len(files))
}

// kube-router's image gets ipset, ip and busybox's sh/cp/mv from this
// machine besides iptables, with their libraries, and /bin/sh resolves
// through Debian's merged-/usr link (the chroot run is in the integration
// test).
func TestHostKubeRouterToolsFiles(t *testing.T) {
	for _, p := range []string{"/usr/sbin/ipset", "/usr/bin/busybox", "/usr/bin/ip"} {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%s is not installed here: run make deps (apt-get install ipset busybox-static iproute2)", p)
		}
	}
	_, byPath := resolved(t, hostKubeRouterTools)
	for p, link := range map[string]string{"/usr/bin/sh": "busybox", "/usr/bin/cp": "busybox", "/bin": "usr/bin", "/usr/sbin/iptables": "xtables-nft-multi"} {
		if byPath[p].Link != link {
			t.Errorf("%s -> %q, want %s", p, byPath[p].Link, link)
		}
	}
	var libipset bool
	for p, f := range byPath {
		libipset = libipset || (strings.Contains(p, "/libipset.so") && f.Src != "")
	}
	if !libipset || byPath["/usr/sbin/ipset"].Src == "" || byPath["/usr/bin/busybox"].Src == "" {
		t.Errorf("ipset %+v, busybox %+v, libipset %v", byPath["/usr/sbin/ipset"], byPath["/usr/bin/busybox"], libipset)
	}
}

// resolved runs a layer's Resolve and returns its normalized files, also by
// path.
func resolved(t *testing.T, resolve func() ([]File, error)) ([]File, map[string]File) {
	t.Helper()
	files, err := resolve()
	if err != nil {
		t.Fatal(err)
	}
	files, err = normalize(files)
	if err != nil {
		t.Fatal(err)
	}
	byPath := map[string]File{}
	for _, f := range files {
		byPath[f.Path] = f
	}
	return files, byPath
}
