//go:build integration

package bench

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/apiaryhq/apiary/dashboard/asuser"
	"github.com/apiaryhq/apiary/dashboard/live"
	"github.com/apiaryhq/apiary/internal/dashtest"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

// BenchmarkDashboardStream measures the dashboard's live stream as a
// signed-in user against a real kube-apiserver with 100 tenants in her
// namespace: how long until the stream has carried all of them (what the
// overview needs to show a full page), and, per iteration, how long a
// status change takes from its write to the stream.
//
//	go test -tags integration -run '^$' -bench BenchmarkDashboardStream -benchtime=50x -count=1 ./bench/...
func BenchmarkDashboardStream(b *testing.B) {
	const tenants = 100
	k, as := aliceWithTenants(b, tenants)
	ctx := b.Context()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		live.Stream(w, r, as, "team-a")
	}))
	defer srv.Close()

	opened := time.Now()
	resp, err := http.Get(srv.URL)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	events := make(chan live.Tenant, 256)
	go func() {
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
				var tn live.Tenant
				if json.Unmarshal([]byte(data), &tn) == nil {
					events <- tn
				}
			}
		}
		close(events)
	}()
	next := func() live.Tenant {
		select {
		case tn, ok := <-events:
			if !ok {
				b.Fatal("the stream ended")
			}
			return tn
		case <-time.After(30 * time.Second):
			b.Fatal("no event within 30s")
		}
		return live.Tenant{}
	}
	for range tenants {
		next()
	}
	full := time.Since(opened)

	var a apiary.TenantControlPlane
	if err := k.Admin.Get(ctx, client.ObjectKey{Namespace: "team-a", Name: "a"}, &a); err != nil {
		b.Fatal(err)
	}
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		meta.SetStatusCondition(&a.Status.Conditions, metav1.Condition{Type: "Ready", Status: metav1.ConditionFalse, Reason: "Probe", Message: fmt.Sprint(i)})
		written := time.Now()
		if err := k.Admin.Status().Update(ctx, &a); err != nil {
			b.Fatal(err)
		}
		for {
			tn := next()
			if tn.Name == "a" && len(tn.Conditions) == 1 && tn.Conditions[0].Message == fmt.Sprint(i) {
				break
			}
		}
		lat = append(lat, time.Since(written))
	}
	b.StopTimer()
	slices.Sort(lat)
	q := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))].Microseconds()) / 1000 }
	b.ReportMetric(float64(full.Milliseconds()), "ms-to-100-tenants")
	b.ReportMetric(q(0.5), "ms-p50-change")
	b.ReportMetric(q(0.9), "ms-p90-change")
	b.ReportMetric(q(1), "ms-max-change")
}

// aliceWithTenants starts a kube-apiserver with n tenants in team-a (t000
// and on, besides a) and returns alice's impersonating client.
func aliceWithTenants(b *testing.B, n int) (*dashtest.Cluster, client.WithWatch) {
	b.Helper()
	// envtest logs through controller-runtime; quiet, not a stack trace
	// in the middle of the benchmark's output.
	ctrllog.SetLogger(logr.Discard())
	k := dashtest.Start(b)
	for i := range n - 1 { // tenant a is there already
		tcp := &apiary.TenantControlPlane{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("t%03d", i), Namespace: "team-a"},
			Spec:       apiary.TenantControlPlaneSpec{Network: apiary.NetworkSpec{ServiceType: corev1.ServiceTypeClusterIP}},
		}
		if err := k.Admin.Create(b.Context(), tcp); err != nil {
			b.Fatal(err)
		}
	}
	clients, err := asuser.New(k.Dashboard)
	if err != nil {
		b.Fatal(err)
	}
	as, err := clients.For(dashtest.Alice)
	if err != nil {
		b.Fatal(err)
	}
	return k, as
}
