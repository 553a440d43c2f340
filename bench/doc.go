// Package bench holds Apiary's benchmarks; it has no code of its own. The
// figures they produced, and what they mean, are in docs/benchmarks.md.
//
// Pure benchmarks (rendering, PKI) start no process and run anywhere:
//
//	go test -run '^$' -bench . -benchmem ./bench/...
//
// BenchmarkOperatorMemoryPerTenant and BenchmarkOperatorProcessRSS have the
// integration build tag. They start a real kube-apiserver and etcd (envtest)
// and a second etcd as the DataStore, all from the binaries `make tools`
// builds, and provision 100 tenants. The first runs the operator in the test
// process. The second runs the `apiary operator` binary, which it builds,
// as its own process. Each is an experiment rather than a loop: run it once
// per process, and repeat the command for more samples:
//
//	go test -tags integration -run '^$' -bench BenchmarkOperatorMemoryPerTenant -benchtime=1x -count=1 ./bench/...
//	go test -tags integration -run '^$' -bench BenchmarkOperatorProcessRSS -benchtime=1x -count=1 ./bench/...
//
// BenchmarkTenantUsageScan and BenchmarkTenantUsageWatch (integration tag)
// run a real etcd and measure what a tenant's datastore quota costs: the
// first scan of a tenant, and a write's way to the operator's count.
//
// BenchmarkDashboardStream (integration tag) serves the dashboard's live
// stream as a signed-in user over 100 tenants in a real kube-apiserver and
// times a status write's way to the stream.
//
// `make bench` runs everything. It takes about 5 minutes on 2 cores, mostly
// BenchmarkOperatorProcessRSS waiting on the operator's client-side rate
// limit (see docs/benchmarks.md).
package bench
