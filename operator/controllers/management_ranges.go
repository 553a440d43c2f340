package controllers

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/operator/render"
)

// Reasons of NetworkIsolated.
const (
	ReasonPolicyApplied        = "PolicyApplied"
	ReasonPodRangesUnknown     = "PodRangesUnknown"
	ReasonNetworkPoliciesOff   = "NetworkPoliciesOff"
	ReasonManagementRangesFlag = "PolicyAppliedWithGivenRanges"
)

// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch
// +kubebuilder:rbac:groups=networking.k8s.io,resources=servicecidrs,verbs=get;list;watch

// managementRanges are the management cluster's own addresses, which a
// tenant's control plane must not connect to (but for DNS and its
// DataStore, which its policy allows by name): the Service ranges
// (ServiceCIDR objects), every node's pod range (spec.podCIDRs) and every
// node's addresses, sorted. podRanges says whether any node records a pod
// range: with a CNI that allocates pod addresses itself, they are unknown
// and must be given with --management-cidrs.
func managementRanges(ctx context.Context, c client.Reader) (cidrs []string, podRanges bool, err error) {
	var services networkingv1.ServiceCIDRList
	if err := c.List(ctx, &services); err != nil {
		return nil, false, fmt.Errorf("listing ServiceCIDRs: %w", err)
	}
	var nodes corev1.NodeList
	if err := c.List(ctx, &nodes); err != nil {
		return nil, false, fmt.Errorf("listing Nodes: %w", err)
	}
	seen := map[string]bool{}
	add := func(s string) {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			a, aerr := netip.ParseAddr(s)
			if aerr != nil {
				return
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		seen[p.Masked().String()] = true
	}
	for _, sc := range services.Items {
		for _, cidr := range sc.Spec.CIDRs {
			add(cidr)
		}
	}
	for _, n := range nodes.Items {
		for _, cidr := range n.Spec.PodCIDRs {
			add(cidr)
			podRanges = true
		}
		if n.Spec.PodCIDR != "" {
			add(n.Spec.PodCIDR)
			podRanges = true
		}
		for _, a := range n.Status.Addresses {
			if a.Type == corev1.NodeInternalIP || a.Type == corev1.NodeExternalIP {
				add(a.Address)
			}
		}
	}
	for cidr := range seen {
		cidrs = append(cidrs, cidr)
	}
	slices.Sort(cidrs)
	return cidrs, podRanges, nil
}

// isolationCondition says what the tenant's NetworkPolicy keeps its control
// plane away from.
func isolationCondition(given bool, cidrs []string, podRanges bool) (status bool, reason, msg string) {
	list := strings.Join(cidrs, ", ")
	switch {
	case given:
		return true, ReasonManagementRangesFlag, "the control plane's egress to the management cluster is refused but for DNS and its DataStore: " + list + " (--management-cidrs)"
	case !podRanges:
		return false, ReasonPodRangesUnknown, "no Node of the management cluster records its pod range (spec.podCIDRs), so the tenant's NetworkPolicy cannot keep its control plane from other pods: give the operator --management-cidrs (chart value networkPolicy.managementCIDRs); refused now: " + list
	default:
		return true, ReasonPolicyApplied, "the control plane's egress to the management cluster is refused but for DNS and its DataStore: " + list + " (found on its Nodes and ServiceCIDRs)"
	}
}

// nodeRangesChanged passes Node events that change what managementRanges
// reads: not the frequent status updates.
func nodeRangesChanged() predicate.Predicate {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		o, okOld := e.ObjectOld.(*corev1.Node)
		n, okNew := e.ObjectNew.(*corev1.Node)
		if !okOld || !okNew {
			return true
		}
		return o.Spec.PodCIDR != n.Spec.PodCIDR || !slices.Equal(o.Spec.PodCIDRs, n.Spec.PodCIDRs) ||
			!slices.Equal(o.Status.Addresses, n.Status.Addresses)
	}}
}

// allTenants enqueues every tenant (the management cluster's ranges
// changed).
func (r *TenantControlPlaneReconciler) allTenants(ctx context.Context, _ client.Object) []reconcile.Request {
	if r.NetworkPolicy == nil || len(r.NetworkPolicy.ManagementCIDRs) > 0 {
		return nil
	}
	var list apiary.TenantControlPlaneList
	if err := r.Client.List(ctx, &list); err != nil {
		log.FromContext(ctx).Error(err, "listing tenants")
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(list.Items))
	for _, t := range list.Items {
		reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&t)})
	}
	return reqs
}

// applyNetworkPolicy confines the tenant's control-plane pods, excluding
// the management cluster's ranges (given by flag, else found on its Nodes
// and ServiceCIDRs), and says so in NetworkIsolated.
func (r *TenantControlPlaneReconciler) applyNetworkPolicy(ctx context.Context, tcp *apiary.TenantControlPlane, ds *apiary.DataStore) error {
	if r.NetworkPolicy == nil {
		r.setCondition(tcp, apiary.ConditionNetworkIsolated, metav1.ConditionFalse, ReasonNetworkPoliciesOff,
			"the operator applies no NetworkPolicies (--network-policies=false): the tenant's control plane may connect to anything the cluster's own policies allow")
		return nil
	}
	in := *r.NetworkPolicy
	given := len(in.ManagementCIDRs) > 0
	podRanges := true
	if !given {
		var err error
		if in.ManagementCIDRs, podRanges, err = managementRanges(ctx, r.Client); err != nil {
			return err
		}
	}
	if err := r.Client.Apply(ctx, render.TenantNetworkPolicy(tcp, ds, in), client.FieldOwner(FieldOwner), client.ForceOwnership); err != nil {
		return fmt.Errorf("applying NetworkPolicy: %w", err)
	}
	ok, reason, msg := isolationCondition(given, in.ManagementCIDRs, podRanges)
	status := metav1.ConditionTrue
	if !ok {
		status = metav1.ConditionFalse
	}
	r.setCondition(tcp, apiary.ConditionNetworkIsolated, status, reason, msg)
	return nil
}
