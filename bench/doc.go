// Package bench holds Apiary's benchmarks; it has no code of its own. The
// figures they produced, and what they mean, are in docs/benchmarks.md.
//
// Pure benchmarks (rendering, PKI) start no process and run anywhere:
//
//	go test -run '^$' -bench . -benchmem ./bench/...
//
// BenchmarkOperatorMemoryPerTenant has the integration build tag: it starts
// a real kube-apiserver and etcd (envtest) plus a second etcd as the
// DataStore, from the binaries `make tools` builds, runs the operator in the
// test process and provisions 100 tenants. It is an experiment rather than
// a loop, so run it once per process and repeat the command for more
// samples:
//
//	go test -tags integration -run '^$' -bench BenchmarkOperatorMemoryPerTenant -benchtime=1x -count=1 ./bench/...
//
// `make bench` runs everything (about 2 minutes on 2 cores).
package bench
