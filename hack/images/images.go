// Package images builds the OCI images that Apiary's local cluster and its
// tenants run, from binaries built from source (hack/build-upstream.sh, and
// go build for the repo's own commands): there is no registry to pull from,
// so every image is made here with go-containerregistry and pushed to a
// local registry (Push) or written as docker-save tarballs (Save).
//
// Images keep their upstream names (registry.k8s.io/kube-apiserver:v1.37.2,
// ...) so that rendered manifests are the same in tests and production; Push
// drops the upstream host, and containerd's mirror config maps the host back.
//
// Builds are deterministic: fixed timestamps, sorted entries, root-owned
// files, no host metadata, so the same inputs give the same digest and a
// second Push of unchanged images uploads nothing.
package images

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Versions of the upstream components. They must agree with the tools
// modules under hack/tools, which hack/build-upstream.sh builds (a unit test
// checks the binary paths against `hack/build-upstream.sh --list`).
const (
	KubeVersion = "v1.37.2"
	// PreviousKubeVersion is the newest patch of the minor before
	// KubeVersion (hack/tools/kubernetes-previous), which upgrade tests
	// start tenants at. Its images are Previous, not part of All yet.
	PreviousKubeVersion = "v1.36.3"
	EtcdVersion         = "v3.6.16"
	// CoreDNSVersion and PreviousCoreDNSVersion are the CoreDNS kubeadm
	// pairs with KubeVersion's and PreviousKubeVersion's minor
	// (tenant.CoreDNSVersion holds the pairs).
	CoreDNSVersion         = "v1.14.6"
	PreviousCoreDNSVersion = "v1.14.2"
	KonnectivityVersion    = "v0.36.0"
	MetalLBVersion         = "v0.16.2"
	// PauseVersion is the tag of the pause image, which is Apiary's own Go
	// pause (hack/images/pause) under the upstream name.
	PauseVersion = "3.10"
	// EtcdImageTag is the tag of registry.k8s.io/etcd for EtcdVersion, as
	// kubeadm names it.
	EtcdImageTag = "3.6.16-0"
	CNIVersion   = "v1.10.0"
	// KubeRouterVersion is the CNI the e2e tests and make quickstart install
	// into tenants (hack/cni/kube-router.yaml); Apiary itself installs none.
	KubeRouterVersion = "v2.1.0"
	// BusyboxVersion is Debian 12's busybox-static, the e2e workload image.
	BusyboxVersion = "1.35.0"
)

// NodeBundleRepository holds one node bundle per Kubernetes version (the
// tag): kubelet, kubeadm and kubectl in /usr/bin and the CNI plugins in
// /opt/cni/bin.
const NodeBundleRepository = "ghcr.io/apiaryhq/node-bundle"

// CNIPlugins are the CNI plugins in the node bundle.
var CNIPlugins = []string{"bridge", "host-local", "loopback", "portmap", "firewall"}

// The image config's PATH, as in the distroless images upstream builds on.
const defaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Users of the base layer.
const (
	RootUID    = 0
	NonrootUID = 65532 // distroless "nonroot"
)

// Image is the spec of one image.
type Image struct {
	// Ref is the upstream reference, e.g. registry.k8s.io/kube-apiserver:v1.37.2.
	Ref        string
	Entrypoint []string
	Cmd        []string
	// User is the image config's user, "" for root.
	User       string
	Env        []string
	WorkingDir string
	// Layers go on top of the base layer (passwd, group, nsswitch.conf, /tmp).
	Layers []Layer
	// Prepare, when set, runs before the layers are read; it makes the files
	// they need (e.g. go build of the repo's own commands).
	Prepare func(ctx context.Context, log func(string, ...any)) error
	// Cache is where compressed layers are kept between runs, keyed by the
	// digest of their content (default $APIARY_CACHE/images/layers).
	Cache string
}

// Name is the image's repository without the registry host, e.g.
// kube-apiserver or metallb/controller.
func (im Image) Name() string {
	n, _, _ := splitRef(im.Ref)
	return n
}

// Layer is one layer of an image.
type Layer struct {
	// Name says what the layer holds (for the image history and logs).
	Name  string
	Files []File
	// Resolve, when set, adds files found when the image is built (e.g. host
	// binaries and the shared libraries they load).
	Resolve func() ([]File, error)
}

// File is one entry of a layer. Exactly one of Src, Data, Link or Dir says
// what it is. Entries are owned by UID/GID (root by default); the parent
// directories of every entry are added (root, 0755) unless listed.
type File struct {
	// Path is the absolute path in the image.
	Path string
	// Src is a regular file on this machine whose content is copied.
	Src string
	// Data is the content of a regular file.
	Data []byte
	// Link is the target of a symbolic link.
	Link string
	// Dir makes a directory.
	Dir bool
	// Mode is the permission bits (fs.ModeSticky, ModeSetuid and ModeSetgid
	// are kept); 0 means 0755 for directories and Src files, 0644 for Data.
	Mode     fs.FileMode
	UID, GID int
	// Caps, when set, are the file capabilities (security.capability xattr)
	// of a regular file, e.g. CapNetBindService.
	Caps uint64
	// Missing, when Src does not exist, says how to make it.
	Missing string
}

