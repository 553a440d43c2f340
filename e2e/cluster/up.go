package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/apiaryhq/apiary/internal/hostnet"
)

// Up starts whatever part of the cluster is not running and waits until the
// whole of it works: node Ready, CoreDNS answering from a pod, MetalLB's
// controller available and its pool routed. On a running cluster it only
// checks, which takes about a second. It prints the time of each step.
func (c *Cluster) Up(ctx context.Context) (err error) {
	t := &timings{c: c, start: time.Now()}
	c.logf("devcluster up: state %s, node %s (%s)", c.opts.StateDir, c.opts.NodeName, c.opts.NodeIP)
	defer func() {
		if err != nil {
			c.logf("up failed after %s (logs in %s)", time.Since(t.start).Round(time.Millisecond), c.paths.logs)
		}
	}()
	if err := t.run("preflight", func() error { return c.preflight(ctx) }); err != nil {
		return err
	}
	if c.staleState() {
		// A previous cluster whose processes are gone (a reboot, the end of
		// a CI job) left mounts, links and chains: start from nothing.
		c.logf("    no component runs, but %s holds a previous cluster's state: cleaning it up first", c.opts.StateDir)
		if err := c.Down(ctx); err != nil {
			return fmt.Errorf("cleaning up the previous cluster: %w", err)
		}
	}
	if err := t.run("pki", c.ensurePKI); err != nil {
		return err
	}
	if err := t.run("configs", func() error {
		if err := c.recordHostPaths(); err != nil {
			return err
		}
		if err := hostnet.EnsureIPForward(); err != nil {
			return err
		}
		return c.writeConfigs()
	}); err != nil {
		return err
	}

	var mu sync.Mutex
	launchedAny := false
	ensure := func(name string) error {
		launched, err := c.ensure(ctx, c.component(name))
		mu.Lock()
		launchedAny = launchedAny || launched
		mu.Unlock()
		return err
	}

	if err := t.run("registry", func() error { return ensure("registry") }); err != nil {
		return err
	}
	// Images are pushed while the control plane starts; the kubelet needs
	// them only once it creates pods.
	pushCtx, cancelPush := context.WithCancel(ctx)
	defer cancelPush()
	type pushResult struct {
		rest func(context.Context) error
		err  error
	}
	pushed := make(chan pushResult, 1)
	pushStart := time.Now()
	go func() {
		rest, err := c.pushImages(pushCtx)
		pushed <- pushResult{rest, err}
	}()
	restPushed := make(chan error, 1)

	for _, name := range []string{"etcd", "kube-apiserver"} {
		if err := t.run(name, func() error { return ensure(name) }); err != nil {
			return err
		}
	}
	if err := t.run("controller-manager+scheduler", func() error {
		errs := make(chan error, 2)
		for _, name := range []string{"kube-controller-manager", "kube-scheduler"} {
			go func() { errs <- ensure(name) }()
		}
		return errors.Join(<-errs, <-errs)
	}); err != nil {
		return err
	}
	if err := t.run("containerd", func() error { return ensure("containerd") }); err != nil {
		return err
	}
	if err := t.run("cluster images pushed", func() error {
		r := <-pushed
		c.logf("    images: the cluster's took %s", time.Since(pushStart).Round(time.Millisecond))
		if r.err != nil {
			return r.err
		}
		// The other images (tenants', Apiary's) go while the add-ons start.
		go func() {
			start := time.Now()
			err := r.rest(pushCtx)
			c.logf("    images: the others took %s", time.Since(start).Round(time.Millisecond))
			restPushed <- err
		}()
		return nil
	}); err != nil {
		return err
	}
	if err := t.run("kubelet", func() error { return ensure("kubelet") }); err != nil {
		return err
	}
	cs, err := c.Clientset()
	if err != nil {
		return err
	}
	if err := t.run("node Ready", func() error {
		if err := c.waitNodeReady(ctx, cs, 120*time.Second); err != nil {
			return fmt.Errorf("%w (see %s and %s)", err, c.paths.log("kubelet"), c.paths.log("containerd"))
		}
		return nil
	}); err != nil {
		return err
	}
	if err := t.run("kube-proxy", func() error { return ensure("kube-proxy") }); err != nil {
		return err
	}
	if err := t.run("kube-router (NetworkPolicy)", func() error { return ensure("kube-router") }); err != nil {
		return err
	}
	if err := t.run("LoadBalancer route", func() error { return c.ensureLBRoute(ctx) }); err != nil {
		return err
	}
	dnsWasReady := c.deploymentReady(ctx, "kube-system", "coredns")
	if err := t.run("CoreDNS+MetalLB", func() error { return c.ensureAddons(ctx, cs) }); err != nil {
		return err
	}
	if launchedAny || !dnsWasReady {
		if err := t.run("DNS from a pod", func() error { return c.checkDNSFromPod(ctx, cs) }); err != nil {
			return err
		}
	}
	if err := t.run("other images pushed", func() error { return <-restPushed }); err != nil {
		return err
	}
	c.logf("%-28s %8s", "total", time.Since(t.start).Round(time.Millisecond))
	c.logf("kubeconfig: %s", c.paths.adminKubeconfig)
	return nil
}

