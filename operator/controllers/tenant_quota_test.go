package controllers

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/apiaryhq/apiary/datastore"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

// fakeUsages answers with what the test sets and records decisions.
type fakeUsages struct {
	usage    datastore.Usage
	ok       bool
	err      error
	exceeded bool
}

func (f *fakeUsages) observe(context.Context, *apiary.TenantControlPlane, string, datastore.Config) (datastore.Usage, bool, error) {
	return f.usage, f.ok, f.err
}
func (f *fakeUsages) decided(_ types.UID, _ apiary.TenantQuota, exceeded bool) { f.exceeded = exceeded }
func (f *fakeUsages) stop(types.UID)                                           {}

func TestReconcileQuota(t *testing.T) {
	meter := &fakeUsages{ok: true}
	r := &TenantControlPlaneReconciler{UsageInterval: 30 * time.Second, usages: meter}
	ds := &apiary.DataStore{ObjectMeta: metav1.ObjectMeta{Name: "shared"}, Spec: apiary.DataStoreSpec{TenantQuota: &apiary.TenantQuotaPolicy{
		Default: apiary.TenantQuota{Bytes: resource.NewQuantity(1000, resource.DecimalSI), Objects: ptr.To[int64](100)},
	}}}
	tcp := &apiary.TenantControlPlane{ObjectMeta: metav1.ObjectMeta{Name: "acme", Namespace: "tenants", UID: "u-1"}}
	tcp.Default()
	step := func(bytes, objects int64) quotaState {
		t.Helper()
		meter.usage = datastore.Usage{Bytes: bytes, Objects: objects}
		return r.reconcileQuota(context.Background(), tcp, ds, datastore.Config{})
	}
	want := func(st quotaState, exceeded bool, reason, msg string) {
		t.Helper()
		c := meta.FindStatusCondition(tcp.Status.Conditions, apiary.ConditionWithinQuota)
		if (st.exceeded != nil) != exceeded || c == nil || c.Reason != reason || !strings.Contains(c.Message, msg) {
			t.Fatalf("exceeded %t, WithinQuota %+v; want exceeded %t, reason %s, message with %q", st.exceeded != nil, c, exceeded, reason, msg)
		}
		if reason != ReasonUsageUnmeasured && meter.exceeded != exceeded {
			t.Fatalf("the tracker was told exceeded=%t", meter.exceeded)
		}
	}

	// The first scan is not done yet: asked again in a second.
	meter.ok = false
	st := step(0, 0)
	want(st, false, ReasonUsageUnmeasured, "measuring the tenant's keys on DataStore shared")
	if st.next != time.Second {
		t.Fatalf("next %s while measuring", st.next)
	}
	meter.ok = true
	st = step(500, 10)
	want(st, false, ReasonWithinQuota, "500 B of 1000 B, 10 of 100 objects")
	if st.next != 30*time.Second {
		t.Fatalf("next %s", st.next)
	}
	// Over the byte limit.
	want(step(1001, 10), true, ReasonQuotaExceeded, "refuses creates and updates (deletes are allowed) until it is back under 95 %")
	if tcp.Status.DataStore.Usage.Bytes != 1001 || tcp.Status.DataStore.Usage.Quota.Bytes.Value() != 1000 {
		t.Fatalf("usage %+v", tcp.Status.DataStore.Usage)
	}
	// Under the limit but above 95 %: still refused (no flapping).
	want(step(960, 10), true, ReasonQuotaExceeded, "960 B of 1000 B")
	// Usage that cannot be followed keeps the refusal.
	meter.err = errors.New("etcd down")
	want(step(0, 0), true, ReasonUsageUnmeasured, "etcd down")
	meter.err = nil
	// Objects over their limit count as much as bytes.
	want(step(100, 101), true, ReasonQuotaExceeded, "101 of 100 objects")
	// Under 95 % of both: lifted.
	want(step(100, 94), false, ReasonWithinQuota, "94 of 100 objects")
	// Within and unmeasurable: not refused.
	meter.err = errors.New("etcd down")
	want(step(0, 0), false, ReasonUsageUnmeasured, "etcd down")
	meter.err = nil

	// A tenant asking for more than the DataStore's max is held to it.
	ds.Spec.TenantQuota.Max = &apiary.TenantQuota{Bytes: resource.NewQuantity(2000, resource.DecimalSI)}
	tcp.Spec.DataStoreQuota = &apiary.TenantQuota{Bytes: resource.NewQuantity(1<<30, resource.BinarySI)}
	want(step(1500, 1), false, ReasonWithinQuota, "1.5 KiB of 2.0 KiB, 1 of 100 objects (spec.dataStoreQuota asks for more than DataStore shared allows")
	want(step(2001, 1), true, ReasonQuotaExceeded, "2.0 KiB of 2.0 KiB")

	// Kubernetes without manifest-based admission: reported, not enforced
	// by a policy it could not load.
	tcp.Spec.Version = "v1.35.3"
	want(step(3000, 1), true, ReasonQuotaExceeded, "Kubernetes v1.35.3 cannot enforce it")

	// No quota on the DataStore: usage is still shown.
	ds.Spec.TenantQuota = nil
	tcp.Spec.DataStoreQuota = nil
	want(step(3000, 7), false, ReasonNoQuota, "DataStore shared sets no quota for its tenants; the tenant stores 2.9 KiB in 7 objects")
}

