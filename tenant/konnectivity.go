package tenant

import (
	appsv1ac "k8s.io/client-go/applyconfigurations/apps/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"
	rbacv1ac "k8s.io/client-go/applyconfigurations/rbac/v1"

	"github.com/apiaryhq/apiary/konnectivity"
)

// konnectivityAgent applies konnectivity's agent half (package
// konnectivity) inside the tenant: the agents' DaemonSet, ServiceAccount
// and kubeconfig, and the RBAC with which the servers review the agents'
// tokens and publish their leases.
func konnectivityAgent(in Inputs) ([]any, error) {
	p := PartKonnectivity
	const ns = konnectivity.Namespace
	// The agents list the servers' leases with their ServiceAccount, through
	// the public endpoint (the kubernetes Service needs kube-proxy first).
	kubeconfig, err := serviceAccountKubeconfig(in)
	if err != nil {
		return nil, err
	}
	sel := konnectivity.AgentSelector()
	ds := appsv1ac.DaemonSet(konnectivity.AgentName, ns).WithLabels(labels(p, sel)).
		WithSpec(appsv1ac.DaemonSetSpec().
			WithSelector(metav1ac.LabelSelector().WithMatchLabels(sel)).
			WithTemplate(corev1ac.PodTemplateSpec().WithLabels(labels(p, sel)).WithAnnotations(in.templateAnnotations()).
				WithSpec(konnectivity.AgentPodSpec(konnectivity.AgentInputs{
					Image:      konnectivity.AgentImage(in.ImageRepository),
					ServerHost: in.serverHost(),
				}))))
	server := user(konnectivity.ServerUser)
	return []any{
		serviceAccount(p, ns, konnectivity.AgentServiceAccount),
		configMap(p, ns, konnectivity.AgentName, map[string]string{konnectivity.AgentKubeconfigKey: kubeconfig}),
		// The servers review the agents' tokens and publish a lease each.
		clusterRoleBinding(p, konnectivity.ServerRoleName, "system:auth-delegator", server),
		rbacv1ac.Role(konnectivity.ServerRoleName, ns).WithLabels(labels(p, nil)).WithRules(konnectivity.ServerRules()...),
		roleBinding(p, ns, konnectivity.ServerRoleName, server),
		rbacv1ac.Role(konnectivity.AgentName, ns).WithLabels(labels(p, nil)).WithRules(konnectivity.AgentRules()...),
		roleBinding(p, ns, konnectivity.AgentName, serviceAccountSubject(ns, konnectivity.AgentServiceAccount)),
		ds,
	}, nil
}
