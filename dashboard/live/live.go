// Package live streams the tenants a user may watch to the dashboard's
// pages as server-sent events, from a watch of the API server made as the
// user: a change shows as soon as the API server sends it, with no
// polling, and RBAC decides what the stream carries.
package live

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

// Tenant is what a page shows of a TenantControlPlane.
type Tenant struct {
	Namespace      string      `json:"namespace"`
	Name           string      `json:"name"`
	Phase          string      `json:"phase,omitempty"`
	Mode           string      `json:"mode,omitempty"`
	Version        string      `json:"version,omitempty"`
	DesiredVersion string      `json:"desiredVersion,omitempty"`
	Endpoint       string      `json:"endpoint,omitempty"`
	Replicas       int32       `json:"replicas"`
	ReadyReplicas  int32       `json:"readyReplicas"`
	Conditions     []Condition `json:"conditions,omitempty"`
}

// Condition is one of a tenant's conditions.
type Condition struct {
	Type    string    `json:"type"`
	Status  string    `json:"status"`
	Reason  string    `json:"reason,omitempty"`
	Message string    `json:"message,omitempty"`
	Since   time.Time `json:"since"`
}

// TenantOf is the page's view of tcp.
func TenantOf(tcp *apiary.TenantControlPlane) Tenant {
	t := Tenant{
		Namespace: tcp.Namespace, Name: tcp.Name,
		Phase: string(tcp.Status.Phase), Mode: string(tcp.Status.Mode),
		Version: tcp.Status.Version, DesiredVersion: tcp.Spec.Version, Endpoint: tcp.Status.Endpoint,
		Replicas: tcp.Status.Replicas, ReadyReplicas: tcp.Status.ReadyReplicas,
	}
	t.Conditions = conditionsOf(tcp.Status.Conditions)
	return t
}

// conditionsOf is the pages' view of an object's conditions.
func conditionsOf(conds []metav1.Condition) []Condition {
	var out []Condition
	for _, c := range conds {
		out = append(out, Condition{Type: c.Type, Status: string(c.Status), Reason: c.Reason, Message: c.Message, Since: c.LastTransitionTime.Time})
	}
	return out
}

// Event names on the stream.
const (
	EventTenant  = "tenant"
	EventDeleted = "tenant-deleted"
	EventError   = "error"
)

// keepAlive is how often an idle stream sends a comment, so that proxies
// do not close it.
const keepAlive = 25 * time.Second

// Watcher is what Stream needs of a client: a watch made as the user.
type Watcher interface {
	Watch(ctx context.Context, list client.ObjectList, opts ...client.ListOption) (watch.Interface, error)
}

// Stream serves the tenants of namespace (every namespace when empty) as
// server-sent events until the client goes or the watch ends (the
// browser's EventSource then reconnects). The watch starts with an event
// per existing tenant. A watch the user may not make is answered 403
// before the stream starts.
func Stream(w http.ResponseWriter, r *http.Request, c Watcher, namespace string) {
	wi, err := c.Watch(r.Context(), &apiary.TenantControlPlaneList{}, client.InNamespace(namespace))
	if err != nil {
		refuse(w, "watching TenantControlPlanes", err)
		return
	}
	serve(w, r, nil, source{wi, encode})
}

// refuse answers a watch that could not start: 403 when RBAC said no.
func refuse(w http.ResponseWriter, what string, err error) {
	code := http.StatusBadGateway
	if apierrors.IsForbidden(err) {
		code = http.StatusForbidden
	}
	http.Error(w, fmt.Sprintf("%s: %v", what, err), code)
}

// source is one watch of a stream and how its events are written.
type source struct {
	watch  watch.Interface
	encode func(watch.Event) (name string, data []byte, last bool)
}

type message struct {
	name string
	data []byte
	last bool
}

// serve streams first, then the sources' events, merged, until the
// client goes or a source's watch ends.
func serve(w http.ResponseWriter, r *http.Request, first []message, sources ...source) {
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	for _, s := range sources {
		defer s.watch.Stop()
	}
	flusher, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	merged := make(chan message)
	for _, s := range sources {
		go func() {
			for ev := range s.watch.ResultChan() {
				m := message{}
				m.name, m.data, m.last = s.encode(ev)
				if m.name == "" {
					continue
				}
				select {
				case merged <- m:
				case <-ctx.Done():
					return
				}
				if m.last {
					return
				}
			}
			select { // the watch closed: the stream ends, the browser reconnects
			case merged <- message{last: true}:
			case <-ctx.Done():
			}
		}()
	}
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	for _, m := range first {
		if _, err := fmt.Fprintf(w, "event: %s\ndata: %s\n\n", m.name, m.data); err != nil {
			return
		}
	}
	flusher.Flush()
	tick := time.NewTicker(keepAlive)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			if _, err := fmt.Fprint(w, ": keep-alive\n\n"); err != nil {
				return
			}
			flusher.Flush()
		case m := <-merged:
			if m.name != "" {
				if _, err := fmt.Fprintf(w, "event: %s\ndata: %s\n\n", m.name, m.data); err != nil {
					return
				}
				flusher.Flush()
			}
			if m.last {
				return
			}
		}
	}
}

// encode turns a watch event into a stream event; last is true when the
// watch cannot go on.
func encode(ev watch.Event) (name string, data []byte, last bool) {
	switch ev.Type {
	case watch.Added, watch.Modified, watch.Deleted:
		tcp, ok := ev.Object.(*apiary.TenantControlPlane)
		if !ok {
			return "", nil, false
		}
		name = EventTenant
		if ev.Type == watch.Deleted {
			name = EventDeleted
		}
		data, _ = json.Marshal(TenantOf(tcp))
		return name, data, false
	case watch.Error:
		msg := "the watch ended"
		if st, ok := ev.Object.(*metav1.Status); ok && st.Message != "" {
			msg = st.Message
		}
		data, _ = json.Marshal(map[string]string{"message": msg})
		return EventError, data, true
	}
	return "", nil, false
}
