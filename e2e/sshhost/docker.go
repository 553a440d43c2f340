// Package sshhost gives tests real SSH hosts: Docker containers that boot
// systemd as PID 1 and run sshd, containerd (CRI v1, from source) with
// Debian's runc, and iptables, on a Docker network the test creates. They
// look to the SSH host agent like freshly installed machines that can later
// receive kubelet/kubeadm over SFTP and `kubeadm join` a tenant cluster, so
// they are run the way kind runs its nodes: every capability and device the
// machine allows, seccomp and AppArmor unconfined, tmpfs /run and /tmp, /var
// on a volume (overlayfs snapshots cannot live on overlayfs), and a private
// cgroup namespace so that systemd and, later, the kubelet see the
// container's cgroups as the root (see StartHost for why not --privileged).
//
// The Docker daemon is Debian's docker.io (20.10), started by EnsureDocker
// on its own socket with its own data root, with no default bridge, so that
// it neither meets a dockerd of the machine nor touches the local management
// cluster's networks. The image is a debootstrapped Debian bookworm, built
// once and cached by the hash of its recipe (EnsureImage).
//
// Everything here shells out to the docker CLI (Debian's /usr/bin/docker
// first: it matches the daemon's API) and, for the image, to debootstrap;
// both are Debian packages that hack/install-deps.sh installs.
package sshhost

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/apiaryhq/apiary/internal/hostnet"
)

// Fixed places of the daemon this package starts. They are fixed (not per
// test) so that a second test process finds the daemon the first one left
// running, and so that a stale one is easy to find by hand.
const (
	// DefaultSocket is the unix socket dockerd listens on.
	DefaultSocket = "/run/apiary-docker.sock"
	// DefaultExecRoot holds dockerd's and its containerd's run-time state.
	DefaultExecRoot = "/run/apiary-docker"
	// DefaultPidFile is dockerd's pidfile.
	DefaultPidFile = "/run/apiary-docker.pid"
	// AddressPool is where Docker takes subnets from for networks created
	// without one. It avoids the management cluster's 10.200.0.0/16 (pods),
	// 10.201.0.0/16 (services), 10.202.0.0/24 (LoadBalancer pool), the
	// tenant defaults 10.244.0.0/16 and 10.96.0.0/16, and the machine's
	// 192.0.2.0/24.
	AddressPool = "172.30.0.0/16"
	// LabelKey marks every container and network this package creates.
	LabelKey = "dev.apiary.sshhost"
)

// Docker is a dockerd this package started (or found running on its socket).
type Docker struct {
	// Socket is the daemon's unix socket.
	Socket string
	// Dir holds the data root (Dir/data), the daemon's log (LogFile), its
	// daemon.json and the image build's scratch space and logs.
	Dir string
	// LogFile is dockerd's log.
	LogFile string
	// Started tells whether EnsureDocker started the daemon (and so Stop
	// stops it).
	Started bool

	cli     string // docker client binary
	pid     int
	exited  chan struct{} // closed when the dockerd we started exits
	pidFile string

	mu         sync.Mutex
	containers map[string]bool // names created through this value
	networks   map[string]bool
}

// CacheDir is $APIARY_CACHE, else ~/.cache/apiary (as for e2e/cluster).
func CacheDir() (string, error) {
	if d := os.Getenv("APIARY_CACHE"); d != "" {
		return filepath.Abs(d)
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("no APIARY_CACHE and no home directory: %w", err)
	}
	return filepath.Join(home, ".cache", "apiary"), nil
}

