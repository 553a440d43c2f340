//go:build integration

package operator_test

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/apiaryhq/apiary/cli"
	"github.com/apiaryhq/apiary/datastore"
	"github.com/apiaryhq/apiary/datastore/etcdtest"
	"github.com/apiaryhq/apiary/internal/testenv"
	"github.com/apiaryhq/apiary/operator"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/operator/controllers"
	"github.com/apiaryhq/apiary/operator/render"
	"github.com/apiaryhq/apiary/operator/render/managedetcd"
	"github.com/apiaryhq/apiary/pki"
)

const (
	systemNS  = "apiary-system"
	tenantsNS = "tenants"
	resync    = 2 * time.Second
)

// suite is one management API server (envtest) with the operator and its
// webhooks running, and one real etcd with auth and TLS as the DataStore.
type suite struct {
	t          *testing.T
	ctx        context.Context
	env        *envtest.Environment
	cfg        *rest.Config
	c          client.Client
	kubeconfig string // of the management API server, for the CLI
	etcd       *etcdtest.Server
	root       *clientv3.Client
}

// TestOperator runs the operator against a real kube-apiserver and etcd.
// Subtests share the environment and run in order.
func TestOperator(t *testing.T) {
	ctrllog.SetLogger(zap.New(zap.WriteTo(&testLogWriter{t: t}), zap.UseDevMode(true)))
	env, cfg := testenv.Start(t, testenv.Options{Webhooks: true})
	s := &suite{t: t, ctx: t.Context(), env: env, cfg: cfg}
	scheme, err := operator.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	if s.c, err = client.New(cfg, client.Options{Scheme: scheme}); err != nil {
		t.Fatal(err)
	}
	s.kubeconfig = writeKubeconfig(t, cfg)
	s.etcd = etcdtest.Start(t)
	s.root = s.etcd.RootClient(t)

	for _, ns := range []string{systemNS, tenantsNS} {
		s.must(s.c.Create(s.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}))
	}
	s.createDataStore("default", s.etcd.Config())

	opts := operator.DefaultOptions()
	opts.MetricsAddr, opts.ProbeAddr = "0", "0"
	wh := env.WebhookInstallOptions
	opts.WebhookHost, opts.WebhookPort, opts.WebhookCertDir = wh.LocalServingHost, wh.LocalServingPort, wh.LocalServingCertDir
	opts.ResyncPeriod = resync
	opts.DataStoreCheckInterval = time.Second
	mgr, cleanup, err := operator.NewManager(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	mgrCtx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := mgr.Start(mgrCtx); err != nil {
			t.Errorf("manager: %v", err)
		}
	})
	t.Cleanup(func() { cancel(); wg.Wait(); cleanup() })
	s.waitForWebhook()
	s.eventually("DataStore default Ready", 30*time.Second, func() error {
		return s.dataStoreCondition("default", apiary.ConditionReady, metav1.ConditionTrue, controllers.ReasonAvailable)
	})

	t.Run("Defaults", s.testDefaults)
	t.Run("ValidationOnCreate", s.testValidationOnCreate)
	t.Run("ValidationOnUpdate", s.testValidationOnUpdate)
	t.Run("Provisions", s.testProvisions)
	t.Run("CertificateLifetimeFollowsTheSpec", s.testCertificateLifetime)
	t.Run("ReadyTenantServesFromRestrictedEtcdUserAndIsQuiet", s.testReadyTenant)
	t.Run("QuotaRefusesWritesInTheTenant", s.testQuota)
	t.Run("AdmissionChecksTheAuthor", s.testAdmissionChecksTheAuthor)
	t.Run("AuthenticationReachesTheAPIServer", s.testAuthentication)
	t.Run("TenantsAreIsolated", s.testIsolation)
	t.Run("DeleteRemovesEverything", s.testDelete)
	t.Run("ForeignSecretIsNotAdopted", s.testForeignSecret)
	t.Run("DataStoreFailures", s.testDataStoreFailures)
	t.Run("DataStoreDeletionBlockedWhileUsed", s.testDataStoreProtection)
	t.Run("ManagedDataStore", s.testManagedDataStore)
	// Last: it removes the webhook configurations.
	t.Run("ControllerRechecksWithoutWebhook", s.testControllerRechecks)
}

type testLogWriter struct {
	mu sync.Mutex
	t  *testing.T
}

func (w *testLogWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if os.Getenv("APIARY_TEST_LOGS") != "" {
		w.t.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

func (s *suite) must(err error) {
	s.t.Helper()
	if err != nil {
		s.t.Fatal(err)
	}
}

// eventually is testenv.Eventually.
func eventually(t *testing.T, what string, timeout time.Duration, f func() error) {
	t.Helper()
	testenv.Eventually(t, what, timeout, f)
}

func (s *suite) eventually(what string, timeout time.Duration, f func() error) {
	s.t.Helper()
	eventually(s.t, what, timeout, f)
}

func writeKubeconfig(t *testing.T, cfg *rest.Config) string {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["envtest"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["envtest"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData, Token: cfg.BearerToken}
	kc.Contexts["envtest"] = &clientcmdapi.Context{Cluster: "envtest", AuthInfo: "envtest"}
	kc.CurrentContext = "envtest"
	path := filepath.Join(t.TempDir(), "management.kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// createDataStore stores a DataStore's TLS material in Secrets and creates
// the DataStore.
func (s *suite) createDataStore(name string, cfg datastore.Config) {
	s.t.Helper()
	ca := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name + "-etcd-ca", Namespace: systemNS}, Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{corev1.TLSCertKey: cfg.CACert, corev1.TLSPrivateKeyKey: cfg.CAKey}}
	root := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name + "-etcd-root", Namespace: systemNS}, Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{corev1.TLSCertKey: cfg.ClientCert, corev1.TLSPrivateKeyKey: cfg.ClientKey}}
	for _, sec := range []*corev1.Secret{ca, root} {
		s.must(s.c.Create(s.ctx, sec))
	}
	s.must(s.c.Create(s.ctx, &apiary.DataStore{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: apiary.DataStoreSpec{
			Endpoints: cfg.Endpoints,
			TLS: &apiary.DataStoreTLS{
				CASecretRef:     apiary.SecretReference{Name: ca.Name, Namespace: systemNS},
				ClientSecretRef: apiary.SecretReference{Name: root.Name, Namespace: systemNS},
			},
		},
	}))
}

func (s *suite) waitForWebhook() {
	s.eventually("webhook serving", 30*time.Second, func() error {
		tcp := newTCP("probe", "")
		return s.c.Create(s.ctx, tcp, client.DryRunAll)
	})
}

func newTCP(name, dataStore string) *apiary.TenantControlPlane {
	return &apiary.TenantControlPlane{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: tenantsNS},
		Spec:       apiary.TenantControlPlaneSpec{DataStore: dataStore, Network: apiary.NetworkSpec{ServiceType: corev1.ServiceTypeClusterIP}},
	}
}

func (s *suite) getTCP(name string) *apiary.TenantControlPlane {
	s.t.Helper()
	var tcp apiary.TenantControlPlane
	s.must(s.c.Get(s.ctx, client.ObjectKey{Namespace: tenantsNS, Name: name}, &tcp))
	return &tcp
}

func conditionIs(conds []metav1.Condition, typ string, status metav1.ConditionStatus, reason string) error {
	c := meta.FindStatusCondition(conds, typ)
	if c == nil {
		return fmt.Errorf("no %s condition yet (conditions: %v)", typ, conds)
	}
	if c.Status != status || (reason != "" && c.Reason != reason) {
		return fmt.Errorf("%s is %s/%s (%s), want %s/%s", typ, c.Status, c.Reason, c.Message, status, reason)
	}
	return nil
}

func (s *suite) tcpCondition(name, typ string, status metav1.ConditionStatus, reason string) error {
	var tcp apiary.TenantControlPlane
	if err := s.c.Get(s.ctx, client.ObjectKey{Namespace: tenantsNS, Name: name}, &tcp); err != nil {
		return err
	}
	return conditionIs(tcp.Status.Conditions, typ, status, reason)
}

func (s *suite) dataStoreCondition(name, typ string, status metav1.ConditionStatus, reason string) error {
	var ds apiary.DataStore
	if err := s.c.Get(s.ctx, client.ObjectKey{Name: name}, &ds); err != nil {
		return err
	}
	return conditionIs(ds.Status.Conditions, typ, status, reason)
}

func (s *suite) testDefaults(t *testing.T) {
	tcp := &apiary.TenantControlPlane{ObjectMeta: metav1.ObjectMeta{Name: "defaults", Namespace: tenantsNS}}
	if err := s.c.Create(s.ctx, tcp, client.DryRunAll); err != nil {
		t.Fatal(err)
	}
	sp := tcp.Spec
	n := sp.Network
	got := fmt.Sprintf("%s %s %d %s %d %s %s %s %s %v %v %v", sp.Version, sp.Mode, ptr.Deref(sp.Replicas, 0), n.ServiceType, n.Port, n.PodCIDR, n.ServiceCIDR, n.DNSServiceIP, n.ClusterDomain,
		*sp.Addons.CoreDNS.Enabled, *sp.Addons.KubeProxy.Enabled, *sp.Addons.Konnectivity.Enabled)
	want := "v1.37.2 standalone 2 LoadBalancer 6443 10.244.0.0/16 10.96.0.0/16 10.96.0.10 cluster.local true true true"
	if got != want {
		t.Errorf("defaults:\n got %s\nwant %s", got, want)
	}
	// dnsServiceIP follows a custom serviceCIDR.
	tcp = &apiary.TenantControlPlane{ObjectMeta: metav1.ObjectMeta{Name: "defaults", Namespace: tenantsNS},
		Spec: apiary.TenantControlPlaneSpec{Network: apiary.NetworkSpec{ServiceCIDR: "172.20.0.0/16"}}}
	if err := s.c.Create(s.ctx, tcp, client.DryRunAll); err != nil {
		t.Fatal(err)
	}
	if tcp.Spec.Network.DNSServiceIP != "172.20.0.10" {
		t.Errorf("dnsServiceIP = %s, want 172.20.0.10", tcp.Spec.Network.DNSServiceIP)
	}
}

// wantRejected checks that err is an Invalid error from the API whose
// message names the field and states the rule.
func wantRejected(t *testing.T, err error, field, rule string) {
	t.Helper()
	if err == nil {
		t.Fatalf("accepted; want rejection naming %s (%s)", field, rule)
	}
	if !apierrors.IsInvalid(err) && !apierrors.IsForbidden(err) {
		t.Fatalf("error is not Invalid: %v", err)
	}
	if !strings.Contains(err.Error(), field) || !strings.Contains(err.Error(), rule) {
		t.Fatalf("error does not name %q with rule %q:\n%v", field, rule, err)
	}
}

