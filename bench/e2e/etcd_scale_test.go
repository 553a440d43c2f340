//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/apiaryhq/apiary/e2e/framework"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/operator/controllers"
	"github.com/apiaryhq/apiary/operator/render/managedetcd"
)

const (
	scaleDataStore = "bench-scale"
	scaleTenant    = "on-bench-scale"
	// scaleVolumes: the walk below binds 5 claims (etcd-0, then 1 and 2,
	// then 3 and 4); a released claim's volume is not reused (Retain),
	// and a member that is replaced takes a new one. Twice that.
	scaleVolumes = 10
	// scaleStepLimit bounds each wait of a step.
	scaleStepLimit = 6 * time.Minute
	// scaleWriteRetry is how long the writer tries a failed write again
	// (a client with a bounded retry) before it counts as failed.
	scaleWriteRetry = 5 * time.Second
)

// scaleWalk is the sequence of spec.managed.replicas after the first 1.
var scaleWalk = []int32{3, 5, 3, 1}

// BenchmarkEtcdScale measures a managed etcd DataStore scaled 1→3→5→3→1
// with one tenant on it, while a writer creates and reads back a
// ConfigMap through the tenant's API every 100 ms (a failed write tried
// again for up to 5 s). Per step: spec.managed.replicas changed → exactly
// the wanted members in status.members, all voting, MembersReady and
// Ready True; and → the tenant's API servers rolled onto that many etcd
// servers. Per member added in a scale-up: the learner first seen in
// status.members → seen voting (status sampled every 200 ms; the
// operator's MemberAdded → MemberPromoted events logged beside it). Over
// the whole walk: writes OK, failed (after the retry), lost, and the
// longest time between two successful writes. b.N is ignored: one walk
// per run (-benchtime=1x).
func BenchmarkEtcdScale(b *testing.B) {
	e := framework.Setup(b)
	// A killed run leaves its objects behind; StaticVolumes then removes
	// its volumes and the members' data, once nothing claims them.
	scaleCleanup(b, e)
	class := e.StaticVolumes(b, scaleDataStore, scaleVolumes)
	// Registered after the volumes' cleanup, so run before it: the
	// claims go before the volumes.
	b.Cleanup(func() { scaleCleanup(b, e) })

	ds := &apiary.DataStore{ObjectMeta: metav1.ObjectMeta{Name: scaleDataStore}, Spec: apiary.DataStoreSpec{
		Managed: &apiary.ManagedEtcd{Namespace: framework.SystemNS, Replicas: 1, Storage: apiary.ManagedEtcdStorage{StorageClassName: &class}},
	}}
	start := time.Now()
	if err := e.C.Create(e.Ctx, ds); err != nil {
		b.Fatal(err)
	}
	scaleSample(b, e, ds.Generation, 1, nil)
	created := time.Since(start)
	took := e.CreateTenant(b, scaleTenant, func(p *apiary.TenantControlPlane) { p.Spec.DataStore = scaleDataStore })
	b.Logf("DataStore %s with 1 member Ready in %s; tenant %s on it Ready in %s", scaleDataStore,
		created.Round(100*time.Millisecond), scaleTenant, took.Round(100*time.Millisecond))

	w := startScaleWriter(b, e, scaleTenant, "etcd-scale-bench")
	time.Sleep(2 * time.Second)

	var figures []string
	var promotions []time.Duration
	from := int32(1)
	for _, n := range scaleWalk {
		label := fmt.Sprintf("%dto%d", from, n)
		var start time.Time
		var gen int64
		framework.Eventually(b, fmt.Sprintf("%s spec.managed.replicas %d", scaleDataStore, n), 30*time.Second, func() error {
			var cur apiary.DataStore
			if err := e.C.Get(e.Ctx, client.ObjectKey{Name: scaleDataStore}, &cur); err != nil {
				return err
			}
			cur.Spec.Managed.Replicas = n
			t0 := time.Now()
			if err := e.C.Update(e.Ctx, &cur); err != nil {
				return err
			}
			start, gen = t0, cur.Generation
			return nil
		})
		seen := &scaleSeen{learner: map[string]time.Time{}, voting: map[string]time.Time{}}
		scaleSample(b, e, gen, n, seen)
		settled := time.Since(start)
		e.WaitEtcdServers(b, scaleTenant, int(n), scaleStepLimit)
		rolled := time.Since(start)

		b.ReportMetric(settled.Seconds(), "s-"+label)
		b.ReportMetric(rolled.Seconds(), "s-"+label+"-tenant")
		var added []string
		for i := from; i < n; i++ {
			name := managedetcd.MemberName(ds, i)
			l, okL := seen.learner[name]
			v, okV := seen.voting[name]
			switch {
			case okL && okV:
				promotions = append(promotions, v.Sub(l))
				added = append(added, fmt.Sprintf("%s learner at +%s, voting %s later", name, l.Sub(start).Round(100*time.Millisecond), v.Sub(l).Round(100*time.Millisecond)))
			default:
				// Promoted between two samples, or never seen a
				// learner: no figure for it.
				added = append(added, fmt.Sprintf("%s learner seen %t, voting seen %t", name, okL, okV))
			}
		}
		b.Logf("%s: members settled %s after the spec change, tenant rolled onto %d etcd servers after %s; members seen %s",
			label, settled.Round(100*time.Millisecond), n, rolled.Round(100*time.Millisecond), strings.Join(seen.counts, " → "))
		if len(added) > 0 {
			b.Logf("%s added: %s; operator events (MemberAdded → MemberPromoted): %s", label, strings.Join(added, "; "), scaleEventPromotions(b, e, ds, from, n, start))
		}
		figures = append(figures, fmt.Sprintf("%d→%d %s (tenant %s)", from, n, settled.Round(100*time.Millisecond), rolled.Round(100*time.Millisecond)))
		from = n
	}
	time.Sleep(2 * time.Second)
	wr := w.finish(b)

	b.ReportMetric(float64(wr.ok), "writes-ok")
	b.ReportMetric(float64(wr.failed), "writes-failed")
	b.ReportMetric(float64(wr.lost), "writes-lost")
	b.ReportMetric(wr.longest.Seconds(), "s-longest-write-gap")
	promo := "none sampled"
	if len(promotions) > 0 {
		s := slices.Clone(promotions)
		slices.Sort(s)
		lo, p50, hi := s[0], s[(len(s)-1)/2], s[len(s)-1]
		b.ReportMetric(lo.Seconds(), "s-learner-to-voting-min")
		b.ReportMetric(p50.Seconds(), "s-learner-to-voting-p50")
		b.ReportMetric(hi.Seconds(), "s-learner-to-voting-max")
		promo = fmt.Sprintf("min %s p50 %s max %s over %d added members", lo.Round(100*time.Millisecond), p50.Round(100*time.Millisecond), hi.Round(100*time.Millisecond), len(s))
	}
	if len(wr.failures) > 0 {
		b.Logf("first failed writes: %s", strings.Join(wr.failures, "; "))
	}
	b.Logf("FIGURE managed etcd with a tenant on it, scaled one member at a time: %s; learner → voting %s; ConfigMap write+read every 100 ms (retried up to %s): %d OK, %d failed (%d retries), %d lost, longest gap %s",
		strings.Join(figures, ", "), promo, scaleWriteRetry, wr.ok, wr.failed, wr.retried, wr.lost, wr.longest.Round(10*time.Millisecond))
	if wr.ok < 50 {
		b.Errorf("only %d successful writes: too few to tell", wr.ok)
	}
}