// dockerClient prefers Debian's client, which matches the daemon's API
// version; a newer client on PATH (e.g. /usr/local/bin/docker) negotiates
// down and works too.
func dockerClient() (string, error) {
	for _, p := range []string{"/usr/bin/docker"} {
		if fi, err := os.Stat(p); err == nil && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	p, err := exec.LookPath("docker")
	if err != nil {
		return "", errors.New("docker client not found (apt-get install docker.io, or run hack/install-deps.sh)")
	}
	return p, nil
}

func lookSbin(name string) (string, error) {
	for _, d := range []string{"/usr/sbin", "/usr/bin", "/sbin", "/bin", "/usr/local/sbin", "/usr/local/bin"} {
		p := filepath.Join(d, name)
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return exec.LookPath(name)
}

// EnsureDocker starts dockerd (data root and logs under
// $APIARY_CACHE/docker, socket DefaultSocket, pidfile DefaultPidFile)
// unless one already answers on that socket. The daemon runs with no
// default bridge (--bridge=none: no docker0 at all) and takes the subnets
// of networks created without one from AddressPool, so the management
// cluster's routes stay as they are. Docker does add its DOCKER* iptables
// chains and jumps from FORWARD and nat PREROUTING/OUTPUT; they only act on
// Docker's own bridges, and it leaves the FORWARD policy alone because IPv4
// forwarding is already on (it sets DROP only when it turns forwarding on
// itself, which is why forwarding is turned on here first). Stop removes
// the chains again. Errors name the daemon's log file.
func EnsureDocker(ctx context.Context) (*Docker, error) {
	d, err := newDocker()
	if err != nil {
		return nil, err
	}
	if d.ping(ctx) == nil {
		return d, nil
	}
	if err := os.MkdirAll(d.Dir, 0o755); err != nil {
		return nil, err
	}
	// Two test processes may get here at once: one starts the daemon, the
	// other finds it answering.
	lock, err := os.OpenFile(filepath.Join(d.Dir, "dockerd.lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	defer lock.Close() // and so unlocked
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return nil, err
	}
	if d.ping(ctx) == nil {
		return d, nil
	}
	if err := d.start(ctx); err != nil {
		return nil, err
	}
	return d, nil
}

// newDocker describes the daemon at the fixed socket without starting it.
func newDocker() (*Docker, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("sshhost: dockerd and the test hosts need root")
	}
	cache, err := CacheDir()
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(cache, "docker")
	cli, err := dockerClient()
	if err != nil {
		return nil, err
	}
	return &Docker{
		Socket:     DefaultSocket,
		Dir:        dir,
		LogFile:    filepath.Join(dir, "dockerd.log"),
		cli:        cli,
		pidFile:    DefaultPidFile,
		containers: map[string]bool{},
		networks:   map[string]bool{},
	}, nil
}

// start starts dockerd and waits until it answers.
func (d *Docker) start(ctx context.Context) error {
	dir := d.Dir
	dockerd, err := lookSbin("dockerd")
	if err != nil {
		return errors.New("dockerd not found (apt-get install docker.io, or run hack/install-deps.sh)")
	}
	for _, p := range []string{"iptables", "containerd", "runc"} {
		if _, err := lookSbin(p); err != nil {
			return fmt.Errorf("%s not found (dockerd needs it; apt-get install docker.io iptables)", p)
		}
	}
	if err := os.MkdirAll(filepath.Join(dir, "data"), 0o711); err != nil {
		return err
	}
	// A daemon.json of our own: dockerd refuses to start when a flag is
	// also set in the machine's /etc/docker/daemon.json.
	cfg := filepath.Join(dir, "daemon.json")
	if err := os.WriteFile(cfg, []byte("{}\n"), 0o644); err != nil {
		return err
	}
	if err := hostnet.EnsureIPForward(); err != nil {
		return fmt.Errorf("turning on IPv4 forwarding: %w", err)
	}
	// A dead daemon's socket and pidfile stop a new one from starting.
	if pid := readPid(d.pidFile); pid > 0 && processAlive(pid) {
		return fmt.Errorf("dockerd (pid %d from %s) runs but does not answer on %s; see %s", pid, d.pidFile, d.Socket, d.LogFile)
	}
	_ = os.Remove(d.Socket)
	_ = os.Remove(d.pidFile)

	logf, err := os.OpenFile(d.LogFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	fmt.Fprintf(logf, "\n==== %s sshhost.EnsureDocker starting dockerd\n", time.Now().Format(time.RFC3339))
	args := []string{
		"--host", "unix://" + d.Socket,
		"--data-root", filepath.Join(dir, "data"),
		"--exec-root", DefaultExecRoot,
		"--pidfile", d.pidFile,
		"--config-file", cfg,
		// No docker0: test hosts live on networks the tests create.
		"--bridge", "none",
		"--default-address-pool", "base=" + AddressPool + ",size=24",
		// Hairpin mode on the bridge ports (dockerd sets it when there
		// is no userland proxy; no test publishes a port). A host's
		// connection to a LoadBalancer address the machine's kube-proxy
		// sends back to that same host (a registered tenant's endpoint
		// with that host as its only backend) leaves and re-enters one
		// bridge port: without hairpin mode the bridge drops it, which
		// no routed network does. The kubelet of the only serving
		// control-plane host then lost its API server, and its Node went
		// NotReady during every rewrite of the other host.
		"--userland-proxy=false",
		"--storage-driver", "overlay2",
		"--log-level", "warn",
	}
	cmd := exec.Command(dockerd, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = daemonEnv()
	// Its own session: the daemon outlives a test process that dies, and a
	// signal to the test's process group does not reach it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting dockerd: %w (log: %s)", err, d.LogFile)
	}
	d.Started, d.pid, d.exited = true, cmd.Process.Pid, make(chan struct{})
	go func() { _ = cmd.Wait(); close(d.exited) }()

	deadline := time.Now().Add(90 * time.Second)
	for {
		if err := d.ping(ctx); err == nil {
			return nil
		}
		select {
		case <-d.exited:
			return fmt.Errorf("dockerd exited while starting: %s (log: %s)", lastLines(d.LogFile, 10), d.LogFile)
		case <-ctx.Done():
			d.kill()
			return fmt.Errorf("waiting for dockerd: %w (log: %s)", ctx.Err(), d.LogFile)
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			d.kill()
			return fmt.Errorf("dockerd did not answer on %s within 90s: %s (log: %s)", d.Socket, lastLines(d.LogFile, 10), d.LogFile)
		}
	}
}

func daemonEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "DOCKER_") || strings.HasPrefix(kv, "PATH=") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
}

// ping asks the daemon's /_ping over its socket.
func (d *Docker) ping(ctx context.Context) error {
	c := http.Client{
		Timeout: 2 * time.Second,
		Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var dl net.Dialer
			return dl.DialContext(ctx, "unix", d.Socket)
		}},
	}
	defer c.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://docker/_ping", nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("dockerd /_ping: %s", resp.Status)
	}
	return nil
}

