// Package cluster starts and stops Apiary's local management cluster: a real
// single-node Kubernetes cluster made of host processes on this machine
// (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, a local
// image registry, containerd, kubelet, kube-proxy, kube-router enforcing
// NetworkPolicy) with bridge CNI, CoreDNS
// and MetalLB's controller. `go run ./hack/devcluster` drives it from the
// command line; e2e tests call Up, Kubeconfig and Down.
//
// Every binary is built from source by hack/build-upstream.sh (cached under
// $APIARY_CACHE/bin). Every image comes from the local registry on
// 127.0.0.1:5000, which containerd mirrors registry.k8s.io, quay.io and
// ghcr.io to, so the manifests name the upstream images.
//
// Addresses (chosen not to clash with the tenant defaults 10.244.0.0/16 and
// 10.96.0.0/16, nor with Docker's default pools 172.17-31.x):
//
//	pods               10.200.0.0/16 (the node gets 10.200.0.0/24)
//	services           10.201.0.0/16 (kubernetes 10.201.0.1, DNS 10.201.0.10)
//	LoadBalancer pool  10.202.0.0/24, routed by the host into a port-less
//	                   bridge (apiary-lb0): kube-proxy DNATs what belongs to a
//	                   Service, and every other packet dies there, so nothing
//	                   addressed to the pool ever leaves through eth0.
//
// Ports: kube-apiserver 0.0.0.0:6443 (pods reach it at the node IP), etcd
// 127.0.0.1:12379-12381, registry 127.0.0.1:5000, kubelet <node IP>:10250,
// and the components' defaults on 127.0.0.1 (10248, 10249, 10256, 10257,
// 10259).
package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// Versions of what the cluster runs; the binaries live in
// $APIARY_CACHE/bin/<component>-<version>/ (hack/build-upstream.sh).
const (
	KubeVersion       = "v1.37.2"
	EtcdVersion       = "v3.6.16"
	ContainerdVersion = "v2.4.2"
	CNIVersion        = "v1.10.0"
	RegistryVersion   = "v3.1.2"
	CoreDNSVersion    = "v1.14.6"
	MetalLBVersion    = "v0.16.2"
	// KubeRouterVersion: kube-router enforces NetworkPolicy on the node
	// (its firewall only: the bridge CNI and kube-proxy do the rest).
	KubeRouterVersion = "v2.1.0"
)

// Network layout and ports of the management cluster.
const (
	PodCIDR       = "10.200.0.0/16"
	NodePodCIDR   = "10.200.0.0/24" // the first /24 the controller-manager allocates
	ServiceCIDR   = "10.201.0.0/16"
	KubernetesIP  = "10.201.0.1"
	DNSServiceIP  = "10.201.0.10"
	LBPoolCIDR    = "10.202.0.0/24"
	LBPoolName    = "apiary-dev"
	LBInterface   = "apiary-lb0"
	BridgeName    = "cni0"
	ClusterDomain = "cluster.local"
	DefaultNode   = "apiary-dev"
	RegistryAddr  = "127.0.0.1:5000"
	// RegistryListen is where the registry listens: every address of the
	// machine, so that pods (the operator pulls node bundles) and SSH test
	// hosts in Docker reach it at the node IP too.
	RegistryListen = ":5000"
	APIServerPort  = 6443
	EtcdClientPort = 12379
	EtcdPeerPort   = 12380
	EtcdMetricPort = 12381
	KubeletPort    = 10250
	FieldManager   = "apiary-devcluster"
)

// Images the cluster itself runs (pulled through the registry mirror).
const (
	PauseImage   = "registry.k8s.io/pause:3.10"
	CoreDNSImage = "registry.k8s.io/coredns/coredns:" + CoreDNSVersion
	MetalLBImage = "quay.io/metallb/controller:" + MetalLBVersion
)

// Logf prints one progress line.
type Logf func(format string, args ...any)

// ImagePusher pushes images to the plain-HTTP registry at addr (host:port)
// under their upstream paths without the registry host, skipping the ones
// the registry already has.
type ImagePusher func(ctx context.Context, addr string, logf Logf) error

// Options configure a Cluster; the zero value is usable.
type Options struct {
	// CacheDir holds the binaries and the registry storage;
	// default $APIARY_CACHE, else ~/.cache/apiary.
	CacheDir string
	// StateDir holds everything of one running cluster (PKI, configs, logs,
	// pid files, data); default $APIARY_DEVCLUSTER_DIR, else
	// <CacheDir>/devcluster.
	StateDir string
	// RepoRoot is the repository checkout (hack/build-upstream.sh,
	// hack/tools); default: found upwards from the working directory.
	RepoRoot string
	// NodeName of the single node; default apiary-dev.
	NodeName string
	// NodeIP is the address the API server advertises and the kubelet
	// serves on; default $APIARY_DEVCLUSTER_NODE_IP, else the IPv4 address
	// of the default route's interface.
	NodeIP net.IP
	// ApiaryImage: also build (go build ./cmd/apiary) and push Apiary's own
	// image, tagged ApiaryVersion.
	ApiaryImage bool
	// ApiaryVersion tags ghcr.io/apiaryhq/apiary; default ApiaryVersion().
	ApiaryVersion string
	// PushImages, when set, replaces the default push of hack/images'
	// images (images.All) and runs whole before the kubelet starts. By
	// default the images the cluster runs (pause, CoreDNS, MetalLB) go
	// first and the others (tenant control plane, konnectivity, Apiary) are
	// pushed while the add-ons start.
	PushImages ImagePusher
	// BuildMissing runs hack/build-upstream.sh for binaries that are not
	// in the cache yet; when false, Up fails naming them.
	BuildMissing bool
	// Log receives progress lines; default: stderr.
	Log io.Writer
}