func (s *suite) testValidationOnCreate(t *testing.T) {
	cases := []struct {
		name        string
		mutate      func(*apiary.TenantControlPlane)
		field, rule string
	}{
		{"version without v", func(p *apiary.TenantControlPlane) { p.Spec.Version = "1.37.2" }, "spec.version", "vMAJOR.MINOR.PATCH"},
		{"version garbage", func(p *apiary.TenantControlPlane) { p.Spec.Version = "latest" }, "spec.version", "vMAJOR.MINOR.PATCH"},
		{"version too old", func(p *apiary.TenantControlPlane) { p.Spec.Version = "v1.34.3" }, "spec.version", "supported versions are v1.35.x to v1.37.x"},
		{"version too new", func(p *apiary.TenantControlPlane) { p.Spec.Version = "v1.38.0" }, "spec.version", "supported versions are v1.35.x to v1.37.x"},
		{"pre-release", func(p *apiary.TenantControlPlane) { p.Spec.Version = "v1.37.0-rc.1" }, "spec.version", "pre-release"},
		{"mode", func(p *apiary.TenantControlPlane) { p.Spec.Mode = "hybrid" }, "spec.mode", "Unsupported value"},
		{"replicas", func(p *apiary.TenantControlPlane) { p.Spec.Replicas = ptr.To(int32(9)) }, "spec.replicas", "less than or equal to 7"},
		{"overlapping CIDRs", func(p *apiary.TenantControlPlane) { p.Spec.Network.PodCIDR = "10.96.0.0/12" }, "spec.network.serviceCIDR", "must not overlap podCIDR 10.96.0.0/12"},
		{"pod CIDR not a network address", func(p *apiary.TenantControlPlane) { p.Spec.Network.PodCIDR = "10.244.1.0/16" }, "spec.network.podCIDR", "network address"},
		{"service CIDR garbage", func(p *apiary.TenantControlPlane) { p.Spec.Network.ServiceCIDR = "banana" }, "spec.network.serviceCIDR", "must be a CIDR"},
		{"service CIDR too large", func(p *apiary.TenantControlPlane) {
			p.Spec.Network.ServiceCIDR = "172.0.0.0/8"
			p.Spec.Network.DNSServiceIP = "172.0.0.10"
		}, "spec.network.serviceCIDR", "larger than /12"},
		{"mixed families", func(p *apiary.TenantControlPlane) {
			p.Spec.Network.ServiceCIDR = "fd00::/108"
			p.Spec.Network.DNSServiceIP = "fd00::a"
		}, "spec.network.serviceCIDR", "same IP family"},
		{"DNS IP outside", func(p *apiary.TenantControlPlane) { p.Spec.Network.DNSServiceIP = "10.97.0.10" }, "spec.network.dnsServiceIP", "inside serviceCIDR 10.96.0.0/16"},
		{"DNS IP of kubernetes", func(p *apiary.TenantControlPlane) { p.Spec.Network.DNSServiceIP = "10.96.0.1" }, "spec.network.dnsServiceIP", "kubernetes Service"},
		{"cluster domain", func(p *apiary.TenantControlPlane) { p.Spec.Network.ClusterDomain = "Bad_Domain" }, "spec.network.clusterDomain", "DNS subdomain"},
		{"address", func(p *apiary.TenantControlPlane) { p.Spec.Network.Address = "not-an-ip" }, "spec.network.address", "IP address"},
		{"service type", func(p *apiary.TenantControlPlane) { p.Spec.Network.ServiceType = "ExternalName" }, "spec.network.serviceType", "Unsupported value"},
		{"cert SAN", func(p *apiary.TenantControlPlane) { p.Spec.Network.CertSANs = []string{"bad_name!"} }, "spec.network.certSANs[0]", "IP address or a DNS name"},
		{"protected extra arg", func(p *apiary.TenantControlPlane) {
			p.Spec.APIServer.ExtraArgs = map[string]string{"etcd-servers": "https://elsewhere:2379"}
		}, "spec.apiServer.extraArgs[etcd-servers]", "--etcd-servers cannot be set in extraArgs"},
		{"extra arg with dashes", func(p *apiary.TenantControlPlane) { p.Spec.Scheduler.ExtraArgs = map[string]string{"--v": "4"} }, "spec.scheduler.extraArgs[--v]", "must be a flag name matching ^[a-z0-9][a-z0-9-]*$"},
		{"name not DNS-1035", func(p *apiary.TenantControlPlane) { p.Name = "9lives" }, "metadata.name", "DNS-1035"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tcp := newTCP("invalid", "default")
			tc.mutate(tcp)
			err := s.c.Create(s.ctx, tcp)
			wantRejected(t, err, tc.field, tc.rule)
			// Nothing was created.
			if err := s.c.Get(s.ctx, client.ObjectKeyFromObject(tcp), &apiary.TenantControlPlane{}); !apierrors.IsNotFound(err) {
				t.Errorf("rejected object exists: %v", err)
			}
		})
	}
}

func (s *suite) testValidationOnUpdate(t *testing.T) {
	// A tenant on a DataStore that does not exist: the operator leaves it
	// unprovisioned, which keeps this test about admission only.
	base := newTCP("upd", "nowhere")
	base.Spec.Version = "v1.36.4"
	s.must(s.c.Create(s.ctx, base))
	t.Cleanup(func() { _ = s.c.Delete(s.ctx, base) })
	cases := []struct {
		name        string
		mutate      func(*apiary.TenantControlPlane)
		field, rule string
	}{
		{"downgrade", func(p *apiary.TenantControlPlane) { p.Spec.Version = "v1.36.3" }, "spec.version", "downgrades are not supported"},
		{"downgrade minor", func(p *apiary.TenantControlPlane) { p.Spec.Version = "v1.35.9" }, "spec.version", "downgrades are not supported"},
		{"dataStore", func(p *apiary.TenantControlPlane) { p.Spec.DataStore = "default" }, "spec.dataStore", "is immutable"},
		{"podCIDR", func(p *apiary.TenantControlPlane) { p.Spec.Network.PodCIDR = "10.245.0.0/16" }, "spec.network.podCIDR", "is immutable"},
		{"serviceCIDR", func(p *apiary.TenantControlPlane) {
			p.Spec.Network.ServiceCIDR = "10.97.0.0/16"
			p.Spec.Network.DNSServiceIP = "10.97.0.10"
		}, "spec.network.serviceCIDR", "is immutable"},
		{"dnsServiceIP", func(p *apiary.TenantControlPlane) { p.Spec.Network.DNSServiceIP = "10.96.0.53" }, "spec.network.dnsServiceIP", "is immutable"},
		{"clusterDomain", func(p *apiary.TenantControlPlane) { p.Spec.Network.ClusterDomain = "tenant.local" }, "spec.network.clusterDomain", "is immutable"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := s.getTCP("upd")
			err := s.updateTCP("upd", tc.mutate)
			wantRejected(t, err, tc.field, tc.rule)
			if after := s.getTCP("upd"); after.Generation != before.Generation {
				t.Errorf("rejected update changed the spec")
			}
		})
	}
	t.Run("skipped minor", func(t *testing.T) {
		old := newTCP("upd-skip", "nowhere")
		old.Spec.Version = "v1.35.2"
		s.must(s.c.Create(s.ctx, old))
		t.Cleanup(func() { _ = s.c.Delete(s.ctx, old) })
		err := s.updateTCP("upd-skip", func(p *apiary.TenantControlPlane) { p.Spec.Version = "v1.37.2" })
		wantRejected(t, err, "spec.version", "must not skip a minor version: upgrade from v1.35.2 to v1.36 first")
	})
	t.Run("one minor up and mutable fields are accepted", func(t *testing.T) {
		s.must(s.updateTCP("upd", func(p *apiary.TenantControlPlane) {
			p.Spec.Version = "v1.37.2"
			p.Spec.Replicas = ptr.To(int32(3))
			p.Spec.Network.CertSANs = []string{"api.example.com"}
		}))
	})
}

// updateTCP changes a tenant, retrying on conflicts with the operator's own
// writes (finalizer, status), and returns the first other outcome.
func (s *suite) updateTCP(name string, mutate func(*apiary.TenantControlPlane)) error {
	for {
		tcp := s.getTCP(name)
		mutate(tcp)
		err := s.c.Update(s.ctx, tcp)
		if !apierrors.IsConflict(err) {
			return err
		}
	}
}

// secretsOf lists the Secrets of a tenant by kind.
func (s *suite) secretsOf(name string) (map[render.SecretKind]corev1.Secret, error) {
	var list corev1.SecretList
	if err := s.c.List(s.ctx, &list, client.InNamespace(tenantsNS), client.MatchingLabels{render.LabelTenant: name}); err != nil {
		return nil, err
	}
	out := map[render.SecretKind]corev1.Secret{}
	for _, sec := range list.Items {
		out[render.SecretKind(sec.Labels[render.LabelSecret])] = sec
	}
	return out, nil
}

