package cluster

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// The order in which Up starts the components.
var startOrder = []string{
	"registry", "etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler",
	"containerd", "kubelet", "kube-proxy", "kube-router",
}

func (c *Cluster) component(name string) component {
	p := c.paths
	pk := p.pkiFile
	switch name {
	case "etcd":
		return component{
			name: name, bin: p.bin("etcd"),
			args: []string{
				"--name=" + c.opts.NodeName,
				"--data-dir=" + p.etcdData,
				fmt.Sprintf("--listen-client-urls=http://127.0.0.1:%d", EtcdClientPort),
				fmt.Sprintf("--advertise-client-urls=http://127.0.0.1:%d", EtcdClientPort),
				fmt.Sprintf("--listen-peer-urls=http://127.0.0.1:%d", EtcdPeerPort),
				fmt.Sprintf("--initial-advertise-peer-urls=http://127.0.0.1:%d", EtcdPeerPort),
				fmt.Sprintf("--initial-cluster=%s=http://127.0.0.1:%d", c.opts.NodeName, EtcdPeerPort),
				fmt.Sprintf("--listen-metrics-urls=http://127.0.0.1:%d", EtcdMetricPort),
				"--log-level=warn",
			},
			ready:        c.etcdReady,
			readyTimeout: 30 * time.Second,
		}
	case "kube-apiserver":
		return component{
			name: name, bin: p.bin("kube-apiserver"),
			args: []string{
				fmt.Sprintf("--etcd-servers=http://127.0.0.1:%d", EtcdClientPort),
				// All addresses: pods reach kubernetes.default at the node IP.
				"--bind-address=0.0.0.0",
				fmt.Sprintf("--secure-port=%d", APIServerPort),
				"--advertise-address=" + c.opts.NodeIP.String(),
				"--tls-cert-file=" + pk("apiserver.crt"), "--tls-private-key-file=" + pk("apiserver.key"),
				"--client-ca-file=" + pk("ca.crt"),
				"--service-account-issuer=https://kubernetes.default.svc." + ClusterDomain,
				"--service-account-key-file=" + pk("sa.pub"),
				"--service-account-signing-key-file=" + pk("sa.key"),
				"--service-cluster-ip-range=" + ServiceCIDR,
				"--authorization-mode=Node,RBAC",
				"--enable-admission-plugins=NodeRestriction",
				"--allow-privileged=true",
				"--kubelet-client-certificate=" + pk("apiserver-kubelet-client.crt"),
				"--kubelet-client-key=" + pk("apiserver-kubelet-client.key"),
				"--kubelet-certificate-authority=" + pk("ca.crt"),
				"--kubelet-preferred-address-types=InternalIP,Hostname",
				"--profiling=false",
			},
			ready:        c.apiserverReady,
			readyTimeout: 90 * time.Second,
		}
	case "kube-controller-manager":
		kc := pk("controller-manager.kubeconfig")
		return component{
			name: name, bin: p.bin("kube-controller-manager"),
			args: []string{
				"--kubeconfig=" + kc, "--authentication-kubeconfig=" + kc, "--authorization-kubeconfig=" + kc,
				"--bind-address=127.0.0.1",
				"--cluster-cidr=" + PodCIDR, "--allocate-node-cidrs=true", "--node-cidr-mask-size=24",
				"--service-cluster-ip-range=" + ServiceCIDR,
				"--service-account-private-key-file=" + pk("sa.key"),
				"--root-ca-file=" + pk("ca.crt"),
				"--cluster-signing-cert-file=" + pk("ca.crt"), "--cluster-signing-key-file=" + pk("ca.key"),
				"--use-service-account-credentials=true",
				"--leader-elect=false",
				"--profiling=false",
			},
			ready:        c.httpsHealthy("https://127.0.0.1:10257/healthz"),
			readyTimeout: 60 * time.Second,
		}
	case "kube-scheduler":
		kc := pk("scheduler.kubeconfig")
		return component{
			name: name, bin: p.bin("kube-scheduler"),
			args: []string{
				"--kubeconfig=" + kc, "--authentication-kubeconfig=" + kc, "--authorization-kubeconfig=" + kc,
				"--bind-address=127.0.0.1", "--leader-elect=false", "--profiling=false",
			},
			ready:        c.httpsHealthy("https://127.0.0.1:10259/readyz"),
			readyTimeout: 60 * time.Second,
		}
	case "registry":
		return component{
			name: name, bin: p.bin("registry"),
			args: []string{"serve", p.registryConfig},
			// No tracing exporter: it would try to reach a collector.
			env:          []string{"OTEL_TRACES_EXPORTER=none", "OTEL_SDK_DISABLED=true"},
			ready:        c.httpHealthy("http://" + RegistryAddr + "/v2/"),
			readyTimeout: 30 * time.Second,
		}
	case "containerd":
		return component{
			name: name, bin: p.bin("containerd"),
			args: []string{"--config", p.containerdConfig},
			// containerd finds its shim through PATH: the v2 shim comes first.
			env:          []string{"PATH=" + p.containerdBin + ":" + os.Getenv("PATH")},
			ready:        c.criReady,
			readyTimeout: 30 * time.Second,
		}
	case "kubelet":
		return component{
			name: name, bin: p.bin("kubelet"),
			args: []string{
				"--config=" + p.kubeletConfig,
				"--kubeconfig=" + pk("kubelet.kubeconfig"),
				"--root-dir=" + p.kubeletRoot,
				"--node-ip=" + c.opts.NodeIP.String(),
				"--hostname-override=" + c.opts.NodeName,
				"--v=1",
			},
			ready:        c.httpHealthy("http://127.0.0.1:10248/healthz"),
			readyTimeout: 60 * time.Second,
		}
	case "kube-proxy":
		return component{
			name: name, bin: p.bin("kube-proxy"),
			args:         []string{"--config=" + p.kubeProxyConfig},
			ready:        c.httpHealthy("http://127.0.0.1:10256/healthz"),
			readyTimeout: 60 * time.Second,
		}
	case "kube-router":
		// NetworkPolicy enforcement only, so that the tests of Apiary's
		// policies are real; it lets the node itself reach every pod
		// (kubelet probes, port-forward, the host's own clients).
		return component{
			name: name, bin: p.bin("kube-router"),
			args: []string{
				"--kubeconfig=" + p.adminKubeconfig,
				"--run-firewall=true", "--run-router=false", "--run-service-proxy=false",
				"--hostname-override=" + c.opts.NodeName,
				"--health-port=20244", "--metrics-port=0",
				"--enable-ipv6=false",
			},
			ready:        c.httpHealthy("http://127.0.0.1:20244/healthz"),
			readyTimeout: 60 * time.Second,
		}
	}
	panic("unknown component " + name)
}

