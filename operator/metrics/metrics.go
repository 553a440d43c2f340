// Package metrics is what the operator exports to Prometheus about the
// tenants, DataStores and Hosts it manages (docs/metrics.md lists every
// series): the state, read from the manager's cache when Prometheus
// scrapes, and the durations of what happened, observed as it happens.
//
// Every series is per object (tenant, DataStore, Host) or per step name,
// never per request: a tenant has about 50 state series, a DataStore
// about 10 per member count and condition, a Host 3 or 4.
package metrics

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

// Collector reports the state of every TenantControlPlane, DataStore and
// Host in Reader at each scrape, while Leading says so: the standby
// replicas' caches are as full as the leader's, and series from every
// replica would count each object once per replica.
type Collector struct {
	Reader  client.Reader
	Leading func() bool
	Log     logr.Logger
	// Timeout bounds one scrape's reads of the cache.
	Timeout time.Duration
}

var (
	tenantInfo = newDesc("apiary_tenant_info",
		"A tenant control plane (always 1): the version its control plane runs and the one spec.version asks for, the mode in effect and asked for, its DataStore and endpoint.",
		[]string{"namespace", "tenant", "version", "desired_version", "mode", "desired_mode", "datastore", "endpoint", "phase"}, nil)
	tenantCondition = newDesc("apiary_tenant_condition",
		"1 for the status (true, false, unknown) each condition of a tenant has, 0 for the others.",
		[]string{"namespace", "tenant", "condition", "status"}, nil)
	tenantReplicas = newDesc("apiary_tenant_replicas",
		"Control-plane pods the tenant's Deployment runs (status.replicas).",
		[]string{"namespace", "tenant"}, nil)
	tenantReadyReplicas = newDesc("apiary_tenant_ready_replicas",
		"Ready control-plane pods of the tenant (status.readyReplicas).",
		[]string{"namespace", "tenant"}, nil)
	tenantDesiredReplicas = newDesc("apiary_tenant_desired_replicas",
		"Control-plane pods spec.replicas asks for.",
		[]string{"namespace", "tenant"}, nil)
	tenantCertExpiry = newDesc("apiary_tenant_certificate_expiry_timestamp_seconds",
		"When each certificate issued for the tenant expires (Unix time).",
		[]string{"namespace", "tenant", "certificate"}, nil)
	tenantCertRenew = newDesc("apiary_tenant_certificate_renew_timestamp_seconds",
		"When each leaf certificate of the tenant is due to be re-issued (Unix time; certificate authorities are not renewed on a timer).",
		[]string{"namespace", "tenant", "certificate"}, nil)
	tenantModeSwitch = newDesc("apiary_tenant_mode_switch_phase_started_timestamp_seconds",
		"While a switch between modes runs: when its current phase began (Unix time); absent otherwise.",
		[]string{"namespace", "tenant", "target", "phase"}, nil)
	tenantUpgrade = newDesc("apiary_tenant_upgrading",
		"1 while the tenant's control plane runs another version than spec.version asks for; absent otherwise.",
		[]string{"namespace", "tenant", "from", "to"}, nil)
	tenantUsageBytes = newDesc("apiary_tenant_datastore_bytes",
		"Bytes of the tenant's keys and values in its DataStore, as last measured.",
		[]string{"namespace", "tenant", "datastore"}, nil)
	tenantUsageObjects = newDesc("apiary_tenant_datastore_objects",
		"Keys of the tenant in its DataStore, as last measured.",
		[]string{"namespace", "tenant", "datastore"}, nil)
	tenantQuotaBytes = newDesc("apiary_tenant_datastore_quota_bytes",
		"The tenant's byte budget in its DataStore; absent when unlimited.",
		[]string{"namespace", "tenant", "datastore"}, nil)
	tenantQuotaObjects = newDesc("apiary_tenant_datastore_quota_objects",
		"The tenant's key budget in its DataStore; absent when unlimited.",
		[]string{"namespace", "tenant", "datastore"}, nil)

	dataStoreInfo = newDesc("apiary_datastore_info",
		"A DataStore (always 1); managed is true for an etcd the operator runs.",
		[]string{"datastore", "managed"}, nil)
	dataStoreCondition = newDesc("apiary_datastore_condition",
		"1 for the status (true, false, unknown) each condition of a DataStore has, 0 for the others.",
		[]string{"datastore", "condition", "status"}, nil)
	dataStoreMembers = newDesc("apiary_datastore_members",
		"Members of a managed etcd as etcd lists them, learners included.",
		[]string{"datastore"}, nil)
	dataStoreLearners = newDesc("apiary_datastore_learners",
		"Members of a managed etcd that are learners (not voting yet).",
		[]string{"datastore"}, nil)
	dataStoreMembersReady = newDesc("apiary_datastore_members_ready",
		"Ready members of a managed etcd.",
		[]string{"datastore"}, nil)
	dataStoreDesiredMembers = newDesc("apiary_datastore_desired_members",
		"Members spec.managed.replicas asks for.",
		[]string{"datastore"}, nil)
	dataStoreTenants = newDesc("apiary_datastore_tenants",
		"Tenant control planes bound to the DataStore.",
		[]string{"datastore"}, nil)

	hostInfo = newDesc("apiary_host_info",
		"A Host (always 1): its tenant, the Kubernetes version installed on it, its Node and its phase.",
		[]string{"namespace", "host", "tenant", "version", "node", "phase"}, nil)
	hostFailingStep = newDesc("apiary_host_failing_step_attempts",
		"While a Host's step has failed and waits to be tried again: how many times it was tried; absent otherwise.",
		[]string{"namespace", "host", "tenant", "step"}, nil)
)

