package live

import (
	"encoding/json"
	"net/http"

	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

// DataStoreDetail is what the DataStore page shows: the overview's row,
// every condition, its endpoints and members.
type DataStoreDetail struct {
	DataStore
	Version    string              `json:"version,omitempty"`
	Endpoints  []string            `json:"endpoints,omitempty"`
	Members    []apiary.EtcdMember `json:"memberList,omitempty"`
	Conditions []Condition         `json:"conditions,omitempty"`
}

// DataStoreDetailOf is the DataStore page's view of ds.
func DataStoreDetailOf(ds *apiary.DataStore) DataStoreDetail {
	d := DataStoreDetail{DataStore: DataStoreOf(ds), Endpoints: ds.Status.Endpoints, Members: ds.Status.Members,
		Conditions: conditionsOf(ds.Status.Conditions)}
	if ds.Spec.Managed != nil {
		d.Version = ds.Spec.Managed.Version
	}
	return d
}

// DataStoreStream serves one DataStore (EventDataStore with its
// DataStoreDetail) from a watch made as the user; 403 without the right.
func DataStoreStream(w http.ResponseWriter, r *http.Request, c Watcher, name string) {
	one(w, r, c, &apiary.DataStoreList{}, "", name, func(ev watch.Event) (string, []byte, bool) {
		ds, ok := ev.Object.(*apiary.DataStore)
		if !ok || (ev.Type != watch.Added && ev.Type != watch.Modified) {
			return encodeDataStore(ev)
		}
		data, _ := json.Marshal(DataStoreDetailOf(ds))
		return EventDataStore, data, false
	})
}

// HostStream serves one Host (EventHost) from a watch made as the user;
// 403 without the right.
func HostStream(w http.ResponseWriter, r *http.Request, c Watcher, namespace, name string) {
	one(w, r, c, &apiary.HostList{}, namespace, name, hostsOf(""))
}

// one streams the object name of list's kind, watched by its name.
func one(w http.ResponseWriter, r *http.Request, c Watcher, list client.ObjectList, namespace, name string, encode func(watch.Event) (string, []byte, bool)) {
	wi, err := c.Watch(r.Context(), list, client.InNamespace(namespace),
		client.MatchingFieldsSelector{Selector: fields.OneTermEqualSelector("metadata.name", name)})
	if err != nil {
		refuse(w, "watching "+name, err)
		return
	}
	serve(w, r, nil, source{wi, encode})
}
