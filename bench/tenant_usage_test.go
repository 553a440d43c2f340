//go:build integration

package bench

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/apiaryhq/apiary/datastore"
	"github.com/apiaryhq/apiary/datastore/etcdtest"
)

// usageFixture is a real etcd holding one tenant of n keys of size bytes
// (plus their key names), written as the tenant.
func usageFixture(b *testing.B, n, size int) (*datastore.Client, datastore.Tenant, func(i int) string) {
	b.Helper()
	s := etcdtest.Start(b)
	c, err := datastore.Connect(context.Background(), s.Config())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = c.Close() })
	tenant := datastore.TenantFor(types.UID("b0000000-0000-4000-8000-000000000001"))
	if _, err := c.EnsureTenant(context.Background(), tenant); err != nil {
		b.Fatal(err)
	}
	root := s.RootClient(b)
	key := func(i int) string { return fmt.Sprintf("%s/registry/configmaps/bench/cm-%06d", tenant.Prefix, i) }
	value := strings.Repeat("v", size)
	for i := range n {
		if _, err := root.Put(context.Background(), key(i), value); err != nil {
			b.Fatal(err)
		}
	}
	return c, tenant, key
}

// BenchmarkTenantUsageScan: what the first measurement of a tenant costs
// (Usage, a paged scan of its keys and values at one revision), per tenant
// size. Reported as the time per scan and the throughput.
func BenchmarkTenantUsageScan(b *testing.B) {
	for _, tc := range []struct{ keys, size int }{{1000, 1024}, {10000, 1024}, {1000, 64 << 10}} {
		b.Run(fmt.Sprintf("%dkeys-%dB", tc.keys, tc.size), func(b *testing.B) {
			c, tenant, _ := usageFixture(b, tc.keys, tc.size)
			var u datastore.Usage
			b.ResetTimer()
			for b.Loop() {
				var err error
				if u, err = c.Usage(context.Background(), tenant); err != nil {
					b.Fatal(err)
				}
			}
			if u.Objects != int64(tc.keys) {
				b.Fatalf("usage %+v", u)
			}
			b.ReportMetric(float64(u.Bytes)/(1<<20)/(b.Elapsed().Seconds()/float64(b.N)), "MiB/s")
		})
	}
}

// BenchmarkTenantUsageWatch: how long after a tenant's write the operator
// knows its new usage (put → WatchUsage reports it), which bounds how far
// past its quota a tenant gets before the refusal starts.
func BenchmarkTenantUsageWatch(b *testing.B) {
	c, tenant, key := usageFixture(b, 100, 1024)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var objects atomic.Int64
	seen := make(chan struct{}, 1)
	go func() {
		_ = c.WatchUsage(ctx, tenant, func(u datastore.Usage) {
			objects.Store(u.Objects)
			select {
			case seen <- struct{}{}:
			default:
			}
		})
	}()
	for objects.Load() != 100 {
		time.Sleep(10 * time.Millisecond)
	}
	etcd := c.Etcd()
	var lags []time.Duration
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		want := objects.Load() + 1
		start := time.Now()
		if _, err := etcd.Put(ctx, key(1000+i), "x"); err != nil {
			b.Fatal(err)
		}
		for objects.Load() != want {
			<-seen
		}
		lags = append(lags, time.Since(start))
	}
	b.StopTimer()
	p50, p99 := percentile(lags, 50), percentile(lags, 99)
	b.ReportMetric(float64(p50.Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(p99.Microseconds())/1000, "p99-ms")
}

// percentile is the p-th percentile (nearest rank) of ds.
func percentile(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	sorted := slices.Sorted(slices.Values(ds))
	return sorted[min(len(sorted)-1, (len(sorted)*p+99)/100-1)]
}