// stateFamilies are the names of the state series, in declaration order.
var stateFamilies []string

// newDesc is prometheus.NewDesc that also records the family's name, which
// a Desc does not give back.
func newDesc(name, help string, labels []string, constLabels prometheus.Labels) *prometheus.Desc {
	stateFamilies = append(stateFamilies, name)
	return prometheus.NewDesc(name, help, labels, constLabels)
}

// Describe sends every state series' description.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{
		tenantInfo, tenantCondition, tenantReplicas, tenantReadyReplicas, tenantDesiredReplicas, tenantCertExpiry, tenantCertRenew,
		tenantModeSwitch, tenantUpgrade, tenantUsageBytes, tenantUsageObjects, tenantQuotaBytes, tenantQuotaObjects,
		dataStoreInfo, dataStoreCondition, dataStoreMembers, dataStoreLearners, dataStoreMembersReady, dataStoreDesiredMembers, dataStoreTenants,
		hostInfo, hostFailingStep,
	} {
		ch <- d
	}
}

// Collect reads the objects from the cache and sends their series.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	if c.Leading != nil && !c.Leading() {
		return
	}
	timeout := c.Timeout
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var tenants apiary.TenantControlPlaneList
	if err := c.Reader.List(ctx, &tenants); err != nil {
		c.Log.Error(err, "listing TenantControlPlanes for metrics")
	}
	for i := range tenants.Items {
		collectTenant(ch, &tenants.Items[i])
	}
	var stores apiary.DataStoreList
	if err := c.Reader.List(ctx, &stores); err != nil {
		c.Log.Error(err, "listing DataStores for metrics")
	}
	for i := range stores.Items {
		collectDataStore(ch, &stores.Items[i])
	}
	var hosts apiary.HostList
	if err := c.Reader.List(ctx, &hosts); err != nil {
		c.Log.Error(err, "listing Hosts for metrics")
	}
	for i := range hosts.Items {
		collectHost(ch, &hosts.Items[i])
	}
}

func gauge(ch chan<- prometheus.Metric, d *prometheus.Desc, v float64, labels ...string) {
	ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
}

