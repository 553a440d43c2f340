package render

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"

	"github.com/apiaryhq/apiary/konnectivity"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/operator/render/conventions"
)

// AnnotationMetalLBIPs asks MetalLB for specific LoadBalancer addresses;
// spec.loadBalancerIP is deprecated upstream.
const AnnotationMetalLBIPs = conventions.AnnotationMetalLBIPs

// Service exposes the tenant API.
func Service(tcp *apiary.TenantControlPlane) *corev1ac.ServiceApplyConfiguration {
	n := tcp.Spec.Network
	spec := corev1ac.ServiceSpec().
		WithType(n.ServiceType).
		WithSelector(SelectorLabels(tcp)).
		WithPorts(corev1ac.ServicePort().
			WithName("https").
			WithProtocol(corev1.ProtocolTCP).
			WithPort(n.Port).
			WithTargetPort(intstr.FromString("https")))
	if KonnectivityEnabled(tcp) {
		spec.WithPorts(konnectivity.ServicePort())
	}
	svc := corev1ac.Service(ServiceName(tcp), tcp.Namespace).
		WithLabels(Labels(tcp)).
		WithOwnerReferences(OwnerReference(tcp))
	if n.Address != "" {
		switch n.ServiceType {
		case corev1.ServiceTypeLoadBalancer:
			svc.WithAnnotations(map[string]string{AnnotationMetalLBIPs: n.Address})
		case corev1.ServiceTypeClusterIP:
			spec.WithClusterIP(n.Address)
		}
	}
	return svc.WithSpec(spec)
}
