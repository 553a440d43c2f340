package tenant

import (
	rbacv1ac "k8s.io/client-go/applyconfigurations/rbac/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	bootstrapapi "k8s.io/cluster-bootstrap/token/api"

	"github.com/apiaryhq/apiary/images"
)

// Names kubeadm uses; `kubeadm join` looks for exactly these.
const (
	// NodeBootstrapTokenGroup is the group of kubeadm's default bootstrap
	// tokens.
	NodeBootstrapTokenGroup = "system:bootstrappers:kubeadm:default-node-token"
	nodesGroup              = "system:nodes"
	// ClusterAdminsGroup is bound to cluster-admin; the tenant's admin
	// certificates carry it instead of system:masters.
	ClusterAdminsGroup = "kubeadm:cluster-admins"

	// AnnotationCreateOnce marks an object the bootstrap creates when the
	// tenant is new and then leaves to the tenant (never re-applied, never
	// re-created once deleted).
	AnnotationCreateOnce = "apiary.dev/create-once"

	KubeadmConfigMap = "kubeadm-config"
	KubeletConfigMap = "kubelet-config"
	// KubeletConfigKey is the key of the KubeletConfiguration in
	// kube-system/kubelet-config.
	KubeletConfigKey = "kubelet"
	// ClusterConfigurationKey is the key of the ClusterConfiguration in
	// kube-system/kubeadm-config.
	ClusterConfigurationKey = "ClusterConfiguration"

	// KubeletPKIDir is where kubeadm join puts the cluster CA on a node.
	KubeletPKIDir = "/etc/kubernetes/pki"
)

// bootstrap is what `kubeadm init` uploads to a new cluster and `kubeadm
// join` reads: the public cluster-info (the bootstrap signer in the
// tenant's kube-controller-manager adds a signature per bootstrap token),
// kubeadm-config and kubelet-config, and the RBAC that lets a bootstrap
// token read them, create a client CSR that is approved automatically, and
// lets nodes renew their client certificates.
func bootstrap(in Inputs) ([]any, error) {
	p := PartBootstrap
	info, err := clusterInfoKubeconfig(in)
	if err != nil {
		return nil, err
	}
	clusterCfg, err := clusterConfiguration(in)
	if err != nil {
		return nil, err
	}
	kubeletCfg, err := kubeletConfiguration(in)
	if err != nil {
		return nil, err
	}
	objs := []any{
		configMap(p, "kube-public", bootstrapapi.ConfigMapClusterInfo, map[string]string{bootstrapapi.KubeConfigKey: info}),
	}
	objs = append(objs, getConfigMapRole(p, "kube-public", "kubeadm:bootstrap-signer-clusterinfo", bootstrapapi.ConfigMapClusterInfo, user("system:anonymous"))...)
	objs = append(objs, configMap(p, "kube-system", KubeadmConfigMap, map[string]string{ClusterConfigurationKey: clusterCfg}))
	objs = append(objs, getConfigMapRole(p, "kube-system", "kubeadm:nodes-kubeadm-config", KubeadmConfigMap, group(NodeBootstrapTokenGroup), group(nodesGroup))...)
	objs = append(objs, configMap(p, "kube-system", KubeletConfigMap, map[string]string{KubeletConfigKey: kubeletCfg}))
	objs = append(objs, getConfigMapRole(p, "kube-system", "kubeadm:kubelet-config", KubeletConfigMap, group(NodeBootstrapTokenGroup), group(nodesGroup))...)
	objs = append(objs,
		clusterRoleBinding(p, "kubeadm:kubelet-bootstrap", "system:node-bootstrapper", group(NodeBootstrapTokenGroup)),
		clusterRoleBinding(p, "kubeadm:node-autoapprove-bootstrap", "system:certificates.k8s.io:certificatesigningrequests:nodeclient", group(NodeBootstrapTokenGroup)),
		clusterRoleBinding(p, "kubeadm:node-autoapprove-certificate-rotation", "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient", group(nodesGroup)),
		getNodesClusterRole(p),
		clusterRoleBinding(p, "kubeadm:get-nodes", "kubeadm:get-nodes", group(NodeBootstrapTokenGroup)),
		// Created once, never re-applied: deleting it (or editing its
		// subjects) is how the tenant's owner revokes exported admin
		// kubeconfigs, and Apiary must not undo that.
		clusterRoleBinding(p, "kubeadm:cluster-admins", "cluster-admin", group(ClusterAdminsGroup)).
			WithAnnotations(map[string]string{AnnotationCreateOnce: "true"}),
	)
	return objs, nil
}

// clusterInfoKubeconfig is the public kubeconfig of cluster-info: the
// endpoint and the CA, no credentials, and a cluster with an empty name
// (as kubeadm writes it).
func clusterInfoKubeconfig(in Inputs) (string, error) {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[""] = &clientcmdapi.Cluster{Server: in.Server, CertificateAuthorityData: in.CACert}
	b, err := clientcmd.Write(*cfg)
	if err != nil {
		return "", err
	}
	return string(b), nil
}

// clusterConfiguration is the kubeadm ClusterConfiguration of the tenant,
// for `kubeadm join` and for users' tools that read it.
func clusterConfiguration(in Inputs) (string, error) {
	tcp := in.TCP
	n := tcp.Spec.Network
	return toYAML(map[string]any{
		"apiVersion":           "kubeadm.k8s.io/v1beta4",
		"kind":                 "ClusterConfiguration",
		"clusterName":          tcp.Name,
		"kubernetesVersion":    in.Version,
		"controlPlaneEndpoint": in.controlPlaneEndpoint(),
		"certificatesDir":      KubeletPKIDir,
		"imageRepository":      images.Repository(in.ImageRepository),
		"networking": map[string]any{
			"dnsDomain":     n.ClusterDomain,
			"podSubnet":     n.PodCIDR,
			"serviceSubnet": n.ServiceCIDR,
		},
	})
}

// kubeletConfiguration is the KubeletConfiguration kubeadm join writes to
// every node: webhook authentication and authorization against the tenant,
// cluster DNS, client certificate rotation and serving certificates through
// CSRs (which the operator approves after checking the node).
func kubeletConfiguration(in Inputs) (string, error) {
	n := in.TCP.Spec.Network
	return toYAML(map[string]any{
		"apiVersion": "kubelet.config.k8s.io/v1beta1",
		"kind":       "KubeletConfiguration",
		"authentication": map[string]any{
			"anonymous": map[string]any{"enabled": false},
			"webhook":   map[string]any{"enabled": true},
			"x509":      map[string]any{"clientCAFile": KubeletPKIDir + "/ca.crt"},
		},
		"authorization":      map[string]any{"mode": "Webhook"},
		"cgroupDriver":       "systemd",
		"clusterDNS":         []string{n.DNSServiceIP},
		"clusterDomain":      n.ClusterDomain,
		"rotateCertificates": true,
		"serverTLSBootstrap": true,
		"staticPodPath":      "/etc/kubernetes/manifests",
	})
}

// getNodesClusterRole lets `kubeadm join` check whether a Node of its name
// exists already.
func getNodesClusterRole(p Part) *rbacv1ac.ClusterRoleApplyConfiguration {
	return rbacv1ac.ClusterRole("kubeadm:get-nodes").WithLabels(labels(p, nil)).WithRules(
		rbacv1ac.PolicyRule().WithAPIGroups("").WithResources("nodes").WithVerbs("get"))
}