var plainHTTP = &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}

func httpGet(ctx context.Context, client *http.Client, url string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		return body, fmt.Errorf("GET %s: %s: %s", url, resp.Status, strings.TrimSpace(string(body)))
	}
	return body, nil
}

func (c *Cluster) httpHealthy(url string) func(context.Context) error {
	return func(ctx context.Context) error {
		_, err := httpGet(ctx, plainHTTP, url)
		return err
	}
}

// httpsHealthy checks a component's self-signed health endpoint (the
// default always-allowed paths need no credentials).
func (c *Cluster) httpsHealthy(url string) func(context.Context) error {
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		Proxy: nil, DisableKeepAlives: true,
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // loopback health check of a self-signed port
	}}
	return func(ctx context.Context) error {
		_, err := httpGet(ctx, client, url)
		return err
	}
}

func (c *Cluster) etcdReady(ctx context.Context) error {
	body, err := httpGet(ctx, plainHTTP, fmt.Sprintf("http://127.0.0.1:%d/health", EtcdClientPort))
	if err != nil {
		return err
	}
	var h struct{ Health string }
	if err := json.Unmarshal(body, &h); err != nil || h.Health != "true" {
		return fmt.Errorf("etcd health: %s", strings.TrimSpace(string(body)))
	}
	return nil
}

func (c *Cluster) adminHTTPClient() (*http.Client, error) {
	caPEM, err := os.ReadFile(c.paths.pkiFile("ca.crt"))
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	cert, err := tls.LoadX509KeyPair(c.paths.pkiFile("admin.crt"), c.paths.pkiFile("admin.key"))
	if err != nil {
		return nil, err
	}
	return &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{
		Proxy: nil, DisableKeepAlives: true,
		TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}},
	}}, nil
}

func (c *Cluster) apiserverReady(ctx context.Context) error {
	client, err := c.adminHTTPClient()
	if err != nil {
		return err
	}
	_, err = httpGet(ctx, client, fmt.Sprintf("https://127.0.0.1:%d/readyz", APIServerPort))
	return err
}

