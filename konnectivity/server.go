package konnectivity

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
)

// ServerName names konnectivity-server's container, the volume of its files
// and its serving certificate (common name).
const ServerName = "konnectivity-server"

// Files of the control-plane pod. The server's files are mounted at
// ConfigDir (kubeadm's /etc/kubernetes), in the volume ServerName; the
// *File names are relative to it, as a projected volume names them.
const (
	ConfigDir = "/etc/kubernetes"

	// EgressSelectorConfigFile is the API server's (see
	// EgressSelectorConfiguration).
	EgressSelectorConfigFile = "konnectivity/egress-selector-configuration.yaml"
	// CertFile and KeyFile are the server's certificate for the agents.
	CertFile = "konnectivity/konnectivity-server.crt"
	KeyFile  = "konnectivity/konnectivity-server.key"
	// KubeconfigFile reaches the tenant API as ServerUser.
	KubeconfigFile = "konnectivity/konnectivity-server.conf"
)

// The Unix socket through which the API server dials konnectivity-server,
// on an emptyDir volume (SocketVolume) both containers mount at SocketDir.
const (
	SocketVolume = "konnectivity-uds"
	SocketDir    = "/run/konnectivity"
	SocketPath   = SocketDir + "/konnectivity-server.socket"
)

// AgentPortName names the agent port on the container and the tenant
// Service.
const AgentPortName = "konn-agent"

// EgressSelectorConfiguration sends only cluster-bound traffic through
// konnectivity; etcd and control-plane traffic stay direct.
const EgressSelectorConfiguration = `apiVersion: apiserver.k8s.io/v1beta1
kind: EgressSelectorConfiguration
egressSelections:
- name: cluster
  connection:
    proxyProtocol: GRPC
    transport:
      uds:
        udsName: ` + SocketPath + `
`

// ServerArgs is the konnectivity-server command line, sorted. Agents
// authenticate with ServiceAccount tokens of the tenant (reviewed through
// the kubeconfig), and count the servers through the leases each server
// publishes, so that a replica change needs no restart of anything.
func ServerArgs() []string {
	return []string{
		fmt.Sprintf("--admin-port=%d", AdminPort),
		"--agent-namespace=" + Namespace,
		fmt.Sprintf("--agent-port=%d", AgentPort),
		"--agent-service-account=" + AgentServiceAccount,
		"--authentication-audience=" + Audience,
		"--cluster-cert=" + ConfigDir + "/" + CertFile,
		"--cluster-key=" + ConfigDir + "/" + KeyFile,
		"--delete-existing-uds-file=true",
		"--enable-lease-controller=true",
		fmt.Sprintf("--health-port=%d", HealthPort),
		"--kubeconfig=" + ConfigDir + "/" + KubeconfigFile,
		"--lease-label=" + LeaseLabel,
		"--lease-namespace=" + Namespace,
		"--logtostderr=true",
		"--mode=grpc",
		// Logs, exec and port-forward go to the agent of the kubelet's
		// node (agents identify themselves by node IP), the rest to any.
		"--proxy-strategies=destHost,default",
		"--server-port=0",
		"--uds-name=" + SocketPath,
	}
}

// ServerContainer is konnectivity-server in the control-plane pod: it
// serves the agents on AgentPort and the API server on SocketPath. It
// mounts the volumes ServerName (its files, at ConfigDir) and SocketVolume,
// which the caller provides; the caller also adds what all of its
// containers share (security context, pull policy).
func ServerContainer(image string, resources *corev1ac.ResourceRequirementsApplyConfiguration) *corev1ac.ContainerApplyConfiguration {
	return corev1ac.Container().
		WithName(ServerName).
		WithImage(image).
		WithCommand("/proxy-server").
		WithArgs(ServerArgs()...).
		WithPorts(
			corev1ac.ContainerPort().WithName(AgentPortName).WithContainerPort(AgentPort).WithProtocol(corev1.ProtocolTCP),
			corev1ac.ContainerPort().WithName("konn-health").WithContainerPort(HealthPort).WithProtocol(corev1.ProtocolTCP),
		).
		WithResources(resources).
		// Not a readiness gate: the server reports unready until an agent
		// connects, and a tenant without nodes must still serve its API.
		WithLivenessProbe(corev1ac.Probe().
			WithHTTPGet(corev1ac.HTTPGetAction().WithPath("/healthz").WithPort(intstr.FromInt32(HealthPort)).WithScheme(corev1.URISchemeHTTP)).
			WithInitialDelaySeconds(10).WithPeriodSeconds(10).WithTimeoutSeconds(3).WithFailureThreshold(6)).
		WithVolumeMounts(
			corev1ac.VolumeMount().WithName(ServerName).WithMountPath(ConfigDir).WithReadOnly(true),
			SocketMount(),
		)
}

// SocketMount mounts the socket's volume in the API server's container.
func SocketMount() *corev1ac.VolumeMountApplyConfiguration {
	return corev1ac.VolumeMount().WithName(SocketVolume).WithMountPath(SocketDir)
}

// ServicePort exposes the agent port on the tenant's address.
func ServicePort() *corev1ac.ServicePortApplyConfiguration {
	return corev1ac.ServicePort().
		WithName(AgentPortName).
		WithProtocol(corev1.ProtocolTCP).
		WithPort(AgentPort).
		WithTargetPort(intstr.FromString(AgentPortName))
}
