package live

import (
	"encoding/json"
	"net/http"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

// Detail is what the tenant page shows of a TenantControlPlane: the
// overview's row and what the operator recorded of its parts.
type Detail struct {
	Tenant
	Created           time.Time                       `json:"created"`
	FirstReady        *metav1.Time                    `json:"firstReady,omitempty"`
	DesiredReplicas   *int32                          `json:"desiredReplicas,omitempty"`
	DesiredMode       string                          `json:"desiredMode,omitempty"`
	KubeconfigSecret  string                          `json:"kubeconfigSecret,omitempty"`
	DataStore         apiary.DataStoreBinding         `json:"dataStore"`
	Certificates      []apiary.CertificateStatus      `json:"certificates,omitempty"`
	ModeSwitch        *apiary.ModeSwitchStatus        `json:"modeSwitch,omitempty"`
	CARotation        *apiary.CARotation              `json:"caRotation,omitempty"`
	ControlPlaneHosts []apiary.ControlPlaneHostStatus `json:"controlPlaneHosts,omitempty"`
}

// DetailOf is the tenant page's view of tcp.
func DetailOf(tcp *apiary.TenantControlPlane) Detail {
	return Detail{
		Tenant:  TenantOf(tcp),
		Created: tcp.CreationTimestamp.Time, FirstReady: tcp.Status.FirstReady,
		DesiredReplicas: tcp.Spec.Replicas, DesiredMode: string(tcp.Spec.Mode),
		KubeconfigSecret: tcp.Status.KubeconfigSecret, DataStore: tcp.Status.DataStore,
		Certificates: tcp.Status.Certificates, ModeSwitch: tcp.Status.ModeSwitch,
		CARotation: tcp.Status.CARotation, ControlPlaneHosts: tcp.Status.ControlPlaneHosts,
	}
}

// Host is what the tenant page shows of one of its Hosts.
type Host struct {
	Namespace   string            `json:"namespace"`
	Name        string            `json:"name"`
	Tenant      string            `json:"tenant"`
	Address     string            `json:"address"`
	Role        string            `json:"role,omitempty"`
	Phase       string            `json:"phase,omitempty"`
	Version     string            `json:"version,omitempty"`
	UpgradingTo string            `json:"upgradingTo,omitempty"`
	NodeName    string            `json:"nodeName,omitempty"`
	Conditions  []Condition       `json:"conditions,omitempty"`
	Journal     []apiary.HostStep `json:"journal,omitempty"`
}

// HostOf is the tenant page's view of h.
func HostOf(h *apiary.Host) Host {
	v := Host{Namespace: h.Namespace, Name: h.Name, Tenant: h.Spec.TenantControlPlane, Address: h.Spec.Address, Role: string(h.Spec.Role), Phase: string(h.Status.Phase),
		Version: h.Status.Version, UpgradingTo: h.Status.UpgradingTo, NodeName: h.Status.NodeName, Journal: h.Status.Journal,
		Conditions: conditionsOf(h.Status.Conditions)}
	return v
}

// Event is one of the tenant's recent events.
type Event struct {
	UID     string    `json:"uid"`
	Type    string    `json:"type"`
	Reason  string    `json:"reason"`
	Message string    `json:"message"`
	Count   int32     `json:"count,omitempty"`
	Last    time.Time `json:"last"`
}

// EventOf is the tenant page's view of e.
func EventOf(e *corev1.Event) Event {
	last := e.LastTimestamp.Time
	if last.IsZero() {
		last = e.EventTime.Time
	}
	if last.IsZero() {
		last = e.CreationTimestamp.Time
	}
	return Event{UID: string(e.UID), Type: e.Type, Reason: e.Reason, Message: e.Message, Count: e.Count, Last: last}
}

// Event names of a tenant's stream, besides EventTenant, EventDeleted and
// EventError.
const (
	EventHost        = "host"
	EventHostDeleted = "host-deleted"
	EventEvent       = "event"
	// EventUnavailable says a part of the page cannot be shown, and why
	// (the user may read the tenant but not its Hosts or events).
	EventUnavailable = "unavailable"
)

// TenantStream serves one tenant as server-sent events: the tenant
// (EventTenant, with its Detail), its Hosts and its events, each from a
// watch made as the user. Without the right to watch the tenant the
// answer is 403; without the right to watch Hosts or events, the stream
// says so in an EventUnavailable and carries the rest.
func TenantStream(w http.ResponseWriter, r *http.Request, c Watcher, namespace, name string) {
	ctx := r.Context()
	tw, err := c.Watch(ctx, &apiary.TenantControlPlaneList{}, client.InNamespace(namespace),
		client.MatchingFieldsSelector{Selector: fields.OneTermEqualSelector("metadata.name", name)})
	if err != nil {
		refuse(w, "watching TenantControlPlane "+namespace+"/"+name, err)
		return
	}
	sources := []source{{tw, encodeDetail}}
	var first []message
	if hw, err := c.Watch(ctx, &apiary.HostList{}, client.InNamespace(namespace)); err != nil {
		first = append(first, unavailable("hosts", err))
	} else {
		sources = append(sources, source{hw, hostsOf(name)})
	}
	if ew, err := c.Watch(ctx, &corev1.EventList{}, client.InNamespace(namespace),
		client.MatchingFieldsSelector{Selector: fields.SelectorFromSet(fields.Set{"involvedObject.name": name, "involvedObject.kind": "TenantControlPlane"})}); err != nil {
		first = append(first, unavailable("events", err))
	} else {
		sources = append(sources, source{ew, encodeEvent})
	}
	serve(w, r, first, sources...)
}

func encodeDetail(ev watch.Event) (string, []byte, bool) {
	if tcp, ok := ev.Object.(*apiary.TenantControlPlane); ok && (ev.Type == watch.Added || ev.Type == watch.Modified) {
		data, _ := json.Marshal(DetailOf(tcp))
		return EventTenant, data, false
	}
	return encode(ev)
}

// hostsOf keeps the Hosts of one tenant (every Host when empty).
func hostsOf(tenant string) func(watch.Event) (string, []byte, bool) {
	return func(ev watch.Event) (string, []byte, bool) {
		h, ok := ev.Object.(*apiary.Host)
		switch {
		case ev.Type == watch.Error:
			return encode(ev)
		case !ok || (tenant != "" && h.Spec.TenantControlPlane != tenant) || !slices.Contains([]watch.EventType{watch.Added, watch.Modified, watch.Deleted}, ev.Type):
			return "", nil, false
		}
		data, _ := json.Marshal(HostOf(h))
		if ev.Type == watch.Deleted {
			return EventHostDeleted, data, false
		}
		return EventHost, data, false
	}
}

func encodeEvent(ev watch.Event) (string, []byte, bool) {
	e, ok := ev.Object.(*corev1.Event)
	switch {
	case ev.Type == watch.Error:
		return encode(ev)
	case !ok || (ev.Type != watch.Added && ev.Type != watch.Modified):
		return "", nil, false
	}
	data, _ := json.Marshal(EventOf(e))
	return EventEvent, data, false
}
