package render

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"

	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/pki"
	"github.com/apiaryhq/apiary/tenant"
)

// konnectivity-server runs beside kube-apiserver in every control-plane pod:
// the API server sends its cluster-bound traffic (kubelets, pods, Services)
// over a Unix socket to it, and the agents on the tenant's nodes dial it on
// the tenant's public address, so the management cluster needs no route to
// the tenant's networks.
const (
	containerKonnectivity = "konnectivity-server"
	konnectivityDir       = kubernetesDir + "/konnectivity"
	socketDir             = "/run/konnectivity"
	socketPath            = socketDir + "/konnectivity-server.socket"

	pathEgressSelectorConfig = konnectivityDir + "/egress-selector-configuration.yaml"
	pathKonnectivityCert     = konnectivityDir + "/konnectivity-server.crt"
	pathKonnectivityKey      = konnectivityDir + "/konnectivity-server.key"
	pathKonnectivityCfg      = konnectivityDir + "/konnectivity-server.conf"

	// KeyEgressSelectorConfig is the key of the egress selector
	// configuration in the tenant's konnectivity ConfigMap.
	KeyEgressSelectorConfig = "egress-selector-configuration.yaml"

	// KonnectivityCN is the client certificate's user; the tenant binds it to
	// system:auth-delegator (token reviews) and lets it manage its leases.
	KonnectivityCN = tenant.KonnectivityServerUser

	volumeSocket = "konnectivity-uds"
	portKonn     = "konn-agent"
)

// KonnectivityEnabled says whether the tenant runs konnectivity (the
// default).
func KonnectivityEnabled(tcp *apiary.TenantControlPlane) bool {
	e := tcp.Spec.Addons.Konnectivity.Enabled
	return e == nil || *e
}

// KonnectivityConfigMapName holds the API server's egress selector
// configuration.
func KonnectivityConfigMapName(tcp *apiary.TenantControlPlane) string {
	return tcp.Name + "-konnectivity"
}

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
        udsName: ` + socketPath + `
`

// KonnectivityConfigMap holds files of the control-plane pod that are not
// secret.
func KonnectivityConfigMap(tcp *apiary.TenantControlPlane) *corev1ac.ConfigMapApplyConfiguration {
	return corev1ac.ConfigMap(KonnectivityConfigMapName(tcp), tcp.Namespace).
		WithLabels(Labels(tcp)).
		WithOwnerReferences(OwnerReference(tcp)).
		WithData(map[string]string{KeyEgressSelectorConfig: EgressSelectorConfiguration})
}

// KonnectivityServerCertRequest names every address agents dial: the same
// names as the API server's certificate.
func KonnectivityServerCertRequest(tcp *apiary.TenantControlPlane, ep Endpoint, mgmtClusterDomain string) pki.Request {
	req := APIServerCertRequest(tcp, ep, mgmtClusterDomain)
	req.CommonName = containerKonnectivity
	return req
}

// KonnectivityServerArgs is the konnectivity-server command line. Agents
// authenticate with ServiceAccount tokens of the tenant (reviewed through
// the kubeconfig), and count the servers through the leases each server
// publishes, so that a replica change needs no restart of anything.
func KonnectivityServerArgs(in Inputs) []string {
	return flags(map[string]string{
		"uds-name":                 socketPath,
		"delete-existing-uds-file": "true",
		"server-port":              "0",
		"mode":                     "grpc",
		"cluster-cert":             pathKonnectivityCert,
		"cluster-key":              pathKonnectivityKey,
		"agent-port":               fmt.Sprint(tenant.KonnectivityAgentPort),
		"admin-port":               fmt.Sprint(tenant.KonnectivityAdminPort),
		"health-port":              fmt.Sprint(tenant.KonnectivityHealthPort),
		"kubeconfig":               pathKonnectivityCfg,
		"authentication-audience":  tenant.KonnectivityAudience,
		"agent-namespace":          "kube-system",
		"agent-service-account":    tenant.KonnectivityAgentServiceAccount,
		"proxy-strategies":         "destHost,default",
		"enable-lease-controller":  "true",
		"lease-namespace":          "kube-system",
		"lease-label":              tenant.KonnectivityLeaseLabel,
		"logtostderr":              "true",
	}, nil)
}

func konnectivityVolume(tcp *apiary.TenantControlPlane) *corev1ac.VolumeApplyConfiguration {
	return projectedVolume(containerKonnectivity,
		secretItems(tcp, SecretKonnectivityServer, KeyTLSCert, pathKonnectivityCert[rel:], KeyTLSKey, pathKonnectivityKey[rel:]),
		secretItems(tcp, SecretKonnectivityKubeconfig, apiary.KubeconfigKey, pathKonnectivityCfg[rel:]),
	)
}

func konnectivityContainer(in Inputs) *corev1ac.ContainerApplyConfiguration {
	repo := in.ImageRepository
	if repo == "" {
		repo = defaultImageRepository
	}
	return corev1ac.Container().
		WithName(containerKonnectivity).
		WithImage(repo+"/kas-network-proxy/proxy-server:"+tenant.KonnectivityVersion).
		WithImagePullPolicy(corev1.PullIfNotPresent).
		WithCommand("/proxy-server").
		WithArgs(KonnectivityServerArgs(in)...).
		WithPorts(
			corev1ac.ContainerPort().WithName(portKonn).WithContainerPort(tenant.KonnectivityAgentPort).WithProtocol(corev1.ProtocolTCP),
			corev1ac.ContainerPort().WithName("konn-health").WithContainerPort(tenant.KonnectivityHealthPort).WithProtocol(corev1.ProtocolTCP),
		).
		WithResources(resources(containerKonnectivity, apiary.ComponentSpec{})).
		// Not a readiness gate: the server reports unready until an agent
		// connects, and a tenant without nodes must still serve its API.
		WithLivenessProbe(corev1ac.Probe().
			WithHTTPGet(corev1ac.HTTPGetAction().WithPath("/healthz").WithPort(intstr.FromInt32(tenant.KonnectivityHealthPort)).WithScheme(corev1.URISchemeHTTP)).
			WithInitialDelaySeconds(10).WithPeriodSeconds(10).WithTimeoutSeconds(3).WithFailureThreshold(6)).
		WithVolumeMounts(
			corev1ac.VolumeMount().WithName(containerKonnectivity).WithMountPath(kubernetesDir).WithReadOnly(true),
			corev1ac.VolumeMount().WithName(volumeSocket).WithMountPath(socketDir),
		).
		WithSecurityContext(corev1ac.SecurityContext().
			WithAllowPrivilegeEscalation(false).
			WithReadOnlyRootFilesystem(true).
			WithCapabilities(corev1ac.Capabilities().WithDrop("ALL"))).
		WithTerminationMessagePolicy(corev1.TerminationMessageFallbackToLogsOnError)
}

// konnectivityServicePort exposes the agent port on the tenant's address.
func konnectivityServicePort() *corev1ac.ServicePortApplyConfiguration {
	return corev1ac.ServicePort().
		WithName(portKonn).
		WithProtocol(corev1.ProtocolTCP).
		WithPort(tenant.KonnectivityAgentPort).
		WithTargetPort(intstr.FromString(portKonn))
}