// scaleSeen is what sampling status.members saw during one step: when
// each member was first seen a learner and first seen voting after that,
// and the distinct (voting, learners) counts in order ("3+1L").
type scaleSeen struct {
	learner, voting map[string]time.Time
	counts          []string
}

// scaleSample reads the DataStore every 200 ms until it has observed
// generation gen and its members are exactly ordinals 0 to n-1, all
// voting, with MembersReady and Ready True; seen, when set, records
// the members' learner and voting times.
func scaleSample(b *testing.B, e *framework.Env, gen int64, n int32, seen *scaleSeen) {
	b.Helper()
	deadline := time.Now().Add(scaleStepLimit)
	var last error
	for {
		var ds apiary.DataStore
		err := e.C.Get(e.Ctx, client.ObjectKey{Name: scaleDataStore}, &ds)
		now := time.Now()
		if err == nil {
			if seen != nil {
				voting, learners := 0, 0
				for _, m := range ds.Status.Members {
					if m.Learner {
						learners++
						if _, ok := seen.learner[m.Name]; !ok {
							seen.learner[m.Name] = now
						}
						continue
					}
					voting++
					if _, ok := seen.learner[m.Name]; ok {
						if _, ok := seen.voting[m.Name]; !ok {
							seen.voting[m.Name] = now
						}
					}
				}
				c := fmt.Sprint(voting)
				if learners > 0 {
					c += fmt.Sprintf("+%dL", learners)
				}
				if len(seen.counts) == 0 || seen.counts[len(seen.counts)-1] != c {
					seen.counts = append(seen.counts, c)
				}
			}
			err = scaleSettled(&ds, gen, n)
			if err == nil {
				return
			}
		}
		last = err
		if now.After(deadline) {
			b.Fatalf("DataStore %s at %d members: not after %s: %v", scaleDataStore, n, scaleStepLimit, last)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// scaleSettled: the status is of generation gen or later, the members are
// ordinals 0 to n-1, none a learner, and MembersReady (all members ready)
// and Ready are True.
func scaleSettled(ds *apiary.DataStore, gen int64, n int32) error {
	if ds.Status.ObservedGeneration < gen {
		return fmt.Errorf("status of generation %d, want %d", ds.Status.ObservedGeneration, gen)
	}
	var names, want []string
	for _, m := range ds.Status.Members {
		if m.Learner {
			return fmt.Errorf("learner %s", m.Name)
		}
		names = append(names, m.Name)
	}
	for i := range n {
		want = append(want, managedetcd.MemberName(ds, i))
	}
	if !slices.Equal(names, want) {
		return fmt.Errorf("members %v, want %v", names, want)
	}
	if err := framework.ConditionIs(ds.Status.Conditions, apiary.ConditionMembersReady, metav1.ConditionTrue, controllers.ReasonAllMembersReady); err != nil {
		return err
	}
	return framework.ConditionIs(ds.Status.Conditions, apiary.ConditionReady, metav1.ConditionTrue, "")
}

// scaleEventPromotions is, for each member of ordinals from to n-1, the
// time between the operator's MemberAdded and MemberPromoted events about
// it since start (their eventTime, set by the operator), for the log.
func scaleEventPromotions(b *testing.B, e *framework.Env, ds *apiary.DataStore, from, n int32, start time.Time) string {
	// Cluster-scoped objects' events land in "default".
	var list eventsv1.EventList
	if err := e.C.List(e.Ctx, &list, client.InNamespace("default")); err != nil {
		b.Logf("listing events: %v", err)
		return "unknown"
	}
	var out []string
	for i := from; i < n; i++ {
		name := managedetcd.MemberName(ds, i)
		var added, promoted time.Time
		for _, ev := range list.Items {
			t := ev.EventTime.Time
			if ev.Regarding.Kind != "DataStore" || ev.Regarding.Name != scaleDataStore ||
				t.Before(start.Add(-time.Second)) || !strings.Contains(ev.Note+" ", name+" ") {
				continue
			}
			switch ev.Reason {
			case controllers.ReasonMemberAdded:
				added = t
			case controllers.ReasonMemberPromoted:
				promoted = t
			}
		}
		if added.IsZero() || promoted.IsZero() {
			out = append(out, name+" no event pair")
			continue
		}
		out = append(out, fmt.Sprintf("%s %s", name, promoted.Sub(added).Round(10*time.Millisecond)))
	}
	return strings.Join(out, ", ")
}

// scaleCleanup removes, in order and each wait bounded, the tenant (the
// DataStore waits for it), then the DataStore with its members and
// claims; the volumes are StaticVolumes'. Before the run it clears what a
// killed run left.
func scaleCleanup(b *testing.B, e *framework.Env) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	gone := func(what string, limit time.Duration, f func() error) {
		deadline := time.Now().Add(limit)
		for {
			err := f()
			if err == nil {
				return
			}
			if time.Now().After(deadline) || ctx.Err() != nil {
				b.Logf("cleanup: %s not gone after %s: %v", what, limit, err)
				return
			}
			time.Sleep(500 * time.Millisecond)
		}
	}
	notFound := func(err error) error {
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err == nil {
			return fmt.Errorf("still there")
		}
		return err
	}

	tcp := &apiary.TenantControlPlane{ObjectMeta: metav1.ObjectMeta{Namespace: framework.TenantsNS, Name: scaleTenant}}
	_ = e.C.Delete(ctx, tcp)
	gone("tenant "+scaleTenant, 3*time.Minute, func() error {
		return notFound(e.C.Get(ctx, client.ObjectKeyFromObject(tcp), &apiary.TenantControlPlane{}))
	})

	ds := &apiary.DataStore{ObjectMeta: metav1.ObjectMeta{Name: scaleDataStore}}
	_ = e.C.Delete(ctx, ds)
	gone("DataStore "+scaleDataStore+", its members and their claims", 3*time.Minute, func() error {
		if err := notFound(e.C.Get(ctx, client.ObjectKeyFromObject(ds), &apiary.DataStore{})); err != nil {
			return fmt.Errorf("DataStore: %w", err)
		}
		var pods corev1.PodList
		if err := e.C.List(ctx, &pods, client.InNamespace(framework.SystemNS), client.MatchingLabels{managedetcd.LabelDataStore: scaleDataStore}); err != nil {
			return err
		}
		if len(pods.Items) > 0 {
			return fmt.Errorf("%d etcd pods left", len(pods.Items))
		}
		var claims corev1.PersistentVolumeClaimList
		if err := e.C.List(ctx, &claims, client.InNamespace(framework.SystemNS)); err != nil {
			return err
		}
		for _, c := range claims.Items {
			if managedetcd.ClaimOrdinal(ds, c.Name) >= 0 {
				// A claim without a DataStore to delete it.
				_ = e.C.Delete(ctx, &c)
				return fmt.Errorf("claim %s left", c.Name)
			}
		}
		return nil
	})
}

// scaleWriter runs a framework.Writer against the tenant until stopped.
type scaleWriter struct {
	*framework.Writer
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// scaleWrites is the writer's account once stopped.
type scaleWrites struct {
	ok, failed, retried, lost int64
	longest                   time.Duration
	failures                  []string
}

func startScaleWriter(b *testing.B, e *framework.Env, tenant, ns string) *scaleWriter {
	b.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", e.ExportKubeconfig(b, tenant))
	if err != nil {
		b.Fatal(err)
	}
	cfg.QPS, cfg.Burst = 100, 100
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := cs.CoreV1().Namespaces().Create(e.Ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		b.Fatal(err)
	}
	w := &scaleWriter{Writer: &framework.Writer{CS: cs, NS: ns, Retry: scaleWriteRetry}}
	ctx, cancel := context.WithCancel(e.Ctx)
	w.cancel = cancel
	w.wg.Go(func() { w.Run(ctx) })
	// Before the tenant goes, on failure too (cleanups run last first).
	b.Cleanup(w.stop)
	return w
}

func (w *scaleWriter) stop() {
	w.cancel()
	w.wg.Wait()
}

// finish stops the writer and counts the acknowledged writes the tenant
// no longer has.
func (w *scaleWriter) finish(b *testing.B) scaleWrites {
	b.Helper()
	w.stop()
	var lost int
	framework.Eventually(b, "the writer's ConfigMaps listed", time.Minute, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		var err error
		lost, err = w.Lost(ctx)
		return err
	})
	return scaleWrites{
		ok: w.OK.Load(), failed: w.Failed.Load(), retried: w.Retried.Load(), lost: int64(lost),
		longest: w.Longest(), failures: w.Failures(),
	}
}