// Stop removes the containers and networks created through d, then, if
// EnsureDocker started dockerd, stops it and removes the iptables chains
// that Docker adds (DOCKER, DOCKER-USER, DOCKER-ISOLATION-*) with the rules
// that jump to them, unless another dockerd still runs on the machine.
// Images and the data root stay: they are the cache. A daemon that
// EnsureDocker found running is left running (StopDaemon stops it).
func (d *Docker) Stop(ctx context.Context) error {
	var errs []error
	d.mu.Lock()
	containers, networks := keys(d.containers), keys(d.networks)
	d.mu.Unlock()
	for _, c := range containers {
		if err := d.RemoveHost(ctx, c); err != nil {
			errs = append(errs, err)
		}
	}
	for _, n := range networks {
		if err := d.removeNetwork(ctx, n); err != nil {
			errs = append(errs, err)
		}
	}
	if d.Started {
		errs = append(errs, d.stopDaemon(ctx))
		d.Started = false
	}
	return errors.Join(errs...)
}

// StopDaemon stops the dockerd on DefaultSocket whoever started it (a test
// that died, say): it removes every container and network this package
// labelled, stops the daemon named by DefaultPidFile and removes Docker's
// iptables chains as Stop does. Nothing running is not an error.
func StopDaemon(ctx context.Context) error {
	d, err := newDocker()
	if err != nil {
		return err
	}
	var errs []error
	if d.ping(ctx) == nil {
		for _, kind := range []string{"ps --all", "network ls"} {
			out, err := d.run(ctx, nil, append(strings.Fields(kind), "--quiet", "--filter", "label="+LabelKey)...)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			for _, id := range strings.Fields(out) {
				if kind == "network ls" {
					errs = append(errs, d.removeNetwork(ctx, id))
				} else {
					errs = append(errs, d.RemoveHost(ctx, id))
				}
			}
		}
	}
	if pid := readPid(d.pidFile); pid > 0 && processAlive(pid) {
		if comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); strings.TrimSpace(string(comm)) != "dockerd" {
			return errors.Join(append(errs, fmt.Errorf("%s names pid %d, which is not dockerd", d.pidFile, pid))...)
		}
		d.pid = pid
		errs = append(errs, d.stopDaemon(ctx))
	}
	return errors.Join(errs...)
}

func (d *Docker) removeNetwork(ctx context.Context, n string) error {
	_, err := d.run(ctx, nil, "network", "rm", n)
	if err != nil && !strings.Contains(err.Error(), "No such network") && !strings.Contains(err.Error(), "not found") {
		return err
	}
	d.mu.Lock()
	delete(d.networks, n)
	d.mu.Unlock()
	return nil
}

