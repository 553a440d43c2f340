package cluster

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// paths is the layout of the cache and state directories.
type paths struct {
	cache, state string

	binDir                                                 string
	kubeBin, etcdBin, containerdBin, cniBin, registryBin   string
	corednsBin, metallbBin, kubeRouterBin                  string
	pki, run, logs                                         string
	adminKubeconfig                                        string
	etcdData                                               string
	registryStorage, registryConfig                        string
	containerdDir, containerdConfig, containerdSock        string
	containerdRoot, containerdState, certsD, runcRoot      string
	cniConfDir, cniIPAM                                    string
	kubeletDir, kubeletRoot, kubeletConfig, kubeletPodLogs string
	kubeletManifests, kubeProxyConfig, manifests, hostLog  string
}

func newPaths(cache, state string) paths {
	bin := filepath.Join(cache, "bin")
	p := paths{
		cache:           cache,
		state:           state,
		binDir:          bin,
		kubeBin:         filepath.Join(bin, "kubernetes-"+KubeVersion),
		etcdBin:         filepath.Join(bin, "etcd-"+EtcdVersion),
		containerdBin:   filepath.Join(bin, "containerd-"+ContainerdVersion),
		cniBin:          filepath.Join(bin, "cni-"+CNIVersion),
		registryBin:     filepath.Join(bin, "registry-"+RegistryVersion),
		corednsBin:      filepath.Join(bin, "coredns-"+CoreDNSVersion),
		metallbBin:      filepath.Join(bin, "metallb-"+MetalLBVersion),
		kubeRouterBin:   filepath.Join(bin, "kube-router-"+KubeRouterVersion),
		pki:             filepath.Join(state, "pki"),
		run:             filepath.Join(state, "run"),
		logs:            filepath.Join(state, "logs"),
		adminKubeconfig: filepath.Join(state, "admin.kubeconfig"),
		etcdData:        filepath.Join(state, "etcd"),
		// The registry's storage outlives the cluster: images are pushed once.
		registryStorage:  filepath.Join(cache, "registry"),
		registryConfig:   filepath.Join(state, "registry", "config.yml"),
		containerdDir:    filepath.Join(state, "containerd"),
		cniConfDir:       filepath.Join(state, "cni", "net.d"),
		cniIPAM:          filepath.Join(state, "cni", "ipam"),
		kubeletDir:       filepath.Join(state, "kubelet"),
		kubeProxyConfig:  filepath.Join(state, "kube-proxy", "config.yaml"),
		manifests:        filepath.Join(state, "manifests"),
		hostLog:          filepath.Join(state, "host-paths.txt"),
		kubeletManifests: filepath.Join(state, "kubelet", "manifests"),
	}
	p.containerdConfig = filepath.Join(p.containerdDir, "config.toml")
	p.containerdSock = filepath.Join(p.containerdDir, "containerd.sock")
	p.containerdRoot = filepath.Join(p.containerdDir, "root")
	p.containerdState = filepath.Join(p.containerdDir, "state")
	p.certsD = filepath.Join(p.containerdDir, "certs.d")
	p.runcRoot = filepath.Join(p.containerdDir, "runc")
	p.kubeletRoot = filepath.Join(p.kubeletDir, "root")
	p.kubeletConfig = filepath.Join(p.kubeletDir, "config.yaml")
	p.kubeletPodLogs = filepath.Join(p.kubeletDir, "pod-logs")
	return p
}

func (p paths) log(component string) string { return filepath.Join(p.logs, component+".log") }
func (p paths) pid(component string) string { return filepath.Join(p.run, component+".pid") }
func (p paths) pkiFile(name string) string  { return filepath.Join(p.pki, name) }

// binaries maps each binary the cluster runs to its path and to the name
// hack/build-upstream.sh builds it by.
func (p paths) binaries() map[string]string {
	m := map[string]string{}
	for _, b := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kube-proxy", "kubectl"} {
		m[b] = filepath.Join(p.kubeBin, b)
	}
	m["etcd"] = filepath.Join(p.etcdBin, "etcd")
	for _, b := range []string{"containerd", "containerd-shim-runc-v2", "ctr"} {
		m[b] = filepath.Join(p.containerdBin, b)
	}
	for _, b := range []string{"bridge", "host-local", "loopback", "portmap", "firewall"} {
		m[b] = filepath.Join(p.cniBin, b)
	}
	m["registry"] = filepath.Join(p.registryBin, "registry")
	m["kube-router"] = filepath.Join(p.kubeRouterBin, "kube-router")
	m["coredns"] = filepath.Join(p.corednsBin, "coredns")
	m["controller"] = filepath.Join(p.metallbBin, "controller")
	return m
}

func (p paths) bin(name string) string { return p.binaries()[name] }

// missingBinaries lists (sorted) the build-upstream.sh names of binaries
// that are not there yet.
func (p paths) missingBinaries() []string {
	var missing []string
	for name, path := range p.binaries() {
		if fi, err := os.Stat(path); err != nil || fi.Mode().Perm()&0o111 == 0 {
			missing = append(missing, name)
		}
	}
	sort.Strings(missing)
	return missing
}

// runcBinary is Debian's runc (containerd v2 does not ship one).
func runcBinary() (string, error) {
	for _, p := range []string{"/usr/sbin/runc", "/usr/bin/runc", "/usr/local/sbin/runc", "/usr/local/bin/runc"} {
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
			return p, nil
		}
	}
	return "", fmt.Errorf("runc not found (apt-get install runc)")
}

func hostTools() error {
	var missing []string
	for _, t := range []string{"ip", "iptables", "iptables-save", "iptables-restore", "ip6tables", "ip6tables-save", "ip6tables-restore", "conntrack"} {
		if _, err := lookPath(t); err != nil {
			missing = append(missing, t)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("host tools missing: %s (apt-get install iproute2 iptables conntrack)", strings.Join(missing, ", "))
	}
	return nil
}