// conditions sends, for each condition, one series per status with 1 on
// the one it has.
func conditions(ch chan<- prometheus.Metric, d *prometheus.Desc, conds []metav1.Condition, labels ...string) {
	for _, c := range conds {
		for _, s := range []metav1.ConditionStatus{metav1.ConditionTrue, metav1.ConditionFalse, metav1.ConditionUnknown} {
			v := 0.0
			if c.Status == s {
				v = 1
			}
			gauge(ch, d, v, append(append([]string{}, labels...), c.Type, strings.ToLower(string(s)))...)
		}
	}
}

func unix(t metav1.Time) float64 { return float64(t.UnixNano()) / 1e9 }

func collectTenant(ch chan<- prometheus.Metric, tcp *apiary.TenantControlPlane) {
	ns, name := tcp.Namespace, tcp.Name
	st := &tcp.Status
	gauge(ch, tenantInfo, 1, ns, name, st.Version, tcp.Spec.Version, string(st.Mode), string(tcp.Spec.Mode), st.DataStore.Name, st.Endpoint, string(st.Phase))
	conditions(ch, tenantCondition, st.Conditions, ns, name)
	gauge(ch, tenantReplicas, float64(st.Replicas), ns, name)
	gauge(ch, tenantReadyReplicas, float64(st.ReadyReplicas), ns, name)
	if tcp.Spec.Replicas != nil {
		gauge(ch, tenantDesiredReplicas, float64(*tcp.Spec.Replicas), ns, name)
	}
	for _, cert := range st.Certificates {
		gauge(ch, tenantCertExpiry, unix(cert.NotAfter), ns, name, cert.Name)
		if cert.RenewAt != nil {
			gauge(ch, tenantCertRenew, unix(*cert.RenewAt), ns, name, cert.Name)
		}
	}
	if sw := st.ModeSwitch; sw != nil && sw.Finished == nil {
		gauge(ch, tenantModeSwitch, unix(sw.PhaseStarted), ns, name, string(sw.Target), sw.Phase)
	}
	if st.Version != "" && tcp.Spec.Version != "" && st.Version != tcp.Spec.Version {
		gauge(ch, tenantUpgrade, 1, ns, name, st.Version, tcp.Spec.Version)
	}
	if u := st.DataStore.Usage; u != nil {
		ds := st.DataStore.Name
		gauge(ch, tenantUsageBytes, float64(u.Bytes), ns, name, ds)
		gauge(ch, tenantUsageObjects, float64(u.Objects), ns, name, ds)
		if u.Quota.Bytes != nil {
			gauge(ch, tenantQuotaBytes, float64(u.Quota.Bytes.Value()), ns, name, ds)
		}
		if u.Quota.Objects != nil {
			gauge(ch, tenantQuotaObjects, float64(*u.Quota.Objects), ns, name, ds)
		}
	}
}

func collectDataStore(ch chan<- prometheus.Metric, ds *apiary.DataStore) {
	name := ds.Name
	managed := ds.Spec.Managed != nil
	gauge(ch, dataStoreInfo, 1, name, strconv.FormatBool(managed))
	conditions(ch, dataStoreCondition, ds.Status.Conditions, name)
	gauge(ch, dataStoreTenants, float64(ds.Status.Tenants), name)
	if !managed {
		return
	}
	learners := 0
	for _, m := range ds.Status.Members {
		if m.Learner {
			learners++
		}
	}
	gauge(ch, dataStoreMembers, float64(len(ds.Status.Members)), name)
	gauge(ch, dataStoreLearners, float64(learners), name)
	gauge(ch, dataStoreMembersReady, float64(ds.Status.ReadyMembers), name)
	gauge(ch, dataStoreDesiredMembers, float64(ds.Spec.Managed.Replicas), name)
}

func collectHost(ch chan<- prometheus.Metric, h *apiary.Host) {
	tenant := h.Spec.TenantControlPlane
	gauge(ch, hostInfo, 1, h.Namespace, h.Name, tenant, h.Status.Version, h.Status.NodeName, string(h.Status.Phase))
	for _, s := range h.Status.Journal {
		if s.Result == apiary.HostStepFailed {
			gauge(ch, hostFailingStep, float64(s.Attempts), h.Namespace, h.Name, tenant, s.Name)
		}
	}
}
