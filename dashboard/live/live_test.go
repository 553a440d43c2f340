package live

import (
	"encoding/json"
	"testing"

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
