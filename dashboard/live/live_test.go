package live

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

func TestEncode(t *testing.T) {
	tcp := &apiary.TenantControlPlane{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "a"}}
	tcp.Spec.Version = "v1.37.2"
	tcp.Status.Version, tcp.Status.Replicas, tcp.Status.ReadyReplicas = "v1.36.3", 2, 1
	tcp.Status.Conditions = []metav1.Condition{{Type: "Ready", Status: metav1.ConditionFalse, Reason: "Upgrading", Message: "1 of 2 replicas at v1.37.2"}}
	for _, tc := range []struct {
		ev   watch.Event
		name string
		last bool
	}{
		{watch.Event{Type: watch.Added, Object: tcp}, EventTenant, false},
		{watch.Event{Type: watch.Modified, Object: tcp}, EventTenant, false},
		{watch.Event{Type: watch.Deleted, Object: tcp}, EventDeleted, false},
		{watch.Event{Type: watch.Bookmark, Object: tcp}, "", false},
		{watch.Event{Type: watch.Error, Object: &metav1.Status{Message: "too old resource version"}}, EventError, true},
	} {
		name, data, last := encode(tc.ev)
		if name != tc.name || last != tc.last {
			t.Errorf("%s: %q last %v, want %q last %v", tc.ev.Type, name, last, tc.name, tc.last)
		}
		if name == EventTenant {
			var got Tenant
			if err := json.Unmarshal(data, &got); err != nil {
				t.Fatal(err)
			}
			if got.Version != "v1.36.3" || got.DesiredVersion != "v1.37.2" || got.ReadyReplicas != 1 || len(got.Conditions) != 1 || got.Conditions[0].Reason != "Upgrading" {
				t.Errorf("%s: %+v", tc.ev.Type, got)
			}
		}
		if name == EventError && string(data) != `{"message":"too old resource version"}` {
			t.Errorf("error event %s", data)
		}
	}
}

// A tenant's stream keeps its own Hosts only, and its events' time is the
// latest the event carries.
func TestEncodeTenantParts(t *testing.T) {
	mine := &apiary.Host{ObjectMeta: metav1.ObjectMeta{Name: "h1"}, Spec: apiary.HostSpec{TenantControlPlane: "a", Address: "10.0.0.5"}}
	mine.Status.Phase, mine.Status.Journal = "Joining", []apiary.HostStep{{Name: "preflight"}}
	theirs := &apiary.Host{ObjectMeta: metav1.ObjectMeta{Name: "h2"}, Spec: apiary.HostSpec{TenantControlPlane: "b"}}
	hosts := hostsOf("a")
	for _, tc := range []struct {
		ev   watch.Event
		name string
	}{
		{watch.Event{Type: watch.Added, Object: mine}, EventHost},
		{watch.Event{Type: watch.Modified, Object: mine}, EventHost},
		{watch.Event{Type: watch.Deleted, Object: mine}, EventHostDeleted},
		{watch.Event{Type: watch.Added, Object: theirs}, ""},
		{watch.Event{Type: watch.Deleted, Object: theirs}, ""},
		{watch.Event{Type: watch.Bookmark, Object: mine}, ""},
		{watch.Event{Type: watch.Error, Object: &metav1.Status{Message: "gone"}}, EventError},
	} {
		name, data, _ := hosts(tc.ev)
		if name != tc.name {
			t.Errorf("host %s of %s: %q, want %q", tc.ev.Type, tc.ev.Object.GetObjectKind(), name, tc.name)
		}
		if name == EventHost {
			var got Host
			if err := json.Unmarshal(data, &got); err != nil {
				t.Fatal(err)
			}
			if got.Name != "h1" || got.Address != "10.0.0.5" || got.Phase != "Joining" || len(got.Journal) != 1 {
				t.Errorf("host %+v", got)
			}
		}
	}

	created := metav1.NewTime(time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC))
	last := metav1.NewTime(created.Add(time.Hour))
	for _, tc := range []struct {
		e    corev1.Event
		want time.Time
	}{
		{corev1.Event{ObjectMeta: metav1.ObjectMeta{CreationTimestamp: created}, LastTimestamp: last}, last.Time},
		{corev1.Event{ObjectMeta: metav1.ObjectMeta{CreationTimestamp: created}, EventTime: metav1.NewMicroTime(last.Time)}, last.Time},
		{corev1.Event{ObjectMeta: metav1.ObjectMeta{CreationTimestamp: created}}, created.Time},
	} {
		if got := EventOf(&tc.e).Last; !got.Equal(tc.want) {
			t.Errorf("event time %s, want %s", got, tc.want)
		}
	}
	if name, _, _ := encodeEvent(watch.Event{Type: watch.Deleted, Object: &corev1.Event{}}); name != "" {
		t.Errorf("a deleted event is sent as %q", name)
	}

	tcp := &apiary.TenantControlPlane{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "a", CreationTimestamp: created}}
	tcp.Spec.Mode = apiary.ModeRegistered
	tcp.Status.KubeconfigSecret = "a-admin-kubeconfig"
	name, data, _ := encodeDetail(watch.Event{Type: watch.Modified, Object: tcp})
	var got Detail
	if err := json.Unmarshal(data, &got); err != nil || name != EventTenant {
		t.Fatalf("detail %q %s: %v", name, data, err)
	}
	if got.Name != "a" || got.DesiredMode != "registered" || got.KubeconfigSecret != "a-admin-kubeconfig" || !got.Created.Equal(created.Time) {
		t.Errorf("detail %+v", got)
	}
	if name, _, _ := encodeDetail(watch.Event{Type: watch.Deleted, Object: tcp}); name != EventDeleted {
		t.Errorf("a deleted tenant is sent as %q", name)
	}
}

// The overview sees a DataStore's health and counts, never which tenants
// (other teams') use it.
func TestEncodeDataStore(t *testing.T) {
	ds := &apiary.DataStore{ObjectMeta: metav1.ObjectMeta{Name: "shared"}, Spec: apiary.DataStoreSpec{Managed: &apiary.ManagedEtcd{Replicas: 3}}}
	ds.Status = apiary.DataStoreStatus{ReadyMembers: 2, Tenants: 5, UsedBy: []string{"team-b/secret-project"},
		Conditions: []metav1.Condition{{Type: apiary.ConditionReady, Status: metav1.ConditionFalse, Reason: "MembersNotReady", Message: "2 of 3"}}}
	name, data, _ := encodeDataStore(watch.Event{Type: watch.Modified, Object: ds})
	var got DataStore
	if err := json.Unmarshal(data, &got); err != nil || name != EventDataStore {
		t.Fatalf("%q %s: %v", name, data, err)
	}
	if want := (DataStore{Name: "shared", Ready: "False", Reason: "MembersNotReady", Message: "2 of 3", Managed: true, Members: 3, ReadyMembers: 2, Tenants: 5}); got != want {
		t.Errorf("got %+v, want %+v", got, want)
	}
	if strings.Contains(string(data), "secret-project") {
		t.Errorf("the overview's DataStore names another team's tenant: %s", data)
	}
	if name, _, _ := encodeDataStore(watch.Event{Type: watch.Deleted, Object: ds}); name != EventDataStoreDeleted {
		t.Errorf("a deleted DataStore is sent as %q", name)
	}
	if name, _, _ := hostsOf("")(watch.Event{Type: watch.Added, Object: &apiary.Host{Spec: apiary.HostSpec{TenantControlPlane: "any"}}}); name != EventHost {
		t.Errorf("the overview's Hosts: %q, want every Host", name)
	}
}
