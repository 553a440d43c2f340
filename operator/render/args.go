package render

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

// Paths inside the control-plane containers. They follow kubeadm's layout so
// that anyone who knows kubeadm finds the files where they expect them.
const (
	kubernetesDir = "/etc/kubernetes"
	pkiDir        = kubernetesDir + "/pki"

	pathCACert               = pkiDir + "/ca.crt"
	pathCAKey                = pkiDir + "/ca.key"
	pathAPIServerCert        = pkiDir + "/apiserver.crt"
	pathAPIServerKey         = pkiDir + "/apiserver.key"
	pathKubeletClientCert    = pkiDir + "/apiserver-kubelet-client.crt"
	pathKubeletClientKey     = pkiDir + "/apiserver-kubelet-client.key"
	pathFrontProxyCACert     = pkiDir + "/front-proxy-ca.crt"
	pathFrontProxyClientCert = pkiDir + "/front-proxy-client.crt"
	pathFrontProxyClientKey  = pkiDir + "/front-proxy-client.key"
	pathSAKey                = pkiDir + "/sa.key"
	pathSAPub                = pkiDir + "/sa.pub"
	pathEtcdCACert           = pkiDir + "/etcd/ca.crt"
	pathEtcdClientCert       = pkiDir + "/apiserver-etcd-client.crt"
	pathEtcdClientKey        = pkiDir + "/apiserver-etcd-client.key"
	pathControllerManagerCfg = kubernetesDir + "/controller-manager.conf"
	pathSchedulerCfg         = kubernetesDir + "/scheduler.conf"

	// FrontProxyClientCN is the common name of the front-proxy client
	// certificate, which kube-apiserver accepts for request-header auth.
	FrontProxyClientCN = "front-proxy-client"

	controllerManagerPort = 10257
	schedulerPort         = 10259
)

// Inputs are the facts a render needs besides the (defaulted) spec.
type Inputs struct {
	// TCP is the tenant, already defaulted.
	TCP *apiary.TenantControlPlane
	// AdvertiseAddress is the IP clients reach the tenant API at (the
	// LoadBalancer address, the node address of a NodePort or the ClusterIP).
	// kube-apiserver publishes it in the tenant's kubernetes Service.
	AdvertiseAddress string
	// EtcdServers are the DataStore's client URLs.
	EtcdServers []string
	// EtcdPrefix is the tenant's key prefix.
	EtcdPrefix string
	// ConfigHash is a hash of every Secret mounted into the pods.
	ConfigHash string
	// ImageRepository replaces registry.k8s.io in image names (air-gapped
	// installs); empty means registry.k8s.io.
	ImageRepository string
}

// flags renders defaults overridden by extraArgs as sorted --key=value
// arguments, so that the same spec always gives the same command line (a
// different order would roll the pods for nothing).
func flags(defaults, extra map[string]string) []string {
	merged := maps.Clone(defaults)
	maps.Copy(merged, extra)
	keys := slices.Sorted(maps.Keys(merged))
	args := make([]string, 0, len(keys))
	for _, k := range keys {
		args = append(args, fmt.Sprintf("--%s=%s", k, merged[k]))
	}
	return args
}

// APIServerArgs is the kube-apiserver command line.
func APIServerArgs(in Inputs) []string {
	s := in.TCP.Spec
	port := strconv.Itoa(int(s.Network.Port))
	defaults := map[string]string{
		"advertise-address":           in.AdvertiseAddress,
		"allow-privileged":            "true",
		"authorization-mode":          "Node,RBAC",
		"bind-address":                "0.0.0.0",
		"client-ca-file":              pathCACert,
		"enable-admission-plugins":    "NodeRestriction",
		"enable-bootstrap-token-auth": "true",
		"endpoint-reconciler-type":    "lease",
		"etcd-cafile":                 pathEtcdCACert,
		"etcd-certfile":               pathEtcdClientCert,
		"etcd-keyfile":                pathEtcdClientKey,
		"etcd-prefix":                 in.EtcdPrefix,
		"etcd-servers":                strings.Join(in.EtcdServers, ","),
		// The datastore is shared: compaction is global to etcd and needs
		// root, so the datastore compacts itself and tenants never do.
		"etcd-compaction-interval":           "0",
		"kubelet-client-certificate":         pathKubeletClientCert,
		"kubelet-client-key":                 pathKubeletClientKey,
		"kubelet-preferred-address-types":    "InternalIP,ExternalIP,Hostname",
		"profiling":                          "false",
		"proxy-client-cert-file":             pathFrontProxyClientCert,
		"proxy-client-key-file":              pathFrontProxyClientKey,
		"requestheader-allowed-names":        FrontProxyClientCN,
		"requestheader-client-ca-file":       pathFrontProxyCACert,
		"requestheader-extra-headers-prefix": "X-Remote-Extra-",
		"requestheader-group-headers":        "X-Remote-Group",
		"requestheader-username-headers":     "X-Remote-User",
		"secure-port":                        port,
		// On SIGTERM keep serving while /readyz fails, so that the Service
		// stops sending new connections before the listener closes (a
		// scale-down or a rolling update then loses no request).
		"shutdown-delay-duration":          "5s",
		"service-account-issuer":           "https://kubernetes.default.svc." + s.Network.ClusterDomain,
		"service-account-key-file":         pathSAPub,
		"service-account-signing-key-file": pathSAKey,
		"service-cluster-ip-range":         s.Network.ServiceCIDR,
		"tls-cert-file":                    pathAPIServerCert,
		"tls-private-key-file":             pathAPIServerKey,
	}
	if KonnectivityEnabled(in.TCP) {
		defaults["egress-selector-config-file"] = pathEgressSelectorConfig
	}
	return flags(defaults, s.APIServer.ExtraArgs)
}

// ControllerManagerArgs is the kube-controller-manager command line. It
// talks to the API server of its own pod over loopback.
func ControllerManagerArgs(in Inputs) []string {
	s := in.TCP.Spec
	return flags(map[string]string{
		"allocate-node-cidrs":              "true",
		"authentication-kubeconfig":        pathControllerManagerCfg,
		"authorization-kubeconfig":         pathControllerManagerCfg,
		"bind-address":                     "0.0.0.0",
		"client-ca-file":                   pathCACert,
		"cluster-cidr":                     s.Network.PodCIDR,
		"cluster-name":                     in.TCP.Name,
		"cluster-signing-cert-file":        pathCACert,
		"cluster-signing-key-file":         pathCAKey,
		"controllers":                      "*,bootstrapsigner,tokencleaner",
		"kubeconfig":                       pathControllerManagerCfg,
		"leader-elect":                     "true",
		"profiling":                        "false",
		"requestheader-client-ca-file":     pathFrontProxyCACert,
		"root-ca-file":                     pathCACert,
		"secure-port":                      strconv.Itoa(controllerManagerPort),
		"service-account-private-key-file": pathSAKey,
		"service-cluster-ip-range":         s.Network.ServiceCIDR,
		"use-service-account-credentials":  "true",
	}, s.ControllerManager.ExtraArgs)
}

// SchedulerArgs is the kube-scheduler command line.
func SchedulerArgs(in Inputs) []string {
	return flags(map[string]string{
		"authentication-kubeconfig": pathSchedulerCfg,
		"authorization-kubeconfig":  pathSchedulerCfg,
		"bind-address":              "0.0.0.0",
		"kubeconfig":                pathSchedulerCfg,
		"leader-elect":              "true",
		"profiling":                 "false",
		"secure-port":               strconv.Itoa(schedulerPort),
	}, in.TCP.Spec.Scheduler.ExtraArgs)
}