func (s *suite) testProvisions(t *testing.T) {
	tcp := newTCP("alpha", "default")
	s.must(s.c.Create(s.ctx, tcp))
	s.eventually("alpha certificates", 30*time.Second, func() error {
		return s.tcpCondition("alpha", apiary.ConditionCertificatesReady, metav1.ConditionTrue, controllers.ReasonIssued)
	})
	got := s.getTCP("alpha")
	for _, want := range []struct {
		typ    string
		status metav1.ConditionStatus
		reason string
	}{
		{apiary.ConditionDataStoreReady, metav1.ConditionTrue, controllers.ReasonBound},
		{apiary.ConditionCertificatesReady, metav1.ConditionTrue, controllers.ReasonIssued},
		{apiary.ConditionEndpointReady, metav1.ConditionTrue, controllers.ReasonAddressAssigned},
		// envtest runs no kubelet: the pods never become ready.
		{apiary.ConditionControlPlaneAvailable, metav1.ConditionFalse, controllers.ReasonNoReadyReplicas},
		{apiary.ConditionReady, metav1.ConditionFalse, controllers.ReasonWaitingForPrerequisites},
	} {
		if err := conditionIs(got.Status.Conditions, want.typ, want.status, want.reason); err != nil {
			t.Error(err)
		}
	}
	st := got.Status
	tenant := datastore.TenantFor(got.UID)
	if b := st.DataStore; b.Name != "default" || b.Prefix != tenant.Prefix || b.User != tenant.User {
		t.Errorf("status.dataStore = %+v, want default %+v", st.DataStore, tenant)
	}
	if st.Phase != apiary.PhaseProvisioning || st.Mode != apiary.ModeStandalone || st.KubeconfigSecret != "alpha-admin-kubeconfig" || st.ObservedGeneration != got.Generation {
		t.Errorf("status phase=%s mode=%s kubeconfigSecret=%s observedGeneration=%d", st.Phase, st.Mode, st.KubeconfigSecret, st.ObservedGeneration)
	}
	var svc corev1.Service
	s.must(s.c.Get(s.ctx, client.ObjectKey{Namespace: tenantsNS, Name: "alpha"}, &svc))
	if want := fmt.Sprintf("https://%s:6443", svc.Spec.ClusterIP); st.Endpoint != want {
		t.Errorf("endpoint %q, want %q", st.Endpoint, want)
	}
	secrets, err := s.secretsOf("alpha")
	s.must(err)
	for _, kind := range render.AllSecretKinds {
		if _, ok := secrets[kind]; !ok {
			t.Errorf("Secret %s missing", kind)
		}
	}
	// Every Secret holds a certificate but the service-account key pair
	// and the CA trust bundle.
	if want := len(render.AllSecretKinds) - 2; len(st.Certificates) != want {
		t.Errorf("status.certificates has %d entries, want %d: %+v", len(st.Certificates), want, st.Certificates)
	}
	for _, c := range st.Certificates {
		if c.NotAfter.Time.Before(time.Now().Add(300 * 24 * time.Hour)) {
			t.Errorf("certificate %s expires %s", c.Name, c.NotAfter)
		}
	}
	// The serving certificate names the Service's ClusterIP and DNS names,
	// and chains to the tenant CA.
	caKP, err := pki.ParseKeyPair(secrets[render.SecretCA].Data["tls.crt"], secrets[render.SecretCA].Data["tls.key"])
	s.must(err)
	serving, err := pki.ParseKeyPair(secrets[render.SecretAPIServer].Data["tls.crt"], secrets[render.SecretAPIServer].Data["tls.key"])
	s.must(err)
	pool := x509.NewCertPool()
	pool.AddCert(caKP.Cert)
	for _, name := range []string{svc.Spec.ClusterIP, "alpha.tenants.svc", "kubernetes.default.svc.cluster.local", "10.96.0.1", "127.0.0.1"} {
		if _, err := serving.Cert.Verify(x509.VerifyOptions{DNSName: name, Roots: pool}); err != nil {
			t.Errorf("serving certificate for %s: %v", name, err)
		}
	}
	// The datastore client certificate is the tenant's etcd user, and etcd
	// knows the user and its role.
	dsClient := secrets[render.SecretDataStoreClient]
	block, _ := pem.Decode(dsClient.Data["tls.crt"])
	cert, err := x509.ParseCertificate(block.Bytes)
	s.must(err)
	if cert.Subject.CommonName != tenant.User {
		t.Errorf("datastore client CN %q, want %q", cert.Subject.CommonName, tenant.User)
	}
	s.wantEtcdTenant(t, tenant, true)
	// The exported admin kubeconfig is in kubeadm's revocable group; only
	// the operator's own, never exported, is system:masters.
	for kind, want := range map[render.SecretKind][2]string{
		render.SecretAdminKubeconfig:    {render.AdminCN, render.ClusterAdminsGroup},
		render.SecretOperatorKubeconfig: {render.OperatorCN, render.MastersGroup},
	} {
		cfg, err := clientcmd.Load(secrets[kind].Data[apiary.KubeconfigKey])
		s.must(err)
		for _, auth := range cfg.AuthInfos {
			block, _ := pem.Decode(auth.ClientCertificateData)
			cert, err := x509.ParseCertificate(block.Bytes)
			s.must(err)
			if cert.Subject.CommonName != want[0] || !slices.Equal(cert.Subject.Organization, []string{want[1]}) {
				t.Errorf("%s: client certificate %s %v, want %s %s", kind, cert.Subject.CommonName, cert.Subject.Organization, want[0], want[1])
			}
		}
	}

	// The network boundary, owned by the tenant.
	var np networkingv1.NetworkPolicy
	s.must(s.c.Get(s.ctx, client.ObjectKey{Namespace: tenantsNS, Name: render.NetworkPolicyName("alpha")}, &np))
	if ref := metav1.GetControllerOf(&np); ref == nil || ref.UID != got.UID || len(np.Spec.PolicyTypes) != 2 {
		t.Errorf("NetworkPolicy owner %v, types %v", ref, np.Spec.PolicyTypes)
	}

	var dep appsv1.Deployment
	s.must(s.c.Get(s.ctx, client.ObjectKey{Namespace: tenantsNS, Name: "alpha"}, &dep))
	if dep.Spec.Template.Annotations[render.AnnotationConfigHash] == "" || *dep.Spec.Replicas != 2 {
		t.Errorf("Deployment: hash %q replicas %d", dep.Spec.Template.Annotations[render.AnnotationConfigHash], *dep.Spec.Replicas)
	}
	if len(dep.ManagedFields) != 1 || dep.ManagedFields[0].Manager != controllers.FieldOwner {
		t.Errorf("Deployment managed by %v, want only %s", dep.ManagedFields, controllers.FieldOwner)
	}
	if !s.hasEvent(t, "alpha", controllers.ReasonIssued) || !s.hasEvent(t, "alpha", controllers.ReasonBound) {
		t.Errorf("no Issued/Bound events for alpha")
	}

	// kubectl scale (the scale subresource) reaches the Deployment, and the
	// subresource reports the pods' selector.
	scale := &autoscalingv1.Scale{Spec: autoscalingv1.ScaleSpec{Replicas: 3}}
	s.must(s.c.SubResource("scale").Update(s.ctx, got, client.WithSubResourceBody(scale)))
	eventually(t, "scale to 3", 20*time.Second, func() error {
		var d appsv1.Deployment
		if err := s.c.Get(s.ctx, client.ObjectKey{Namespace: tenantsNS, Name: "alpha"}, &d); err != nil {
			return err
		}
		if *d.Spec.Replicas != 3 {
			return fmt.Errorf("Deployment has %d replicas", *d.Spec.Replicas)
		}
		return nil
	})
	s.must(s.c.SubResource("scale").Get(s.ctx, got, scale))
	if scale.Status.Selector != "apiary.dev/tenant=alpha,app.kubernetes.io/component=control-plane" {
		t.Errorf("scale selector %q", scale.Status.Selector)
	}
}

// testCertificateLifetime: status.certificates says when each leaf is
// renewed (CAs are not on a timer); shortening spec.certificates.validity
// re-issues every leaf at once, in one roll of the control plane, and keeps
// the CAs; going back to the defaults re-issues them for a year.
func (s *suite) testCertificateLifetime(t *testing.T) {
	const name = "alpha"
	checkStatus := func(validity, renewBefore time.Duration) error {
		tcp := s.getTCP(name)
		if len(tcp.Status.Certificates) == 0 {
			return errors.New("no status.certificates")
		}
		for _, c := range tcp.Status.Certificates {
			isCA := c.Name == string(render.SecretCA) || c.Name == string(render.SecretFrontProxyCA)
			switch {
			case isCA && c.RenewAt != nil:
				return fmt.Errorf("CA %s has renewAt %s", c.Name, c.RenewAt)
			case isCA:
			case c.RenewAt == nil:
				return fmt.Errorf("%s has no renewAt", c.Name)
			case c.NotAfter.Sub(c.RenewAt.Time) != renewBefore:
				return fmt.Errorf("%s renewAt %s is %s before notAfter %s, want %s", c.Name, c.RenewAt, c.NotAfter.Sub(c.RenewAt.Time), c.NotAfter, renewBefore)
			case time.Until(c.NotAfter.Time) > validity:
				return fmt.Errorf("%s notAfter %s is more than %s away", c.Name, c.NotAfter, validity)
			}
		}
		return nil
	}
	if err := checkStatus(apiary.DefaultCertificateValidity, apiary.DefaultCertificateRenewBefore); err != nil {
		t.Fatal(err)
	}
	hashAndGeneration := func() (string, int64) {
		var dep appsv1.Deployment
		s.must(s.c.Get(s.ctx, client.ObjectKey{Namespace: tenantsNS, Name: name}, &dep))
		return dep.Spec.Template.Annotations[render.AnnotationConfigHash], dep.Generation
	}
	before, err := s.secretsOf(name)
	s.must(err)
	hash, generation := hashAndGeneration()

	s.must(s.updateTCP(name, func(tcp *apiary.TenantControlPlane) {
		tcp.Spec.Certificates = apiary.CertificatesSpec{Validity: &metav1.Duration{Duration: 2 * time.Minute}, RenewBefore: &metav1.Duration{Duration: time.Minute}}
	}))
	eventually(t, "leaves re-issued for 2m", 30*time.Second, func() error { return checkStatus(2*time.Minute, time.Minute) })
	after, err := s.secretsOf(name)
	s.must(err)
	for _, kind := range []render.SecretKind{render.SecretCA, render.SecretFrontProxyCA, render.SecretServiceAccount} {
		if !maps.EqualFunc(before[kind].Data, after[kind].Data, bytes.Equal) {
			t.Errorf("Secret %s changed with the leaves' validity", kind)
		}
	}
	serving, err := pki.ParseKeyPair(after[render.SecretAPIServer].Data["tls.crt"], after[render.SecretAPIServer].Data["tls.key"])
	s.must(err)
	// NotBefore is backdated five minutes for peers whose clock is behind.
	if life := serving.Cert.NotAfter.Sub(serving.Cert.NotBefore); life != 7*time.Minute {
		t.Errorf("serving certificate valid from %s to %s (%s), want 2m after 5m backdating", serving.Cert.NotBefore, serving.Cert.NotAfter, life)
	}
	eventually(t, "one roll of the Deployment", 10*time.Second, func() error {
		if h, g := hashAndGeneration(); h == hash || g != generation+1 {
			return fmt.Errorf("Deployment generation %d → %d, hash changed: %t; want one new generation with a new hash", generation, g, h != hash)
		}
		return nil
	})
	eventually(t, "an Issued event", 10*time.Second, func() error {
		if !s.hasEventMessage(t, name, controllers.ReasonIssued, "longer than the 2m0s asked for") {
			return errors.New("no Issued event saying why the certificates were re-issued")
		}
		return nil
	})

	// Back to the defaults: the short-lived leaves are due at once.
	s.must(s.updateTCP(name, func(tcp *apiary.TenantControlPlane) { tcp.Spec.Certificates = apiary.CertificatesSpec{} }))
	eventually(t, "leaves re-issued for a year", 30*time.Second, func() error {
		if err := checkStatus(apiary.DefaultCertificateValidity, apiary.DefaultCertificateRenewBefore); err != nil {
			return err
		}
		for _, c := range s.getTCP(name).Status.Certificates {
			if time.Until(c.NotAfter.Time) < 300*24*time.Hour {
				return fmt.Errorf("%s expires %s", c.Name, c.NotAfter)
			}
		}
		return nil
	})
	// Events are written asynchronously.
	eventually(t, "a Renewed event", 10*time.Second, func() error {
		if !s.hasEventMessage(t, name, controllers.ReasonRenewed, "due for renewal") {
			var list eventsv1.EventList
			s.must(s.c.List(s.ctx, &list, client.InNamespace(tenantsNS)))
			var notes []string
			for _, e := range list.Items {
				if e.Regarding.Name == name {
					notes = append(notes, e.Reason+": "+e.Note)
				}
			}
			return fmt.Errorf("no Renewed event saying the certificates were due for renewal; events: %q", notes)
		}
		return nil
	})

	// A rotation on request: every leaf re-issued once, the CAs kept.
	before, err = s.secretsOf(name)
	s.must(err)
	hash, generation = hashAndGeneration()
	s.must(s.updateTCP(name, func(tcp *apiary.TenantControlPlane) {
		metav1.SetMetaDataAnnotation(&tcp.ObjectMeta, apiary.AnnotationRotateCertificates, "first")
	}))
	eventually(t, "rotation first completed", 30*time.Second, func() error {
		rot := s.getTCP(name).Status.CertificateRotation
		if rot == nil || rot.Token != "first" || rot.Completed == nil {
			return fmt.Errorf("status.certificateRotation %+v", rot)
		}
		return nil
	})
	after, err = s.secretsOf(name)
	s.must(err)
	for kind, sec := range after {
		same := maps.EqualFunc(before[kind].Data, sec.Data, bytes.Equal)
		switch kind {
		case render.SecretCA, render.SecretCATrust, render.SecretFrontProxyCA, render.SecretServiceAccount:
			if !same {
				t.Errorf("Secret %s changed in a rotation of the leaves", kind)
			}
		default:
			if same {
				t.Errorf("Secret %s not re-issued by the rotation", kind)
			}
		}
	}
	eventually(t, "one roll of the Deployment", 10*time.Second, func() error {
		if h, g := hashAndGeneration(); h == hash || g != generation+1 {
			return fmt.Errorf("Deployment generation %d → %d, hash changed: %t; want one new generation with a new hash", generation, g, h != hash)
		}
		return nil
	})
	eventually(t, "RotationRequested and Rotated events", 10*time.Second, func() error {
		if !s.hasEvent(t, name, controllers.ReasonRotationRequested) || !s.hasEventMessage(t, name, controllers.ReasonRotated, `rotation "first"`) {
			return errors.New("no RotationRequested event, or no Rotated event naming the rotation")
		}
		return nil
	})
	// Each leaf's Secret carries the token it was issued under.
	for kind, sec := range after {
		switch kind {
		case render.SecretCA, render.SecretCATrust, render.SecretFrontProxyCA, render.SecretServiceAccount:
		default:
			if sec.Annotations["apiary.dev/rotation"] != "first" {
				t.Errorf("Secret %s annotations %v, want apiary.dev/rotation: first", kind, sec.Annotations)
			}
		}
	}
	// Answered once: nothing is re-issued again for the same token.
	settled, err := s.secretsOf(name)
	s.must(err)
	s.must(s.updateTCP(name, func(tcp *apiary.TenantControlPlane) {
		metav1.SetMetaDataAnnotation(&tcp.ObjectMeta, "touch", "1")
	}))
	time.Sleep(3 * time.Second)
	now, err := s.secretsOf(name)
	s.must(err)
	for kind, sec := range now {
		if sec.ResourceVersion != settled[kind].ResourceVersion {
			t.Errorf("Secret %s written again for a rotation already done", kind)
		}
	}
}

