package images

import (
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strings"
)

// The directories where this machine's dynamic loader looks for libraries
// (Debian, x86-64, merged /usr), in its order.
var libDirs = []string{
	"/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu",
	"/lib64", "/usr/lib64", "/lib", "/usr/lib",
}

// xtablesDir is where libxtables loads its match and target extensions from
// (dlopen, so they are not DT_NEEDED by the binaries).
const xtablesDir = "/usr/lib/x86_64-linux-gnu/xtables"

// hostIPTables is the iptables userspace that kube-proxy runs in its image,
// copied from this machine as upstream's distroless-iptables copies Debian's:
// xtables-nft-multi and xtables-legacy-multi with their iptables*/ip6tables*
// names (plain names → nft, like Debian 12's default alternative), conntrack,
// the xtables extensions, and every shared library they load.
func hostIPTables() ([]File, error) {
	roots, links, err := iptablesFiles()
	if err != nil {
		return nil, err
	}
	return hostTools("kube-proxy", "apt-get install iptables conntrack", roots, links)
}

// hostKubeRouterTools is what kube-router executes besides itself, copied from
// this machine as hostIPTables is: iptables (the same names, so that it
// writes the same backend as kube-proxy), ipset and ip (iproute2), plus
// busybox (static) for the sh, cp and mv of its CNI-config init container,
// which upstream's Alpine-based image has. No modprobe: loading kernel
// modules is the host's business (kube-router only logs that it failed).
func hostKubeRouterTools() ([]File, error) {
	const rtTables = "/etc/iproute2/rt_tables"
	if _, err := os.Stat(rtTables); err != nil {
		return nil, fmt.Errorf("the kube-router image needs %s from this machine: apt-get install iproute2 (%w)", rtTables, err)
	}
	roots, extra, err := iptablesFiles()
	if err != nil {
		return nil, err
	}
	roots = append(roots, "/usr/sbin/ipset", "/usr/bin/ip", "/usr/bin/busybox")
	for _, applet := range []string{"sh", "cp", "mv", "rm", "cat", "test", "["} {
		extra = append(extra, File{Path: "/usr/bin/" + applet, Link: "busybox"})
	}
	// Upstream's manifests run /bin/sh: keep Debian's merged-/usr link.
	extra = append(extra, File{Path: "/bin", Link: "usr/bin"}, File{Path: "/sbin", Link: "usr/sbin"})
	// ip's tables: kube-router adds its routing table to rt_tables (for the
	// IPIP overlay between subnets) and fails that step without the file.
	conf, err := filepath.Glob("/etc/iproute2/*")
	if err != nil {
		return nil, err
	}
	for _, c := range conf {
		if fi, err := os.Stat(c); err == nil && fi.Mode().IsRegular() {
			extra = append(extra, File{Path: c, Src: c, Mode: 0o644})
		}
	}
	return hostTools("kube-router", "apt-get install iptables conntrack ipset iproute2 busybox-static", roots, extra)
}

// hostBusybox is Debian's static busybox at /bin/busybox with a link per
// applet in /bin, like the upstream busybox image: the e2e tests' workload
// (httpd, wget, nslookup, sh).
func hostBusybox() ([]File, error) {
	const bb = "/usr/bin/busybox"
	if _, err := os.Stat(bb); err != nil {
		return nil, fmt.Errorf("the busybox image needs %s from this machine: apt-get install busybox-static (%w)", bb, err)
	}
	out, err := exec.Command(bb, "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("%s --list: %w", bb, err)
	}
	files := []File{{Path: "/bin/busybox", Src: bb, Mode: 0o755}}
	for _, applet := range strings.Fields(string(out)) {
		if applet != "busybox" && !strings.Contains(applet, "/") {
			files = append(files, File{Path: "/bin/" + applet, Link: "busybox"})
		}
	}
	return files, nil
}

// iptablesFiles are the iptables binaries and extensions (roots) and the
// iptables*/ip6tables* names (links) of hostIPTables.
func iptablesFiles() (roots []string, links []File, err error) {
	const sbin = "/usr/sbin"
	for _, multi := range []string{"xtables-nft-multi", "xtables-legacy-multi"} {
		roots = append(roots, sbin+"/"+multi)
	}
	roots = append(roots, sbin+"/conntrack")
	for _, fam := range []string{"iptables", "ip6tables"} {
		for _, op := range []string{"", "-save", "-restore"} {
			links = append(links,
				File{Path: sbin + "/" + fam + op, Link: "xtables-nft-multi"},
				File{Path: sbin + "/" + fam + "-nft" + op, Link: "xtables-nft-multi"},
				File{Path: sbin + "/" + fam + "-legacy" + op, Link: "xtables-legacy-multi"},
			)
		}
	}
	exts, err := filepath.Glob(xtablesDir + "/*.so")
	if err != nil {
		return nil, nil, err
	}
	if len(exts) == 0 {
		return nil, nil, fmt.Errorf("no iptables extensions in %s: apt-get install iptables conntrack", xtablesDir)
	}
	return append(roots, exts...), links, nil
}

