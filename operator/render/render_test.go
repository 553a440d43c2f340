package render

import (
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/apiaryhq/apiary/internal/golden"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

func fixture() *apiary.TenantControlPlane {
	tcp := &apiary.TenantControlPlane{
		ObjectMeta: metav1.ObjectMeta{Name: "acme", Namespace: "tenants", UID: "0a1b2c3d-0000-4000-8000-000000000001"},
	}
	tcp.Default()
	return tcp
}

func inputs(tcp *apiary.TenantControlPlane) Inputs {
	return Inputs{
		TCP:              tcp,
		AdvertiseAddress: "192.0.2.10",
		EtcdServers:      []string{"https://etcd-0.etcd:2379", "https://etcd-1.etcd:2379"},
		EtcdPrefix:       "/apiary/" + string(tcp.UID),
		ConfigHash:       "0123456789abcdef",
	}
}

func TestDeploymentGolden(t *testing.T) {
	golden.YAML(t, "deployment", Deployment(inputs(fixture())))
}

func TestDeploymentGoldenCustomised(t *testing.T) {
	tcp := fixture()
	tcp.Spec.Replicas = new(int32(3))
	tcp.Spec.Network.Port = 443
	tcp.Spec.APIServer.ExtraArgs = map[string]string{"audit-log-maxage": "7", "profiling": "true"}
	tcp.Spec.Scheduler.ExtraArgs = map[string]string{"v": "4"}
	in := inputs(tcp)
	in.ImageRepository = "mirror.example.com/k8s"
	golden.YAML(t, "deployment-customised", Deployment(in))
}

func TestServiceGolden(t *testing.T) {
	golden.YAML(t, "service", Service(fixture()))
	tcp := fixture()
	tcp.Spec.Network.Address = "192.0.2.50"
	golden.YAML(t, "service-fixed-address", Service(tcp))
}

func TestArgsAreDeterministicAndSorted(t *testing.T) {
	tcp := fixture()
	tcp.Spec.APIServer.ExtraArgs = map[string]string{"z": "1", "a": "2", "m": "3", "audit-log-path": "-"}
	first := APIServerArgs(inputs(tcp))
	for range 50 {
		if got := APIServerArgs(inputs(tcp)); !slices.Equal(got, first) {
			t.Fatalf("arguments changed between renders:\n%v\n%v", first, got)
		}
	}
	if !slices.IsSorted(first) {
		t.Errorf("arguments are not sorted: %v", first)
	}
}

func TestExtraArgsOverrideDefaults(t *testing.T) {
	tcp := fixture()
	tcp.Spec.APIServer.ExtraArgs = map[string]string{"authorization-mode": "RBAC"}
	args := APIServerArgs(inputs(tcp))
	if !slices.Contains(args, "--authorization-mode=RBAC") || slices.Contains(args, "--authorization-mode=Node,RBAC") {
		t.Errorf("extraArgs did not replace the default: %v", args)
	}
	count := 0
	for _, a := range args {
		if strings.HasPrefix(a, "--authorization-mode=") {
			count++
		}
	}
	if count != 1 {
		t.Errorf("--authorization-mode appears %d times", count)
	}
}

// A spec that adds feature gates keeps Apiary's, after its own so that
// Apiary's win.
func TestExtraFeatureGatesMerged(t *testing.T) {
	tcp := fixture()
	tcp.Spec.APIServer.ExtraArgs = map[string]string{"feature-gates": "MutatingAdmissionPolicy=true"}
	args := APIServerArgs(inputs(tcp))
	if want := "--feature-gates=MutatingAdmissionPolicy=true,ListFromCacheSnapshot=false,ManifestBasedAdmissionControlConfig=true"; !slices.Contains(args, want) {
		t.Errorf("want %s in %v", want, args)
	}
}

func TestAPIServerArgsBindTenantToItsDatastore(t *testing.T) {
	args := APIServerArgs(inputs(fixture()))
	for _, want := range []string{
		"--etcd-prefix=/apiary/0a1b2c3d-0000-4000-8000-000000000001",
		"--etcd-servers=https://etcd-0.etcd:2379,https://etcd-1.etcd:2379",
		"--etcd-certfile=/etc/kubernetes/pki/apiserver-etcd-client.crt",
		"--etcd-compaction-interval=0",
		"--advertise-address=192.0.2.10",
		"--service-cluster-ip-range=10.96.0.0/16",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
	} {
		if !slices.Contains(args, want) {
			t.Errorf("missing %s in %v", want, args)
		}
	}
}

func TestAPIServerCertRequestNames(t *testing.T) {
	tcp := fixture()
	tcp.Spec.Network.CertSANs = []string{"api.acme.example", "198.51.100.7"}
	tcp.Spec.Network.Address = "192.0.2.10"
	req := APIServerCertRequest(tcp, Endpoint{Host: "192.0.2.10", Port: 6443, ClusterIP: "10.0.0.42"}, "cluster.local")
	for _, name := range []string{"kubernetes", "kubernetes.default.svc.cluster.local", "acme", "acme.tenants.svc", "acme.tenants.svc.cluster.local", "localhost", "api.acme.example"} {
		if !slices.Contains(req.DNSNames, name) {
			t.Errorf("missing DNS name %s in %v", name, req.DNSNames)
		}
	}
	var ips []string
	for _, ip := range req.IPs {
		ips = append(ips, ip.String())
	}
	slices.Sort(ips)
	if want := []string{"10.0.0.42", "10.96.0.1", "127.0.0.1", "192.0.2.10", "198.51.100.7"}; !slices.Equal(ips, want) {
		t.Errorf("IPs %v, want %v (each once)", ips, want)
	}
}

func TestKubeconfigRoundTrip(t *testing.T) {
	raw, err := Kubeconfig("acme", "https://192.0.2.10:6443", []byte("CA"), "acme-admin", []byte("CERT"), []byte("KEY"))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.Load(raw)
	if err != nil {
		t.Fatal(err)
	}
	ctx := cfg.Contexts[cfg.CurrentContext]
	if ctx == nil || cfg.Clusters[ctx.Cluster].Server != "https://192.0.2.10:6443" || string(cfg.AuthInfos[ctx.AuthInfo].ClientKeyData) != "KEY" {
		t.Errorf("kubeconfig does not round-trip: %s", raw)
	}
}

func TestConfigHashChangesWithContent(t *testing.T) {
	a := ConfigHash(map[string]map[string][]byte{"s1": {"k": []byte("v")}, "s2": {"k": []byte("w")}})
	b := ConfigHash(map[string]map[string][]byte{"s2": {"k": []byte("w")}, "s1": {"k": []byte("v")}})
	c := ConfigHash(map[string]map[string][]byte{"s1": {"k": []byte("v2")}, "s2": {"k": []byte("w")}})
	if a != b {
		t.Errorf("hash depends on map order")
	}
	if a == c {
		t.Errorf("hash ignores content")
	}
}

func managedFixture(replicas int32) *apiary.DataStore {
	return &apiary.DataStore{
		ObjectMeta: metav1.ObjectMeta{Name: "default", UID: "5e7c1d2a-0000-4000-8000-000000000002"},
		Spec: apiary.DataStoreSpec{Managed: &apiary.ManagedEtcd{
			Namespace: "apiary-system", Replicas: replicas, Version: "3.6.16",
		}},
	}
}

func TestManagedEtcdGolden(t *testing.T) {
	in := EtcdInputs{DataStore: managedFixture(3), ClusterDomain: "cluster.local", ConfigHash: "fedcba9876543210", PeerCAOnly: true}
	golden.YAML(t, "etcd-statefulset", EtcdStatefulSet(in))
	golden.YAML(t, "etcd-service", EtcdService(in.DataStore))
	golden.YAML(t, "etcd-pdb", EtcdPodDisruptionBudget(in.DataStore))
	dev := managedFixture(1)
	dev.Spec.Managed.Storage.EmptyDir = true
	golden.YAML(t, "etcd-statefulset-emptydir", EtcdStatefulSet(EtcdInputs{DataStore: dev, ClusterDomain: "cluster.local", ConfigHash: "0"}))
}

func TestManagedEtcdNames(t *testing.T) {
	ds := managedFixture(3)
	eps := EtcdEndpoints(ds, "cluster.local")
	want := []string{
		"https://default-etcd-0.default-etcd.apiary-system.svc.cluster.local:2379",
		"https://default-etcd-1.default-etcd.apiary-system.svc.cluster.local:2379",
		"https://default-etcd-2.default-etcd.apiary-system.svc.cluster.local:2379",
	}
	if !slices.Equal(eps, want) {
		t.Errorf("endpoints %v", eps)
	}
	// Every member's name is covered by the serving certificate.
	req := EtcdServingCertRequest(ds, "cluster.local", true)
	if !slices.Contains(req.DNSNames, "*.default-etcd.apiary-system.svc.cluster.local") {
		t.Errorf("SANs %v", req.DNSNames)
	}
	args := EtcdArgs(EtcdInputs{DataStore: ds, ClusterDomain: "cluster.local"})
	for _, a := range []string{
		"--initial-cluster=default-etcd-0=https://default-etcd-0.default-etcd.apiary-system.svc.cluster.local:2380,default-etcd-1=https://default-etcd-1.default-etcd.apiary-system.svc.cluster.local:2380,default-etcd-2=https://default-etcd-2.default-etcd.apiary-system.svc.cluster.local:2380",
		"--client-cert-auth=true", "--peer-client-cert-auth=true", "--auto-compaction-mode=periodic",
		// 80 % of the default 1Gi volume.
		"--quota-backend-bytes=858993456",
		"--peer-trusted-ca-file=/etc/etcd/pki/peer-trust.crt",
	} {
		if !slices.Contains(args, a) {
			t.Errorf("missing %s in %v", a, args)
		}
	}
	// The peer common name is required only once the client CA is no
	// longer trusted on the peer port.
	if slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--peer-cert-allowed-cn") }) {
		t.Errorf("peer-cert-allowed-cn while moving to the peer CA: %v", args)
	}
	separate := EtcdArgs(EtcdInputs{DataStore: ds, ClusterDomain: "cluster.local", PeerCAOnly: true})
	if !slices.Contains(separate, "--peer-cert-allowed-cn="+EtcdPeerCN) {
		t.Errorf("separate peer CA without peer-cert-allowed-cn: %v", separate)
	}
}