// hasEventMessage reports an event about regarding with the reason and a
// note containing text.
func (s *suite) hasEventMessage(t *testing.T, regarding, reason, text string) bool {
	t.Helper()
	var list eventsv1.EventList
	s.must(s.c.List(s.ctx, &list, client.InNamespace(tenantsNS)))
	for _, e := range list.Items {
		if e.Regarding.Name == regarding && e.Reason == reason && strings.Contains(e.Note, text) {
			return true
		}
	}
	return false
}

func (s *suite) hasEvent(t *testing.T, regarding, reason string) bool {
	t.Helper()
	var list eventsv1.EventList
	s.must(s.c.List(s.ctx, &list, client.InNamespace(tenantsNS)))
	for _, e := range list.Items {
		if e.Regarding.Name == regarding && e.Reason == reason {
			return true
		}
	}
	return false
}

func (s *suite) wantEtcdTenant(t *testing.T, tenant datastore.Tenant, exists bool) {
	t.Helper()
	dc, err := datastore.Connect(s.ctx, s.etcd.Config())
	s.must(err)
	defer dc.Close()
	user, err := dc.UserExists(s.ctx, tenant.User)
	s.must(err)
	role, err := dc.RoleExists(s.ctx, tenant.User)
	s.must(err)
	keys, err := dc.CountKeys(s.ctx, tenant.Prefix+"/")
	s.must(err)
	if exists && (!user || !role) {
		t.Errorf("etcd: user %s exists=%v, role exists=%v; want both", tenant.User, user, role)
	}
	if !exists && (user || role || keys != 0) {
		t.Errorf("etcd: after deletion user exists=%v role exists=%v keys under %s=%d; want none", user, role, tenant.Prefix, keys)
	}
}

func freePort(t *testing.T) int32 {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return int32(l.Addr().(*net.TCPAddr).Port)
}

// testReadyTenant runs the rendered kube-apiserver, with its exact
// arguments and the credentials the operator issued, as a local process
// against the shared etcd; plays MetalLB (an address on the Service) and the
// kubelet (ready replicas on the Deployment), which envtest does not run;
// then checks Ready, uses the exported kubeconfig with kubectl, and watches
// that nothing is written while nothing changes.
func (s *suite) testReadyTenant(t *testing.T) {
	port := freePort(t)
	tcp := newTCP("ready", "default")
	tcp.Spec.Network.ServiceType = corev1.ServiceTypeLoadBalancer
	tcp.Spec.Network.Port = port
	s.must(s.c.Create(s.ctx, tcp))

	eventually(t, "waiting for a LoadBalancer address", 30*time.Second, func() error {
		return s.tcpCondition("ready", apiary.ConditionEndpointReady, metav1.ConditionFalse, controllers.ReasonWaitingForAddress)
	})
	if err := s.c.Get(s.ctx, client.ObjectKey{Namespace: tenantsNS, Name: "ready"}, &appsv1.Deployment{}); !apierrors.IsNotFound(err) {
		t.Fatalf("Deployment exists before the endpoint is known: %v", err)
	}
	s.playMetalLB("ready")

	var dep appsv1.Deployment
	eventually(t, "Deployment rendered", 30*time.Second, func() error {
		if err := s.tcpCondition("ready", apiary.ConditionCertificatesReady, metav1.ConditionTrue, ""); err != nil {
			return err
		}
		return s.c.Get(s.ctx, client.ObjectKey{Namespace: tenantsNS, Name: "ready"}, &dep)
	})
	got := s.getTCP("ready")
	if want := fmt.Sprintf("https://127.0.0.1:%d", port); got.Status.Endpoint != want {
		t.Fatalf("endpoint %s, want %s", got.Status.Endpoint, want)
	}
	stop := s.runTenantAPIServer(t, &dep)
	defer stop()

	s.playKubelet(&dep)
	eventually(t, "Ready", 60*time.Second, func() error {
		return s.tcpCondition("ready", apiary.ConditionReady, metav1.ConditionTrue, controllers.ReasonAPIAnswering)
	})
	got = s.getTCP("ready")
	if got.Status.Phase != apiary.PhaseReady || got.Status.Version != "v1.37.2" || got.Status.ReadyReplicas != 2 {
		t.Errorf("status phase=%s version=%s readyReplicas=%d", got.Status.Phase, got.Status.Version, got.Status.ReadyReplicas)
	}

	// Export the kubeconfig with the CLI, then use it with kubectl.
	kubeconfig := s.exportKubeconfig(t, "ready")
	kubectl := func(args ...string) string {
		t.Helper()
		out, err := kubectlRun(s.ctx, kubeconfig, args...)
		if err != nil {
			t.Fatalf("kubectl %v: %v\n%s", args, err, out)
		}
		return out
	}
	kubectl("create", "namespace", "hello")
	if name := kubectl("get", "namespace", "hello", "-o", "jsonpath={.metadata.name}"); name != "hello" {
		t.Errorf("kubectl get namespace hello: %q", name)
	}
	var version struct {
		ServerVersion struct{ GitVersion string } `json:"serverVersion"`
	}
	s.must(json.Unmarshal([]byte(kubectl("version", "-o", "json")), &version))
	if version.ServerVersion.GitVersion != "v1.37.2" {
		t.Errorf("server version %q, want v1.37.2", version.ServerVersion.GitVersion)
	}
	// Everything the tenant wrote is under its prefix.
	tenant := datastore.TenantFor(got.UID)
	resp, err := s.root.Get(s.ctx, tenant.Prefix+"/namespaces/hello")
	s.must(err)
	if len(resp.Kvs) != 1 {
		t.Errorf("namespace hello not stored under %s", tenant.Prefix)
	}
	outside, err := s.root.Get(s.ctx, "", clientv3.WithFromKey(), clientv3.WithKeysOnly())
	s.must(err)
	for _, kv := range outside.Kvs {
		if !strings.HasPrefix(string(kv.Key), "/apiary/") {
			t.Errorf("key outside every tenant prefix: %s", kv.Key)
		}
	}

	// The bootstrap's objects land after the reconcile that applied them:
	// wait until status shows what the tenant stores, then nothing may
	// change.
	eventually(t, "usage in status settled", 30*time.Second, func() error {
		resp, err := s.root.Get(s.ctx, tenant.Prefix+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			return err
		}
		if u := s.getTCP("ready").Status.DataStore.Usage; u == nil || u.Objects != resp.Count {
			return fmt.Errorf("status shows %+v, etcd holds %d keys", u, resp.Count)
		}
		return nil
	})
	s.checkQuiet(t, "ready")
}

// playMetalLB gives a LoadBalancer tenant's Service the loopback address,
// as MetalLB would give it one (envtest runs no load balancer).
func (s *suite) playMetalLB(name string) {
	s.t.Helper()
	var svc corev1.Service
	s.must(s.c.Get(s.ctx, client.ObjectKey{Namespace: tenantsNS, Name: name}, &svc))
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "127.0.0.1"}}
	s.must(s.c.Status().Update(s.ctx, &svc))
}

// playKubelet reports what the kubelet and the Deployment controller would:
// every replica ready.
func (s *suite) playKubelet(dep *appsv1.Deployment) {
	s.t.Helper()
	dep.Status = appsv1.DeploymentStatus{ObservedGeneration: dep.Generation, Replicas: *dep.Spec.Replicas, ReadyReplicas: *dep.Spec.Replicas, UpdatedReplicas: *dep.Spec.Replicas, AvailableReplicas: *dep.Spec.Replicas}
	s.must(s.c.Status().Update(s.ctx, dep))
}

// exportKubeconfig runs `apiary kubeconfig NAME` and writes what it prints.
func (s *suite) exportKubeconfig(t *testing.T, name string) string {
	t.Helper()
	var out, errOut bytes.Buffer
	cmd := cli.NewKubeconfigCommand(&cli.ConfigFlags{Kubeconfig: s.kubeconfig, Namespace: tenantsNS})
	cmd.SetArgs([]string{name})
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	if err := cmd.ExecuteContext(s.ctx); err != nil {
		t.Fatalf("apiary kubeconfig: %v: %s", err, errOut.String())
	}
	path := filepath.Join(t.TempDir(), name+".kubeconfig")
	s.must(os.WriteFile(path, out.Bytes(), 0o600))
	return path
}

// kubectlRun runs the from-source kubectl against a kubeconfig.
func kubectlRun(ctx context.Context, kubeconfig string, args ...string) (string, error) {
	bin, err := testenv.KubeBinary("kubectl")
	if err != nil {
		return "", err
	}
	b, err := exec.CommandContext(ctx, bin, append([]string{"--kubeconfig", kubeconfig}, args...)...).CombinedOutput()
	return strings.TrimSpace(string(b)), err
}

