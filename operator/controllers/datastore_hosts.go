package controllers

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/operator/render/managedetcd"
)

// Reasons of HostAccessReady.
const (
	ReasonHostAccessReady    = "Exposed"
	ReasonHostAccessDeclared = "Declared"
)

// +kubebuilder:rbac:groups=apiary.dev,resources=hosts,verbs=get;list;watch

// hostAccess is what a managed etcd's exposure to hosts observed.
type hostAccess struct {
	// ips are the addresses of the host Service, which the serving
	// certificate must name.
	ips []net.IP
	// sources are the control-plane hosts the NetworkPolicy admits to the
	// client port (CIDRs).
	sources []string
}

// reconcileHostAccess exposes a managed etcd's client port to tenants'
// control-plane hosts (spec.hostAccess), or removes the exposure.
func (r *DataStoreReconciler) reconcileHostAccess(ctx context.Context, ds *apiary.DataStore) (hostAccess, error) {
	var ha hostAccess
	if ds.Spec.HostAccess == nil {
		ds.Status.HostEndpoints = nil
		meta.RemoveStatusCondition(&ds.Status.Conditions, apiary.ConditionHostAccessReady)
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ds.Spec.Managed.Namespace, Name: managedetcd.HostServiceName(ds)}}
		// From the cache (the operator's Services are cached): no request
		// to the API server on every reconcile of a DataStore without it.
		return ha, deleteOwnedBy(ctx, r.Client, r.Client, ds.UID, svc)
	}
	svc := managedetcd.HostService(ds)
	if err := r.Client.Apply(ctx, svc, client.FieldOwner(FieldOwner), client.ForceOwnership); err != nil {
		return ha, fmt.Errorf("applying Service %s: %w", managedetcd.HostServiceName(ds), err)
	}
	// The addresses the load balancer gave, and one asked for: the
	// certificate names it before it is assigned, so that no member
	// restarts when it is.
	var endpoints []string
	if svc.Status != nil && svc.Status.LoadBalancer != nil {
		for _, in := range svc.Status.LoadBalancer.Ingress {
			if ip := net.ParseIP(deref(in.IP)); ip != nil {
				ha.ips = append(ha.ips, ip)
				endpoints = append(endpoints, "https://"+net.JoinHostPort(ip.String(), fmt.Sprint(managedetcd.ClientPort)))
			}
		}
	}
	if a := net.ParseIP(ds.Spec.HostAccess.Address); a != nil && !slices.ContainsFunc(ha.ips, a.Equal) {
		ha.ips = append(ha.ips, a)
	}
	sources, err := r.controlPlaneHostSources(ctx, ds)
	if err != nil {
		return ha, err
	}
	ha.sources = sources
	ds.Status.HostEndpoints = endpoints
	if len(endpoints) == 0 {
		r.set(ds, apiary.ConditionHostAccessReady, metav1.ConditionFalse, ReasonWaitingForAddress,
			fmt.Sprintf("Service %s/%s of type LoadBalancer has no IP address yet", ds.Spec.Managed.Namespace, managedetcd.HostServiceName(ds)))
		return ha, nil
	}
	r.set(ds, apiary.ConditionHostAccessReady, metav1.ConditionTrue, ReasonHostAccessReady,
		fmt.Sprintf("control-plane hosts reach the client port at %s; its NetworkPolicy admits %d of them (%s)",
			strings.Join(ds.Status.HostEndpoints, ","), len(sources), strings.Join(sources, ",")))
	return ha, nil
}

// externalHostAccess records where hosts reach an external DataStore: its
// own endpoints, or those spec.hostAccess names. Reachability from the
// hosts themselves is what a mode switch checks, host by host.
func (r *DataStoreReconciler) externalHostAccess(ds *apiary.DataStore) {
	if ds.Spec.HostAccess == nil {
		ds.Status.HostEndpoints = nil
		meta.RemoveStatusCondition(&ds.Status.Conditions, apiary.ConditionHostAccessReady)
		return
	}
	ds.Status.HostEndpoints = slices.Clone(ds.Spec.Endpoints)
	if len(ds.Spec.HostAccess.Endpoints) > 0 {
		ds.Status.HostEndpoints = slices.Clone(ds.Spec.HostAccess.Endpoints)
	}
	r.set(ds, apiary.ConditionHostAccessReady, metav1.ConditionTrue, ReasonHostAccessDeclared,
		"control-plane hosts dial "+strings.Join(ds.Status.HostEndpoints, ","))
}

// controlPlaneHostSources are the addresses of the control-plane Hosts of
// the tenants bound to ds, as /32 or /128 CIDRs, sorted. Only installed
// Hosts count (the agent reached that address with the pinned key and
// installed the node software there; spec.address is immutable), so that
// writing a Host object naming any address (a management pod's, another
// machine's) does not open the client port to it. Installed, not joined:
// a control-plane Host of a standalone tenant is not joined (Standby), and
// the switch's preflight checks the DataStore from it before it joins;
// and a registered host whose Node goes NotReady must keep its datastore. A Host addressed by DNS name is left out (the NetworkPolicy takes
// addresses only), and so is one whose tenant is not bound here.
func (r *DataStoreReconciler) controlPlaneHostSources(ctx context.Context, ds *apiary.DataStore) ([]string, error) {
	var hosts apiary.HostList
	if err := r.Client.List(ctx, &hosts); err != nil {
		return nil, fmt.Errorf("listing Hosts: %w", err)
	}
	var out []string
	for _, h := range hosts.Items {
		if !admittedControlPlane(&h) ||
			!slices.Contains(ds.Status.UsedBy, h.Namespace+"/"+h.Spec.TenantControlPlane) {
			continue
		}
		ip := net.ParseIP(h.Spec.Address)
		if ip == nil {
			continue
		}
		bits := 32
		if ip.To4() == nil {
			bits = 128
		}
		out = append(out, fmt.Sprintf("%s/%d", ip, bits))
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// dataStoreOfHost maps a Host to its tenant's DataStore, whose
// NetworkPolicy admits the tenant's joined control-plane Hosts.
func (r *DataStoreReconciler) dataStoreOfHost(ctx context.Context, o client.Object) []reconcile.Request {
	h, ok := o.(*apiary.Host)
	if !ok {
		return nil
	}
	var tcp apiary.TenantControlPlane
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: h.Namespace, Name: h.Spec.TenantControlPlane}, &tcp); err != nil {
		return nil
	}
	if tcp.Status.DataStore.Name == "" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: client.ObjectKey{Name: tcp.Status.DataStore.Name}}}
}

// admittedControlPlane: a control-plane Host the agent installed, whose
// address its DataStore admits.
func admittedControlPlane(h *apiary.Host) bool {
	return h.Spec.Role == apiary.HostRoleControlPlane && h.DeletionTimestamp.IsZero() &&
		meta.IsStatusConditionTrue(h.Status.Conditions, apiary.HostConditionInstalled)
}

// hostChangesAdmission passes the Host changes that add it to or remove it
// from its DataStore's admitted sources: its role (both ways), its
// Installed condition, creation and deletion. Not the journal's
// many status writes while a host installs.
func hostChangesAdmission() predicate.Predicate {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		o, okOld := e.ObjectOld.(*apiary.Host)
		n, okNew := e.ObjectNew.(*apiary.Host)
		if !okOld || !okNew {
			return true
		}
		return admittedControlPlane(o) != admittedControlPlane(n) || !o.DeletionTimestamp.Equal(n.DeletionTimestamp)
	}}
}
