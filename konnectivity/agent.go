package konnectivity

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/intstr"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	rbacv1ac "k8s.io/client-go/applyconfigurations/rbac/v1"
)

// AgentName names the agents' DaemonSet, their Role and RoleBinding, and
// the ConfigMap of their kubeconfig (key AgentKubeconfigKey), in Namespace.
const AgentName = "konnectivity-agent"

// AgentKubeconfigKey is the key of the agents' kubeconfig in the ConfigMap
// AgentName: it reaches the tenant API at its public endpoint with the
// pod's ServiceAccount token (the kubernetes Service needs kube-proxy
// first), to list the servers' leases.
const AgentKubeconfigKey = "kubeconfig.conf"

// ServerRoleName names the Role (in Namespace) and the bindings that let
// ServerUser manage its leases and review the agents' tokens.
const ServerRoleName = "system:konnectivity-server"

// serviceAccountDir is where the kubelet mounts a pod's ServiceAccount
// token and the cluster CA.
const serviceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// AgentInputs are what the agents' pod depends on.
type AgentInputs struct {
	// Image of the agent (AgentImage).
	Image string
	// ServerHost is the host of the tenant's public address, where the
	// agents dial the servers (on AgentPort).
	ServerHost string
}

// AgentSelector selects the agents' pods.
func AgentSelector() map[string]string {
	return map[string]string{"k8s-app": AgentName}
}

// AgentPodSpec runs an agent on every node that dials the
// konnectivity-servers in the control-plane pods through the tenant's public
// address, so that the API server reaches kubelets, pods and Services
// through the tunnels. Agents identify themselves by node IP, which is what
// the servers' destHost strategy matches on for logs, exec and port-forward.
// The pod runs as AgentServiceAccount and mounts the ConfigMap AgentName.
func AgentPodSpec(in AgentInputs) *corev1ac.PodSpecApplyConfiguration {
	const tokenDir = "/var/run/secrets/tokens"
	ctr := corev1ac.Container().WithName(AgentName).
		WithImage(in.Image).
		WithArgs(
			"--logtostderr=true",
			"--ca-cert="+serviceAccountDir+"/ca.crt",
			"--proxy-server-host="+in.ServerHost,
			fmt.Sprintf("--proxy-server-port=%d", AgentPort),
			fmt.Sprintf("--admin-server-port=%d", AgentAdminPort),
			fmt.Sprintf("--health-server-port=%d", AgentHealthPort),
			"--service-account-token-path="+tokenDir+"/konnectivity-agent-token",
			"--agent-identifiers=host=$(NODE_IP)",
			// Keep looking for servers, and count them by their leases: a
			// scale-up adds one without restarting anything.
			"--sync-forever=true",
			"--count-server-leases=true",
			"--lease-namespace="+Namespace,
			"--lease-label="+LeaseLabel,
			"--kubeconfig=/etc/konnectivity-agent/"+AgentKubeconfigKey,
		).
		WithEnv(corev1ac.EnvVar().WithName("NODE_IP").WithValueFrom(corev1ac.EnvVarSource().
			WithFieldRef(corev1ac.ObjectFieldSelector().WithFieldPath("status.hostIP")))).
		WithLivenessProbe(corev1ac.Probe().
			WithHTTPGet(corev1ac.HTTPGetAction().WithPath("/healthz").WithPort(intstr.FromInt32(AgentHealthPort)).WithHost("127.0.0.1")).
			WithInitialDelaySeconds(15).WithTimeoutSeconds(15)).
		WithResources(corev1ac.ResourceRequirements().
			WithRequests(corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("30Mi")})).
		WithSecurityContext(corev1ac.SecurityContext().
			WithAllowPrivilegeEscalation(false).
			WithReadOnlyRootFilesystem(true).
			WithRunAsNonRoot(true).
			WithCapabilities(corev1ac.Capabilities().WithDrop("ALL"))).
		WithVolumeMounts(
			corev1ac.VolumeMount().WithName("konnectivity-agent-token").WithMountPath(tokenDir).WithReadOnly(true),
			corev1ac.VolumeMount().WithName("kubeconfig").WithMountPath("/etc/konnectivity-agent").WithReadOnly(true),
		)
	return corev1ac.PodSpec().
		WithPriorityClassName("system-node-critical").
		WithServiceAccountName(AgentServiceAccount).
		// No dependency on the pod network: the agent is what makes the
		// node reachable at all.
		WithHostNetwork(true).
		// SIGTERM makes the agent drain (servers stop choosing it for new
		// dials; destHost falls back to another agent) and it exits only
		// on a second signal, so it would wait out the whole grace period
		// at every restart: 30 s by default, per node, during each roll
		// of the DaemonSet. A few seconds let in-flight dials finish.
		WithTerminationGracePeriodSeconds(agentGracePeriod).
		WithNodeSelector(map[string]string{"kubernetes.io/os": "linux"}).
		WithTolerations(corev1ac.Toleration().WithOperator(corev1.TolerationOpExists)).
		WithContainers(ctr).
		WithVolumes(
			corev1ac.Volume().WithName("konnectivity-agent-token").
				WithProjected(corev1ac.ProjectedVolumeSource().WithSources(corev1ac.VolumeProjection().
					WithServiceAccountToken(corev1ac.ServiceAccountTokenProjection().
						WithPath("konnectivity-agent-token").WithAudience(Audience)))),
			corev1ac.Volume().WithName("kubeconfig").
				WithConfigMap(corev1ac.ConfigMapVolumeSource().WithName(AgentName)),
		)
}

// agentGracePeriod is how long a stopping agent drains.
const agentGracePeriod = 5

// leases are the objects the servers publish and the agents count.
func leases() *rbacv1ac.PolicyRuleApplyConfiguration {
	return rbacv1ac.PolicyRule().WithAPIGroups("coordination.k8s.io").WithResources("leases")
}

// ServerRules are the Role ServerRoleName's: each server publishes and
// renews a lease. (Token reviews come from system:auth-delegator.)
func ServerRules() []*rbacv1ac.PolicyRuleApplyConfiguration {
	return []*rbacv1ac.PolicyRuleApplyConfiguration{
		leases().WithVerbs("get", "list", "watch", "create", "update", "patch", "delete"),
	}
}

// AgentRules are the Role AgentName's: agents count the servers' leases.
func AgentRules() []*rbacv1ac.PolicyRuleApplyConfiguration {
	return []*rbacv1ac.PolicyRuleApplyConfiguration{
		leases().WithVerbs("get", "list", "watch"),
	}
}
