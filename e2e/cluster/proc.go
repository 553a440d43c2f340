package cluster

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// A component is one host process of the cluster.
type component struct {
	name  string
	bin   string
	args  []string
	env   []string // added to the environment
	ready func(ctx context.Context) error
	// readyTimeout bounds the wait for ready after the launch.
	readyTimeout time.Duration
}

// fingerprint hashes the binary's path and size, the arguments, the added
// environment, and the content of every file an argument names (config
// files, certificates, kubeconfigs).
func (comp component) fingerprint() string {
	h := sha256.New()
	fi, _ := os.Stat(comp.bin)
	var size int64
	if fi != nil {
		size = fi.Size()
	}
	fmt.Fprintf(h, "%s %d\n", comp.bin, size)
	for _, a := range append(append([]string(nil), comp.args...), comp.env...) {
		fmt.Fprintf(h, "%s\n", a)
		path := a
		if _, v, ok := strings.Cut(a, "="); ok {
			path = v
		}
		if !strings.HasPrefix(path, "/") {
			continue
		}
		if fi, err := os.Stat(path); err == nil && fi.Mode().IsRegular() && fi.Size() < 1<<20 {
			b, _ := os.ReadFile(path)
			h.Write(b)
		}
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// procInfo identifies a process across PID reuse: its start time in clock
// ticks since boot (field 22 of /proc/PID/stat).
type procInfo struct {
	pid   int
	start uint64
	// fingerprint of the command line and the files it names (PID file
	// only): a change makes Up restart the component.
	fingerprint string
}

func readStat(pid int) (state byte, start uint64, ppid int, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, 0, err
	}
	// The command name is in parentheses and may contain anything.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, 0, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state), so field N is f[N-3].
	if len(f) < 20 {
		return 0, 0, 0, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	start, err = strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return 0, 0, 0, err
	}
	ppid, _ = strconv.Atoi(f[1])
	return f[0][0], start, ppid, nil
}

// alive: the process exists, is not a zombie and is the one recorded.
func (p procInfo) alive() bool {
	if p.pid <= 0 {
		return false
	}
	state, start, _, err := readStat(p.pid)
	if err != nil {
		return false
	}
	return state != 'Z' && state != 'X' && (p.start == 0 || start == p.start)
}

func (c *Cluster) readPID(name string) (procInfo, bool) {
	b, err := os.ReadFile(c.paths.pid(name))
	if err != nil {
		return procInfo{}, false
	}
	f := strings.Fields(string(b))
	if len(f) < 1 {
		return procInfo{}, false
	}
	var p procInfo
	p.pid, _ = strconv.Atoi(f[0])
	if len(f) > 1 {
		p.start, _ = strconv.ParseUint(f[1], 10, 64)
	}
	if len(f) > 2 {
		p.fingerprint = f[2]
	}
	return p, p.pid > 0
}

// running returns the recorded process of a component if it is alive.
func (c *Cluster) running(name string) (procInfo, bool) {
	p, ok := c.readPID(name)
	if !ok || !p.alive() {
		return procInfo{}, false
	}
	return p, true
}

// launch starts a component detached from this process (its own session,
// output appended to its log file) and records its PID.
func (c *Cluster) launch(comp component) (procInfo, error) {
	if err := os.MkdirAll(c.paths.logs, 0o755); err != nil {
		return procInfo{}, err
	}
	if err := os.MkdirAll(c.paths.run, 0o755); err != nil {
		return procInfo{}, err
	}
	logPath := c.paths.log(comp.name)
	lf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return procInfo{}, err
	}
	defer lf.Close()
	fmt.Fprintf(lf, "\n===== %s starting: %s %s\n", time.Now().Format(time.RFC3339), comp.bin, strings.Join(comp.args, " "))
	cmd := exec.Command(comp.bin, comp.args...)
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.Env = append(os.Environ(), comp.env...)
	cmd.Dir = c.opts.StateDir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return procInfo{}, fmt.Errorf("starting %s: %w (see %s)", comp.name, err, logPath)
	}
	p := procInfo{pid: cmd.Process.Pid, fingerprint: comp.fingerprint()}
	if _, start, _, err := readStat(p.pid); err == nil {
		p.start = start
	}
	done := make(chan struct{})
	c.mu.Lock()
	c.exited[p.pid] = done
	c.mu.Unlock()
	// Reap it if it ends while this process lives; when this process exits
	// first, the component goes on (it has its own session).
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	if err := os.WriteFile(c.paths.pid(comp.name), fmt.Appendf(nil, "%d %d %s\n", p.pid, p.start, p.fingerprint), 0o644); err != nil {
		return p, err
	}
	return p, nil
}

