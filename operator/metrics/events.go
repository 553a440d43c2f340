package metrics

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

var (
	firstReadyOpts = prometheus.HistogramOpts{
		Name:    "apiary_tenant_first_ready_seconds",
		Help:    "Time from a tenant's creation to its first Ready (status.firstReady), observed by the replica that saw it.",
		Buckets: []float64{15, 30, 45, 60, 90, 120, 180, 300, 600, 1200},
	}
	hostStepDurationOpts = prometheus.HistogramOpts{
		Name:    "apiary_host_step_duration_seconds",
		Help:    "Duration of each attempt of a Host's step (preflight, install, join, upgrade-*, leave, ...), by step and result (Succeeded, Failed).",
		Buckets: []float64{1, 5, 10, 20, 30, 60, 120, 300, 600, 1200},
	}
	hostStepFailuresOpts = prometheus.CounterOpts{
		Name: "apiary_host_step_failures_total",
		Help: "Failed attempts of Host steps, by step and the reason their condition gives.",
	}

	firstReady       = prometheus.NewHistogram(firstReadyOpts)
	hostStepDuration = prometheus.NewHistogramVec(hostStepDurationOpts, []string{"step", "result"})
	hostStepFailures = prometheus.NewCounterVec(hostStepFailuresOpts, []string{"step", "reason"})
)

// Family is a series family this package exports.
type Family struct {
	Name string
	// Histogram: the family's series are Name_bucket, Name_sum and
	// Name_count.
	Histogram bool
}

// Families lists every family the operator exports under the apiary_
// prefix, for checks of what refers to them (the chart's dashboard).
func Families() []Family {
	var fs []Family
	for _, n := range stateFamilies {
		fs = append(fs, Family{Name: n})
	}
	return append(fs,
		Family{Name: firstReadyOpts.Name, Histogram: true},
		Family{Name: hostStepDurationOpts.Name, Histogram: true},
		Family{Name: hostStepFailuresOpts.Name})
}

// Register adds the state collector and the event metrics to reg. A
// collector registered before (an earlier manager in this process) is
// replaced: there is one source of state per process.
func Register(reg prometheus.Registerer, c *Collector) error {
	reg.Unregister(c)
	if err := reg.Register(c); err != nil {
		return err
	}
	for _, m := range []prometheus.Collector{firstReady, hostStepDuration, hostStepFailures} {
		var already prometheus.AlreadyRegisteredError
		if err := reg.Register(m); err != nil && !errors.As(err, &already) {
			return err
		}
	}
	return nil
}

// TenantFirstReady records the time from a tenant's creation to its first
// Ready.
func TenantFirstReady(d time.Duration) { firstReady.Observe(d.Seconds()) }

// HostStepEnded records one attempt of a Host's step; reason is the
// condition's reason when it failed.
func HostStepEnded(step, result, reason string, d time.Duration) {
	hostStepDuration.WithLabelValues(step, result).Observe(d.Seconds())
	if result == apiary.HostStepFailed {
		hostStepFailures.WithLabelValues(step, reason).Inc()
	}
}
