package v1alpha1

import (
	"net/netip"
	"reflect"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

func TestDefaultFillsEverything(t *testing.T) {
	tcp := &TenantControlPlane{}
	tcp.Default()
	want := TenantControlPlaneSpec{
		Version:  DefaultVersion,
		Mode:     ModeStandalone,
		Replicas: ptr.To(DefaultReplicas),
		Network: NetworkSpec{
			ServiceType:   corev1.ServiceTypeLoadBalancer,
			Port:          DefaultPort,
			PodCIDR:       DefaultPodCIDR,
			ServiceCIDR:   DefaultServiceCIDR,
			DNSServiceIP:  "10.96.0.10",
			ClusterDomain: DefaultClusterDomain,
		},
		Addons: AddonsSpec{
			CoreDNS:      AddonSpec{Enabled: ptr.To(true)},
			KubeProxy:    AddonSpec{Enabled: ptr.To(true)},
			Konnectivity: AddonSpec{Enabled: ptr.To(true)},
		},
		Certificates: CertificatesSpec{
			Validity:    &metav1.Duration{Duration: 8760 * time.Hour},
			RenewBefore: &metav1.Duration{Duration: 720 * time.Hour},
		},
	}
	if !reflect.DeepEqual(tcp.Spec, want) {
		t.Errorf("Default() spec =\n%+v\nwant\n%+v", tcp.Spec, want)
	}
	// Values that the spec documents.
	if DefaultVersion != "v1.37.2" || DefaultReplicas != 2 || DefaultPort != 6443 ||
		DefaultPodCIDR != "10.244.0.0/16" || DefaultServiceCIDR != "10.96.0.0/16" || DefaultClusterDomain != "cluster.local" {
		t.Errorf("defaults changed: %s %d %d %s %s %s", DefaultVersion, DefaultReplicas, DefaultPort, DefaultPodCIDR, DefaultServiceCIDR, DefaultClusterDomain)
	}
	// Defaulting leaves status and metadata alone.
	if !reflect.DeepEqual(tcp.Status, TenantControlPlaneStatus{}) || tcp.Name != "" {
		t.Errorf("Default() touched status or metadata: %+v", tcp)
	}

	// Idempotent.
	again := tcp.DeepCopy()
	again.Default()
	if !reflect.DeepEqual(again, tcp) {
		t.Errorf("second Default() changed the object:\n%+v\n%+v", again.Spec, tcp.Spec)
	}
	// The defaulted pointers are not shared between objects.
	other := &TenantControlPlane{}
	other.Default()
	*other.Spec.Replicas = 5
	*other.Spec.Addons.CoreDNS.Enabled = false
	other.Spec.Certificates.Validity.Duration = time.Hour
	if *tcp.Spec.Replicas != DefaultReplicas || !*tcp.Spec.Addons.CoreDNS.Enabled || tcp.Spec.Certificates.Validity.Duration != DefaultCertificateValidity {
		t.Error("Default() shares pointers between objects")
	}
}

func TestDefaultKeepsSetFields(t *testing.T) {
	spec := TenantControlPlaneSpec{
		Version:   "v1.35.1",
		Mode:      ModeRegistered,
		Replicas:  ptr.To[int32](3),
		DataStore: "ds-a",
		Network: NetworkSpec{
			ServiceType:   corev1.ServiceTypeNodePort,
			Address:       "192.0.2.1",
			Port:          443,
			CertSANs:      []string{"api.example.com"},
			PodCIDR:       "10.1.0.0/16",
			ServiceCIDR:   "10.2.0.0/16",
			DNSServiceIP:  "10.2.0.53",
			ClusterDomain: "tenant.example",
		},
		APIServer: ComponentSpec{ExtraArgs: map[string]string{"v": "2"}},
		Addons: AddonsSpec{
			CoreDNS:      AddonSpec{Enabled: ptr.To(false)},
			KubeProxy:    AddonSpec{Enabled: ptr.To(false)},
			Konnectivity: AddonSpec{Enabled: ptr.To(false)},
		},
		Certificates: CertificatesSpec{
			Validity:    &metav1.Duration{Duration: 10 * time.Minute},
			RenewBefore: &metav1.Duration{Duration: 4 * time.Minute},
		},
	}
	tcp := &TenantControlPlane{Spec: *spec.DeepCopy()}
	tcp.Default()
	if !reflect.DeepEqual(tcp.Spec, spec) {
		t.Errorf("Default() changed set fields:\n%+v\nwant\n%+v", tcp.Spec, spec)
	}

	// Replicas explicitly 0 is set, not defaulted (validation rejects it).
	zero := &TenantControlPlane{Spec: TenantControlPlaneSpec{Replicas: ptr.To[int32](0)}}
	zero.Default()
	if *zero.Spec.Replicas != 0 {
		t.Errorf("Default() replaced replicas 0 with %d", *zero.Spec.Replicas)
	}
}

func TestDefaultDNSServiceIPFollowsServiceCIDR(t *testing.T) {
	tests := []struct {
		serviceCIDR string
		want        string
	}{
		{"172.20.0.0/16", "172.20.0.10"},
		{"10.100.0.0/12", "10.96.0.10"}, // non-canonical: the masked network counts
		{"192.168.5.0/28", "192.168.5.10"},
		{"192.168.5.0/29", ""}, // 8 addresses, no 10th one
		{"fd00:10:96::/112", "fd00:10:96::a"},
		{"fd00::/108", "fd00::a"},
		{"not-a-cidr", ""},
	}
	for _, tt := range tests {
		t.Run(tt.serviceCIDR, func(t *testing.T) {
			tcp := &TenantControlPlane{Spec: TenantControlPlaneSpec{Network: NetworkSpec{ServiceCIDR: tt.serviceCIDR}}}
			tcp.Default()
			if got := tcp.Spec.Network.DNSServiceIP; got != tt.want {
				t.Errorf("dnsServiceIP for serviceCIDR %s = %q, want %q", tt.serviceCIDR, got, tt.want)
			}
			if tcp.Spec.Network.ServiceCIDR != tt.serviceCIDR {
				t.Errorf("serviceCIDR rewritten to %q", tcp.Spec.Network.ServiceCIDR)
			}
		})
	}
}

func TestNthIP(t *testing.T) {
	tests := []struct {
		cidr string
		n    int
		want string // "" when NthIP reports false
	}{
		{"10.96.0.0/16", 0, "10.96.0.0"},
		{"10.96.0.0/16", 1, "10.96.0.1"},
		{"10.96.0.0/16", 10, "10.96.0.10"},
		{"10.96.0.0/16", 256, "10.96.1.0"},
		{"10.96.0.0/16", 65535, "10.96.255.255"},
		{"10.96.0.0/16", 65536, ""},
		{"10.96.7.9/16", 10, "10.96.0.10"}, // masked first
		{"10.0.0.0/30", 3, "10.0.0.3"},
		{"10.0.0.0/30", 4, ""},
		{"10.0.0.0/30", 10, ""},
		{"10.0.0.4/32", 0, "10.0.0.4"},
		{"10.0.0.4/32", 1, ""},
		{"255.255.255.254/31", 1, "255.255.255.255"},
		{"255.255.255.255/32", 1, ""}, // past the end of the address space
		{"fd00::/108", 10, "fd00::a"},
		{"fd00:10:96::/112", 1, "fd00:10:96::1"},
		{"fd00::/120", 255, "fd00::ff"},
		{"fd00::/120", 256, ""},
		{"::/128", 0, "::"},
		{"::/128", 1, ""},
		{"ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff/128", 1, ""},
		{"10.96.0.0", 10, ""},
		{"garbage", 1, ""},
		{"", 0, ""},
	}
	for _, tt := range tests {
		got, ok := NthIP(tt.cidr, tt.n)
		if tt.want == "" {
			if ok || got.IsValid() {
				t.Errorf("NthIP(%q, %d) = %s, %v; want false", tt.cidr, tt.n, got, ok)
			}
			continue
		}
		if !ok || got != netip.MustParseAddr(tt.want) {
			t.Errorf("NthIP(%q, %d) = %s, %v; want %s, true", tt.cidr, tt.n, got, ok, tt.want)
		}
	}
}

func TestDefaultRenewBeforeFollowsAShortValidity(t *testing.T) {
	for _, tt := range []struct{ validity, want time.Duration }{
		{8760 * time.Hour, 720 * time.Hour},
		{24 * time.Hour, 8 * time.Hour},
		{10 * time.Minute, 200 * time.Second},
		{2 * time.Minute, time.Minute},
	} {
		tcp := &TenantControlPlane{Spec: TenantControlPlaneSpec{Certificates: CertificatesSpec{Validity: &metav1.Duration{Duration: tt.validity}}}}
		tcp.Default()
		if got := tcp.Spec.Certificates.RenewBefore.Duration; got != tt.want {
			t.Errorf("validity %s: renewBefore defaulted to %s, want %s", tt.validity, got, tt.want)
		}
	}
}
