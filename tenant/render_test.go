package tenant

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/apiaryhq/apiary/internal/golden"
	"github.com/apiaryhq/apiary/konnectivity"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

const testCA = "-----BEGIN CERTIFICATE-----\nMIIBfake\n-----END CERTIFICATE-----\n"

func fixture() Inputs {
	tcp := &apiary.TenantControlPlane{ObjectMeta: metav1.ObjectMeta{Name: "acme", Namespace: "tenants", UID: "0a1b2c3d-0000-4000-8000-000000000001"}}
	tcp.Default()
	return Inputs{TCP: tcp, Version: tcp.Spec.Version, Server: "https://192.0.2.10:6443", CACert: []byte(testCA)}
}

func TestPartsGolden(t *testing.T) {
	for _, p := range Parts {
		objs, err := Render(fixture(), p)
		if err != nil {
			t.Fatal(err)
		}
		golden.YAML(t, string(p), objs)
	}
}

func TestEveryObjectIsLabelledWithItsPart(t *testing.T) {
	for _, p := range Parts {
		objs, err := Render(fixture(), p)
		if err != nil {
			t.Fatal(err)
		}
		if len(objs) == 0 {
			t.Fatalf("%s renders nothing", p)
		}
		for _, o := range objs {
			if o.GetLabels()[LabelPart] != string(p) || o.GetLabels()[LabelManagedBy] != ManagedBy {
				t.Errorf("%s %s: labels %v", o.GetKind(), o.GetName(), o.GetLabels())
			}
			if o.GetAPIVersion() == "" || o.GetKind() == "" || o.GetName() == "" {
				t.Errorf("incomplete object %v", o.Object)
			}
		}
	}
}

// kubeadm join reads the CA and the server from cluster-info.
func TestClusterInfoIsAPublicKubeconfig(t *testing.T) {
	objs, err := Render(fixture(), PartBootstrap)
	if err != nil {
		t.Fatal(err)
	}
	cm := find(t, objs, "ConfigMap", "kube-public", "cluster-info")
	data, _, _ := unstructured.NestedStringMap(cm.Object, "data")
	cfg, err := clientcmd.Load([]byte(data["kubeconfig"]))
	if err != nil {
		t.Fatal(err)
	}
	c := cfg.Clusters[""]
	if c == nil || c.Server != "https://192.0.2.10:6443" || string(c.CertificateAuthorityData) != testCA {
		t.Fatalf("cluster-info cluster: %+v", c)
	}
	if len(cfg.AuthInfos) != 0 {
		t.Fatalf("cluster-info carries credentials: %v", cfg.AuthInfos)
	}
}

func TestKubeletConfigFollowsTheNetwork(t *testing.T) {
	in := fixture()
	in.TCP.Spec.Network.DNSServiceIP = "10.96.0.53"
	in.TCP.Spec.Network.ClusterDomain = "tenant.example"
	objs, err := Render(in, PartBootstrap)
	if err != nil {
		t.Fatal(err)
	}
	cm := find(t, objs, "ConfigMap", "kube-system", "kubelet-config")
	data, _, _ := unstructured.NestedStringMap(cm.Object, "data")
	var cfg map[string]any
	if err := yaml.Unmarshal([]byte(data[KubeletConfigKey]), &cfg); err != nil {
		t.Fatal(err)
	}
	if dns := cfg["clusterDNS"].([]any); len(dns) != 1 || dns[0] != "10.96.0.53" || cfg["clusterDomain"] != "tenant.example" {
		t.Fatalf("kubelet config: %v", cfg)
	}
}

func TestAddonToggles(t *testing.T) {
	in := fixture()
	for _, p := range Parts {
		if !in.Enabled(p) {
			t.Errorf("%s disabled by default", p)
		}
	}
	in.TCP.Spec.Addons.KubeProxy.Enabled = ptr.To(false)
	if in.Enabled(PartKubeProxy) || !in.Enabled(PartCoreDNS) || !in.Enabled(PartBootstrap) {
		t.Error("toggling kube-proxy off toggled something else")
	}
}

