package render

import (
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"
	networkingv1ac "k8s.io/client-go/applyconfigurations/networking/v1"

	"github.com/apiaryhq/apiary/konnectivity"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/operator/render/managedetcd"
)

// PolicyInputs are what the NetworkPolicies need to know about the
// management cluster (operator flags, set by the chart).
type PolicyInputs struct {
	// OperatorNamespace and OperatorPodLabels select the operator's pods,
	// which reach every etcd's client port.
	OperatorNamespace string
	OperatorPodLabels map[string]string
	// DNSNamespace and DNSPodLabels select the cluster DNS the control
	// planes resolve names (the DataStore's members) with.
	DNSNamespace string
	DNSPodLabels map[string]string
	// MonitoringNamespaceLabels select the namespaces whose pods may scrape
	// etcd's metrics port; empty: none.
	MonitoringNamespaceLabels map[string]string
	// ManagementCIDRs are the management cluster's pod and Service ranges:
	// a control plane's egress there is refused but for DNS and its
	// DataStore.
	ManagementCIDRs []string
}

// linkLocal is never a tenant's destination: it holds the cloud metadata
// service (169.254.169.254; on AWS also fd00:ec2::254), whose answers are
// the management node's credentials, and a tenant's API server with
// konnectivity off connects to whatever address a Node of the tenant's
// names.
var linkLocal = []string{"169.254.0.0/16", "fe80::/10", "fd00:ec2::254/128"}

// ControlPlanePodLabels are on the control-plane pods of every tenant.
var ControlPlanePodLabels = map[string]string{LabelManagedBy: ManagedBy, LabelComponent: componentControlPlane}

// NetworkPolicyName names a tenant's (and a managed etcd's) policy.
func NetworkPolicyName(name string) string { return name + "-boundary" }

func tcpPort(p int32) *networkingv1ac.NetworkPolicyPortApplyConfiguration {
	return networkingv1ac.NetworkPolicyPort().WithProtocol(corev1.ProtocolTCP).WithPort(intstr.FromInt32(p))
}

func selector(m map[string]string) *metav1ac.LabelSelectorApplyConfiguration {
	return metav1ac.LabelSelector().WithMatchLabels(m)
}

// TenantNetworkPolicy confines a tenant's control-plane pods: they accept
// only the API and konnectivity-agent ports, and reach DNS, their
// DataStore's members (managed) or its client port (external), and
// addresses outside the management cluster's pod and Service ranges (the
// tenant's nodes, OIDC issuers). ds is the bound DataStore.
func TenantNetworkPolicy(tcp *apiary.TenantControlPlane, ds *apiary.DataStore, in PolicyInputs) *networkingv1ac.NetworkPolicyApplyConfiguration {
	dns := networkingv1ac.NetworkPolicyEgressRule().
		WithTo(networkingv1ac.NetworkPolicyPeer().
			WithNamespaceSelector(selector(map[string]string{corev1.LabelMetadataName: in.DNSNamespace})).
			WithPodSelector(selector(in.DNSPodLabels))).
		WithPorts(
			networkingv1ac.NetworkPolicyPort().WithProtocol(corev1.ProtocolUDP).WithPort(intstr.FromInt32(53)),
			tcpPort(53))
	egress := []*networkingv1ac.NetworkPolicyEgressRuleApplyConfiguration{dns}
	if ds != nil && ds.Spec.Managed != nil {
		egress = append(egress, networkingv1ac.NetworkPolicyEgressRule().
			WithTo(networkingv1ac.NetworkPolicyPeer().
				WithNamespaceSelector(selector(map[string]string{corev1.LabelMetadataName: ds.Spec.Managed.Namespace})).
				WithPodSelector(selector(managedetcd.Selector(ds)))).
			WithPorts(tcpPort(managedetcd.ClientPort)))
	}
	outside := networkingv1ac.NetworkPolicyEgressRule()
	for _, cidr := range []string{"0.0.0.0/0", "::/0"} {
		block := networkingv1ac.IPBlock().WithCIDR(cidr)
		for _, m := range append(slices.Clone(linkLocal), in.ManagementCIDRs...) {
			if isIPv6(m) == isIPv6(cidr) {
				block.WithExcept(m)
			}
		}
		outside.WithTo(networkingv1ac.NetworkPolicyPeer().WithIPBlock(block))
	}
	egress = append(egress, outside)
	return networkingv1ac.NetworkPolicy(NetworkPolicyName(tcp.Name), tcp.Namespace).
		WithLabels(Labels(tcp)).
		WithOwnerReferences(OwnerReference(tcp)).
		WithSpec(networkingv1ac.NetworkPolicySpec().
			WithPodSelector(selector(SelectorLabels(tcp))).
			WithPolicyTypes("Ingress", "Egress").
			WithIngress(networkingv1ac.NetworkPolicyIngressRule().
				WithPorts(tcpPort(tcp.Spec.Network.Port), tcpPort(konnectivity.AgentPort))).
			WithEgress(egress...))
}

