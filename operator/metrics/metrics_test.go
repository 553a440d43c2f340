package metrics

import (
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

func at(s string) metav1.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return metav1.NewTime(t)
}

func objects() []runtime.Object {
	tcp := &apiary.TenantControlPlane{
		ObjectMeta: metav1.ObjectMeta{Namespace: "tenants", Name: "alpha"},
		Spec:       apiary.TenantControlPlaneSpec{Version: "v1.37.2", Mode: apiary.ModeRegistered, Replicas: ptr.To[int32](2)},
		Status: apiary.TenantControlPlaneStatus{
			Phase: apiary.PhaseReady, Version: "v1.36.3", Mode: apiary.ModeStandalone, Endpoint: "https://192.0.2.10:6443",
			Replicas: 3, ReadyReplicas: 2,
			Conditions: []metav1.Condition{
				{Type: apiary.ConditionReady, Status: metav1.ConditionTrue, Reason: "Ready"},
				{Type: apiary.ConditionVersionRolledOut, Status: metav1.ConditionFalse, Reason: "Upgrading"},
			},
			DataStore: apiary.DataStoreBinding{Name: "shared", Usage: &apiary.DataStoreUsage{Bytes: 1500, Objects: 12,
				Quota: apiary.TenantQuota{Bytes: ptr.To(resource.MustParse("10Mi")), Objects: ptr.To[int64](1000)}}},
			Certificates: []apiary.CertificateStatus{
				{Name: "ca", NotAfter: at("2036-01-01T00:00:00Z")},
				{Name: "apiserver", NotAfter: at("2027-01-01T00:00:00Z"), RenewAt: ptr.To(at("2026-12-01T00:00:00Z"))},
			},
			ModeSwitch: &apiary.ModeSwitchStatus{Target: apiary.ModeRegistered, From: apiary.ModeStandalone, Phase: apiary.SwitchStartingHosts,
				Started: at("2026-12-05T10:00:00Z"), PhaseStarted: at("2026-12-05T10:01:00Z")},
		},
	}
	done := &apiary.TenantControlPlane{
		ObjectMeta: metav1.ObjectMeta{Namespace: "tenants", Name: "beta"},
		Spec:       apiary.TenantControlPlaneSpec{Version: "v1.37.2"},
		Status: apiary.TenantControlPlaneStatus{Version: "v1.37.2", Phase: apiary.PhaseNotReady,
			ModeSwitch: &apiary.ModeSwitchStatus{Target: apiary.ModeStandalone, Phase: apiary.SwitchCompleted, Finished: ptr.To(at("2026-12-05T10:00:00Z"))}},
	}
	managed := &apiary.DataStore{
		ObjectMeta: metav1.ObjectMeta{Name: "trio"},
		Spec:       apiary.DataStoreSpec{Managed: &apiary.ManagedEtcd{Replicas: 3}},
		Status: apiary.DataStoreStatus{Tenants: 2, ReadyMembers: 2,
			Members:    []apiary.EtcdMember{{Name: "trio-etcd-0"}, {Name: "trio-etcd-1"}, {Name: "trio-etcd-2", Learner: true}},
			Conditions: []metav1.Condition{{Type: apiary.ConditionMembersReady, Status: metav1.ConditionUnknown, Reason: "Checking"}}},
	}
	external := &apiary.DataStore{ObjectMeta: metav1.ObjectMeta{Name: "shared"}, Status: apiary.DataStoreStatus{Tenants: 1}}
	host := &apiary.Host{
		ObjectMeta: metav1.ObjectMeta{Namespace: "tenants", Name: "worker-1"},
		Spec:       apiary.HostSpec{TenantControlPlane: "alpha"},
		Status: apiary.HostStatus{Phase: apiary.HostPhaseFailed, Version: "v1.36.3", NodeName: "worker-1", Journal: []apiary.HostStep{
			{Name: "preflight", Result: "Succeeded", Attempts: 1},
			{Name: "upgrade-node", Result: apiary.HostStepFailed, Attempts: 3},
		}},
	}
	return []runtime.Object{tcp, done, managed, external, host}
}

func collector(t *testing.T, leading bool) *Collector {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := apiary.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	return &Collector{
		Reader:  fake.NewClientBuilder().WithScheme(scheme).WithRuntimeObjects(objects()...).Build(),
		Leading: func() bool { return leading },
		Log:     logr.Discard(),
	}
}

