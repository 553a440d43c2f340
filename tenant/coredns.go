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

// CoreDNSServiceName is the cluster DNS Service, as kubeadm names it.
const CoreDNSServiceName = "kube-dns"

// coreDNS is the cluster DNS: kubeadm's CoreDNS deployment, its Service at
// spec.network.dnsServiceIP and the RBAC it needs to watch Services and
// EndpointSlices.
func coreDNS(in Inputs) ([]any, error) {
	p := PartCoreDNS
	n := in.TCP.Spec.Network
	corefile := fmt.Sprintf(`.:53 {
    errors
    health {
       lameduck 5s
    }
    ready
    kubernetes %s in-addr.arpa ip6.arpa {
       pods insecure
       fallthrough in-addr.arpa ip6.arpa
       ttl 30
    }
    prometheus :9153
    forward . /etc/resolv.conf {
       max_concurrent 1000
    }
    cache 30 {
       disable success %s
       disable denial %s
    }
    loop
    reload
    loadbalance
}
`, n.ClusterDomain, n.ClusterDomain, n.ClusterDomain)
	sel := map[string]string{"k8s-app": "kube-dns"}
	role := rbacv1ac.ClusterRole("system:coredns").WithLabels(labels(p, nil)).WithRules(
		rbacv1ac.PolicyRule().WithAPIGroups("").WithResources("endpoints", "services", "pods", "namespaces").WithVerbs("list", "watch"),
		rbacv1ac.PolicyRule().WithAPIGroups("discovery.k8s.io").WithResources("endpointslices").WithVerbs("list", "watch"),
	)
	probe := func(path string, port int32) *corev1ac.ProbeApplyConfiguration {
		return corev1ac.Probe().WithHTTPGet(corev1ac.HTTPGetAction().WithPath(path).WithPort(intstr.FromInt32(port)).WithScheme(corev1.URISchemeHTTP))
	}
	ctr := corev1ac.Container().WithName("coredns").
		WithImage(in.image("coredns/coredns", CoreDNSVersion(in.Version))).
		WithArgs("-conf", "/etc/coredns/Corefile").
		WithPorts(
			corev1ac.ContainerPort().WithName("dns").WithContainerPort(53).WithProtocol(corev1.ProtocolUDP),
			corev1ac.ContainerPort().WithName("dns-tcp").WithContainerPort(53).WithProtocol(corev1.ProtocolTCP),
			corev1ac.ContainerPort().WithName("metrics").WithContainerPort(9153).WithProtocol(corev1.ProtocolTCP),
		).
		WithResources(corev1ac.ResourceRequirements().
			WithRequests(corev1.ResourceList{corev1.ResourceCPU: mustQuantity("100m"), corev1.ResourceMemory: mustQuantity("70Mi")}).
			WithLimits(corev1.ResourceList{corev1.ResourceMemory: mustQuantity("170Mi")})).
		WithVolumeMounts(corev1ac.VolumeMount().WithName("config-volume").WithMountPath("/etc/coredns").WithReadOnly(true)).
		WithLivenessProbe(probe("/health", 8080).WithInitialDelaySeconds(60).WithTimeoutSeconds(5).WithFailureThreshold(5)).
		WithReadinessProbe(probe("/ready", 8181)).
		WithSecurityContext(corev1ac.SecurityContext().
			WithAllowPrivilegeEscalation(false).
			WithCapabilities(corev1ac.Capabilities().WithAdd("NET_BIND_SERVICE").WithDrop("ALL")).
			WithReadOnlyRootFilesystem(true))
	dep := appsv1ac.Deployment("coredns", "kube-system").WithLabels(labels(p, sel)).
		WithSpec(appsv1ac.DeploymentSpec().
			WithReplicas(2).
			WithSelector(metav1ac.LabelSelector().WithMatchLabels(sel)).
			WithStrategy(appsv1ac.DeploymentStrategy().WithType("RollingUpdate").
				WithRollingUpdate(appsv1ac.RollingUpdateDeployment().WithMaxUnavailable(intstr.FromInt32(1)))).
			WithTemplate(corev1ac.PodTemplateSpec().WithLabels(labels(p, sel)).WithAnnotations(in.templateAnnotations()).
				WithSpec(corev1ac.PodSpec().
					WithPriorityClassName("system-cluster-critical").
					WithServiceAccountName("coredns").
					WithNodeSelector(map[string]string{"kubernetes.io/os": "linux"}).
					WithTolerations(
						corev1ac.Toleration().WithKey("CriticalAddonsOnly").WithOperator(corev1.TolerationOpExists),
						corev1ac.Toleration().WithKey("node-role.kubernetes.io/control-plane").WithEffect(corev1.TaintEffectNoSchedule),
					).
					WithAffinity(corev1ac.Affinity().WithPodAntiAffinity(corev1ac.PodAntiAffinity().
						WithPreferredDuringSchedulingIgnoredDuringExecution(corev1ac.WeightedPodAffinityTerm().WithWeight(100).
							WithPodAffinityTerm(corev1ac.PodAffinityTerm().WithTopologyKey("kubernetes.io/hostname").
								WithLabelSelector(metav1ac.LabelSelector().WithMatchLabels(sel)))))).
					WithDNSPolicy(corev1.DNSDefault).
					WithContainers(ctr).
					WithVolumes(corev1ac.Volume().WithName("config-volume").
						WithConfigMap(corev1ac.ConfigMapVolumeSource().WithName("coredns").
							WithItems(corev1ac.KeyToPath().WithKey("Corefile").WithPath("Corefile")))))))
	svc := corev1ac.Service(CoreDNSServiceName, "kube-system").
		WithLabels(labels(p, map[string]string{"k8s-app": "kube-dns", "kubernetes.io/name": "CoreDNS"})).
		WithAnnotations(map[string]string{"prometheus.io/port": "9153", "prometheus.io/scrape": "true"}).
		WithSpec(corev1ac.ServiceSpec().
			WithClusterIP(n.DNSServiceIP).
			WithSelector(sel).
			WithPorts(
				corev1ac.ServicePort().WithName("dns").WithPort(53).WithProtocol(corev1.ProtocolUDP).WithTargetPort(intstr.FromInt32(53)),
				corev1ac.ServicePort().WithName("dns-tcp").WithPort(53).WithProtocol(corev1.ProtocolTCP).WithTargetPort(intstr.FromInt32(53)),
				corev1ac.ServicePort().WithName("metrics").WithPort(9153).WithProtocol(corev1.ProtocolTCP).WithTargetPort(intstr.FromInt32(9153)),
			))
	return []any{
		serviceAccount(p, "kube-system", "coredns"),
		role,
		clusterRoleBinding(p, "system:coredns", "system:coredns", serviceAccountSubject("kube-system", "coredns")),
		configMap(p, "kube-system", "coredns", map[string]string{"Corefile": corefile}),
		dep,
		svc,
	}, nil
}
