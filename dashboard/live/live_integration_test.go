//go:build integration

package live

import (
	"bufio"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/apiaryhq/apiary/dashboard/asuser"
	"github.com/apiaryhq/apiary/internal/dashtest"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

// Alice's stream of team-a starts with tenant a and shows a condition
// change within a second of the status write; a stream of team-b is
// refused before it starts.
func TestStreamShowsChangesAsTheUser(t *testing.T) {
	k := dashtest.Start(t)
	clients, err := asuser.New(k.Dashboard)
	if err != nil {
		t.Fatal(err)
	}
	as, err := clients.For(dashtest.Alice)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		Stream(w, r, as, r.URL.Query().Get("namespace"))
	}))
	defer srv.Close()

	resp, err := http.Get(srv.URL + "?namespace=team-b")
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("alice's stream of team-b: %s, want 403", resp.Status)
	}

	resp, err = http.Get(srv.URL + "?namespace=team-a")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("alice's stream of team-a: %s %s", resp.Status, resp.Header.Get("Content-Type"))
	}
	events := make(chan [2]string, 16)
	go func() {
		sc := bufio.NewScanner(resp.Body)
		var name string
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.HasPrefix(line, "event: "):
				name = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "data: "):
				events <- [2]string{name, strings.TrimPrefix(line, "data: ")}
			}
		}
		close(events)
	}()
	next := func() Tenant {
		t.Helper()
		select {
		case ev, ok := <-events:
			if !ok {
				t.Fatal("the stream ended")
			}
			if ev[0] != EventTenant {
				t.Fatalf("event %s: %s", ev[0], ev[1])
			}
			var tn Tenant
			if err := json.Unmarshal([]byte(ev[1]), &tn); err != nil {
				t.Fatal(err)
			}
			return tn
		case <-time.After(10 * time.Second):
			t.Fatal("no event within 10s")
		}
		return Tenant{}
	}
	if first := next(); first.Namespace != "team-a" || first.Name != "a" {
		t.Fatalf("first event %+v, want tenant a", first)
	}

	var a apiary.TenantControlPlane
	if err := k.Admin.Get(t.Context(), client.ObjectKey{Namespace: "team-a", Name: "a"}, &a); err != nil {
		t.Fatal(err)
	}
	meta.SetStatusCondition(&a.Status.Conditions, metav1.Condition{Type: "Ready", Status: metav1.ConditionFalse, Reason: "DataStoreUnavailable", Message: "etcd stopped"})
	written := time.Now()
	if err := k.Admin.Status().Update(t.Context(), &a); err != nil {
		t.Fatal(err)
	}
	got := next()
	shown := time.Since(written)
	if len(got.Conditions) != 1 || got.Conditions[0].Reason != "DataStoreUnavailable" || got.Conditions[0].Message != "etcd stopped" {
		t.Errorf("after the status write: %+v", got)
	}
	if shown > time.Second {
		t.Errorf("the change reached the stream after %s, want within 1s", shown)
	}
	t.Logf("FIGURE a condition change reached alice's stream %s after the status write", shown.Round(time.Millisecond))
}