// The state series of a tenant mid-upgrade and mid-switch, a finished
// one, a managed etcd with a learner, an external DataStore and a Host
// whose step failed: each value as the status says.
func TestCollectorReportsTheStatus(t *testing.T) {
	const want = `
# HELP apiary_datastore_condition 1 for the status (true, false, unknown) each condition of a DataStore has, 0 for the others.
# TYPE apiary_datastore_condition gauge
apiary_datastore_condition{condition="MembersReady",datastore="trio",status="false"} 0
apiary_datastore_condition{condition="MembersReady",datastore="trio",status="true"} 0
apiary_datastore_condition{condition="MembersReady",datastore="trio",status="unknown"} 1
# HELP apiary_datastore_desired_members Members spec.managed.replicas asks for.
# TYPE apiary_datastore_desired_members gauge
apiary_datastore_desired_members{datastore="trio"} 3
# HELP apiary_datastore_info A DataStore (always 1); managed is true for an etcd the operator runs.
# TYPE apiary_datastore_info gauge
apiary_datastore_info{datastore="shared",managed="false"} 1
apiary_datastore_info{datastore="trio",managed="true"} 1
# HELP apiary_datastore_learners Members of a managed etcd that are learners (not voting yet).
# TYPE apiary_datastore_learners gauge
apiary_datastore_learners{datastore="trio"} 1
# HELP apiary_datastore_members Members of a managed etcd as etcd lists them, learners included.
# TYPE apiary_datastore_members gauge
apiary_datastore_members{datastore="trio"} 3
# HELP apiary_datastore_members_ready Ready members of a managed etcd.
# TYPE apiary_datastore_members_ready gauge
apiary_datastore_members_ready{datastore="trio"} 2
# HELP apiary_datastore_tenants Tenant control planes bound to the DataStore.
# TYPE apiary_datastore_tenants gauge
apiary_datastore_tenants{datastore="shared"} 1
apiary_datastore_tenants{datastore="trio"} 2
# HELP apiary_host_failing_step_attempts While a Host's step has failed and waits to be tried again: how many times it was tried; absent otherwise.
# TYPE apiary_host_failing_step_attempts gauge
apiary_host_failing_step_attempts{host="worker-1",namespace="tenants",step="upgrade-node",tenant="alpha"} 3
# HELP apiary_host_info A Host (always 1): its tenant, the Kubernetes version installed on it, its Node and its phase.
# TYPE apiary_host_info gauge
apiary_host_info{host="worker-1",namespace="tenants",node="worker-1",phase="Failed",tenant="alpha",version="v1.36.3"} 1
# HELP apiary_tenant_certificate_expiry_timestamp_seconds When each certificate issued for the tenant expires (Unix time).
# TYPE apiary_tenant_certificate_expiry_timestamp_seconds gauge
apiary_tenant_certificate_expiry_timestamp_seconds{certificate="apiserver",namespace="tenants",tenant="alpha"} 1.7987616e+09
apiary_tenant_certificate_expiry_timestamp_seconds{certificate="ca",namespace="tenants",tenant="alpha"} 2.0827584e+09
# HELP apiary_tenant_certificate_renew_timestamp_seconds When each leaf certificate of the tenant is due to be re-issued (Unix time; certificate authorities are not renewed on a timer).
# TYPE apiary_tenant_certificate_renew_timestamp_seconds gauge
apiary_tenant_certificate_renew_timestamp_seconds{certificate="apiserver",namespace="tenants",tenant="alpha"} 1.7960832e+09
# HELP apiary_tenant_condition 1 for the status (true, false, unknown) each condition of a tenant has, 0 for the others.
# TYPE apiary_tenant_condition gauge
apiary_tenant_condition{condition="Ready",namespace="tenants",status="false",tenant="alpha"} 0
apiary_tenant_condition{condition="Ready",namespace="tenants",status="true",tenant="alpha"} 1
apiary_tenant_condition{condition="Ready",namespace="tenants",status="unknown",tenant="alpha"} 0
apiary_tenant_condition{condition="VersionRolledOut",namespace="tenants",status="false",tenant="alpha"} 1
apiary_tenant_condition{condition="VersionRolledOut",namespace="tenants",status="true",tenant="alpha"} 0
apiary_tenant_condition{condition="VersionRolledOut",namespace="tenants",status="unknown",tenant="alpha"} 0
# HELP apiary_tenant_datastore_bytes Bytes of the tenant's keys and values in its DataStore, as last measured.
# TYPE apiary_tenant_datastore_bytes gauge
apiary_tenant_datastore_bytes{datastore="shared",namespace="tenants",tenant="alpha"} 1500
# HELP apiary_tenant_datastore_objects Keys of the tenant in its DataStore, as last measured.
# TYPE apiary_tenant_datastore_objects gauge
apiary_tenant_datastore_objects{datastore="shared",namespace="tenants",tenant="alpha"} 12
# HELP apiary_tenant_datastore_quota_bytes The tenant's byte budget in its DataStore; absent when unlimited.
# TYPE apiary_tenant_datastore_quota_bytes gauge
apiary_tenant_datastore_quota_bytes{datastore="shared",namespace="tenants",tenant="alpha"} 1.048576e+07
# HELP apiary_tenant_datastore_quota_objects The tenant's key budget in its DataStore; absent when unlimited.
# TYPE apiary_tenant_datastore_quota_objects gauge
apiary_tenant_datastore_quota_objects{datastore="shared",namespace="tenants",tenant="alpha"} 1000
# HELP apiary_tenant_desired_replicas Control-plane pods spec.replicas asks for.
# TYPE apiary_tenant_desired_replicas gauge
apiary_tenant_desired_replicas{namespace="tenants",tenant="alpha"} 2
# HELP apiary_tenant_info A tenant control plane (always 1): the version its control plane runs and the one spec.version asks for, the mode in effect and asked for, its DataStore and endpoint.
# TYPE apiary_tenant_info gauge
apiary_tenant_info{datastore="",desired_mode="",desired_version="v1.37.2",endpoint="",mode="",namespace="tenants",phase="NotReady",tenant="beta",version="v1.37.2"} 1
apiary_tenant_info{datastore="shared",desired_mode="registered",desired_version="v1.37.2",endpoint="https://192.0.2.10:6443",mode="standalone",namespace="tenants",phase="Ready",tenant="alpha",version="v1.36.3"} 1
# HELP apiary_tenant_mode_switch_phase_started_timestamp_seconds While a switch between modes runs: when its current phase began (Unix time); absent otherwise.
# TYPE apiary_tenant_mode_switch_phase_started_timestamp_seconds gauge
apiary_tenant_mode_switch_phase_started_timestamp_seconds{namespace="tenants",phase="StartingHosts",target="registered",tenant="alpha"} 1.79646486e+09
# HELP apiary_tenant_ready_replicas Ready control-plane pods of the tenant (status.readyReplicas).
# TYPE apiary_tenant_ready_replicas gauge
apiary_tenant_ready_replicas{namespace="tenants",tenant="alpha"} 2
apiary_tenant_ready_replicas{namespace="tenants",tenant="beta"} 0
# HELP apiary_tenant_replicas Control-plane pods the tenant's Deployment runs (status.replicas).
# TYPE apiary_tenant_replicas gauge
apiary_tenant_replicas{namespace="tenants",tenant="alpha"} 3
apiary_tenant_replicas{namespace="tenants",tenant="beta"} 0
# HELP apiary_tenant_upgrading 1 while the tenant's control plane runs another version than spec.version asks for; absent otherwise.
# TYPE apiary_tenant_upgrading gauge
apiary_tenant_upgrading{from="v1.36.3",namespace="tenants",tenant="alpha",to="v1.37.2"} 1
`
	if err := testutil.CollectAndCompare(collector(t, true), strings.NewReader(want)); err != nil {
		t.Error(err)
	}
}

