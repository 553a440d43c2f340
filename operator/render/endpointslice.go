package render

import (
	"net"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	discoveryv1ac "k8s.io/client-go/applyconfigurations/discovery/v1"

	"github.com/apiaryhq/apiary/konnectivity"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

// In registered mode, and while a switch hands the tenant's address from
// pods to hosts or back, the hosts serving the tenant's control plane are
// listed in an EndpointSlice the operator owns (ports on the hosts'
// network). kube-proxy merges it with the endpoint slice controller's
// slice of the hosted pods, which leaves a slice of another manager alone.
const (
	// EndpointSliceManager is the value of endpointslice.kubernetes.io/managed-by
	// on the operator's slices.
	EndpointSliceManager = "operator.apiary.dev"
)

// Backend is one address behind the tenant Service.
type Backend struct {
	// Address is an IP.
	Address string
	// Ready: it answered /readyz (a host) or is a ready pod.
	Ready bool
	// AgentsReady: its konnectivity-server takes agents. A host's is
	// sent agents before its kube-apiserver gets clients, so that the
	// API server has agents to reach the Nodes through once it serves
	// (else logs, exec and port-forward through it fail with "No agent
	// available" until the agents find the new server).
	AgentsReady bool
	// Hostname names it in the slice (the Host, or the pod).
	Hostname string
}

// EndpointSliceName is the name of the operator's slice of an IP family
// for the API server port.
func EndpointSliceName(tcp *apiary.TenantControlPlane, family discoveryv1.AddressType) string {
	return tcp.Name + "-apiary-" + strings.ToLower(string(family))
}

// AgentEndpointSliceName is the name of the operator's slice of an IP
// family for the konnectivity agent port.
func AgentEndpointSliceName(tcp *apiary.TenantControlPlane, family discoveryv1.AddressType) string {
	return EndpointSliceName(tcp, family) + "-agents"
}

// EndpointSlices list the backends of the tenant Service, per IP family
// that has any, one slice for the API server port and (konnectivity on)
// one for the agent port, each sorted by address so that the same
// backends always render the same slices. Ports are the Service's, by
// name.
func EndpointSlices(tcp *apiary.TenantControlPlane, backends []Backend) []*discoveryv1ac.EndpointSliceApplyConfiguration {
	byFamily := map[discoveryv1.AddressType][]Backend{}
	for _, b := range backends {
		ip := net.ParseIP(b.Address)
		if ip == nil {
			continue
		}
		family := discoveryv1.AddressTypeIPv4
		if ip.To4() == nil {
			family = discoveryv1.AddressTypeIPv6
		}
		byFamily[family] = append(byFamily[family], b)
	}
	var out []*discoveryv1ac.EndpointSliceApplyConfiguration
	for _, family := range []discoveryv1.AddressType{discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6} {
		bs := byFamily[family]
		if len(bs) == 0 {
			continue
		}
		slices.SortFunc(bs, func(a, b Backend) int { return strings.Compare(a.Address, b.Address) })
		out = append(out, endpointSlice(tcp, EndpointSliceName(tcp, family), family, bs,
			discoveryv1ac.EndpointPort().WithName("https").WithProtocol(corev1.ProtocolTCP).WithPort(tcp.Spec.Network.Port),
			func(b Backend) bool { return b.Ready }))
		if KonnectivityEnabled(tcp) {
			out = append(out, endpointSlice(tcp, AgentEndpointSliceName(tcp, family), family, bs,
				discoveryv1ac.EndpointPort().WithName(konnectivity.AgentPortName).WithProtocol(corev1.ProtocolTCP).WithPort(konnectivity.AgentPort),
				func(b Backend) bool { return b.Ready || b.AgentsReady }))
		}
	}
	return out
}

// endpointSlice is one of the operator's slices: backends bs on port,
// ready as ready says.
func endpointSlice(tcp *apiary.TenantControlPlane, name string, family discoveryv1.AddressType, bs []Backend,
	port *discoveryv1ac.EndpointPortApplyConfiguration, ready func(Backend) bool) *discoveryv1ac.EndpointSliceApplyConfiguration {
	labels := Labels(tcp)
	labels[discoveryv1.LabelServiceName] = ServiceName(tcp)
	labels[discoveryv1.LabelManagedBy] = EndpointSliceManager
	slice := discoveryv1ac.EndpointSlice(name, tcp.Namespace).
		WithLabels(labels).
		WithOwnerReferences(OwnerReference(tcp)).
		WithAddressType(family).
		WithPorts(port)
	for _, b := range bs {
		slice.WithEndpoints(discoveryv1ac.Endpoint().
			WithAddresses(b.Address).
			WithHostname(b.Hostname).
			WithConditions(discoveryv1ac.EndpointConditions().
				WithReady(ready(b)).
				// A backend that stops answering is not ready and not
				// serving: kube-proxy sends it nothing new.
				WithServing(ready(b)).
				WithTerminating(false)))
	}
	return slice
}
