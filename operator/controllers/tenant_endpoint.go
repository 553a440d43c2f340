package controllers

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/operator/render"
)

// reconcileEndpoint applies the tenant Service and sets EndpointReady from
// the address it got. Without one (ok false) what needs the endpoint waits.
func (r *TenantControlPlaneReconciler) reconcileEndpoint(ctx context.Context, tcp *apiary.TenantControlPlane) (ep render.Endpoint, ok bool, err error) {
	st := &tcp.Status
	svc := render.Service(tcp)
	if err := r.Client.Apply(ctx, svc, client.FieldOwner(FieldOwner), client.ForceOwnership); err != nil {
		return ep, false, fmt.Errorf("applying Service: %w", err)
	}
	ep, why, err := r.observeEndpoint(ctx, tcp, svc)
	if err != nil {
		return ep, false, err
	}
	if why != "" {
		st.Endpoint = ""
		r.setCondition(tcp, apiary.ConditionEndpointReady, metav1.ConditionFalse, ReasonWaitingForAddress, why)
		r.waiting(tcp, "the tenant endpoint has no address yet", apiary.ConditionCertificatesReady, apiary.ConditionControlPlaneAvailable, apiary.ConditionReady)
		return ep, false, nil
	}
	st.Endpoint = ep.URL()
	r.setCondition(tcp, apiary.ConditionEndpointReady, metav1.ConditionTrue, ReasonAddressAssigned, "the tenant API is exposed at "+st.Endpoint)
	return ep, true, nil
}

// observeEndpoint reads the address the Service actually got. It returns why
// there is none yet.
func (r *TenantControlPlaneReconciler) observeEndpoint(ctx context.Context, tcp *apiary.TenantControlPlane, svc *corev1ac.ServiceApplyConfiguration) (render.Endpoint, string, error) {
	n := tcp.Spec.Network
	ep := render.Endpoint{Port: n.Port}
	if svc.Spec != nil && svc.Spec.ClusterIP != nil && *svc.Spec.ClusterIP != corev1.ClusterIPNone {
		ep.ClusterIP = *svc.Spec.ClusterIP
	}
	switch n.ServiceType {
	case corev1.ServiceTypeLoadBalancer:
		if svc.Status != nil && svc.Status.LoadBalancer != nil {
			for _, in := range svc.Status.LoadBalancer.Ingress {
				if in.IP != nil && *in.IP != "" {
					ep.Host = *in.IP
					return ep, "", nil
				}
				if in.Hostname != nil && *in.Hostname != "" {
					ep.Host = *in.Hostname
					return ep, "", nil
				}
			}
		}
		return ep, fmt.Sprintf("Service %s/%s of type LoadBalancer has no address yet", tcp.Namespace, render.ServiceName(tcp)), nil
	case corev1.ServiceTypeNodePort:
		// The Service also carries the konnectivity port: take the NodePort
		// of the API's own port, not the last one allocated.
		allocated := false
		for _, p := range svc.Spec.Ports {
			if p.Port != nil && *p.Port == n.Port && p.NodePort != nil && *p.NodePort != 0 {
				ep.Port, allocated = *p.NodePort, true
			}
		}
		if !allocated {
			return ep, "the NodePort has not been allocated yet", nil
		}
		ep.Host = n.Address
		if ep.Host == "" {
			addr, err := r.nodeAddress(ctx)
			if err != nil {
				return ep, "", err
			}
			if addr == "" {
				return ep, "no Node has an InternalIP to reach the NodePort at; set spec.network.address", nil
			}
			ep.Host = addr
		}
		return ep, "", nil
	default:
		if ep.ClusterIP == "" {
			return ep, "the Service has no ClusterIP yet", nil
		}
		ep.Host = ep.ClusterIP
		return ep, "", nil
	}
}

func (r *TenantControlPlaneReconciler) nodeAddress(ctx context.Context) (string, error) {
	var nodes corev1.NodeList
	if err := r.APIReader.List(ctx, &nodes, &client.ListOptions{LabelSelector: labels.Everything(), Limit: 20}); err != nil {
		return "", fmt.Errorf("listing Nodes for the NodePort address: %w", err)
	}
	for _, node := range nodes.Items {
		for _, a := range node.Status.Addresses {
			if a.Type == corev1.NodeInternalIP {
				return a.Address, nil
			}
		}
	}
	return "", nil
}