func TestEtcdQuotaBytes(t *testing.T) {
	for size, want := range map[string]int64{"": 858993456, "10Gi": 8589934592, "500M": 400000000} {
		m := &apiary.ManagedEtcd{}
		if size != "" {
			q := resource.MustParse(size)
			m.Storage.Size = &q
		}
		if got := EtcdQuotaBytes(m); got != want {
			t.Errorf("size %q: quota %d, want %d", size, got, want)
		}
	}
}

func TestNetworkPolicyGolden(t *testing.T) {
	in := PolicyInputs{
		OperatorNamespace: "apiary-system", OperatorPodLabels: map[string]string{"app.kubernetes.io/name": "apiary"},
		DNSNamespace: "kube-system", DNSPodLabels: map[string]string{"k8s-app": "kube-dns"},
		MonitoringNamespaceLabels: map[string]string{"kubernetes.io/metadata.name": "monitoring"},
		ManagementCIDRs:           []string{"10.200.0.0/16", "10.201.0.0/16", "fd00:200::/56"},
	}
	golden.YAML(t, "networkpolicy-tenant", TenantNetworkPolicy(fixture(), managedFixture(3), in))
	golden.YAML(t, "networkpolicy-etcd", EtcdNetworkPolicy(managedFixture(3), in))
	// An external DataStore: no etcd pods to select; its client port is
	// outside the management ranges or not reachable at all.
	external := TenantNetworkPolicy(fixture(), &apiary.DataStore{}, in)
	if n := len(external.Spec.Egress); n != 2 {
		t.Errorf("external DataStore: %d egress rules, want DNS and outside", n)
	}
}

