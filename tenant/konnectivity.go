package tenant

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	appsv1ac "k8s.io/client-go/applyconfigurations/apps/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"
	rbacv1ac "k8s.io/client-go/applyconfigurations/rbac/v1"
)

// KonnectivityServerUser is the user of konnectivity-server's client
// certificate; it may review the agents' tokens.
const KonnectivityServerUser = "system:konnectivity-server"

// konnectivityAgent runs an agent on every node that dials the
// konnectivity-servers in the control-plane pods through the tenant's public
// address, so that the API server reaches kubelets, pods and Services
// through the tunnels. Agents identify themselves by node IP, which is what
// the servers' destHost strategy matches on for logs, exec and port-forward.
func konnectivityAgent(in Inputs) ([]any, error) {
	p := PartKonnectivity
	// The agents list the servers' leases with their ServiceAccount, through
	// the public endpoint (the kubernetes Service needs kube-proxy first).
	kubeconfig, err := serviceAccountKubeconfig(in)
	if err != nil {
		return nil, err
	}
	sel := map[string]string{"k8s-app": "konnectivity-agent"}
	const tokenDir = "/var/run/secrets/tokens"
	ctr := corev1ac.Container().WithName("konnectivity-agent").
		WithImage(in.image("kas-network-proxy/proxy-agent", KonnectivityVersion)).
		WithArgs(
			"--logtostderr=true",
			"--ca-cert="+saDir+"/ca.crt",
			"--proxy-server-host="+in.serverHost(),
			fmt.Sprintf("--proxy-server-port=%d", KonnectivityAgentPort),
			fmt.Sprintf("--admin-server-port=%d", KonnectivityAdminPort),
			fmt.Sprintf("--health-server-port=%d", KonnectivityHealthPort),
			"--service-account-token-path="+tokenDir+"/konnectivity-agent-token",
			"--agent-identifiers=host=$(NODE_IP)",
			// Keep looking for servers, and count them by their leases: a
			// scale-up adds one without restarting anything.
			"--sync-forever=true",
			"--count-server-leases=true",
			"--lease-namespace=kube-system",
			"--lease-label="+KonnectivityLeaseLabel,
			"--kubeconfig=/etc/konnectivity-agent/kubeconfig.conf",
		).
		WithEnv(corev1ac.EnvVar().WithName("NODE_IP").WithValueFrom(corev1ac.EnvVarSource().
			WithFieldRef(corev1ac.ObjectFieldSelector().WithFieldPath("status.hostIP")))).
		WithLivenessProbe(corev1ac.Probe().
			WithHTTPGet(corev1ac.HTTPGetAction().WithPath("/healthz").WithPort(intstr.FromInt32(KonnectivityHealthPort)).WithHost("127.0.0.1")).
			WithInitialDelaySeconds(15).WithTimeoutSeconds(15)).
		WithResources(corev1ac.ResourceRequirements().
			WithRequests(corev1.ResourceList{corev1.ResourceCPU: mustQuantity("10m"), corev1.ResourceMemory: mustQuantity("30Mi")})).
		WithSecurityContext(corev1ac.SecurityContext().
			WithAllowPrivilegeEscalation(false).
			WithReadOnlyRootFilesystem(true).
			WithRunAsNonRoot(true).
			WithCapabilities(corev1ac.Capabilities().WithDrop("ALL"))).
		WithVolumeMounts(
			corev1ac.VolumeMount().WithName("konnectivity-agent-token").WithMountPath(tokenDir).WithReadOnly(true),
			corev1ac.VolumeMount().WithName("kubeconfig").WithMountPath("/etc/konnectivity-agent").WithReadOnly(true),
		)
	ds := appsv1ac.DaemonSet("konnectivity-agent", "kube-system").WithLabels(labels(p, sel)).
		WithSpec(appsv1ac.DaemonSetSpec().
			WithSelector(metav1ac.LabelSelector().WithMatchLabels(sel)).
			WithTemplate(corev1ac.PodTemplateSpec().WithLabels(labels(p, sel)).
				WithSpec(corev1ac.PodSpec().
					WithPriorityClassName("system-node-critical").
					WithServiceAccountName(KonnectivityAgentServiceAccount).
					// No dependency on the pod network: the agent is what
					// makes the node reachable at all.
					WithHostNetwork(true).
					WithNodeSelector(map[string]string{"kubernetes.io/os": "linux"}).
					WithTolerations(corev1ac.Toleration().WithOperator(corev1.TolerationOpExists)).
					WithContainers(ctr).
					WithVolumes(
						corev1ac.Volume().WithName("konnectivity-agent-token").
							WithProjected(corev1ac.ProjectedVolumeSource().WithSources(corev1ac.VolumeProjection().
								WithServiceAccountToken(corev1ac.ServiceAccountTokenProjection().
									WithPath("konnectivity-agent-token").WithAudience(KonnectivityAudience)))),
						corev1ac.Volume().WithName("kubeconfig").
							WithConfigMap(corev1ac.ConfigMapVolumeSource().WithName("konnectivity-agent")),
					))))
	leases := rbacv1ac.PolicyRule().WithAPIGroups("coordination.k8s.io").WithResources("leases")
	return []any{
		serviceAccount(p, "kube-system", KonnectivityAgentServiceAccount),
		configMap(p, "kube-system", "konnectivity-agent", map[string]string{"kubeconfig.conf": kubeconfig}),
		// The servers review the agents' tokens and publish a lease each.
		clusterRoleBinding(p, "system:konnectivity-server", "system:auth-delegator", user(KonnectivityServerUser)),
		rbacv1ac.Role("system:konnectivity-server", "kube-system").WithLabels(labels(p, nil)).
			WithRules(leases.WithVerbs("get", "list", "watch", "create", "update", "patch", "delete")),
		roleBinding(p, "kube-system", "system:konnectivity-server", user(KonnectivityServerUser)),
		rbacv1ac.Role("konnectivity-agent", "kube-system").WithLabels(labels(p, nil)).
			WithRules(rbacv1ac.PolicyRule().WithAPIGroups("coordination.k8s.io").WithResources("leases").WithVerbs("get", "list", "watch")),
		roleBinding(p, "kube-system", "konnectivity-agent", serviceAccountSubject("kube-system", KonnectivityAgentServiceAccount)),
		ds,
	}, nil
}