// CapNetBindService is the bit of CAP_NET_BIND_SERVICE for File.Caps.
const CapNetBindService = 1 << 10

// bin is a binary that hack/build-upstream.sh builds into the cache.
func bin(cacheDir, dir, name, imagePath string) File {
	return File{
		Path:    imagePath,
		Src:     filepath.Join(cacheDir, "bin", dir, name),
		Mode:    0o755,
		Missing: "hack/build-upstream.sh " + name,
	}
}

// DefaultCacheDir is $APIARY_CACHE, else ~/.cache/apiary, as in
// hack/build-upstream.sh.
func DefaultCacheDir() string {
	if d := os.Getenv("APIARY_CACHE"); d != "" {
		return d
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return filepath.Join(os.TempDir(), "apiary-cache")
	}
	return filepath.Join(home, ".cache", "apiary")
}

// All is the spec of every image Apiary's local cluster and tenants use,
// under upstream names. cacheDir is where hack/build-upstream.sh put the
// binaries ($APIARY_CACHE); apiaryVersion tags ghcr.io/apiaryhq/apiary and is
// stamped into its binary. Nothing is read or built until Push or Save.
func All(cacheDir, apiaryVersion string) []Image {
	out := kubeImages(cacheDir, KubeVersion, "")
	etcd := "etcd-" + EtcdVersion
	out = append(out, Image{
		Ref:        "registry.k8s.io/etcd:" + EtcdImageTag,
		Entrypoint: []string{"/usr/local/bin/etcd"},
		Layers: []Layer{{Name: "etcd", Files: []File{
			bin(cacheDir, etcd, "etcd", "/usr/local/bin/etcd"),
			bin(cacheDir, etcd, "etcdctl", "/usr/local/bin/etcdctl"),
		}}},
	})
	pause := filepath.Join(cacheDir, "bin", "apiary-images", "pause")
	out = append(out, Image{
		Ref:        "registry.k8s.io/pause:" + PauseVersion,
		Entrypoint: []string{"/pause"},
		User:       "65535:65535", // as upstream's pause image
		Layers:     []Layer{{Name: "pause", Files: []File{{Path: "/pause", Src: pause, Mode: 0o755}}}},
		Prepare: func(ctx context.Context, log func(string, ...any)) error {
			return goBuild(ctx, log, "./hack/images/pause", pause, "")
		},
	})
	out = append(out, corednsImage(cacheDir, CoreDNSVersion, ""))
	knp := "konnectivity-" + KonnectivityVersion
	for _, c := range []string{"proxy-server", "proxy-agent"} {
		out = append(out, Image{
			Ref:        "registry.k8s.io/kas-network-proxy/" + c + ":" + KonnectivityVersion,
			Entrypoint: []string{"/" + c},
			User:       "65532", // upstream's base is distroless static:nonroot
			WorkingDir: "/",
			Layers:     []Layer{{Name: c, Files: []File{bin(cacheDir, knp, c, "/"+c)}}},
		})
	}
	out = append(out, Image{
		Ref:        "quay.io/metallb/controller:" + MetalLBVersion,
		Entrypoint: []string{"/controller"},
		Layers: []Layer{{Name: "metallb controller", Files: []File{
			bin(cacheDir, "metallb-"+MetalLBVersion, "controller", "/controller"),
		}}},
	})
	out = append(out, Image{
		Ref:        "docker.io/cloudnativelabs/kube-router:" + KubeRouterVersion,
		Entrypoint: []string{"/usr/local/bin/kube-router"},
		Layers: []Layer{
			{Name: "iptables, ipset, ip and busybox from this machine (Debian)", Resolve: hostKubeRouterTools},
			{Name: "kube-router", Files: []File{
				bin(cacheDir, "kube-router-"+KubeRouterVersion, "kube-router", "/usr/local/bin/kube-router"),
			}},
		},
	})
	out = append(out, Image{
		Ref: "docker.io/library/busybox:" + BusyboxVersion,
		Cmd: []string{"sh"},
		Layers: []Layer{
			{Name: "busybox from this machine (Debian busybox-static)", Resolve: hostBusybox},
		},
	})
	apiary := filepath.Join(cacheDir, "bin", "apiary-"+apiaryVersion, "apiary")
	out = append(out, Image{
		Ref:        "ghcr.io/apiaryhq/apiary:" + apiaryVersion,
		Entrypoint: []string{"/apiary"},
		User:       "65532:65532",
		Layers:     []Layer{{Name: "apiary", Files: []File{{Path: "/apiary", Src: apiary, Mode: 0o755}}}},
		Prepare: func(ctx context.Context, log func(string, ...any)) error {
			return goBuild(ctx, log, "./cmd/apiary", apiary, "-X main.version="+apiaryVersion)
		},
	})
	for i := range out {
		out[i].Cache = filepath.Join(cacheDir, "images", "layers")
	}
	return out
}

