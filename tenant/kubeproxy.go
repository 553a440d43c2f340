package tenant

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	appsv1ac "k8s.io/client-go/applyconfigurations/apps/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

func mustQuantity(s string) resource.Quantity { return resource.MustParse(s) }

const saDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// serviceAccountKubeconfig reaches the tenant API at its public endpoint
// with the pod's ServiceAccount token: for host-network pods that run before
// (or without) the kubernetes Service working.
func serviceAccountKubeconfig(in Inputs) (string, error) {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["default"] = &clientcmdapi.Cluster{Server: in.Server, CertificateAuthority: saDir + "/ca.crt"}
	kc.AuthInfos["default"] = &clientcmdapi.AuthInfo{TokenFile: saDir + "/token"}
	kc.Contexts["default"] = &clientcmdapi.Context{Cluster: "default", AuthInfo: "default", Namespace: "default"}
	kc.CurrentContext = "default"
	b, err := clientcmd.Write(*kc)
	return string(b), err
}

// kubeProxy is kubeadm's kube-proxy: a DaemonSet in iptables mode on every
// node, reaching the tenant API at its public endpoint with its
// ServiceAccount token (there is no Service VIP before kube-proxy runs).
func kubeProxy(in Inputs) ([]any, error) {
	p := PartKubeProxy
	kubeconfig, err := serviceAccountKubeconfig(in)
	if err != nil {
		return nil, err
	}
	config, err := toYAML(map[string]any{
		"apiVersion":       "kubeproxy.config.k8s.io/v1alpha1",
		"kind":             "KubeProxyConfiguration",
		"clientConnection": map[string]any{"kubeconfig": "/var/lib/kube-proxy/kubeconfig.conf"},
		"clusterCIDR":      in.TCP.Spec.Network.PodCIDR,
		// The hosts are the tenant's: kube-proxy leaves their conntrack
		// table size as it is. (v1.36 otherwise sets nf_conntrack_max to
		// exactly its default, lowering a larger limit, and fails where
		// the table is not its to change: in a container's network
		// namespace, as on kind-like hosts. v1.37 only ever raises it.)
		"conntrack": map[string]any{"maxPerCore": 0},
		"mode":      "iptables",
	})
	if err != nil {
		return nil, err
	}
	sel := map[string]string{"k8s-app": "kube-proxy"}
	ds := appsv1ac.DaemonSet("kube-proxy", "kube-system").WithLabels(labels(p, sel)).
		WithSpec(appsv1ac.DaemonSetSpec().
			WithSelector(metav1ac.LabelSelector().WithMatchLabels(sel)).
			WithUpdateStrategy(appsv1ac.DaemonSetUpdateStrategy().WithType("RollingUpdate")).
			WithTemplate(corev1ac.PodTemplateSpec().WithLabels(labels(p, sel)).WithAnnotations(in.templateAnnotations()).
				WithSpec(corev1ac.PodSpec().
					WithPriorityClassName("system-node-critical").
					WithServiceAccountName("kube-proxy").
					WithHostNetwork(true).
					WithNodeSelector(map[string]string{"kubernetes.io/os": "linux"}).
					WithTolerations(corev1ac.Toleration().WithOperator(corev1.TolerationOpExists)).
					WithContainers(corev1ac.Container().WithName("kube-proxy").
						WithImage(in.image("kube-proxy", in.Version)).
						WithCommand("/usr/local/bin/kube-proxy", "--config=/var/lib/kube-proxy/config.conf", "--hostname-override=$(NODE_NAME)").
						WithEnv(corev1ac.EnvVar().WithName("NODE_NAME").WithValueFrom(corev1ac.EnvVarSource().
							WithFieldRef(corev1ac.ObjectFieldSelector().WithFieldPath("spec.nodeName")))).
						WithSecurityContext(corev1ac.SecurityContext().WithPrivileged(true)).
						WithVolumeMounts(
							corev1ac.VolumeMount().WithName("kube-proxy").WithMountPath("/var/lib/kube-proxy"),
							corev1ac.VolumeMount().WithName("xtables-lock").WithMountPath("/run/xtables.lock"),
							corev1ac.VolumeMount().WithName("lib-modules").WithMountPath("/lib/modules").WithReadOnly(true),
						)).
					WithVolumes(
						corev1ac.Volume().WithName("kube-proxy").WithConfigMap(corev1ac.ConfigMapVolumeSource().WithName("kube-proxy")),
						corev1ac.Volume().WithName("xtables-lock").WithHostPath(corev1ac.HostPathVolumeSource().
							WithPath("/run/xtables.lock").WithType(corev1.HostPathFileOrCreate)),
						corev1ac.Volume().WithName("lib-modules").WithHostPath(corev1ac.HostPathVolumeSource().WithPath("/lib/modules")),
					))))
	objs := []any{
		serviceAccount(p, "kube-system", "kube-proxy"),
		clusterRoleBinding(p, "kubeadm:node-proxier", "system:node-proxier", serviceAccountSubject("kube-system", "kube-proxy")),
		configMap(p, "kube-system", "kube-proxy", map[string]string{"config.conf": config, "kubeconfig.conf": kubeconfig}),
	}
	// kubeadm join reads the kube-proxy ConfigMap with the bootstrap token.
	objs = append(objs, getConfigMapRole(p, "kube-system", "kube-proxy", "kube-proxy", group(NodeBootstrapTokenGroup))...)
	return append(objs, ds), nil
}