// The tracker enqueues a tenant once when usage crosses what was decided,
// either way, and after the first scan.
func TestUsageTrackerSignalsCrossings(t *testing.T) {
	events := make(chan event.GenericEvent, 10)
	u := &usageTracker{events: events}
	tr := &tracked{ref: &apiary.TenantControlPlane{}, cancel: func() {}}
	ctx := context.Background()
	signals := func() int {
		n := 0
		for {
			select {
			case <-events:
				n++
			default:
				return n
			}
		}
	}
	u.tenants = map[types.UID]*tracked{"u": tr}
	u.report(ctx, tr, datastore.Usage{Bytes: 10})
	if n := signals(); n != 1 {
		t.Fatalf("first scan: %d signals", n)
	}
	u.decided("u", apiary.TenantQuota{Bytes: resource.NewQuantity(100, resource.DecimalSI)}, false)
	u.report(ctx, tr, datastore.Usage{Bytes: 99})
	u.report(ctx, tr, datastore.Usage{Bytes: 101})
	u.report(ctx, tr, datastore.Usage{Bytes: 150})
	if n := signals(); n != 1 {
		t.Fatalf("crossing the quota: %d signals, want 1", n)
	}
	u.decided("u", apiary.TenantQuota{Bytes: resource.NewQuantity(100, resource.DecimalSI)}, true)
	u.report(ctx, tr, datastore.Usage{Bytes: 96})
	if n := signals(); n != 0 {
		t.Fatalf("over 95 %% while refused: %d signals", n)
	}
	u.report(ctx, tr, datastore.Usage{Bytes: 90})
	if n := signals(); n != 1 {
		t.Fatalf("back under 95 %%: %d signals, want 1", n)
	}
	u.stop("u")
	if len(u.tenants) != 0 {
		t.Fatal("stop kept the tenant")
	}
}

// A few bytes of drift (a lease renewed) are not worth a status write; an
// object more, or a real change of size, is.
func TestSignificantChange(t *testing.T) {
	shown := apiary.DataStoreUsage{Bytes: 200 << 10, Objects: 300}
	none := apiary.TenantQuota{}
	for _, tc := range []struct {
		now   datastore.Usage
		quota apiary.TenantQuota
		want  bool
	}{
		{datastore.Usage{Bytes: 200<<10 + 3, Objects: 300}, none, false},
		{datastore.Usage{Bytes: 200<<10 - 4000, Objects: 300}, none, false},
		{datastore.Usage{Bytes: 200<<10 + 5000, Objects: 300}, none, true},
		{datastore.Usage{Bytes: 200 << 10, Objects: 301}, none, true},
		// A small quota makes small changes matter.
		{datastore.Usage{Bytes: 200<<10 + 3000, Objects: 300}, apiary.TenantQuota{Bytes: resource.NewQuantity(256<<10, resource.BinarySI)}, true},
	} {
		if got := significantChange(shown, tc.now, tc.quota); got != tc.want {
			t.Errorf("%+v with quota %+v: %t, want %t", tc.now, tc.quota, got, tc.want)
		}
	}
}