// runTenantAPIServer starts the kube-apiserver container of a rendered
// Deployment as a local process: the same arguments, each mounted volume
// written to a local directory (paths in the arguments and in the mounted
// configuration files moved there), only the bind address changed. A
// ConfigMap volume is kept current as the kubelet would (an atomic swap of
// its files when the ConfigMap changes).
func (s *suite) runTenantAPIServer(t *testing.T, dep *appsv1.Deployment) func() {
	t.Helper()
	dir := t.TempDir()
	var ctr *corev1.Container
	for i := range dep.Spec.Template.Spec.Containers {
		if dep.Spec.Template.Spec.Containers[i].Name == "kube-apiserver" {
			ctr = &dep.Spec.Template.Spec.Containers[i]
		}
	}
	if ctr == nil {
		t.Fatal("no kube-apiserver container")
	}
	volumes := map[string]corev1.Volume{}
	for _, v := range dep.Spec.Template.Spec.Volumes {
		volumes[v.Name] = v
	}
	// Mount paths, longest first, and where they are here.
	moved := map[string]string{}
	for _, m := range ctr.VolumeMounts {
		moved[m.MountPath] = filepath.Join(dir, m.Name)
	}
	mounts := slices.SortedFunc(maps.Keys(moved), func(a, b string) int { return len(b) - len(a) })
	move := func(text string) string {
		for _, m := range mounts {
			text = strings.ReplaceAll(text, m, moved[m])
		}
		return text
	}
	configMap := func(name string) *corev1.ConfigMap {
		var cm corev1.ConfigMap
		s.must(s.c.Get(s.ctx, client.ObjectKey{Namespace: dep.Namespace, Name: name}, &cm))
		return &cm
	}
	refreshCtx, stopRefresh := context.WithCancel(s.ctx)
	for _, m := range ctr.VolumeMounts {
		local, v := moved[m.MountPath], volumes[m.Name]
		write := func(items []corev1.KeyToPath, data func(key string) []byte) {
			for _, item := range items {
				path := filepath.Join(local, item.Path)
				s.must(os.MkdirAll(filepath.Dir(path), 0o700))
				s.must(os.WriteFile(path, data(item.Key), 0o600))
			}
		}
		switch {
		case v.Projected != nil:
			for _, src := range v.Projected.Sources {
				switch {
				case src.Secret != nil:
					var sec corev1.Secret
					s.must(s.c.Get(s.ctx, client.ObjectKey{Namespace: dep.Namespace, Name: src.Secret.Name}, &sec))
					write(src.Secret.Items, func(k string) []byte { return sec.Data[k] })
				case src.ConfigMap != nil:
					cm := configMap(src.ConfigMap.Name)
					write(src.ConfigMap.Items, func(k string) []byte { return []byte(move(cm.Data[k])) })
				}
			}
		case v.ConfigMap != nil:
			files := func(cm *corev1.ConfigMap) map[string]string {
				out := map[string]string{}
				for _, item := range v.ConfigMap.Items {
					out[item.Path] = move(cm.Data[item.Key])
				}
				return out
			}
			last := files(configMap(v.ConfigMap.Name))
			atomic := testenv.NewAtomicDir(t, local, last)
			go func() {
				for refreshCtx.Err() == nil {
					time.Sleep(200 * time.Millisecond)
					var cm corev1.ConfigMap
					if err := s.c.Get(refreshCtx, client.ObjectKey{Namespace: dep.Namespace, Name: v.ConfigMap.Name}, &cm); err != nil {
						continue
					}
					if now := files(&cm); !maps.Equal(now, last) {
						if err := atomic.Update(now); err != nil {
							t.Errorf("updating %s: %v", local, err)
							return
						}
						last = now
					}
				}
			}()
		default:
			s.must(os.MkdirAll(local, 0o700))
		}
	}
	var args []string
	for _, a := range ctr.Args {
		a = move(a)
		switch {
		case strings.HasPrefix(a, "--bind-address="):
			// Listen on loopback only, as tests must.
			a = "--bind-address=127.0.0.1"
		case a == "--advertise-address=127.0.0.1":
			// The test plays MetalLB with a loopback address so that the
			// operator's probe reaches this process; kube-apiserver refuses
			// to publish a loopback address in the tenant's kubernetes
			// Service, so publish a documentation address (TEST-NET-2,
			// nothing connects to it) instead.
			a = "--advertise-address=198.51.100.10"
		}
		args = append(args, a)
	}
	bin, err := testenv.KubeBinary(ctr.Command[0])
	s.must(err)
	logPath := filepath.Join(dir, "kube-apiserver.log")
	logFile, err := os.Create(logPath)
	s.must(err)
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	s.must(cmd.Start())
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			stopRefresh()
			_ = cmd.Process.Kill()
			<-done
			logFile.Close()
			if t.Failed() {
				b, _ := os.ReadFile(logPath)
				t.Logf("tenant kube-apiserver log (%s):\n%s", logPath, tailLines(string(b), 60))
			}
			// The tenant's restricted etcd user must have sufficed.
			if b, _ := os.ReadFile(logPath); bytes.Contains(b, []byte("permission denied")) {
				t.Errorf("tenant kube-apiserver hit etcd permission errors:\n%s", grepLines(string(b), "permission denied", 10))
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func tailLines(s string, n int) string {
	lines := strings.Split(s, "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

func grepLines(s, substr string, n int) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, substr) && len(out) < n {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// checkQuiet watches every object of a Ready tenant over several resync
// periods, during which the operator reconciles it again and again, and
// fails on any write.
func (s *suite) checkQuiet(t *testing.T, name string) {
	cs, err := kubernetes.NewForConfig(s.cfg)
	s.must(err)
	dyn, err := client.NewWithWatch(s.cfg, client.Options{Scheme: s.c.Scheme()})
	s.must(err)
	ctx, cancel := context.WithTimeout(s.ctx, 4*resync+time.Second)
	defer cancel()

	var mu sync.Mutex
	var writes []string
	watchList := func(what string, w watch.Interface, err error, mine func(metav1.Object) bool) {
		s.must(err)
		go func() {
			defer w.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case ev, ok := <-w.ResultChan():
					if !ok {
						return
					}
					if obj, err := meta.Accessor(ev.Object); err == nil && mine(obj) {
						mu.Lock()
						desc := fmt.Sprintf("%s %s %s rv=%s", ev.Type, what, obj.GetName(), obj.GetResourceVersion())
						if e, ok := ev.Object.(*eventsv1.Event); ok {
							desc += fmt.Sprintf(" reason=%s note=%q series=%v", e.Reason, e.Note, e.Series)
						}
						if tcp, ok := ev.Object.(*apiary.TenantControlPlane); ok {
							b, _ := json.Marshal(tcp.Status)
							desc += " status=" + string(b)
						}
						writes = append(writes, desc)
						mu.Unlock()
					}
				}
			}
		}()
	}
	tenantLabel := func(o metav1.Object) bool { return o.GetLabels()[render.LabelTenant] == name }
	startRV := func(list client.ObjectList) string {
		s.must(s.c.List(s.ctx, list, client.InNamespace(tenantsNS)))
		return list.(metav1.ListInterface).GetResourceVersion()
	}
	opts := func(rv string) metav1.ListOptions { return metav1.ListOptions{ResourceVersion: rv} }
	w, err := cs.CoreV1().Secrets(tenantsNS).Watch(ctx, opts(startRV(&corev1.SecretList{})))
	watchList("Secret", w, err, tenantLabel)
	w, err = cs.CoreV1().Services(tenantsNS).Watch(ctx, opts(startRV(&corev1.ServiceList{})))
	watchList("Service", w, err, tenantLabel)
	w, err = cs.AppsV1().Deployments(tenantsNS).Watch(ctx, opts(startRV(&appsv1.DeploymentList{})))
	watchList("Deployment", w, err, tenantLabel)
	w, err = cs.EventsV1().Events(tenantsNS).Watch(ctx, opts(startRV(&eventsv1.EventList{})))
	watchList("Event", w, err, func(o metav1.Object) bool { return strings.HasPrefix(o.GetName(), name+".") })
	var tcps apiary.TenantControlPlaneList
	w, err = dyn.Watch(ctx, &tcps, client.InNamespace(tenantsNS), &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: startRV(&apiary.TenantControlPlaneList{})}})
	watchList("TenantControlPlane", w, err, func(o metav1.Object) bool { return o.GetName() == name })

	before := reconcileCount(t)
	<-ctx.Done()
	reconciles := reconcileCount(t) - before
	// The check is only meaningful if the operator did reconcile meanwhile.
	if reconciles < 3 {
		t.Errorf("only %v reconciles during the quiet window; the resync did not run", reconciles)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(writes) > 0 {
		t.Errorf("a Ready tenant with no changes was written %d times over %v reconciles:\n%s", len(writes), reconciles, strings.Join(writes, "\n"))
	}
	t.Logf("quiet: %v reconciles of all tenants in %s, 0 writes to tenant %s", reconciles, 4*resync, name)
}

// reconcileCount reads controller-runtime's reconcile counter of the
// TenantControlPlane controller.
func reconcileCount(t *testing.T) float64 { return reconciles(t, "") }

// reconciles sums the TenantControlPlane controller's reconcile counter
// for one result (error, success, requeue...), or for all when "".
func reconciles(t *testing.T, result string) float64 {
	families, err := crmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var total float64
	for _, f := range families {
		if f.GetName() != "controller_runtime_reconcile_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			if labelValue(m, "controller") == "tenantcontrolplane" && (result == "" || labelValue(m, "result") == result) {
				total += m.GetCounter().GetValue()
			}
		}
	}
	return total
}

func labelValue(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

func (s *suite) datastoreClientOf(t *testing.T, name string) (*clientv3.Client, datastore.Tenant) {
	t.Helper()
	eventually(t, name+" bound", 30*time.Second, func() error {
		return s.tcpCondition(name, apiary.ConditionCertificatesReady, metav1.ConditionTrue, "")
	})
	secrets, err := s.secretsOf(name)
	s.must(err)
	sec := secrets[render.SecretDataStoreClient]
	return s.etcd.ClientFor(t, sec.Data["tls.crt"], sec.Data["tls.key"]), datastore.TenantFor(s.getTCP(name).UID)
}

func (s *suite) testIsolation(t *testing.T) {
	for _, name := range []string{"iso-a", "iso-b"} {
		s.must(s.c.Create(s.ctx, newTCP(name, "default")))
	}
	a, ta := s.datastoreClientOf(t, "iso-a")
	b, tb := s.datastoreClientOf(t, "iso-b")
	if _, err := a.Put(s.ctx, ta.Prefix+"/namespaces/a", "a"); err != nil {
		t.Fatalf("tenant A cannot write its own prefix: %v", err)
	}
	if _, err := b.Put(s.ctx, tb.Prefix+"/namespaces/b", "b"); err != nil {
		t.Fatalf("tenant B cannot write its own prefix: %v", err)
	}
	denied := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, rpctypes.ErrPermissionDenied) {
			t.Errorf("%s: got %v, want %v", what, err, rpctypes.ErrPermissionDenied)
		}
	}
	_, err := a.Get(s.ctx, tb.Prefix+"/namespaces/b")
	denied("A reads B's key", err)
	_, err = a.Get(s.ctx, tb.Prefix+"/", clientv3.WithPrefix())
	denied("A lists B's prefix", err)
	_, err = a.Put(s.ctx, tb.Prefix+"/namespaces/evil", "x")
	denied("A writes B's prefix", err)
	_, err = a.Delete(s.ctx, tb.Prefix+"/", clientv3.WithPrefix())
	denied("A deletes B's prefix", err)
	_, err = a.Get(s.ctx, "/", clientv3.WithPrefix())
	denied("A lists everything", err)
	_, err = b.Get(s.ctx, ta.Prefix+"/namespaces/a")
	denied("B reads A's key", err)
	if resp, err := b.Get(s.ctx, tb.Prefix+"/namespaces/b"); err != nil || len(resp.Kvs) != 1 {
		t.Errorf("B's data after A's attempts: %v %v", resp, err)
	}
}