// Cluster is the local management cluster described by its Options.
type Cluster struct {
	opts  Options
	paths paths
	logw  io.Writer

	mu       sync.Mutex
	exited   map[int]chan struct{} // processes started by this process
	probeRef string
}

// New fills in the defaults of opts.
func New(opts Options) (*Cluster, error) {
	if opts.CacheDir == "" {
		opts.CacheDir = os.Getenv("APIARY_CACHE")
	}
	if opts.CacheDir == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return nil, fmt.Errorf("no APIARY_CACHE and no home directory: %w", err)
		}
		opts.CacheDir = filepath.Join(home, ".cache", "apiary")
	}
	if opts.StateDir == "" {
		opts.StateDir = os.Getenv("APIARY_DEVCLUSTER_DIR")
	}
	if opts.StateDir == "" {
		opts.StateDir = filepath.Join(opts.CacheDir, "devcluster")
	}
	var err error
	if opts.CacheDir, err = filepath.Abs(opts.CacheDir); err != nil {
		return nil, err
	}
	if opts.StateDir, err = filepath.Abs(opts.StateDir); err != nil {
		return nil, err
	}
	if opts.RepoRoot == "" {
		opts.RepoRoot, _ = findRepoRoot()
	}
	if opts.NodeName == "" {
		opts.NodeName = DefaultNode
	}
	if opts.NodeIP == nil {
		if s := os.Getenv("APIARY_DEVCLUSTER_NODE_IP"); s != "" {
			opts.NodeIP = net.ParseIP(s)
			if opts.NodeIP == nil || opts.NodeIP.To4() == nil {
				return nil, fmt.Errorf("APIARY_DEVCLUSTER_NODE_IP=%q is not an IPv4 address", s)
			}
		} else {
			ip, err := primaryIPv4()
			if err != nil {
				return nil, fmt.Errorf("finding the node IP (set APIARY_DEVCLUSTER_NODE_IP): %w", err)
			}
			opts.NodeIP = ip
		}
	}
	opts.NodeIP = opts.NodeIP.To4()
	if opts.ApiaryVersion == "" {
		opts.ApiaryVersion = ApiaryVersion(opts.RepoRoot)
	}
	c := &Cluster{opts: opts, logw: opts.Log, exited: map[int]chan struct{}{}}
	if c.logw == nil {
		c.logw = os.Stderr
	}
	c.paths = newPaths(opts.CacheDir, opts.StateDir)
	return c, nil
}

// StateDir is where the cluster keeps its state, logs and kubeconfig.
func (c *Cluster) StateDir() string { return c.opts.StateDir }

// NodeIP is the node's address.
func (c *Cluster) NodeIP() net.IP { return c.opts.NodeIP }

// NodeName is the node's name.
func (c *Cluster) NodeName() string { return c.opts.NodeName }

// KubeconfigPath is the admin (system:masters) kubeconfig Up writes.
func (c *Cluster) KubeconfigPath() string { return c.paths.adminKubeconfig }

// Kubeconfig returns the admin kubeconfig's content.
func (c *Cluster) Kubeconfig() ([]byte, error) {
	b, err := os.ReadFile(c.paths.adminKubeconfig)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%s does not exist: run `up` first", c.paths.adminKubeconfig)
	}
	return b, err
}

// LogFile is the log of a component (etcd, kube-apiserver, ...).
func (c *Cluster) LogFile(component string) string { return c.paths.log(component) }

func (c *Cluster) logf(format string, args ...any) {
	fmt.Fprintf(c.logw, format+"\n", args...)
}

// findRepoRoot walks up from the working directory to the directory whose
// go.mod declares github.com/apiaryhq/apiary.
func findRepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && strings.HasPrefix(strings.TrimSpace(string(b)), "module github.com/apiaryhq/apiary\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("not inside the apiary repository")
		}
		dir = parent
	}
}

// timings runs named steps and prints how long each took.
type timings struct {
	c     *Cluster
	start time.Time
}

func (t *timings) run(name string, f func() error) error {
	start := time.Now()
	err := f()
	took := time.Since(start)
	if err != nil {
		t.c.logf("%-28s FAILED after %s", name, took.Round(time.Millisecond))
		return fmt.Errorf("%s: %w", name, err)
	}
	t.c.logf("%-28s %8s", name, took.Round(time.Millisecond))
	return nil
}