// EtcdNetworkPolicy confines a managed etcd's members: the client port
// only from control-plane pods (each confined to its prefix by etcd's own
// auth) and the operator, the peer port only from the other members, the
// metrics port only from monitoring namespaces. It stays beside
// TenantNetworkPolicy, whose egress it mirrors: the two are one boundary.
//
// hostSources are the addresses (CIDRs) of the tenants' registered
// control-plane hosts, admitted to the client port when the DataStore is
// exposed to hosts (spec.hostAccess); nothing else from outside the
// management cluster is.
func EtcdNetworkPolicy(ds *apiary.DataStore, in PolicyInputs, hostSources []string) *networkingv1ac.NetworkPolicyApplyConfiguration {
	ingress := []*networkingv1ac.NetworkPolicyIngressRuleApplyConfiguration{
		networkingv1ac.NetworkPolicyIngressRule().
			WithFrom(
				networkingv1ac.NetworkPolicyPeer().
					WithNamespaceSelector(metav1ac.LabelSelector()).
					WithPodSelector(selector(ControlPlanePodLabels)),
				networkingv1ac.NetworkPolicyPeer().
					WithNamespaceSelector(selector(map[string]string{corev1.LabelMetadataName: in.OperatorNamespace})).
					WithPodSelector(selector(in.OperatorPodLabels))).
			WithPorts(tcpPort(managedetcd.ClientPort)),
		networkingv1ac.NetworkPolicyIngressRule().
			WithFrom(networkingv1ac.NetworkPolicyPeer().WithPodSelector(selector(managedetcd.Selector(ds)))).
			WithPorts(tcpPort(managedetcd.PeerPort)),
	}
	if len(in.MonitoringNamespaceLabels) > 0 {
		ingress = append(ingress, networkingv1ac.NetworkPolicyIngressRule().
			WithFrom(networkingv1ac.NetworkPolicyPeer().WithNamespaceSelector(selector(in.MonitoringNamespaceLabels))).
			WithPorts(tcpPort(managedetcd.MetricsPort)))
	}
	if ds.Spec.HostAccess != nil && len(hostSources) > 0 {
		var from []*networkingv1ac.NetworkPolicyPeerApplyConfiguration
		for _, cidr := range hostSources {
			from = append(from, networkingv1ac.NetworkPolicyPeer().WithIPBlock(networkingv1ac.IPBlock().WithCIDR(cidr)))
		}
		ingress = append(ingress, networkingv1ac.NetworkPolicyIngressRule().WithFrom(from...).WithPorts(tcpPort(managedetcd.ClientPort)))
	}
	return networkingv1ac.NetworkPolicy(NetworkPolicyName(managedetcd.Name(ds)), ds.Spec.Managed.Namespace).
		WithLabels(managedetcd.Labels(ds)).
		WithOwnerReferences(managedetcd.OwnerReference(ds)).
		WithSpec(networkingv1ac.NetworkPolicySpec().
			WithPodSelector(selector(managedetcd.Selector(ds))).
			WithPolicyTypes("Ingress").
			WithIngress(ingress...))
}

func isIPv6(cidr string) bool { return strings.Contains(cidr, ":") }