func (s *suite) testDelete(t *testing.T) {
	_, victim := s.datastoreClientOf(t, "iso-b")
	for _, name := range []string{"iso-a", "ready"} {
		tcp := s.getTCP(name)
		tenant := datastore.TenantFor(tcp.UID)
		keys, err := s.root.Get(s.ctx, tenant.Prefix+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		s.must(err)
		if keys.Count == 0 {
			t.Fatalf("%s has no keys before deletion; the test would prove nothing", name)
		}
		if name == "iso-a" {
			// Whoever may write status points iso-a's binding at iso-b's
			// user and prefix: the finalizer must still remove only iso-a's.
			forged := tcp.DeepCopy()
			forged.Status.DataStore.User, forged.Status.DataStore.Prefix = victim.User, victim.Prefix
			s.must(s.c.Status().Patch(s.ctx, forged, client.MergeFrom(tcp)))
			tcp = forged
		}
		s.must(s.c.Delete(s.ctx, tcp))
		eventually(t, name+" deleted", 30*time.Second, func() error {
			err := s.c.Get(s.ctx, client.ObjectKeyFromObject(tcp), &apiary.TenantControlPlane{})
			if apierrors.IsNotFound(err) {
				return nil
			}
			return fmt.Errorf("still there: %v", err)
		})
		s.wantEtcdTenant(t, tenant, false)
		secrets, err := s.secretsOf(name)
		s.must(err)
		if len(secrets) != 0 {
			t.Errorf("%s: %d Secrets left", name, len(secrets))
		}
		for _, obj := range []client.Object{&corev1.Service{}, &appsv1.Deployment{}} {
			if err := s.c.Get(s.ctx, client.ObjectKey{Namespace: tenantsNS, Name: name}, obj); !apierrors.IsNotFound(err) {
				t.Errorf("%s: %T left: %v", name, obj, err)
			}
		}
		if !s.hasEvent(t, name, "Released") {
			t.Errorf("%s: no Released event", name)
		}
	}
	// The other tenant is untouched, its user and role too.
	resp, err := s.root.Get(s.ctx, victim.Prefix+"/namespaces/b")
	s.must(err)
	if len(resp.Kvs) != 1 {
		t.Errorf("iso-b lost its data when iso-a (with a forged status.dataStore) was deleted")
	}
	s.wantEtcdTenant(t, victim, true)
}

func (s *suite) testDataStoreFailures(t *testing.T) {
	t.Run("full", func(t *testing.T) {
		const quota = 16 << 20
		full := etcdtest.Start(t, etcdtest.WithArgs(fmt.Sprintf("--quota-backend-bytes=%d", quota)))
		s.createDataStore("full", full.Config())
		eventually(t, "full has space", 30*time.Second, func() error {
			return s.dataStoreCondition("full", apiary.ConditionSpaceAvailable, metav1.ConditionTrue, controllers.ReasonNoAlarm)
		})
		root := full.RootClient(t)
		value := strings.Repeat("x", 256<<10)
		next := 0
		// NOSPACE can come while the data is still under the disarm line;
		// the operator then disarms (SpaceReclaimed) and the test writes on
		// until the data fills the quota and NoSpace must stay.
		for round := 1; ; round++ {
			for ; ; next++ {
				if _, err := root.Put(s.ctx, fmt.Sprintf("/apiary/x/%04d", next), value); err != nil {
					if !errors.Is(err, rpctypes.ErrNoSpace) || next > 400 {
						t.Fatalf("filling etcd: put %d: %v", next, err)
					}
					break
				}
			}
			var c *metav1.Condition
			eventually(t, "NOSPACE reported, or disarmed by the operator", 30*time.Second, func() error {
				c = meta.FindStatusCondition(s.dataStore("full").Status.Conditions, apiary.ConditionSpaceAvailable)
				if c != nil && c.Reason == datastore.ReasonNoSpace {
					return nil
				}
				alarms, err := root.AlarmList(s.ctx)
				if err == nil && len(alarms.Alarms) == 0 {
					return nil
				}
				return fmt.Errorf("SpaceAvailable %+v, alarms %v %v", c, alarms, err)
			})
			if c != nil && c.Reason == datastore.ReasonNoSpace {
				if c.Status != metav1.ConditionFalse {
					t.Fatalf("SpaceAvailable %+v", c)
				}
				break
			}
			if round == 5 {
				t.Fatal("the data never filled the quota in 5 rounds")
			}
		}
		eventually(t, "NoSpace event", 10*time.Second, func() error {
			var list eventsv1.EventList
			s.must(s.c.List(s.ctx, &list))
			for _, e := range list.Items {
				if e.Regarding.Name == "full" && e.Reason == datastore.ReasonNoSpace && e.Type == corev1.EventTypeWarning {
					return nil
				}
			}
			return errors.New("no NoSpace warning event for DataStore full")
		})
		del, err := root.Delete(s.ctx, "/apiary/x/", clientv3.WithPrefix())
		s.must(err)
		_, err = root.Compact(s.ctx, del.Header.Revision, clientv3.WithCompactPhysical())
		s.must(err)
		eventually(t, "NOSPACE disarmed", 30*time.Second, func() error {
			c := meta.FindStatusCondition(s.dataStore("full").Status.Conditions, apiary.ConditionSpaceAvailable)
			if c == nil || c.Status != metav1.ConditionTrue {
				return fmt.Errorf("SpaceAvailable %+v", c)
			}
			return nil
		})
		if _, err := root.Put(s.ctx, "/apiary/x/after", "ok"); err != nil {
			t.Errorf("write after the operator disarmed NOSPACE: %v", err)
		}
		s.must(s.c.Delete(s.ctx, s.dataStore("full")))
	})
	t.Run("unreachable", func(t *testing.T) {
		flaky := etcdtest.Start(t)
		s.createDataStore("flaky", flaky.Config())
		eventually(t, "flaky Ready", 30*time.Second, func() error {
			return s.dataStoreCondition("flaky", apiary.ConditionReady, metav1.ConditionTrue, "")
		})
		s.must(s.c.Create(s.ctx, newTCP("on-flaky", "flaky")))
		eventually(t, "on-flaky bound", 30*time.Second, func() error {
			return s.tcpCondition("on-flaky", apiary.ConditionDataStoreReady, metav1.ConditionTrue, controllers.ReasonBound)
		})
		flaky.Stop()
		eventually(t, "flaky unreachable", 60*time.Second, func() error {
			return s.dataStoreCondition("flaky", apiary.ConditionReady, metav1.ConditionFalse, datastore.ReasonUnreachable)
		})
		eventually(t, "tenant of flaky not ready", 60*time.Second, func() error {
			return s.tcpCondition("on-flaky", apiary.ConditionDataStoreReady, metav1.ConditionFalse, datastore.ReasonUnreachable)
		})
		// Deleting it waits for the dead DataStore and says how to let go.
		s.must(s.c.Delete(s.ctx, s.getTCP("on-flaky")))
		eventually(t, "deletion blocked with the escape hatch named", 90*time.Second, func() error {
			c := meta.FindStatusCondition(s.getTCP("on-flaky").Status.Conditions, apiary.ConditionDataStoreReady)
			if c == nil || !strings.Contains(c.Message, "cannot remove the tenant's etcd keys") || !strings.Contains(c.Message, controllers.AnnotationOrphanDataStoreData) {
				return fmt.Errorf("DataStoreReady %+v", c)
			}
			return nil
		})
		s.must(s.updateTCP("on-flaky", func(p *apiary.TenantControlPlane) {
			p.Annotations = map[string]string{controllers.AnnotationOrphanDataStoreData: "true"}
		}))
		eventually(t, "on-flaky deleted once annotated", 60*time.Second, func() error {
			if err := s.c.Get(s.ctx, client.ObjectKey{Namespace: tenantsNS, Name: "on-flaky"}, &apiary.TenantControlPlane{}); !apierrors.IsNotFound(err) {
				return fmt.Errorf("still there: %v", err)
			}
			return nil
		})
		eventually(t, "DataStoreDataOrphaned event", 10*time.Second, func() error {
			if !s.hasEvent(t, "on-flaky", "DataStoreDataOrphaned") {
				return errors.New("no DataStoreDataOrphaned event")
			}
			return nil
		})
	})
	t.Run("peer port open to tenants", func(t *testing.T) {
		// The operator offers each member's peer URL a certificate of the
		// DataStore's CA made like a tenant's.
		eventually(t, "default (plain HTTP peer URL) says so", 30*time.Second, func() error {
			return s.dataStoreCondition("default", apiary.ConditionPeerPortClosed, metav1.ConditionFalse, controllers.ReasonPeerPortUnencrypted)
		})
		trusting := etcdtest.Start(t, etcdtest.WithPeerTLS(nil))
		s.createDataStore("peer-trusts-client-ca", trusting.Config())
		peerCA, err := pki.NewCA("peer CA")
		s.must(err)
		separate := etcdtest.Start(t, etcdtest.WithPeerTLS(peerCA))
		s.createDataStore("peer-ca-separate", separate.Config())
		eventually(t, "a peer port trusting the client CA is reported", 30*time.Second, func() error {
			return s.dataStoreCondition("peer-trusts-client-ca", apiary.ConditionPeerPortClosed, metav1.ConditionFalse, controllers.ReasonPeerPortAcceptsTenants)
		})
		eventually(t, "a peer port with its own CA passes", 30*time.Second, func() error {
			return s.dataStoreCondition("peer-ca-separate", apiary.ConditionPeerPortClosed, metav1.ConditionTrue, controllers.ReasonPeerPortRefusesTenants)
		})
		// The finding is a warning: the DataStore stays usable.
		s.must(s.dataStoreCondition("peer-trusts-client-ca", apiary.ConditionReady, metav1.ConditionTrue, ""))
	})
	t.Run("wrong root credentials", func(t *testing.T) {
		// A client certificate from the right CA, for a user etcd does not
		// know: TLS passes, authentication fails.
		cfg := s.etcd.Config()
		kp, err := s.etcd.CA.Sign(render.ClientCertRequest("impostor"))
		s.must(err)
		cfg.ClientCert = kp.CertPEM()
		cfg.ClientKey, err = kp.KeyPEM()
		s.must(err)
		s.createDataStore("wrong-auth", cfg)
		eventually(t, "wrong-auth not Ready", 30*time.Second, func() error {
			return s.dataStoreCondition("wrong-auth", apiary.ConditionReady, metav1.ConditionFalse, datastore.ReasonAuthFailed)
		})
		s.must(s.c.Create(s.ctx, newTCP("on-wrong-auth", "wrong-auth")))
		eventually(t, "tenant of wrong-auth not ready", 30*time.Second, func() error {
			return s.tcpCondition("on-wrong-auth", apiary.ConditionDataStoreReady, metav1.ConditionFalse, datastore.ReasonAuthFailed)
		})
	})
	t.Run("foreign CA", func(t *testing.T) {
		other, err := pki.NewCA("someone else")
		s.must(err)
		kp, err := other.Sign(render.ClientCertRequest("root"))
		s.must(err)
		cfg := s.etcd.Config()
		cfg.ClientCert = kp.CertPEM()
		cfg.ClientKey, err = kp.KeyPEM()
		s.must(err)
		s.createDataStore("foreign-ca", cfg)
		eventually(t, "foreign-ca not Ready", 30*time.Second, func() error {
			return s.dataStoreCondition("foreign-ca", apiary.ConditionReady, metav1.ConditionFalse, datastore.ReasonTLSFailed)
		})
	})
	t.Run("missing Secret", func(t *testing.T) {
		s.must(s.c.Create(s.ctx, &apiary.DataStore{
			ObjectMeta: metav1.ObjectMeta{Name: "no-secret"},
			Spec: apiary.DataStoreSpec{Endpoints: []string{s.etcd.Endpoint}, TLS: &apiary.DataStoreTLS{
				CASecretRef:     apiary.SecretReference{Name: "absent", Namespace: systemNS},
				ClientSecretRef: apiary.SecretReference{Name: "absent", Namespace: systemNS},
			}},
		}))
		eventually(t, "no-secret not Ready", 30*time.Second, func() error {
			return s.dataStoreCondition("no-secret", apiary.ConditionReady, metav1.ConditionFalse, "SecretNotFound")
		})
	})
}

func (s *suite) testDataStoreProtection(t *testing.T) {
	s.createDataStore("guarded", s.etcd.Config())
	s.must(s.c.Create(s.ctx, newTCP("guarded-t", "guarded")))
	eventually(t, "guarded-t bound", 30*time.Second, func() error {
		return s.tcpCondition("guarded-t", apiary.ConditionDataStoreReady, metav1.ConditionTrue, controllers.ReasonBound)
	})
	var ds apiary.DataStore
	s.must(s.c.Get(s.ctx, client.ObjectKey{Name: "guarded"}, &ds))
	s.must(s.c.Delete(s.ctx, &ds))
	eventually(t, "deletion blocked", 30*time.Second, func() error {
		if err := s.dataStoreCondition("guarded", controllers.ConditionDeletionBlocked, metav1.ConditionTrue, controllers.ReasonInUse); err != nil {
			return err
		}
		s.must(s.c.Get(s.ctx, client.ObjectKey{Name: "guarded"}, &ds))
		if c := meta.FindStatusCondition(ds.Status.Conditions, controllers.ConditionDeletionBlocked); !strings.Contains(c.Message, "tenants/guarded-t") {
			return fmt.Errorf("message does not name the tenant: %s", c.Message)
		}
		if ds.Status.Tenants != 1 || !slices.Equal(ds.Status.UsedBy, []string{"tenants/guarded-t"}) {
			return fmt.Errorf("tenants=%d usedBy=%v", ds.Status.Tenants, ds.Status.UsedBy)
		}
		return nil
	})
	s.must(s.c.Delete(s.ctx, s.getTCP("guarded-t")))
	eventually(t, "DataStore gone once unused", 30*time.Second, func() error {
		err := s.c.Get(s.ctx, client.ObjectKey{Name: "guarded"}, &apiary.DataStore{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("still there: %v", err)
	})
}

// testManagedDataStore checks what envtest can show of a managed etcd: its
// API rules, the Secrets, Service, PDB and StatefulSet the operator creates,
// and Ready=False until members are ready (envtest runs no pods; the e2e
// suite runs the members for real).
func (s *suite) testManagedDataStore(t *testing.T) {
	t.Run("API rules", func(t *testing.T) {
		both := &apiary.DataStore{ObjectMeta: metav1.ObjectMeta{Name: "both"}, Spec: apiary.DataStoreSpec{
			Endpoints: []string{"https://x:2379"},
			TLS:       &apiary.DataStoreTLS{CASecretRef: apiary.SecretReference{Name: "a", Namespace: "b"}, ClientSecretRef: apiary.SecretReference{Name: "a", Namespace: "b"}},
			Managed:   &apiary.ManagedEtcd{Namespace: systemNS},
		}}
		wantRejected(t, s.c.Create(s.ctx, both), "spec", "set either managed, or endpoints and tls, not both")
		neither := &apiary.DataStore{ObjectMeta: metav1.ObjectMeta{Name: "neither"}, Spec: apiary.DataStoreSpec{Endpoints: []string{"https://x:2379"}}}
		wantRejected(t, s.c.Create(s.ctx, neither), "spec", "needs both endpoints and tls")
		even := &apiary.DataStore{ObjectMeta: metav1.ObjectMeta{Name: "even"}, Spec: apiary.DataStoreSpec{Managed: &apiary.ManagedEtcd{Namespace: systemNS, Replicas: 2}}}
		wantRejected(t, s.c.Create(s.ctx, even), "spec.managed.replicas", "Unsupported value: 2")
	})
	ds := &apiary.DataStore{ObjectMeta: metav1.ObjectMeta{Name: "managed"}, Spec: apiary.DataStoreSpec{
		Managed: &apiary.ManagedEtcd{Namespace: systemNS, Replicas: 3, Storage: apiary.ManagedEtcdStorage{EmptyDir: true}},
	}}
	s.must(s.c.Create(s.ctx, ds))
	if ds.Spec.Managed.Version != "3.6.16" {
		t.Errorf("default version %q", ds.Spec.Managed.Version)
	}
	eventually(t, "managed etcd provisioning", 30*time.Second, func() error {
		return s.dataStoreCondition("managed", apiary.ConditionReady, metav1.ConditionFalse, controllers.ReasonProvisioning)
	})
	var sts appsv1.StatefulSet
	s.must(s.c.Get(s.ctx, client.ObjectKey{Namespace: systemNS, Name: "managed-etcd"}, &sts))
	if *sts.Spec.Replicas != 3 || sts.Spec.PodManagementPolicy != appsv1.ParallelPodManagement {
		t.Errorf("StatefulSet replicas %d policy %s", *sts.Spec.Replicas, sts.Spec.PodManagementPolicy)
	}
	s.must(s.c.Get(s.ctx, client.ObjectKey{Namespace: systemNS, Name: "managed-etcd"}, &corev1.Service{}))
	s.must(s.c.Get(s.ctx, client.ObjectKey{Namespace: systemNS, Name: "managed-etcd"}, &policyv1.PodDisruptionBudget{}))
	s.must(s.c.Get(s.ctx, client.ObjectKey{Namespace: systemNS, Name: render.NetworkPolicyName("managed-etcd")}, &networkingv1.NetworkPolicy{}))
	secrets := map[render.SecretKind]*corev1.Secret{}
	for _, kind := range managedetcd.SecretKinds {
		secrets[kind] = &corev1.Secret{}
		s.must(s.c.Get(s.ctx, client.ObjectKey{Namespace: systemNS, Name: "managed-" + string(kind)}, secrets[kind]))
	}
	// A new DataStore has the separate peer CA from the start: the peer
	// certificate chains to it and not to the client CA that signs tenant
	// certificates, the peer port trusts only it, and only the peer name.
	parse := func(kind render.SecretKind, key string) *x509.Certificate {
		block, _ := pem.Decode(secrets[kind].Data[key])
		if block == nil {
			t.Fatalf("%s has no certificate under %s", kind, key)
		}
		c, err := x509.ParseCertificate(block.Bytes)
		s.must(err)
		return c
	}
	peer, clientCA, peerCA := parse(managedetcd.SecretPeer, "tls.crt"), parse(managedetcd.SecretCA, "tls.crt"), parse(managedetcd.SecretPeerCA, "tls.crt")
	if peer.CheckSignatureFrom(peerCA) != nil || peer.CheckSignatureFrom(clientCA) == nil || peer.Subject.CommonName != managedetcd.PeerCN {
		t.Errorf("peer certificate %s signed by %s, want %s by the peer CA only", peer.Subject.CommonName, peer.Issuer.CommonName, managedetcd.PeerCN)
	}
	if trust := parse(managedetcd.SecretPeerTrust, "ca.crt"); !trust.Equal(peerCA) || len(bytes.TrimSpace(secrets[managedetcd.SecretPeerTrust].Data["ca.crt"])) != len(bytes.TrimSpace(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: peerCA.Raw}))) {
		t.Errorf("peer trust bundle is not the peer CA alone")
	}
	args := sts.Spec.Template.Spec.Containers[0].Args
	if !slices.Contains(args, "--peer-cert-allowed-cn="+managedetcd.PeerCN) || !slices.Contains(args, "--peer-trusted-ca-file=/etc/etcd/pki/peer-trust.crt") {
		t.Errorf("etcd args %v", args)
	}
	s.eventually("PeerCASeparate", 10*time.Second, func() error {
		return s.dataStoreCondition("managed", apiary.ConditionPeerCASeparate, metav1.ConditionTrue, controllers.ReasonPeerCASeparate)
	})
	s.must(s.c.Get(s.ctx, client.ObjectKey{Name: "managed"}, ds))
	if len(ds.Status.Endpoints) != 3 || ds.Status.Endpoints[0] != "https://managed-etcd-0.managed-etcd.apiary-system.svc.cluster.local:2379" {
		t.Errorf("status.endpoints %v", ds.Status.Endpoints)
	}
	if c := meta.FindStatusCondition(ds.Status.Conditions, apiary.ConditionReady); !strings.Contains(c.Message, "0 of 3 etcd members ready") {
		t.Errorf("Ready message %q", c.Message)
	}
	s.testHostAccess(t, ds)
	// The members ConfigMap says which cluster a member starts into:
	// before etcd was listed, the bootstrap members form a new one.
	var members corev1.ConfigMap
	s.must(s.c.Get(s.ctx, client.ObjectKey{Namespace: systemNS, Name: "managed-etcd-members"}, &members))
	if members.Data[managedetcd.KeyInitialClusterState] != "new" || strings.Count(members.Data[managedetcd.KeyInitialCluster], "=https://") != 3 {
		t.Errorf("members ConfigMap %v", members.Data)
	}
	// Replicas may change (odd counts only). Before the cluster formed,
	// nothing moves: the bootstrap members stay as the StatefulSet runs
	// them until etcd can be listed.
	s.must(s.c.Get(s.ctx, client.ObjectKey{Name: "managed"}, ds))
	ds.Spec.Managed.Replicas = 4
	wantRejected(t, s.c.Update(s.ctx, ds), "spec.managed.replicas", "supported values")
	s.must(s.c.Get(s.ctx, client.ObjectKey{Name: "managed"}, ds))
	ds.Spec.Managed.Replicas = 5
	s.must(s.c.Update(s.ctx, ds))
	s.eventually("the scale seen", 10*time.Second, func() error {
		var cur apiary.DataStore
		s.must(s.c.Get(s.ctx, client.ObjectKey{Name: "managed"}, &cur))
		if cur.Status.ObservedGeneration != cur.Generation {
			return fmt.Errorf("observed generation %d of %d", cur.Status.ObservedGeneration, cur.Generation)
		}
		return nil
	})
	s.must(s.c.Get(s.ctx, client.ObjectKey{Namespace: systemNS, Name: "managed-etcd"}, &sts))
	s.must(s.c.Get(s.ctx, client.ObjectKey{Namespace: systemNS, Name: "managed-etcd-members"}, &members))
	if *sts.Spec.Replicas != 3 || strings.Count(members.Data[managedetcd.KeyInitialCluster], "=https://") != 3 {
		t.Errorf("before the cluster formed, a scale to 5 changed the bootstrap: %d pods, initial cluster %s", *sts.Spec.Replicas, members.Data[managedetcd.KeyInitialCluster])
	}
	// Deleting an unused managed DataStore removes its etcd and Secrets.
	s.must(s.c.Get(s.ctx, client.ObjectKey{Name: "managed"}, ds))
	s.must(s.c.Delete(s.ctx, ds))
	eventually(t, "managed etcd removed", 30*time.Second, func() error {
		if err := s.c.Get(s.ctx, client.ObjectKey{Namespace: systemNS, Name: "managed-etcd"}, &appsv1.StatefulSet{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("StatefulSet: %v", err)
		}
		if err := s.c.Get(s.ctx, client.ObjectKey{Namespace: systemNS, Name: "managed-etcd-root"}, &corev1.Secret{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("root Secret: %v", err)
		}
		if err := s.c.Get(s.ctx, client.ObjectKey{Name: "managed"}, &apiary.DataStore{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("DataStore: %v", err)
		}
		return nil
	})
}

// testHostAccess exposes a managed etcd to registered-mode hosts: the
// client port alone, through a LoadBalancer Service that keeps source
// addresses, named by the serving certificate once it has an address; and
// takes the exposure back.
func (s *suite) testHostAccess(t *testing.T, ds *apiary.DataStore) {
	s.must(s.c.Get(s.ctx, client.ObjectKey{Name: ds.Name}, ds))
	bad := ds.DeepCopy()
	bad.Spec.HostAccess = &apiary.HostAccess{Endpoints: []string{"https://192.0.2.9:2379"}}
	wantRejected(t, s.c.Update(s.ctx, bad), "spec", "spec.hostAccess.endpoints is for external DataStores")
	ds.Spec.HostAccess = &apiary.HostAccess{Address: "192.0.2.77"}
	s.must(s.c.Update(s.ctx, ds))
	svcKey := client.ObjectKey{Namespace: systemNS, Name: managedetcd.HostServiceName(ds)}
	var svc corev1.Service
	s.eventually("host Service, waiting for an address", 10*time.Second, func() error {
		if err := s.c.Get(s.ctx, svcKey, &svc); err != nil {
			return err
		}
		return s.dataStoreCondition(ds.Name, apiary.ConditionHostAccessReady, metav1.ConditionFalse, controllers.ReasonWaitingForAddress)
	})
	if svc.Spec.Type != corev1.ServiceTypeLoadBalancer || svc.Spec.ExternalTrafficPolicy != corev1.ServiceExternalTrafficPolicyLocal ||
		len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != managedetcd.ClientPort {
		t.Errorf("host Service %s %s %v: want a LoadBalancer of the client port alone, keeping source addresses", svc.Spec.Type, svc.Spec.ExternalTrafficPolicy, svc.Spec.Ports)
	}
	serving := func() *x509.Certificate {
		var server corev1.Secret
		s.must(s.c.Get(s.ctx, client.ObjectKey{Namespace: systemNS, Name: managedetcd.SecretName(ds, managedetcd.SecretServer)}, &server))
		block, _ := pem.Decode(server.Data["tls.crt"])
		cert, err := x509.ParseCertificate(block.Bytes)
		s.must(err)
		return cert
	}
	// The address asked for is named before it is assigned.
	var before *x509.Certificate
	s.eventually("serving certificate names the address asked for", 10*time.Second, func() error {
		before = serving()
		if !slices.ContainsFunc(before.IPAddresses, func(ip net.IP) bool { return ip.String() == "192.0.2.77" }) {
			return fmt.Errorf("the serving certificate names %v", before.IPAddresses)
		}
		return nil
	})
	// The load balancer gives it.
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "192.0.2.77"}}
	s.must(s.c.Status().Update(s.ctx, &svc))
	s.eventually("HostAccessReady", 10*time.Second, func() error {
		return s.dataStoreCondition(ds.Name, apiary.ConditionHostAccessReady, metav1.ConditionTrue, controllers.ReasonHostAccessReady)
	})
	s.must(s.c.Get(s.ctx, client.ObjectKey{Name: ds.Name}, ds))
	if !slices.Equal(ds.Status.HostEndpoints, []string{"https://192.0.2.77:2379"}) {
		t.Errorf("status.hostEndpoints %v", ds.Status.HostEndpoints)
	}
	if after := serving(); after.SerialNumber.Cmp(before.SerialNumber) != 0 {
		t.Error("the serving certificate was reissued when the address arrived: the members would restart for nothing")
	}
	// Taken back: the Service goes, and so do the endpoints and condition.
	s.must(s.c.Get(s.ctx, client.ObjectKey{Name: ds.Name}, ds))
	ds.Spec.HostAccess = nil
	s.must(s.c.Update(s.ctx, ds))
	s.eventually("host Service removed", 10*time.Second, func() error {
		if err := s.c.Get(s.ctx, svcKey, &corev1.Service{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("host Service: %v", err)
		}
		var got apiary.DataStore
		s.must(s.c.Get(s.ctx, client.ObjectKey{Name: ds.Name}, &got))
		if len(got.Status.HostEndpoints) > 0 || meta.FindStatusCondition(got.Status.Conditions, apiary.ConditionHostAccessReady) != nil {
			return fmt.Errorf("status keeps host access: %v", got.Status.HostEndpoints)
		}
		return nil
	})
}

// With the webhooks gone, the controller still refuses a spec that would
// cross the tenant boundary: nothing of it reaches a pod or the datastore,
// and Ready says why. Deletion is never blocked by it.
func (s *suite) testControllerRechecks(t *testing.T) {
	s.must(s.c.DeleteAllOf(s.ctx, &admissionregistrationv1.ValidatingWebhookConfiguration{}))
	s.must(s.c.DeleteAllOf(s.ctx, &admissionregistrationv1.MutatingWebhookConfiguration{}))
	tcp := newTCP("nowebhook", "default")
	tcp.Spec.APIServer.ExtraArgs = map[string]string{"etcd_servers": "https://127.0.0.1:1", "--authorization-mode=AlwaysAllow": ""}
	s.must(s.c.Create(s.ctx, tcp)) // accepted: nothing checks it at admission now
	s.eventually("Ready=False InvalidSpec", 30*time.Second, func() error {
		return s.tcpCondition("nowebhook", apiary.ConditionReady, metav1.ConditionFalse, controllers.ReasonInvalidSpec)
	})
	c := meta.FindStatusCondition(s.getTCP("nowebhook").Status.Conditions, apiary.ConditionReady)
	for _, want := range []string{"--etcd-servers cannot be set", "--authorization-mode cannot be set", "spec.apiServer.extraArgs"} {
		if !strings.Contains(c.Message, want) {
			t.Errorf("Ready message %q does not say %q", c.Message, want)
		}
	}
	s.eventually("InvalidSpec event", 10*time.Second, func() error {
		if !s.hasEvent(t, "nowebhook", controllers.ReasonInvalidSpec) {
			return fmt.Errorf("no %s event", controllers.ReasonInvalidSpec)
		}
		return nil
	})
	// A few resyncs later nothing was made for it.
	time.Sleep(2 * resync)
	if err := s.c.Get(s.ctx, client.ObjectKey{Namespace: tenantsNS, Name: render.DeploymentName(tcp)}, &appsv1.Deployment{}); !apierrors.IsNotFound(err) {
		t.Errorf("Deployment of a refused spec: %v", err)
	}
	tenant := datastore.TenantFor(s.getTCP("nowebhook").UID)
	s.wantEtcdTenant(t, tenant, false)

	// Fixed, it provisions; refused again, then deleted, it goes away.
	s.must(s.updateTCP("nowebhook", func(p *apiary.TenantControlPlane) {
		p.Spec.APIServer.ExtraArgs = map[string]string{"audit-log-maxage": "3"}
	}))
	s.eventually("Deployment once the spec is valid", 30*time.Second, func() error {
		return s.c.Get(s.ctx, client.ObjectKey{Namespace: tenantsNS, Name: render.DeploymentName(tcp)}, &appsv1.Deployment{})
	})
	s.must(s.updateTCP("nowebhook", func(p *apiary.TenantControlPlane) {
		p.Spec.Scheduler.ExtraArgs = map[string]string{"kubeconfig": "/etc/kubernetes/admin.conf"}
	}))
	s.eventually("Ready=False InvalidSpec again", 30*time.Second, func() error {
		return s.tcpCondition("nowebhook", apiary.ConditionReady, metav1.ConditionFalse, controllers.ReasonInvalidSpec)
	})
	var dep appsv1.Deployment
	s.must(s.c.Get(s.ctx, client.ObjectKey{Namespace: tenantsNS, Name: render.DeploymentName(tcp)}, &dep))
	// The flags are container args (the command is the binary alone).
	scheduler := false
	for _, ctr := range dep.Spec.Template.Spec.Containers {
		for _, a := range append(slices.Clone(ctr.Command), ctr.Args...) {
			if strings.Contains(a, "admin.conf") {
				t.Errorf("refused flag reached container %s: %s", ctr.Name, a)
			}
			scheduler = scheduler || strings.HasPrefix(a, "--kubeconfig=/etc/kubernetes/scheduler.conf")
		}
	}
	if !scheduler {
		t.Errorf("no container runs with the scheduler's own --kubeconfig: the check above looked at the wrong place")
	}
	s.must(s.c.Delete(s.ctx, s.getTCP("nowebhook")))
	s.eventually("refused tenant deleted", 30*time.Second, func() error {
		if err := s.c.Get(s.ctx, client.ObjectKeyFromObject(tcp), &apiary.TenantControlPlane{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there: %v", err)
		}
		return nil
	})
	s.wantEtcdTenant(t, tenant, false)

	// Past admission, the controller still refuses what the webhook would
	// have: konnectivity off without the admin's consent, a DataStore that
	// does not take the namespace, another tenant's object names.
	direct := newTCP("nowebhook-direct", "default")
	direct.Spec.Addons.Konnectivity.Enabled = ptr.To(false)
	s.must(s.c.Create(s.ctx, direct))
	s.eventually("konnectivity off refused by the controller", 30*time.Second, func() error {
		c := meta.FindStatusCondition(s.getTCP("nowebhook-direct").Status.Conditions, apiary.ConditionReady)
		if c == nil || c.Reason != controllers.ReasonInvalidSpec || !strings.Contains(c.Message, "spec.addons.konnectivity.enabled") {
			return fmt.Errorf("Ready %+v", c)
		}
		return nil
	})
	s.must(s.c.Create(s.ctx, newTCP("nowebhook-restricted", "restricted")))
	s.eventually("DataStore not taking the namespace refused by the controller", 30*time.Second, func() error {
		return s.tcpCondition("nowebhook-restricted", apiary.ConditionDataStoreReady, metav1.ConditionFalse, controllers.ReasonNamespaceNotAllowed)
	})
	if _, err := s.root.UserGet(s.ctx, datastore.TenantFor(s.getTCP("nowebhook-restricted").UID).User); err == nil {
		t.Errorf("an etcd user was made for a tenant its DataStore does not take")
	}
	s.must(s.c.Create(s.ctx, newTCP("collide", "default")))
	s.eventually("collide provisioned", 30*time.Second, func() error {
		return s.tcpCondition("collide", apiary.ConditionCertificatesReady, metav1.ConditionTrue, "")
	})
	s.must(s.c.Create(s.ctx, newTCP("collide-front-proxy", "default")))
	s.eventually("a newer tenant taking an older one's names refused by the controller", 30*time.Second, func() error {
		c := meta.FindStatusCondition(s.getTCP("collide-front-proxy").Status.Conditions, apiary.ConditionReady)
		if c == nil || c.Reason != controllers.ReasonInvalidSpec || !strings.Contains(c.Message, "collide-front-proxy-ca") {
			return fmt.Errorf("Ready %+v", c)
		}
		return nil
	})
	if err := s.tcpCondition("collide", apiary.ConditionCertificatesReady, metav1.ConditionTrue, ""); err != nil {
		t.Errorf("the older tenant suffered: %v", err)
	}
}

func (s *suite) dataStore(name string) *apiary.DataStore {
	s.t.Helper()
	var ds apiary.DataStore
	s.must(s.c.Get(s.ctx, client.ObjectKey{Name: name}, &ds))
	return &ds
}

// A Secret someone else made under a tenant Secret's name is neither
// adopted nor overwritten: issuing fails with a message that says so, with
// the controller's backoff, until it is gone.
func (s *suite) testForeignSecret(t *testing.T) {
	foreign := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: tenantsNS, Name: "foreign-ca"}, StringData: map[string]string{"tls.crt": "not ours"}}
	s.must(s.c.Create(s.ctx, foreign))
	s.must(s.c.Create(s.ctx, newTCP("foreign", "default")))
	s.eventually("IssueFailed naming the foreign Secret", 30*time.Second, func() error {
		if err := s.tcpCondition("foreign", apiary.ConditionCertificatesReady, metav1.ConditionFalse, controllers.ReasonIssueFailed); err != nil {
			return err
		}
		c := meta.FindStatusCondition(s.getTCP("foreign").Status.Conditions, apiary.ConditionCertificatesReady)
		if !strings.Contains(c.Message, "Secret tenants/foreign-ca already exists and was not made by Apiary") {
			return fmt.Errorf("message %q", c.Message)
		}
		return nil
	})
	// Failed reconciles back off exponentially (a hot loop would retry
	// every 200 ms); the other tenants' reconciles succeed.
	time.Sleep(5 * time.Second)
	before := reconcileErrors(t)
	time.Sleep(5 * time.Second)
	if n := reconcileErrors(t) - before; n > 4 {
		t.Errorf("%v failed reconciles in 5 s with a foreign Secret: a hot loop", n)
	}
	var got corev1.Secret
	s.must(s.c.Get(s.ctx, client.ObjectKeyFromObject(foreign), &got))
	if string(got.Data["tls.crt"]) != "not ours" || len(got.OwnerReferences) != 0 {
		t.Errorf("the foreign Secret was changed: %v owners %v", got.Data, got.OwnerReferences)
	}
	s.must(s.c.Delete(s.ctx, &got))
	s.eventually("issued once the foreign Secret is gone", 60*time.Second, func() error {
		return s.tcpCondition("foreign", apiary.ConditionCertificatesReady, metav1.ConditionTrue, controllers.ReasonIssued)
	})
	s.must(s.c.Delete(s.ctx, s.getTCP("foreign")))
	s.eventually("foreign deleted", 30*time.Second, func() error {
		if err := s.c.Get(s.ctx, client.ObjectKey{Namespace: tenantsNS, Name: "foreign"}, &apiary.TenantControlPlane{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there: %v", err)
		}
		return nil
	})
}

func reconcileErrors(t *testing.T) float64 { return reconciles(t, "error") }