// staleState: no component runs, yet runtime state, a bridge or a pod
// cgroup of a cluster is there.
func (c *Cluster) staleState() bool {
	for _, name := range startOrder {
		if _, ok := c.running(name); ok {
			return false
		}
	}
	for _, p := range []string{c.paths.etcdData, c.paths.containerdDir, c.paths.kubeletDir} {
		if _, err := os.Stat(p); err == nil {
			return true
		}
	}
	return linkExists(BridgeName) || linkExists(LBInterface)
}

func (c *Cluster) deploymentReady(ctx context.Context, ns, name string) bool {
	cs, err := c.Clientset()
	if err != nil {
		return false
	}
	d, err := cs.AppsV1().Deployments(ns).Get(ctx, name, metav1.GetOptions{})
	return err == nil && deploymentAvailable(d)
}

func (c *Cluster) preflight(ctx context.Context) error {
	if os.Geteuid() != 0 {
		return errors.New("the devcluster runs a kubelet, containerd and iptables: run as root")
	}
	if err := hostTools(); err != nil {
		return err
	}
	if _, err := runcBinary(); err != nil {
		return err
	}
	if missing := c.paths.missingBinaries(); len(missing) > 0 {
		if !c.opts.BuildMissing || c.opts.RepoRoot == "" {
			return fmt.Errorf("binaries not built yet: %s: run hack/build-upstream.sh %s",
				strings.Join(missing, ", "), strings.Join(missing, " "))
		}
		c.logf("    building %s (hack/build-upstream.sh, cached afterwards)", strings.Join(missing, " "))
		cmd := exec.CommandContext(ctx, filepath.Join(c.opts.RepoRoot, "hack", "build-upstream.sh"), missing...)
		cmd.Dir = c.opts.RepoRoot
		cmd.Env = append(os.Environ(), "APIARY_CACHE="+c.opts.CacheDir)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("hack/build-upstream.sh %s: %w\n%s", strings.Join(missing, " "), err, out.String())
		}
		if missing := c.paths.missingBinaries(); len(missing) > 0 {
			return fmt.Errorf("still missing after the build: %s", strings.Join(missing, ", "))
		}
	}
	for _, d := range []string{c.opts.StateDir, c.paths.logs, c.paths.run} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	// The cluster's containerd, kubelet and etcd live in the state dir,
	// the registry's images in the cache.
	for _, d := range []string{c.opts.StateDir, c.opts.CacheDir} {
		if err := enoughSpace(d); err != nil {
			return err
		}
	}
	return nil
}

// minFreeBytes is a floor for what the cluster, its images and a run of
// the e2e suite write, with a margin: short of space, pods get evicted and
// images garbage-collected mid-run, which fails tests far from the cause.
const minFreeBytes = 10 << 30

// enoughSpace refuses a filesystem with less than minFreeBytes available.
func enoughSpace(dir string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return fmt.Errorf("free space on %s: %w", dir, err)
	}
	return checkFree(dir, st.Bavail*uint64(st.Bsize))
}

func checkFree(dir string, avail uint64) error {
	if avail >= minFreeBytes {
		return nil
	}
	return fmt.Errorf("only %.1f GiB free on the filesystem of %s; the local cluster needs at least %d GiB "+
		"(Go's build cache is often the largest user: go clean -cache)", float64(avail)/(1<<30), dir, minFreeBytes>>30)
}