func TestAdmissionGolden(t *testing.T) {
	tcp := fixture()
	within, err := AdmissionConfigMap(tcp, nil)
	if err != nil {
		t.Fatal(err)
	}
	golden.YAML(t, "admission-within-quota", within)
	over, err := AdmissionConfigMap(tcp, &QuotaExceeded{Quota: apiary.TenantQuota{
		Bytes: resource.NewQuantity(64<<20, resource.BinarySI), Objects: new(int64(5000)),
	}})
	if err != nil {
		t.Fatal(err)
	}
	golden.YAML(t, "admission-over-quota", over)
	golden.Bytes(t, "datastore-quota-policy.golden.yaml", []byte(over.Data[KeyQuotaPolicy]))
}

// Versions without manifest-based admission get no admission flag, volume
// or gate (1.35 would refuse the gate and the configuration's field).
func TestStaticAdmissionOnlyFrom136(t *testing.T) {
	for v, want := range map[string]bool{"v1.35.4": false, "v1.36.0": true, "v1.37.2": true} {
		tcp := fixture()
		tcp.Spec.Version = v
		args := strings.Join(APIServerArgs(inputs(tcp)), " ")
		hasFlag := strings.Contains(args, "--admission-control-config-file=")
		hasGate := strings.Contains(args, "ManifestBasedAdmissionControlConfig=true")
		dep := Deployment(inputs(tcp))
		hasVolume := false
		for _, vol := range dep.Spec.Template.Spec.Volumes {
			hasVolume = hasVolume || *vol.Name == volumePolicies
		}
		if hasFlag != want || hasGate != want || hasVolume != want {
			t.Errorf("%s: flag %t, gate %t, volume %t; want %t", v, hasFlag, hasGate, hasVolume, want)
		}
	}
}
