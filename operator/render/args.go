package render

import (
	"net"
	"strconv"
	"strings"

	"github.com/apiaryhq/apiary/konnectivity"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/operator/render/conventions"
)

// Paths inside the control-plane containers. They follow kubeadm's layout so
// that anyone who knows kubeadm finds the files where they expect them.
const (
	kubernetesDir = "/etc/kubernetes"
	pkiDir        = kubernetesDir + "/pki"

	pathCACert = pkiDir + "/ca.crt"
	pathCAKey  = pkiDir + "/ca.key"
	// pathCAIssuerCert is the CA that signs, with pathCAKey: pathCACert is
	// the bundle trusted, which holds two CAs during a CA rotation.
	pathCAIssuerCert         = pkiDir + "/ca-issuer.crt"
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

// Inputs are the facts a render needs besides the (defaulted) spec. Every
// observed fact is here, named; the render functions compute the rest.
type Inputs struct {
	// TCP is the tenant, already defaulted.
	TCP *apiary.TenantControlPlane
	// Version is the Kubernetes version of the control plane to render
	// (image tags, version-gated flags): spec.version for a rollout. It is
	// not the version the tenant runs (status.version), which the objects
	// inside the tenant follow.
	Version string
	// Endpoint is where clients reach the tenant API (the LoadBalancer
	// address, the node address of a NodePort or the ClusterIP).
	Endpoint Endpoint
	// EtcdServers are the DataStore's client URLs.
	EtcdServers []string
	// EtcdPrefix is the tenant's key prefix.
	EtcdPrefix string
	// Secrets holds the data of the tenant's Secrets by kind; those in
	// MountedSecrets are hashed into the pods, so that new credentials roll
	// them.
	Secrets map[SecretKind]map[string][]byte
	// ImageRepository replaces registry.k8s.io in image names (air-gapped
	// installs); empty means registry.k8s.io.
	ImageRepository string
	// HostsOnly: the control plane runs on the tenant's hosts alone
	// (registered mode): the Deployment keeps its template at 0 replicas,
	// ready to come back when the tenant switches to standalone.
	HostsOnly bool
	// OnHost: the render is a control-plane host's static Pods (StaticPods
	// sets it), not the Deployment.
	OnHost bool
	// Authentication is the tenant's AuthenticationConfiguration file
	// (AuthenticationFile, with the certificates its references held when
	// read); empty without spec.authentication.
	Authentication string
}

// AdvertiseAddress is the IP kube-apiserver publishes in the tenant's
// kubernetes Service: the endpoint's when it is an IP, else (a
// LoadBalancer with a hostname) the Service's ClusterIP.
func (in Inputs) AdvertiseAddress() string {
	if net.ParseIP(in.Endpoint.Host) != nil {
		return in.Endpoint.Host
	}
	return in.Endpoint.ClusterIP
}

// ConfigHash hashes the mounted Secrets: it changes, and the pods roll,
// whenever a credential they read does.
func (in Inputs) ConfigHash() string {
	mounted := map[string]map[string][]byte{}
	for _, kind := range MountedSecrets {
		mounted[string(kind)] = in.Secrets[kind]
	}
	// Only when set, so that tenants without it keep their hash (and do
	// not roll when the operator is upgraded).
	if in.Authentication != "" {
		mounted[AuthenticationConfigMapName(in.TCP)] = map[string][]byte{KeyAuthenticationConfig: []byte(in.Authentication)}
	}
	return ConfigHash(mounted)
}

// featureGates is merged, not replaced, by extraArgs (see
// conventions.Flags): a spec that adds a gate cannot drop one Apiary pins.
const featureGates = conventions.FlagFeatureGates

// Component names a control-plane component whose command line a spec can
// extend with extraArgs.
type Component string

const (
	APIServer         Component = "apiServer"
	ControllerManager Component = "controllerManager"
	Scheduler         Component = "scheduler"
)

// Components are the components with extraArgs, in spec order.
var Components = []Component{APIServer, ControllerManager, Scheduler}

// DefaultFlags are the flags Apiary sets on a component, before extraArgs.
func DefaultFlags(c Component, in Inputs) map[string]string {
	switch c {
	case APIServer:
		return apiServerDefaults(in)
	case ControllerManager:
		return controllerManagerDefaults(in)
	case Scheduler:
		return schedulerDefaults()
	}
	return nil
}

// ExtraArgs are the extraArgs of a component in the spec.
func ExtraArgs(c Component, s *apiary.TenantControlPlaneSpec) map[string]string {
	switch c {
	case APIServer:
		return s.APIServer.ExtraArgs
	case ControllerManager:
		return s.ControllerManager.ExtraArgs
	case Scheduler:
		return s.Scheduler.ExtraArgs
	}
	return nil
}

// Args is a component's command line.
func Args(c Component, in Inputs) []string {
	return conventions.Flags(DefaultFlags(c, in), ExtraArgs(c, &in.TCP.Spec))
}

// APIServerArgs is the kube-apiserver command line.
func APIServerArgs(in Inputs) []string { return Args(APIServer, in) }

func apiServerDefaults(in Inputs) map[string]string {
	s := in.TCP.Spec
	port := strconv.Itoa(int(s.Network.Port))
	defaults := map[string]string{
		"advertise-address":           in.AdvertiseAddress(),
		"allow-privileged":            "true",
		"authorization-mode":          "Node,RBAC",
		"bind-address":                "0.0.0.0",
		"client-ca-file":              pathCACert,
		"enable-admission-plugins":    "NodeRestriction",
		"enable-bootstrap-token-auth": "true",
		// Webhooks and aggregated APIs are called at their endpoints'
		// addresses, so a new one does not wait for some node's kube-proxy
		// to program its ClusterIP (the API server runs on no node).
		"enable-aggregator-routing": "true",
		"endpoint-reconciler-type":  "lease",
		"etcd-cafile":               pathEtcdCACert,
		"etcd-certfile":             pathEtcdClientCert,
		"etcd-keyfile":              pathEtcdClientKey,
		"etcd-prefix":               in.EtcdPrefix,
		"etcd-servers":              strings.Join(in.EtcdServers, ","),
		// The datastore is shared: compaction is global to etcd and needs
		// root, so the datastore compacts itself and tenants never do.
		"etcd-compaction-interval": "0",
		// So the tenant still sees the datastore's compaction: a list
		// continue token older than the compacted revision is answered 410
		// Gone, as upstream. Served from the watch cache's snapshots, it
		// would be accepted, because the cache learns the compacted
		// revision only from etcd's compact_rev_key, outside the tenant's
		// prefix.
		featureGates: "ListFromCacheSnapshot=false",
		// Kubelets serve with certificates the tenant's CA signed (the
		// host agent approves their serving CSRs for the Host's own name
		// and address only): the API server checks them, so that a
		// machine answering at a Node's address cannot pose as its
		// kubelet for logs, exec and port-forward.
		"kubelet-certificate-authority":      pathCACert,
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
		// scale-down or a rolling update then loses no request). 10 s:
		// every kube-proxy must have taken the pod out of its rules by
		// then, and on a busy node that took more than 5 s once (a CI
		// run: 1 of 1151 requests in certificate rolls failed with "no
		// route to host", sent to a pod already gone). The pod's life
		// is not longer for it: its open watches hold it until the 30 s
		// grace period anyway. A host, which leaves the Service before it
		// stops, keeps 5 s (below).
		"shutdown-delay-duration":          "10s",
		"service-account-issuer":           defaultServiceAccountIssuer(in.TCP),
		"service-account-key-file":         pathSAPub,
		"service-account-signing-key-file": pathSAKey,
		"service-cluster-ip-range":         s.Network.ServiceCIDR,
		"tls-cert-file":                    pathAPIServerCert,
		"tls-private-key-file":             pathAPIServerKey,
	}
	if in.Authentication != "" {
		defaults["authentication-config"] = pathAuthenticationConfig
	}
	if KonnectivityEnabled(in.TCP) {
		defaults["egress-selector-config-file"] = kubernetesDir + "/" + konnectivity.EgressSelectorConfigFile
	}
	if in.OnHost {
		// On a host, close the watches it serves within 5 s of the
		// shutdown delay: the HTTP server waits for its connections to go
		// idle, which watches never do, so it otherwise runs until the
		// kubelet kills it at the end of the 30 s grace period, and the
		// host's new static Pod waits for that (a host update took 52 s,
		// now 30 s). The host left the Service before the rewrite, so
		// those watches' clients watch again elsewhere. Not in the
		// Deployment: nothing there waits for the old pod's exit, and
		// hosted tenants keep the behaviour their e2e runs measured.
		defaults["shutdown-watch-termination-grace-period"] = "5s"
		defaults["shutdown-delay-duration"] = "5s"
	}
	if StaticAdmissionSupported(in.Version) {
		// The datastore quota's policy (admission.go). 1.36 has the gate
		// as alpha, off by default.
		defaults["admission-control-config-file"] = pathAdmissionConfig
		defaults[featureGates] += "," + manifestGate + "=true"
	}
	return defaults
}

// ControllerManagerArgs is the kube-controller-manager command line. It
// talks to the API server of its own pod over loopback.
func ControllerManagerArgs(in Inputs) []string { return Args(ControllerManager, in) }

func controllerManagerDefaults(in Inputs) map[string]string {
	s := in.TCP.Spec
	return map[string]string{
		"allocate-node-cidrs":              "true",
		"authentication-kubeconfig":        pathControllerManagerCfg,
		"authorization-kubeconfig":         pathControllerManagerCfg,
		"bind-address":                     "0.0.0.0",
		"client-ca-file":                   pathCACert,
		"cluster-cidr":                     s.Network.PodCIDR,
		"cluster-name":                     in.TCP.Name,
		"cluster-signing-cert-file":        pathCAIssuerCert,
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
	}
}

// SchedulerArgs is the kube-scheduler command line.
func SchedulerArgs(in Inputs) []string { return Args(Scheduler, in) }

func schedulerDefaults() map[string]string {
	return map[string]string{
		"authentication-kubeconfig": pathSchedulerCfg,
		"authorization-kubeconfig":  pathSchedulerCfg,
		"bind-address":              "0.0.0.0",
		"kubeconfig":                pathSchedulerCfg,
		"leader-elect":              "true",
		"profiling":                 "false",
		"secure-port":               strconv.Itoa(schedulerPort),
	}
}

// MountDirs are the directories Apiary mounts into the control-plane
// containers (certificates, keys, kubeconfigs, the konnectivity socket,
// the admission policies).
var MountDirs = []string{kubernetesDir, konnectivity.SocketDir, admissionDir}
