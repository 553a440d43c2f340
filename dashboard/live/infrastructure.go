package live

import (
	"encoding/json"
	"net/http"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

// DataStore is what the overview shows of a DataStore: its health and
// how full it is of tenants, not which tenants (names of other teams'
// tenants are not the reader's to see).
type DataStore struct {
	Name         string `json:"name"`
	Ready        string `json:"ready"`
	Reason       string `json:"reason,omitempty"`
	Message      string `json:"message,omitempty"`
	Managed      bool   `json:"managed"`
	Members      int32  `json:"members"`
	ReadyMembers int32  `json:"readyMembers"`
	Tenants      int32  `json:"tenants"`
}

// DataStoreOf is the overview's view of ds.
func DataStoreOf(ds *apiary.DataStore) DataStore {
	v := DataStore{Name: ds.Name, Ready: string(metav1.ConditionUnknown), Managed: ds.Spec.Managed != nil,
		Members: int32(len(ds.Status.Members)), ReadyMembers: ds.Status.ReadyMembers, Tenants: ds.Status.Tenants}
	if ds.Spec.Managed != nil && ds.Spec.Managed.Replicas > v.Members {
		v.Members = ds.Spec.Managed.Replicas
	}
	if c := meta.FindStatusCondition(ds.Status.Conditions, apiary.ConditionReady); c != nil {
		v.Ready, v.Reason, v.Message = string(c.Status), c.Reason, c.Message
	}
	return v
}

// Event names of the infrastructure stream, besides EventHost,
// EventHostDeleted, EventUnavailable and EventError.
const (
	EventDataStore        = "datastore"
	EventDataStoreDeleted = "datastore-deleted"
)

// Infrastructure serves what the overview shows beside the tenants: the
// DataStores and the Hosts of namespace (every namespace when empty), each
// from a watch made as the user. What the user may not watch is named in
// an EventUnavailable with the API server's reason; the rest streams.
func Infrastructure(w http.ResponseWriter, r *http.Request, c Watcher, namespace string) {
	var sources []source
	var first []message
	if dw, err := c.Watch(r.Context(), &apiary.DataStoreList{}); err != nil {
		first = append(first, unavailable("datastores", err))
	} else {
		sources = append(sources, source{dw, encodeDataStore})
	}
	if hw, err := c.Watch(r.Context(), &apiary.HostList{}, client.InNamespace(namespace)); err != nil {
		first = append(first, unavailable("hosts", err))
	} else {
		sources = append(sources, source{hw, hostsOf("")})
	}
	serve(w, r, first, sources...)
}

func unavailable(part string, err error) message {
	data, _ := json.Marshal(map[string]string{"part": part, "message": err.Error()})
	return message{name: EventUnavailable, data: data}
}

func encodeDataStore(ev watch.Event) (string, []byte, bool) {
	ds, ok := ev.Object.(*apiary.DataStore)
	switch {
	case ev.Type == watch.Error:
		return encode(ev)
	case !ok || (ev.Type != watch.Added && ev.Type != watch.Modified && ev.Type != watch.Deleted):
		return "", nil, false
	}
	data, _ := json.Marshal(DataStoreOf(ds))
	if ev.Type == watch.Deleted {
		return EventDataStoreDeleted, data, false
	}
	return EventDataStore, data, false
}
