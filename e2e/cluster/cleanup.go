package cluster

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Fixed host paths the kubelet, containerd and the CNI plugins use whatever
// their configuration says. Up records which of them existed before the
// first Up; Down removes only its own entries from them, and the paths
// themselves when they were not there before (and, for /run/containerd,
// only when empty: another containerd may use it).
var fixedHostPaths = []string{
	"/var/lib/kubelet",    // device-plugins, plugins_registry
	"/var/log/containers", // the kubelet's symlinks to container logs
	"/var/lib/cni",        // libcni's result cache
	"/run/containerd",     // shim sockets (/run/containerd/s)
}

func (c *Cluster) recordHostPaths() error {
	if _, err := os.Stat(c.paths.hostLog); err == nil {
		return nil // recorded at the first Up after the last Down
	}
	var b strings.Builder
	b.WriteString("# host paths that existed before this cluster's first Up; Down keeps them\n")
	for _, p := range fixedHostPaths {
		if _, err := os.Lstat(p); err == nil {
			b.WriteString(p + "\n")
		}
	}
	return writeFileAtomic(c.paths.hostLog, []byte(b.String()), 0o644)
}

func (c *Cluster) preexistingHostPaths() map[string]bool {
	m := map[string]bool{}
	b, err := os.ReadFile(c.paths.hostLog)
	if err != nil {
		// Unknown: keep every fixed path that exists, remove only ours.
		for _, p := range fixedHostPaths {
			m[p] = true
		}
		return m
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "/") {
			m[l] = true
		}
	}
	return m
}

// mountsUnder lists the mount points at or below any of dirs, deepest
// first (from /proc/self/mountinfo).
func mountsUnder(dirs ...string) ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var mps []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMount(fields[4])
		for _, d := range dirs {
			if mp == d || strings.HasPrefix(mp, d+"/") {
				mps = append(mps, mp)
				break
			}
		}
	}
	// Deepest first; a path mounted twice is listed twice.
	sort.SliceStable(mps, func(i, j int) bool { return strings.Count(mps[i], "/") > strings.Count(mps[j], "/") })
	return mps, sc.Err()
}

func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// unmountAll unmounts everything at or below dirs, lazily when a plain
// unmount fails.
func unmountAll(dirs ...string) (int, error) {
	n := 0
	for range 5 {
		mps, err := mountsUnder(dirs...)
		if err != nil {
			return n, err
		}
		if len(mps) == 0 {
			return n, nil
		}
		for _, mp := range mps {
			if err := syscall.Unmount(mp, 0); err != nil {
				_ = syscall.Unmount(mp, syscall.MNT_DETACH)
			}
			n++
		}
	}
	mps, _ := mountsUnder(dirs...)
	if len(mps) > 0 {
		return n, fmt.Errorf("still mounted: %s", strings.Join(mps, ", "))
	}
	return n, nil
}

// cgroupRoots are the mounted cgroup hierarchies (v1 controllers, the named
// systemd one and the v2 one of a hybrid setup).
func cgroupRoots() []string {
	ents, err := os.ReadDir("/sys/fs/cgroup")
	if err != nil {
		return nil
	}
	var roots []string
	for _, e := range ents {
		p := filepath.Join("/sys/fs/cgroup", e.Name())
		if fi, err := os.Lstat(p); err == nil && fi.IsDir() && fi.Mode()&os.ModeSymlink == 0 {
			roots = append(roots, p)
		}
	}
	// cgroup v2 only: /sys/fs/cgroup itself is the hierarchy.
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		roots = append(roots, "/sys/fs/cgroup")
	}
	return roots
}

// killKubepods SIGKILLs every process left in a kubepods cgroup (pods'
// processes whose shim is gone).
func killKubepods() int {
	n := 0
	for _, root := range cgroupRoots() {
		_ = filepath.WalkDir(filepath.Join(root, "kubepods"), func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
				return nil
			}
			b, _ := os.ReadFile(path)
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil && pid > 1 {
					_ = syscall.Kill(pid, syscall.SIGKILL)
					n++
				}
			}
			return nil
		})
	}
	return n
}

// removeKubepodsCgroups removes the kubepods cgroup trees, deepest first.
func removeKubepodsCgroups() error {
	var errs []error
	deadline := time.Now().Add(10 * time.Second)
	for _, root := range cgroupRoots() {
		top := filepath.Join(root, "kubepods")
		if _, err := os.Stat(top); err != nil {
			continue
		}
		var dirs []string
		_ = filepath.WalkDir(top, func(path string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, path)
			}
			return nil
		})
		sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
		for _, d := range dirs {
			for {
				err := syscall.Rmdir(d)
				if err == nil || errors.Is(err, syscall.ENOENT) {
					break
				}
				if !errors.Is(err, syscall.EBUSY) || time.Now().After(deadline) {
					errs = append(errs, fmt.Errorf("rmdir %s: %w", d, err))
					break
				}
				time.Sleep(100 * time.Millisecond) // processes still exiting
			}
		}
	}
	return errors.Join(errs...)
}

// cleanHostPaths removes what the cluster left in the fixed host paths.
func (c *Cluster) cleanHostPaths() error {
	pre := c.preexistingHostPaths()
	var errs []error
	state := c.opts.StateDir + "/"

	if _, err := os.Lstat("/var/lib/kubelet"); err == nil && !pre["/var/lib/kubelet"] {
		if _, err := unmountAll("/var/lib/kubelet"); err != nil {
			errs = append(errs, err)
		} else if err := os.RemoveAll("/var/lib/kubelet"); err != nil {
			errs = append(errs, err)
		}
	}

	ents, _ := os.ReadDir("/var/log/containers")
	for _, e := range ents {
		full := filepath.Join("/var/log/containers", e.Name())
		if target, err := os.Readlink(full); err == nil && strings.HasPrefix(target, state) {
			_ = os.Remove(full)
		}
	}
	if !pre["/var/log/containers"] {
		_ = os.Remove("/var/log/containers") // only if empty
	}

	if _, err := os.Lstat("/var/lib/cni"); err == nil {
		if !pre["/var/lib/cni"] {
			if err := os.RemoveAll("/var/lib/cni"); err != nil {
				errs = append(errs, err)
			}
		} else {
			for _, sub := range []string{"results", "cache/results"} {
				matches, _ := filepath.Glob(filepath.Join("/var/lib/cni", sub, "apiary-dev-*"))
				for _, m := range matches {
					_ = os.Remove(m)
				}
			}
		}
	}

	// Shim sockets are removed by the shims; drop the dirs only when empty.
	_ = os.Remove("/run/containerd/s")
	if !pre["/run/containerd"] {
		_ = os.Remove("/run/containerd")
	}
	return errors.Join(errs...)
}