// writeConfigs writes every component's configuration file.
func (c *Cluster) writeConfigs() error {
	p := c.paths
	runc, err := runcBinary()
	if err != nil {
		return err
	}
	files := map[string]string{
		p.registryConfig: fmt.Sprintf(`version: 0.1
log:
  level: warn
  formatter: text
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: %s
  delete:
    enabled: true
  maintenance:
    uploadpurging:
      enabled: false
http:
  addr: %s
  secret: apiary-devcluster
`, p.registryStorage, RegistryListen),

		// containerd v2 (config version 3), everything under the state dir.
		// restrict_oom_score_adj: this VM lacks CAP_SYS_RESOURCE, so runc
		// cannot set the kubelet's -998 for the sandbox ("can't get final
		// child's PID from pipe: EOF"). NRI is off (it would open
		// /var/run/nri), netns mounts live under the state dir, runc's
		// state too. Only /run/containerd/s (shim sockets) is fixed.
		p.containerdConfig: fmt.Sprintf(`version = 3
root = %[1]q
state = %[2]q
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.erofs", "io.containerd.differ.v1.erofs", "io.containerd.nri.v1.nri"]

[grpc]
  address = %[3]q
[ttrpc]
  address = %[4]q
[debug]
  address = %[5]q
  level = "info"
[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = %[6]q

[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = %[7]q
  [plugins."io.containerd.cri.v1.images".registry]
    config_path = %[8]q

[plugins."io.containerd.cri.v1.runtime"]
  enable_selinux = false
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  cdi_spec_dirs = []
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = %[9]q
        Root = %[10]q
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = [%[11]q]
    conf_dir = %[12]q
    max_conf_num = 1
`, p.containerdRoot, p.containerdState, p.containerdSock, p.containerdSock+".ttrpc",
			filepath.Join(p.containerdDir, "debug.sock"), filepath.Join(p.containerdDir, "opt"),
			PauseImage, p.certsD, runc, p.runcRoot, p.cniBin, p.cniConfDir),

		// bridge + host-local + portmap + firewall: the filter FORWARD
		// policy may be DROP (Docker sets it), which the firewall plugin's
		// CNI-FORWARD accept rules get pod traffic past.
		filepath.Join(p.cniConfDir, "10-apiary-dev.conflist"): fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "apiary-dev",
  "plugins": [
    {
      "type": "bridge",
      "bridge": %q,
      "isGateway": true,
      "ipMasq": true,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": %q,
        "ranges": [[{"subnet": %q}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}},
    {"type": "firewall", "backend": "iptables"}
  ]
}
`, BridgeName, p.cniIPAM, NodePodCIDR),

		p.kubeletConfig: fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# cgroup v1 is refused by default since 1.35.
failCgroupV1: false
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://%[1]s
# The API server reaches the kubelet at the node IP (logs, exec).
address: %[2]s
port: %[3]d
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: %[4]s
authorization:
  mode: Webhook
tlsCertFile: %[5]s
tlsPrivateKeyFile: %[6]s
rotateCertificates: false
serverTLSBootstrap: false
clusterDomain: %[7]s
clusterDNS:
- %[8]s
resolvConf: /etc/resolv.conf
staticPodPath: %[9]s
podLogsDir: %[10]s
failSwapOn: false
serializeImagePulls: false
evictionHard:
  memory.available: "100Mi"
  nodefs.available: "2%%"
  imagefs.available: "2%%"
imageGCHighThresholdPercent: 95
imageGCLowThresholdPercent: 90
`, p.containerdSock, c.opts.NodeIP, KubeletPort, p.pkiFile("ca.crt"), p.pkiFile("kubelet-server.crt"),
			p.pkiFile("kubelet-server.key"), ClusterDomain, DNSServiceIP, p.kubeletManifests, p.kubeletPodLogs),

		// localhostNodePorts false: no route_localnet; maxPerCore 0: the
		// nf_conntrack sysctls stay as they are.
		p.kubeProxyConfig: fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clientConnection:
  kubeconfig: %s
hostnameOverride: %s
clusterCIDR: %s
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
nodePortAddresses: ["primary"]
iptables:
  localhostNodePorts: false
conntrack:
  maxPerCore: 0
`, p.pkiFile("kube-proxy.kubeconfig"), c.opts.NodeName, PodCIDR),
	}
	// Registry mirrors: every registry, named or not, resolves to the local
	// one only. "server" is the local registry itself (no [host] mirror
	// list), so a missing image fails here instead of reaching out.
	mirror := fmt.Sprintf(`server = "http://%s"
capabilities = ["pull", "resolve"]
skip_verify = true
`, RegistryAddr)
	for _, host := range []string{"registry.k8s.io", "quay.io", "ghcr.io", "docker.io", RegistryAddr, "_default"} {
		files[filepath.Join(p.certsD, host, "hosts.toml")] = mirror
	}
	for path, content := range files {
		if _, err := writeIfChanged(path, []byte(content), 0o644); err != nil {
			return err
		}
	}
	for _, d := range []string{p.etcdData, p.containerdRoot, p.containerdState, p.runcRoot, p.cniIPAM,
		p.kubeletRoot, p.kubeletPodLogs, p.kubeletManifests, p.registryStorage, p.manifests} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	return os.Chmod(p.etcdData, 0o700)
}