// A standby reports nothing: its series would double every sum.
func TestCollectorIsQuietOffTheLeader(t *testing.T) {
	if n := testutil.CollectAndCount(collector(t, false)); n != 0 {
		t.Fatalf("a standby replica reported %d series", n)
	}
}

// Registering again (a second manager in one process) replaces the state
// collector and keeps the event metrics.
func TestRegisterTwice(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	if err := Register(reg, collector(t, true)); err != nil {
		t.Fatal(err)
	}
	if err := Register(reg, collector(t, false)); err != nil {
		t.Fatalf("second Register: %v", err)
	}
	HostStepEnded("join", apiary.HostStepFailed, "JoinFailed", 12*time.Second)
	TenantFirstReady(40 * time.Second)
	n, err := testutil.GatherAndCount(reg, "apiary_tenant_info", "apiary_host_step_failures_total", "apiary_tenant_first_ready_seconds")
	if err != nil {
		t.Fatal(err)
	}
	// No tenant series (the second collector is not leading), one
	// failure counter, one histogram.
	if n != 2 {
		t.Fatalf("%d series, want 2", n)
	}
}

// Families names exactly the families a leader exports (the fixture has
// every kind of series), with the histograms marked.
func TestFamiliesAreWhatIsExported(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	if err := Register(reg, collector(t, true)); err != nil {
		t.Fatal(err)
	}
	HostStepEnded("join", apiary.HostStepFailed, "JoinFailed", 12*time.Second)
	TenantFirstReady(40 * time.Second)
	gathered, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	exported := map[string]bool{}
	for _, mf := range gathered {
		exported[mf.GetName()] = mf.GetType() == dto.MetricType_HISTOGRAM
	}
	listed := map[string]bool{}
	for _, f := range Families() {
		listed[f.Name] = f.Histogram
	}
	if !maps.Equal(exported, listed) {
		t.Errorf("Families() = %v, the registry exports %v", listed, exported)
	}
}
