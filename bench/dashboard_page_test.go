//go:build integration

package bench

import (
	"context"
	"fmt"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/apiaryhq/apiary/dashboard/server"
	"github.com/apiaryhq/apiary/internal/browsertest"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

// BenchmarkDashboardPage measures the overview in a real browser
// (headless Chromium) with 100 tenants in alice's namespace, the server's
// requests made as alice against a real kube-apiserver. Per iteration:
// from navigation start to the first page of 25 rows and the counts of
// all 100 drawn (the page's own clock), and from a status write to the
// change drawn on the page.
//
//	go test -tags integration -run '^$' -bench BenchmarkDashboardPage -benchtime=20x -count=1 ./bench/...
func BenchmarkDashboardPage(b *testing.B) {
	const tenants = 100
	k, as := aliceWithTenants(b, tenants)
	ctx := b.Context()
	var list apiary.TenantControlPlaneList
	if err := k.Admin.List(ctx, &list, client.InNamespace("team-a")); err != nil {
		b.Fatal(err)
	}
	for i := range list.Items {
		tcp := &list.Items[i]
		tcp.Status.Phase, tcp.Status.Version, tcp.Status.Replicas, tcp.Status.ReadyReplicas = apiary.PhaseReady, "v1.37.2", 2, 2
		meta.SetStatusCondition(&tcp.Status.Conditions, metav1.Condition{Type: "Ready", Status: metav1.ConditionTrue, Reason: "Ready", Message: "serving"})
		if err := k.Admin.Status().Update(ctx, tcp); err != nil {
			b.Fatal(err)
		}
	}
	h, err := server.New(server.Options{Local: as})
	if err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewServer(h)
	// Cleanups run last first: the browser, and its streams, go before
	// the server.
	b.Cleanup(srv.Close)
	browser := browsertest.Start(b, "")
	run := func(what string, action chromedp.Action[chromedp.Void]) {
		b.Helper()
		c, cancel := context.WithTimeout(browser, 30*time.Second)
		defer cancel()
		if err := chromedp.Do(c, action); err != nil {
			b.Fatalf("%s: %v", what, err)
		}
	}
	evaluate := func(what, js string) float64 {
		b.Helper()
		c, cancel := context.WithTimeout(browser, 30*time.Second)
		defer cancel()
		v, err := chromedp.Run(c, chromedp.Evaluate[float64](js, chromedp.EvalAwaitPromise))
		if err != nil {
			b.Fatalf("%s: %v", what, err)
		}
		return v
	}
	// until resolves with performance.now() once test() holds, checked at
	// every turn of the page's event loop.
	until := func(test string) string {
		return `new Promise(resolve => { const check = () => (` + test + `) ? resolve(performance.now()) : setTimeout(check, 0); check(); })`
	}
	drawn := fmt.Sprintf(`document.getElementById("counts").textContent.startsWith("%d tenants") && document.querySelectorAll("#tenants tbody tr").length === 25`, tenants)
	probe := list.Items[tenants/2]

	var load, change []time.Duration
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		run("open the overview", chromedp.Navigate(srv.URL+"/?namespace=team-a"))
		load = append(load, time.Duration(evaluate("the first page", until(drawn))*float64(time.Millisecond)))

		// The watcher is in the page before the write; then the write,
		// and the page says how long ago it saw the change.
		msg := fmt.Sprintf("probe %d", i)
		evaluate("watch", `(window.seen = `+until(`document.querySelector("#tenants tbody").textContent.includes("`+msg+`")`)+`), 0`)
		if err := k.Admin.Get(ctx, client.ObjectKeyFromObject(&probe), &probe); err != nil {
			b.Fatal(err)
		}
		meta.SetStatusCondition(&probe.Status.Conditions, metav1.Condition{Type: "Ready", Status: metav1.ConditionFalse, Reason: "Probe", Message: msg})
		written := time.Now()
		if err := k.Admin.Status().Update(ctx, &probe); err != nil {
			b.Fatal(err)
		}
		ago := evaluate("the change", `window.seen.then(t => performance.now() - t)`)
		change = append(change, time.Since(written)-time.Duration(ago*float64(time.Millisecond)))
	}
	b.StopTimer()
	report := func(unit string, d []time.Duration) {
		slices.Sort(d)
		q := func(p float64) float64 { return float64(d[int(p*float64(len(d)-1))].Microseconds()) / 1000 }
		b.ReportMetric(q(0.5), "ms-p50-"+unit)
		b.ReportMetric(q(0.9), "ms-p90-"+unit)
		b.ReportMetric(q(1), "ms-max-"+unit)
	}
	report("load", load)
	report("change", change)
}