func TestImageRepository(t *testing.T) {
	in := fixture()
	in.ImageRepository = "mirror.example/k8s/"
	objs, err := Render(in, PartKonnectivity)
	if err != nil {
		t.Fatal(err)
	}
	ds := find(t, objs, "DaemonSet", "kube-system", "konnectivity-agent")
	ctrs, _, _ := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "containers")
	img := ctrs[0].(map[string]any)["image"].(string)
	if img != "mirror.example/k8s/kas-network-proxy/proxy-agent:"+konnectivity.Version {
		t.Fatalf("image %s", img)
	}
	args := ctrs[0].(map[string]any)["args"].([]any)
	var joined []string
	for _, a := range args {
		joined = append(joined, a.(string))
	}
	if !strings.Contains(strings.Join(joined, " "), "--proxy-server-host=192.0.2.10 ") {
		t.Fatalf("agent args %v", joined)
	}
	// kubeadm's imageRepository is the same repository, without the "/".
	objs, err = Render(in, PartBootstrap)
	if err != nil {
		t.Fatal(err)
	}
	cm := find(t, objs, "ConfigMap", "kube-system", KubeadmConfigMap)
	data, _, _ := unstructured.NestedStringMap(cm.Object, "data")
	var cfg map[string]any
	if err := yaml.Unmarshal([]byte(data[ClusterConfigurationKey]), &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg["imageRepository"] != "mirror.example/k8s" {
		t.Fatalf("kubeadm imageRepository %v", cfg["imageRepository"])
	}
}

func find(t *testing.T, objs []*unstructured.Unstructured, kind, ns, name string) *unstructured.Unstructured {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == kind && o.GetNamespace() == ns && o.GetName() == name {
			return o
		}
	}
	t.Fatalf("no %s %s/%s", kind, ns, name)
	return nil
}

// Inside the tenant, versions follow the version it runs, not the one
// its spec asks for: mid-upgrade, kubeadm-config and kube-proxy stay at
// the running kube-apiserver's.
func TestObjectsFollowTheRunningVersion(t *testing.T) {
	in := fixture()
	in.TCP.Spec.Version = "v1.99.0"
	in.Version = "v1.37.2"
	for _, p := range []Part{PartBootstrap, PartKubeProxy} {
		objs, err := Render(in, p)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range objs {
			b, err := o.MarshalJSON()
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(string(b), "v1.99.0") {
				t.Errorf("%s %s carries spec.version v1.99.0", o.GetKind(), o.GetName())
			}
		}
	}
	cm := find(t, mustRender(t, in, PartBootstrap), "ConfigMap", "kube-system", "kubeadm-config")
	if !strings.Contains(cm.Object["data"].(map[string]any)["ClusterConfiguration"].(string), "kubernetesVersion: v1.37.2") {
		t.Error("kubeadm-config does not name the running version")
	}
	ds := find(t, mustRender(t, in, PartKubeProxy), "DaemonSet", "kube-system", "kube-proxy")
	if b, _ := ds.MarshalJSON(); !strings.Contains(string(b), "kube-proxy:v1.37.2") {
		t.Error("kube-proxy does not run the running version")
	}
}

// CoreDNS is the one kubeadm pairs with the version the tenant runs: an
// upgrade moves it only once the control plane has moved.
func TestCoreDNSFollowsTheRunningVersion(t *testing.T) {
	for _, c := range []struct{ running, want string }{
		{"v1.36.3", "coredns:v1.14.2"},
		{"v1.37.2", "coredns:v1.14.6"},
		{"v1.35.0", "coredns:v1.13.1"},
		// Outside the pairs (the webhook admits none): the newest pair.
		{"v1.99.0", "coredns:v1.14.6"},
		{"", "coredns:v1.14.6"},
	} {
		in := fixture()
		in.TCP.Spec.Version, in.Version = "v1.37.2", c.running
		dep := find(t, mustRender(t, in, PartCoreDNS), "Deployment", "kube-system", "coredns")
		if b, _ := dep.MarshalJSON(); !strings.Contains(string(b), c.want) {
			t.Errorf("running %q: CoreDNS is not %s", c.running, c.want)
		}
	}
}

func mustRender(t *testing.T, in Inputs, p Part) []*unstructured.Unstructured {
	t.Helper()
	objs, err := Render(in, p)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// The addons the CA rotation waits for (RootCAReaders) are the rendered
// workloads, and each carries the root-CA fingerprint on its pod template
// once given one, and nothing before (no roll for tenants never rotated).
func TestRootCAReadersCarryTheRootCA(t *testing.T) {
	in := fixture()
	for _, w := range RootCAReaders {
		o := find(t, mustRender(t, in, w.Part), w.Kind, w.Namespace, w.Name)
		if _, ok, _ := unstructured.NestedMap(o.Object, "spec", "template", "metadata", "annotations"); ok {
			t.Errorf("%s %s/%s: pod annotations before any rotation", w.Kind, w.Namespace, w.Name)
		}
	}
	in.RootCA = "0123456789abcdef"
	for _, w := range RootCAReaders {
		o := find(t, mustRender(t, in, w.Part), w.Kind, w.Namespace, w.Name)
		if got, _, _ := unstructured.NestedString(o.Object, "spec", "template", "metadata", "annotations", AnnotationRootCA); got != in.RootCA {
			t.Errorf("%s %s/%s: %s %q, want %q", w.Kind, w.Namespace, w.Name, AnnotationRootCA, got, in.RootCA)
		}
	}
}