// ensure starts a component unless it already runs, then waits until it is
// ready; it reports whether it launched the process. Errors name the
// component's log file and quote its end.
func (c *Cluster) ensure(ctx context.Context, comp component) (bool, error) {
	p, ok := c.running(comp.name)
	if ok && p.fingerprint != comp.fingerprint() {
		c.logf("    %s: command line or configuration changed, restarting", comp.name)
		if _, err := c.stop(comp.name, 10*time.Second); err != nil {
			return false, err
		}
		ok = false
	}
	if ok {
		cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		err := comp.ready(cctx)
		cancel()
		if err == nil {
			return false, nil
		}
	}
	launched := false
	if !ok {
		var err error
		if p, err = c.launch(comp); err != nil {
			return true, err
		}
		launched = true
	}
	timeout := comp.readyTimeout
	if timeout == 0 {
		timeout = 60 * time.Second
	}
	return launched, c.waitReady(ctx, comp.name, p, timeout, comp.ready)
}

// waitReady polls check until it succeeds, the process dies or time is up.
func (c *Cluster) waitReady(ctx context.Context, name string, p procInfo, timeout time.Duration, check func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
		last = check(cctx)
		ccancel()
		if last == nil {
			return nil
		}
		if !p.alive() {
			return fmt.Errorf("%s exited (pid %d): see %s%s", name, p.pid, c.paths.log(name), c.logTail(name, 15))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not ready after %s: %v; see %s%s", name, timeout, last, c.paths.log(name), c.logTail(name, 15))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// logTail quotes the last lines of a component's log for an error message.
func (c *Cluster) logTail(name string, n int) string {
	b, err := os.ReadFile(c.paths.log(name))
	if err != nil || len(b) == 0 {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	for i, l := range lines {
		if len(l) > 400 {
			lines[i] = l[:400] + "…"
		}
	}
	return "\n  | " + strings.Join(lines, "\n  | ")
}

// stop ends a component by its recorded PID: SIGTERM to its process group,
// then SIGKILL after grace. It is a no-op when the component is not running.
func (c *Cluster) stop(name string, grace time.Duration) (bool, error) {
	p, ok := c.readPID(name)
	if !ok {
		return false, nil
	}
	defer os.Remove(c.paths.pid(name))
	if !p.alive() {
		return false, nil
	}
	return true, c.kill(p, grace)
}

func (c *Cluster) kill(p procInfo, grace time.Duration) error {
	// Setsid made it a process-group leader: signal the group.
	_ = syscall.Kill(-p.pid, syscall.SIGTERM)
	_ = syscall.Kill(p.pid, syscall.SIGTERM)
	if c.waitGone(p, grace) {
		return nil
	}
	_ = syscall.Kill(-p.pid, syscall.SIGKILL)
	_ = syscall.Kill(p.pid, syscall.SIGKILL)
	if c.waitGone(p, 5*time.Second) {
		return nil
	}
	return fmt.Errorf("pid %d did not exit after SIGKILL", p.pid)
}

func (c *Cluster) waitGone(p procInfo, d time.Duration) bool {
	deadline := time.Now().Add(d)
	c.mu.Lock()
	done := c.exited[p.pid]
	c.mu.Unlock()
	for time.Now().Before(deadline) {
		if done != nil {
			select {
			case <-done:
				return true
			default:
			}
		}
		if !p.alive() {
			return true
		}
		time.Sleep(50 * time.Millisecond)
	}
	return !p.alive()
}

// stray is a process of the cluster that no PID file records.
type stray struct {
	procInfo
	name string // the binary's name
}

// strayProcesses finds processes of the cluster's binaries (names; all of
// them when none is given), such as containerd's shims or a component whose
// PID file was lost, whose command line mentions the state directory, as
// every component's and shim's does. Processes that a PID file records,
// other programs (a `tail -f` of a log, an editor), this process and its
// ancestors are never included.
func (c *Cluster) strayProcesses(names ...string) []stray {
	skip := map[int]bool{}
	for pid := os.Getpid(); pid > 1; {
		skip[pid] = true
		_, _, ppid, err := readStat(pid)
		if err != nil {
			break
		}
		pid = ppid
	}
	for _, n := range startOrder {
		if p, ok := c.readPID(n); ok {
			skip[p.pid] = true
		}
	}
	want := c.paths.binaries()
	if len(names) > 0 {
		want = map[string]string{}
		for _, n := range names {
			want[n] = n
		}
	}
	ents, _ := os.ReadDir("/proc")
	needle := []byte(c.opts.StateDir + string(filepath.Separator))
	var out []stray
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || skip[pid] {
			continue
		}
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil || !bytes.Contains(cmdline, needle) {
			continue
		}
		exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
		name := filepath.Base(strings.TrimSuffix(exe, " (deleted)"))
		if _, ok := want[name]; !ok {
			continue
		}
		state, start, _, err := readStat(pid)
		if err != nil || state == 'Z' {
			continue
		}
		out = append(out, stray{procInfo{pid: pid, start: start}, name})
	}
	return out
}

func lookPath(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, dir := range []string{"/usr/sbin", "/sbin", "/usr/local/sbin"} {
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().Perm()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found in PATH", name)
}

// run runs a short host command and returns its combined output.
func run(ctx context.Context, name string, args ...string) (string, error) {
	path, err := lookPath(name)
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, path, args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}
