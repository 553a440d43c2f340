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
	// Hostname names it in the slice (the Host, or the pod).
	Hostname string
}

// EndpointSliceName is the name of the operator's slice of an IP family.
func EndpointSliceName(tcp *apiary.TenantControlPlane, family discoveryv1.AddressType) string {
	return tcp.Name + "-apiary-" + strings.ToLower(string(family))
}

// EndpointSlices list the backends of the tenant Service, one slice per IP
// family that has any (sorted by address, so that the same backends always
// render the same slice). The ports are those of the Service, by name.
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
		labels := Labels(tcp)
		labels[discoveryv1.LabelServiceName] = ServiceName(tcp)
		labels[discoveryv1.LabelManagedBy] = EndpointSliceManager
		slice := discoveryv1ac.EndpointSlice(EndpointSliceName(tcp, family), tcp.Namespace).
			WithLabels(labels).
			WithOwnerReferences(OwnerReference(tcp)).
			WithAddressType(family).
			WithPorts(discoveryv1ac.EndpointPort().WithName("https").WithProtocol(corev1.ProtocolTCP).WithPort(tcp.Spec.Network.Port))
		if KonnectivityEnabled(tcp) {
			slice.WithPorts(discoveryv1ac.EndpointPort().WithName(konnectivity.AgentPortName).WithProtocol(corev1.ProtocolTCP).WithPort(konnectivity.AgentPort))
		}
		for _, b := range bs {
			slice.WithEndpoints(discoveryv1ac.Endpoint().
				WithAddresses(b.Address).
				WithHostname(b.Hostname).
				WithConditions(discoveryv1ac.EndpointConditions().
					WithReady(b.Ready).
					// A backend that stops answering is not ready and
					// not serving: kube-proxy sends it nothing new.
					WithServing(b.Ready).
					WithTerminating(false)))
		}
		out = append(out, slice)
	}
	return out
}
