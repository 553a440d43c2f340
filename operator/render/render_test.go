package render

import (
	"k8s.io/utils/ptr"

	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"reflect"
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
		TCP:         tcp,
		Version:     tcp.Spec.Version,
		Endpoint:    Endpoint{Host: "192.0.2.10", Port: tcp.Spec.Network.Port, ClusterIP: "10.96.0.20"},
		EtcdServers: []string{"https://etcd-0.etcd:2379", "https://etcd-1.etcd:2379"},
		EtcdPrefix:  "/apiary/" + string(tcp.UID),
		Secrets:     map[SecretKind]map[string][]byte{SecretCA: {KeyTLSCert: []byte("ca")}},
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

// Every image of the pod comes from the configured repository, written
// with or without a trailing "/".
func TestImageRepository(t *testing.T) {
	in := inputs(fixture())
	in.ImageRepository = "mirror.example.com/k8s/"
	for _, c := range Deployment(in).Spec.Template.Spec.Containers {
		if img := *c.Image; !strings.HasPrefix(img, "mirror.example.com/k8s/") || strings.Contains(img, "//") {
			t.Errorf("%s: image %s", *c.Name, img)
		}
	}
}

// The webhook refuses extraArgs that point into MountDirs: every directory
// a control-plane container mounts (konnectivity-server's too) must be in
// it.
func TestMountDirsCoverEveryMount(t *testing.T) {
	for _, c := range Deployment(inputs(fixture())).Spec.Template.Spec.Containers {
		for _, m := range c.VolumeMounts {
			if !slices.ContainsFunc(MountDirs, func(d string) bool { return *m.MountPath == d || strings.HasPrefix(*m.MountPath, d+"/") }) {
				t.Errorf("%s mounts %s, outside MountDirs %v", *c.Name, *m.MountPath, MountDirs)
			}
		}
	}
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

func TestNetworkPolicyGolden(t *testing.T) {
	in := PolicyInputs{
		OperatorNamespace: "apiary-system", OperatorPodLabels: map[string]string{"app.kubernetes.io/name": "apiary"},
		DNSNamespace: "kube-system", DNSPodLabels: map[string]string{"k8s-app": "kube-dns"},
		MonitoringNamespaceLabels: map[string]string{"kubernetes.io/metadata.name": "monitoring"},
		ManagementCIDRs:           []string{"10.200.0.0/16", "10.201.0.0/16", "fd00:200::/56"},
	}
	golden.YAML(t, "networkpolicy-tenant", TenantNetworkPolicy(fixture(), managedFixture(3), in))
	golden.YAML(t, "networkpolicy-etcd", EtcdNetworkPolicy(managedFixture(3), in, []string{"192.0.2.50/32"}))
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

// The pods roll when a credential they mount changes, and only then: the
// admin kubeconfig is not mounted.
func TestConfigHashFollowsMountedSecrets(t *testing.T) {
	in := inputs(fixture())
	base := Deployment(in).Spec.Template.Annotations[AnnotationConfigHash]
	in.Secrets = map[SecretKind]map[string][]byte{SecretCA: {KeyTLSCert: []byte("ca")}, SecretAdminKubeconfig: {"admin.conf": []byte("x")}}
	if got := Deployment(in).Spec.Template.Annotations[AnnotationConfigHash]; got != base {
		t.Errorf("an unmounted Secret changed the hash: %s → %s", base, got)
	}
	in.Secrets = map[SecretKind]map[string][]byte{SecretCA: {KeyTLSCert: []byte("renewed")}}
	if got := Deployment(in).Spec.Template.Annotations[AnnotationConfigHash]; got == base {
		t.Error("a renewed mounted Secret kept the hash: the pods would not roll")
	}
}

// kube-apiserver advertises an IP: the endpoint's, or the Service's
// ClusterIP when the LoadBalancer gave a hostname.
func TestAdvertiseAddress(t *testing.T) {
	for _, c := range []struct {
		ep   Endpoint
		want string
	}{
		{Endpoint{Host: "192.0.2.10", ClusterIP: "10.96.0.20"}, "192.0.2.10"},
		{Endpoint{Host: "2001:db8::10", ClusterIP: "10.96.0.20"}, "2001:db8::10"},
		{Endpoint{Host: "lb.example.com", ClusterIP: "10.96.0.20"}, "10.96.0.20"},
	} {
		in := inputs(fixture())
		in.Endpoint = c.ep
		if got := in.AdvertiseAddress(); got != c.want {
			t.Errorf("%+v: %s, want %s", c.ep, got, c.want)
		}
		if !slices.Contains(APIServerArgs(in), "--advertise-address="+c.want) {
			t.Errorf("%+v: --advertise-address=%s not in the arguments", c.ep, c.want)
		}
	}
}

// Exposed to hosts, the etcd admits the control-plane hosts' addresses on
// its client port and nowhere else; not exposed, no address from outside.
func TestEtcdNetworkPolicyAdmitsControlPlaneHosts(t *testing.T) {
	in := PolicyInputs{OperatorNamespace: "apiary-system", OperatorPodLabels: map[string]string{"app": "apiary"}}
	ds := managedFixture(3)
	ds.Spec.HostAccess = &apiary.HostAccess{}
	np := EtcdNetworkPolicy(ds, in, []string{"192.0.2.50/32", "2001:db8::5/128"})
	var blocks []string
	for _, rule := range np.Spec.Ingress {
		for _, from := range rule.From {
			if from.IPBlock != nil {
				blocks = append(blocks, *from.IPBlock.CIDR)
				if len(rule.Ports) != 1 || rule.Ports[0].Port.IntValue() != 2379 {
					t.Errorf("hosts admitted to ports %v, want the client port alone", rule.Ports)
				}
			}
		}
	}
	if !slices.Equal(blocks, []string{"192.0.2.50/32", "2001:db8::5/128"}) {
		t.Errorf("ipBlocks %v", blocks)
	}
	ds.Spec.HostAccess = nil
	for _, rule := range EtcdNetworkPolicy(ds, in, []string{"192.0.2.50/32"}).Spec.Ingress {
		for _, from := range rule.From {
			if from.IPBlock != nil {
				t.Errorf("not exposed to hosts, yet %s is admitted", *from.IPBlock.CIDR)
			}
		}
	}
}

func TestEndpointSlicesGolden(t *testing.T) {
	tcp := fixture()
	slices := EndpointSlices(tcp, []Backend{
		{Address: "192.0.2.21", Ready: true, Hostname: "cp-2"},
		// Started, not yet serving: agents first.
		{Address: "192.0.2.20", Ready: false, AgentsReady: true, Hostname: "cp-1"},
		{Address: "192.0.2.22", Ready: false, Hostname: "cp-3"},
		{Address: "2001:db8::20", Ready: true, Hostname: "cp-1"},
		{Address: "not-an-ip", Ready: true, Hostname: "x"},
	})
	if len(slices) != 4 {
		t.Fatalf("%d slices, want two per family (API server, agents)", len(slices))
	}
	golden.YAML(t, "endpointslice-ipv4", slices[0])
	golden.YAML(t, "endpointslice-ipv4-agents", slices[1])
	golden.YAML(t, "endpointslice-ipv6", slices[2])
	golden.YAML(t, "endpointslice-ipv6-agents", slices[3])
	// Konnectivity off: the API server's slices alone.
	off := fixture()
	off.Spec.Addons.Konnectivity.Enabled = ptr.To(false)
	if n := len(EndpointSlices(off, []Backend{{Address: "192.0.2.21", Ready: true}})); n != 1 {
		t.Errorf("konnectivity off: %d slices, want 1", n)
	}
	// The API server refuses a label value with a '/' (found on a real
	// cluster: the first managed-by value was apiary.dev/operator).
	for _, s := range slices {
		if errs := metav1validation.ValidateLabels(s.Labels, field.NewPath("metadata", "labels")); len(errs) > 0 {
			t.Errorf("slice labels: %v", errs.ToAggregate())
		}
	}
	if len(EndpointSlices(tcp, nil)) != 0 {
		t.Error("a slice without backends")
	}
}

// In registered mode the Deployment keeps its template at 0 replicas: the
// same pods come back, unchanged, when the tenant switches to standalone.
func TestHostsOnlyScalesTheDeploymentToZero(t *testing.T) {
	in := inputs(fixture())
	hosted := Deployment(in)
	in.HostsOnly = true
	off := Deployment(in)
	if *off.Spec.Replicas != 0 || *hosted.Spec.Replicas != *in.TCP.Spec.Replicas {
		t.Errorf("replicas hosted %d, hosts only %d; want %d and 0", *hosted.Spec.Replicas, *off.Spec.Replicas, *in.TCP.Spec.Replicas)
	}
	if !reflect.DeepEqual(hosted.Spec.Template, off.Spec.Template) {
		t.Error("the pod template differs between the modes: switching back would roll the pods")
	}
}