// hostTools copies roots (ELF files on this machine) into a layer at the same
// paths, with their loader and every shared library they load, plus extra
// (links and plain files); hint says how to install a missing root.
func hostTools(image, hint string, roots []string, extra []File) ([]File, error) {
	for _, r := range roots {
		if _, err := os.Stat(r); err != nil {
			return nil, fmt.Errorf("the %s image needs %s from this machine: %s (%w)", image, r, hint, err)
		}
	}
	needed, err := elfClosure(roots)
	if err != nil {
		return nil, err
	}
	byPath := map[string]File{}
	for _, p := range needed {
		if err := hostPath(p, byPath, 0); err != nil {
			return nil, err
		}
	}
	// iptables takes its lock at /run/xtables.lock (the DaemonSets mount the
	// host's there).
	byPath["/run"] = File{Path: "/run", Dir: true, Mode: 0o755}
	for _, f := range extra {
		byPath[f.Path] = f
	}
	files := make([]File, 0, len(byPath))
	for _, f := range byPath {
		files = append(files, f)
	}
	return files, nil
}

// elfClosure returns the ELF files roots and, recursively, their program
// interpreter and the shared libraries they need (DT_NEEDED, resolved as
// ld.so would: DT_RUNPATH/DT_RPATH, then the system directories), sorted.
func elfClosure(roots []string) ([]string, error) {
	seen := map[string]bool{}
	var visit func(p, from string) error
	visit = func(p, from string) error {
		if seen[p] {
			return nil
		}
		seen[p] = true
		f, err := elf.Open(p)
		if err != nil {
			return fmt.Errorf("%s (needed by %s): %w", p, from, err)
		}
		defer f.Close()
		for _, prog := range f.Progs {
			if prog.Type != elf.PT_INTERP {
				continue
			}
			b := make([]byte, prog.Filesz)
			if _, err := prog.ReadAt(b, 0); err != nil {
				return fmt.Errorf("%s: reading PT_INTERP: %w", p, err)
			}
			if err := visit(strings.TrimRight(string(b), "\x00"), p); err != nil {
				return err
			}
		}
		libs, err := f.ImportedLibraries()
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		var dirs []string
		for _, tag := range []elf.DynTag{elf.DT_RUNPATH, elf.DT_RPATH} {
			vals, _ := f.DynString(tag)
			for _, v := range vals {
				for _, d := range strings.Split(v, ":") {
					dirs = append(dirs, strings.ReplaceAll(d, "$ORIGIN", path.Dir(p)))
				}
			}
		}
		dirs = append(dirs, libDirs...)
		for _, lib := range libs {
			found := ""
			for _, d := range dirs {
				if c := path.Join(d, lib); fileExists(c) {
					found = c
					break
				}
			}
			if found == "" {
				return fmt.Errorf("%s needs %s, found in none of %v", p, lib, dirs)
			}
			if err := visit(found, p); err != nil {
				return err
			}
		}
		return nil
	}
	for _, r := range roots {
		if err := visit(r, "the image"); err != nil {
			return nil, err
		}
	}
	out := make([]string, 0, len(seen))
	for p := range seen {
		out = append(out, p)
	}
	sort.Strings(out)
	return out, nil
}

func fileExists(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular()
}

// hostPath adds the file at p on this machine to out, at the same path,
// keeping every symbolic link on the way as a link (e.g. /lib64 → usr/lib64,
// libc.so.6 → ...), so that the image resolves the same names the same way.
func hostPath(p string, out map[string]File, depth int) error {
	if depth > 40 {
		return fmt.Errorf("%s: too many levels of symbolic links", p)
	}
	parts := strings.Split(strings.TrimPrefix(path.Clean(p), "/"), "/")
	cur := "/"
	for i, part := range parts {
		next := path.Join(cur, part)
		fi, err := os.Lstat(next)
		if err != nil {
			return err
		}
		switch {
		case fi.Mode()&os.ModeSymlink != 0:
			target, err := os.Readlink(next)
			if err != nil {
				return err
			}
			out[next] = File{Path: next, Link: target}
			resolved := target
			if !path.IsAbs(target) {
				resolved = path.Join(cur, target)
			}
			return hostPath(path.Join(append([]string{resolved}, parts[i+1:]...)...), out, depth+1)
		case fi.IsDir():
			if i == len(parts)-1 {
				out[next] = File{Path: next, Dir: true, Mode: 0o755}
			}
			cur = next
		case fi.Mode().IsRegular():
			if i != len(parts)-1 {
				return fmt.Errorf("%s: not a directory", next)
			}
			out[next] = File{Path: next, Src: next, Mode: fi.Mode().Perm()}
		default:
			return fmt.Errorf("%s: not a regular file, directory or symbolic link", next)
		}
	}
	return nil
}