// stopDaemon stops dockerd (SIGTERM, then SIGKILL after 30s) and removes
// Docker's iptables chains.
func (d *Docker) stopDaemon(ctx context.Context) error {
	pid := d.pid
	if pid == 0 {
		pid = readPid(d.pidFile)
	}
	if pid > 0 {
		_ = syscall.Kill(pid, syscall.SIGTERM)
		if !d.waitExit(pid, 30*time.Second) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			if !d.waitExit(pid, 10*time.Second) {
				return fmt.Errorf("dockerd (pid %d) did not exit (log: %s)", pid, d.LogFile)
			}
		}
	}
	if otherDockerd() {
		return nil
	}
	// The parent cgroups Docker made for its containers (cgroupfs driver:
	// /sys/fs/cgroup/<hierarchy>/docker), now empty. rmdir removes only
	// an empty cgroup, so a busy one stays.
	if dirs, _ := filepath.Glob("/sys/fs/cgroup/*/docker"); len(dirs) > 0 {
		for _, dir := range dirs {
			_ = syscall.Rmdir(dir)
		}
	}
	if _, err := cleanDockerIptables(ctx); err != nil {
		return fmt.Errorf("removing Docker's iptables chains: %w", err)
	}
	return nil
}

func (d *Docker) kill() {
	if d.pid > 0 {
		_ = syscall.Kill(d.pid, syscall.SIGTERM)
		d.waitExit(d.pid, 20*time.Second)
	}
}

func (d *Docker) waitExit(pid int, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if d.exited != nil && pid == d.pid {
			select {
			case <-d.exited:
				return true
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		if !processAlive(pid) {
			return true
		}
		time.Sleep(100 * time.Millisecond)
	}
	return false
}

func keys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func readPid(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

// processAlive is true for a process that exists and is not a zombie.
func processAlive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// pid (comm) state ...; comm may hold spaces and parentheses.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

// otherDockerd tells whether a dockerd is still running (the machine's
// own, say), in which case Docker's iptables chains are its too.
func otherDockerd() bool {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		if err == nil && strings.TrimSpace(string(comm)) == "dockerd" && processAlive(pid) {
			return true
		}
	}
	return false
}

var dockerChain = regexp.MustCompile(`^DOCKER(-|$)`)

// cleanDockerIptables deletes, in iptables' filter and nat tables, the
// DOCKER* chains and the rules of other chains that jump to them. Nothing
// else is touched. It returns how many chains it removed.
func cleanDockerIptables(ctx context.Context) (int, error) {
	save, err := lookSbin("iptables-save")
	if err != nil {
		return 0, nil
	}
	restore, err := lookSbin("iptables-restore")
	if err != nil {
		return 0, err
	}
	total := 0
	var errs []error
	for _, table := range []string{"filter", "nat"} {
		out, err := exec.CommandContext(ctx, save, "-t", table).Output()
		if err != nil {
			continue
		}
		script, n := iptablesCleanupScript(table, string(out))
		if n == 0 {
			continue
		}
		cmd := exec.CommandContext(ctx, restore, "--noflush")
		cmd.Stdin = strings.NewReader(script)
		if out, err := cmd.CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("iptables-restore (%s): %w: %s", table, err, bytes.TrimSpace(out)))
			continue
		}
		total += n
	}
	return total, errors.Join(errs...)
}

// iptablesCleanupScript removes dockerd's DOCKER* chains and the jumps
// into them.
func iptablesCleanupScript(table, save string) (string, int) {
	return hostnet.CleanupScript(table, save, dockerChain)
}

// run runs the docker CLI against d's socket. stdin may be nil.
func (d *Docker) run(ctx context.Context, stdin io.Reader, args ...string) (string, error) {
	full := append([]string{"--host", "unix://" + d.Socket}, args...)
	cmd := exec.CommandContext(ctx, d.cli, full...)
	cmd.Stdin = stdin
	cmd.Env = append(daemonEnv(), "DOCKER_CLI_HINTS=false")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil {
		msg := strings.TrimSpace(stderr.String())
		if msg == "" {
			msg = strings.TrimSpace(stdout.String())
		}
		return stdout.String(), fmt.Errorf("docker %s: %w: %s", strings.Join(redact(args), " "), err, msg)
	}
	return stdout.String(), nil
}

// redact shortens long arguments (scripts) in error messages.
func redact(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		if len(a) > 120 {
			a = a[:117] + "..."
		}
		out[i] = a
	}
	return out
}

// lastLines returns the last n lines of a file, joined by " | ".
func lastLines(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, " | ")
}