// Down stops every process of the cluster and removes everything it made
// on this host, except the PKI, the logs (both in the state dir) and the
// registry's storage (in the cache). Down on nothing does nothing.
func (c *Cluster) Down(ctx context.Context) error {
	t := &timings{c: c, start: time.Now()}
	if os.Geteuid() != 0 {
		return errors.New("run as root")
	}
	c.logf("devcluster down: state %s", c.opts.StateDir)
	var errs []error
	step := func(name string, f func() error) {
		if err := t.run(name, f); err != nil {
			errs = append(errs, err)
		}
	}
	// stop ends components by PID file, and processes of the same binaries
	// that no PID file records (strayProcesses), all at once.
	stop := func(grace time.Duration, names ...string) error {
		var wg sync.WaitGroup
		errc := make(chan error, len(names)+8)
		for _, n := range names {
			wg.Add(1)
			go func() {
				defer wg.Done()
				start := time.Now()
				stopped, err := c.stop(n, grace)
				if err != nil {
					errc <- fmt.Errorf("%s: %w", n, err)
				}
				if took := time.Since(start); stopped && took > time.Second {
					c.logf("    %s took %s to stop", n, took.Round(time.Millisecond))
				}
			}()
		}
		for _, p := range c.strayProcesses(names...) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c.logf("    stopping pid %d (%s), which no PID file records", p.pid, p.name)
				if err := c.kill(p.procInfo, grace); err != nil {
					errc <- err
				}
			}()
		}
		wg.Wait()
		close(errc)
		var all []error
		for err := range errc {
			all = append(all, err)
		}
		return errors.Join(all...)
	}
	// The kubelet first, so that it restarts nothing; then every pod
	// through the CRI (SIGTERM, 1 s, SIGKILL), which runs CNI DEL.
	step("stop kubelet", func() error { return stop(10*time.Second, "kubelet") })
	step("stop pods", func() error {
		if _, ok := c.running("containerd"); !ok {
			return nil
		}
		n, err := c.criTeardown(ctx, time.Second)
		if n > 0 {
			c.logf("    %d pod sandboxes removed", n)
		}
		return err
	})
	step("stop containerd", func() error {
		// Shims that outlived containerd, and what still runs in pod cgroups.
		err := errors.Join(stop(10*time.Second, "containerd"), stop(2*time.Second, "containerd-shim-runc-v2"))
		if n := killKubepods(); n > 0 {
			c.logf("    killed %d leftover pod processes", n)
		}
		return err
	})
	step("stop control plane", func() error {
		// Clients first: the API server waits for its watches to end (a
		// client that stays gets it 3 s), etcd for its clients.
		return errors.Join(
			stop(10*time.Second, "kube-router", "kube-proxy", "kube-scheduler", "kube-controller-manager"),
			stop(3*time.Second, "kube-apiserver"),
			stop(10*time.Second, "etcd", "registry"))
	})
	step("iptables, links", func() error {
		n, err := cleanIptables(ctx)
		if n > 0 {
			c.logf("    removed %d KUBE-*/CNI-* chains", n)
		}
		sets, setErr := destroyIPSets(ctx)
		if sets > 0 {
			c.logf("    destroyed %d kube-router ipsets", sets)
		}
		return errors.Join(err, setErr, deleteLinks(ctx))
	})
	step("mounts", func() error {
		n, err := unmountAll(c.opts.StateDir)
		if n > 0 {
			c.logf("    unmounted %d", n)
		}
		return err
	})
	step("cgroups", func() error {
		killKubepods()
		return removeKubepodsCgroups()
	})
	step("files", func() error {
		err := c.cleanHostPaths()
		return errors.Join(err, c.removeState())
	})
	c.logf("%-28s %8s", "total", time.Since(t.start).Round(time.Millisecond))
	return errors.Join(errs...)
}

// removeState deletes the state directory except the PKI and the logs. It
// refuses while anything is still mounted below it.
func (c *Cluster) removeState() error {
	if mps, err := mountsUnder(c.opts.StateDir); err != nil || len(mps) > 0 {
		return fmt.Errorf("not removing %s: still mounted: %v %v", c.opts.StateDir, mps, err)
	}
	ents, err := os.ReadDir(c.opts.StateDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range ents {
		switch e.Name() {
		case "pki", "logs":
			continue
		}
		errs = append(errs, os.RemoveAll(filepath.Join(c.opts.StateDir, e.Name())))
	}
	return errors.Join(errs...)
}