// Select returns the images whose Ref or Name is one of names (e.g.
// "pause", "registry.k8s.io/pause:3.10", "kas-network-proxy/proxy-server"),
// or an error naming those that match none.
func Select(all []Image, names ...string) ([]Image, error) {
	var out []Image
	for _, n := range names {
		found := false
		for _, im := range all {
			short := im.Name()
			if i := strings.LastIndex(short, "/"); i >= 0 {
				short = short[i+1:]
			}
			if n == im.Ref || n == im.Name() || n == short {
				out = append(out, im)
				found = true
			}
		}
		if !found {
			return nil, fmt.Errorf("no image named %q", n)
		}
	}
	return out, nil
}

// splitRef splits an upstream reference into repository path without the
// registry host, and tag.
func splitRef(ref string) (repo, tag string, err error) {
	i := strings.LastIndex(ref, ":")
	if i < 0 || strings.Contains(ref[i:], "/") {
		return "", "", fmt.Errorf("image reference %q has no tag", ref)
	}
	repo, tag = ref[:i], ref[i+1:]
	if j := strings.Index(repo, "/"); j >= 0 {
		if host := repo[:j]; strings.ContainsAny(host, ".:") || host == "localhost" {
			repo = repo[j+1:]
		}
	}
	return repo, tag, nil
}

// Mirror is where Push puts an image at the registry addr: the upstream
// reference without its host, e.g. registry.k8s.io/kube-apiserver:v1.37.2 →
// 127.0.0.1:5000/kube-apiserver:v1.37.2, quay.io/metallb/controller:v0.16.2 →
// 127.0.0.1:5000/metallb/controller:v0.16.2.
func Mirror(addr, ref string) (string, error) {
	repo, tag, err := splitRef(ref)
	if err != nil {
		return "", err
	}
	return addr + "/" + repo + ":" + tag, nil
}

// Previous is the images of PreviousKubeVersion: its control plane,
// kube-proxy and node bundle, and the CoreDNS paired with it (built by
// hack/build-upstream.sh kubernetes-previous coredns-previous).
func Previous(cacheDir string) []Image {
	return append(kubeImages(cacheDir, PreviousKubeVersion, "previous/"), corednsImage(cacheDir, PreviousCoreDNSVersion, "previous/"))
}

// corednsImage is CoreDNS at version, as upstream's image: /coredns with
// the capability to bind port 53, run as nonroot. buildPrefix is the
// prefix of its name in hack/build-upstream.sh.
func corednsImage(cacheDir, version, buildPrefix string) Image {
	coredns := bin(cacheDir, "coredns-"+version, "coredns", "/coredns")
	coredns.Missing = "hack/build-upstream.sh " + buildPrefix + "coredns"
	coredns.Caps = CapNetBindService // upstream: setcap cap_net_bind_service=+ep
	return Image{
		Ref:        "registry.k8s.io/coredns/coredns:" + version,
		Entrypoint: []string{"/coredns"},
		User:       "65532:65532",
		WorkingDir: "/",
		Layers:     []Layer{{Name: "coredns", Files: []File{coredns}}},
	}
}

// kubeImages is one Kubernetes version's images: the control-plane
// components, kube-proxy and the node bundle. buildPrefix is the prefix of
// the binaries' names in hack/build-upstream.sh.
func kubeImages(cacheDir, version, buildPrefix string) []Image {
	kube := "kubernetes-" + version
	kubeBin := func(name, imagePath string) File {
		f := bin(cacheDir, kube, name, imagePath)
		f.Missing = "hack/build-upstream.sh " + buildPrefix + name
		return f
	}
	var out []Image
	for _, c := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler"} {
		p := "/usr/local/bin/" + c
		out = append(out, Image{
			Ref:        "registry.k8s.io/" + c + ":" + version,
			Entrypoint: []string{p},
			Layers:     []Layer{{Name: c, Files: []File{kubeBin(c, p)}}},
		})
	}
	out = append(out, Image{
		Ref:        "registry.k8s.io/kube-proxy:" + version,
		Entrypoint: []string{"/usr/local/bin/kube-proxy"},
		Layers: []Layer{
			{Name: "iptables and conntrack from this machine (Debian)", Resolve: hostIPTables},
			{Name: "kube-proxy", Files: []File{kubeBin("kube-proxy", "/usr/local/bin/kube-proxy")}},
		},
	})
	// The node bundle is what the SSH host agent installs on a host: the
	// node binaries of one Kubernetes version and the CNI plugins, copied
	// out of the image (it is never run).
	cni := "cni-" + CNIVersion
	var cniFiles []File
	for _, p := range CNIPlugins {
		cniFiles = append(cniFiles, bin(cacheDir, cni, p, "/opt/cni/bin/"+p))
	}
	return append(out, Image{
		Ref: NodeBundleRepository + ":" + version,
		Layers: []Layer{
			{Name: "kubelet, kubeadm, kubectl", Files: []File{
				kubeBin("kubelet", "/usr/bin/kubelet"),
				kubeBin("kubeadm", "/usr/bin/kubeadm"),
				kubeBin("kubectl", "/usr/bin/kubectl"),
			}},
			{Name: "CNI plugins", Files: cniFiles},
		},
	})
}
