package webhooks

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"

	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/tenant"
)

// valid returns a defaulted TenantControlPlane that passes validation.
func valid() *apiary.TenantControlPlane {
	tcp := &apiary.TenantControlPlane{ObjectMeta: metav1.ObjectMeta{Name: "tenant-a", Namespace: "tenants"}}
	tcp.Default()
	return tcp
}

// with returns a valid TenantControlPlane changed by f.
func with(f func(*apiary.TenantControlPlane)) *apiary.TenantControlPlane {
	tcp := valid()
	f(tcp)
	return tcp
}

// want describes one expected field error.
type want struct {
	field  string
	typ    field.ErrorType
	detail []string // substrings of the detail
}

func inv(path string, detail ...string) want {
	return want{field: path, typ: field.ErrorTypeInvalid, detail: detail}
}

func forbidden(path string, detail ...string) want {
	return want{field: path, typ: field.ErrorTypeForbidden, detail: detail}
}

func (w want) matches(e *field.Error) bool {
	if e.Field != w.field || e.Type != w.typ {
		return false
	}
	for _, d := range w.detail {
		if !strings.Contains(e.Detail, d) {
			return false
		}
	}
	return true
}

func (w want) String() string {
	return fmt.Sprintf("%s %s %q", w.field, w.typ, w.detail)
}

func describe(errs field.ErrorList) string {
	var b strings.Builder
	for _, e := range errs {
		fmt.Fprintf(&b, "\n\t%s %s (value %v): %s", e.Field, e.Type, e.BadValue, e.Detail)
	}
	return b.String()
}

// expect checks that errs holds exactly the wanted errors, in any order.
func expect(t *testing.T, errs field.ErrorList, wants ...want) {
	t.Helper()
	used := make([]bool, len(errs))
	for _, w := range wants {
		found := false
		for i, e := range errs {
			if !used[i] && w.matches(e) {
				used[i], found = true, true
				break
			}
		}
		if !found {
			t.Errorf("missing error %s; got:%s", w, describe(errs))
		}
	}
	for i, e := range errs {
		if !used[i] {
			t.Errorf("unexpected error %s %s: %s", e.Field, e.Type, e.Detail)
		}
	}
}

func TestValidateDefaultedIsValid(t *testing.T) {
	tcp := valid()
	if errs := Validate(tcp); len(errs) != 0 {
		t.Fatalf("Validate(defaulted) = %s", describe(errs))
	}
	warns, err := TenantControlPlane{}.ValidateCreate(context.Background(), tcp)
	if err != nil || warns != nil {
		t.Errorf("ValidateCreate(defaulted) = %v, %v; want nil, nil", warns, err)
	}
	warns, err = TenantControlPlane{}.ValidateUpdate(context.Background(), valid(), tcp)
	if err != nil || warns != nil {
		t.Errorf("ValidateUpdate(unchanged) = %v, %v; want nil, nil", warns, err)
	}
}

func TestValidate(t *testing.T) {
	const (
		versionForm = "must be a Kubernetes version of the form vMAJOR.MINOR.PATCH"
		unsupported = "is not supported: supported versions are v1.35.x to v1.37.x"
		preRelease  = "must be a released version without pre-release or build suffix"
		sanRule     = "must be an IP address or a DNS name (optionally starting with *.)"
		dashes      = "must be a flag name matching"
		protected   = "binds the tenant to its own datastore credentials"
	)
	tests := []struct {
		name  string
		tcp   *apiary.TenantControlPlane
		wants []want // none: valid
	}{
		// spec.version
		{"version oldest supported", with(func(t *apiary.TenantControlPlane) { t.Spec.Version = "v1.35.0" }), nil},
		{"version newest supported", with(func(t *apiary.TenantControlPlane) { t.Spec.Version = "v1.37.99" }), nil},
		{"version without v", with(func(t *apiary.TenantControlPlane) { t.Spec.Version = "1.37.2" }),
			[]want{inv("spec.version", versionForm, apiary.DefaultVersion)}},
		{"version without patch", with(func(t *apiary.TenantControlPlane) { t.Spec.Version = "v1.37" }),
			[]want{inv("spec.version", versionForm)}},
		{"version with four parts", with(func(t *apiary.TenantControlPlane) { t.Spec.Version = "v1.37.2.1" }),
			[]want{inv("spec.version", versionForm)}},
		{"version zero-prefixed", with(func(t *apiary.TenantControlPlane) { t.Spec.Version = "v1.036.0" }),
			[]want{inv("spec.version", versionForm)}},
		{"version word", with(func(t *apiary.TenantControlPlane) { t.Spec.Version = "latest" }),
			[]want{inv("spec.version", versionForm)}},
		{"version v only", with(func(t *apiary.TenantControlPlane) { t.Spec.Version = "v" }),
			[]want{inv("spec.version", versionForm)}},
		{"version empty after defaulting", with(func(t *apiary.TenantControlPlane) { t.Spec.Version = "" }),
			[]want{inv("spec.version", versionForm)}},
		{"version pre-release", with(func(t *apiary.TenantControlPlane) { t.Spec.Version = "v1.37.0-rc.1" }),
			[]want{inv("spec.version", preRelease)}},
		{"version alpha", with(func(t *apiary.TenantControlPlane) { t.Spec.Version = "v1.36.0-alpha.0" }),
			[]want{inv("spec.version", preRelease)}},
		{"version build metadata", with(func(t *apiary.TenantControlPlane) { t.Spec.Version = "v1.37.2+apiary.1" }),
			[]want{inv("spec.version", preRelease)}},
		{"version below range", with(func(t *apiary.TenantControlPlane) { t.Spec.Version = "v1.34.9" }),
			[]want{inv("spec.version", unsupported)}},
		{"version above range", with(func(t *apiary.TenantControlPlane) { t.Spec.Version = "v1.38.0" }),
			[]want{inv("spec.version", unsupported)}},
		{"version major 2", with(func(t *apiary.TenantControlPlane) { t.Spec.Version = "v2.36.0" }),
			[]want{inv("spec.version", unsupported)}},
		{"version major 0", with(func(t *apiary.TenantControlPlane) { t.Spec.Version = "v0.36.0" }),
			[]want{inv("spec.version", unsupported)}},

		// spec.mode
		{"mode registered", with(func(t *apiary.TenantControlPlane) { t.Spec.Mode = apiary.ModeRegistered }), nil},
		{"mode unknown", with(func(t *apiary.TenantControlPlane) { t.Spec.Mode = "hosted" }),
			[]want{{field: "spec.mode", typ: field.ErrorTypeNotSupported, detail: []string{`"standalone"`, `"registered"`}}}},
		{"mode wrong case", with(func(t *apiary.TenantControlPlane) { t.Spec.Mode = "Standalone" }),
			[]want{{field: "spec.mode", typ: field.ErrorTypeNotSupported, detail: []string{`"standalone"`}}}},

		// spec.replicas
		{"replicas 1", with(func(t *apiary.TenantControlPlane) { t.Spec.Replicas = ptr.To[int32](1) }), nil},
		{"replicas 7", with(func(t *apiary.TenantControlPlane) { t.Spec.Replicas = ptr.To[int32](7) }), nil},
		{"replicas unset", with(func(t *apiary.TenantControlPlane) { t.Spec.Replicas = nil }), nil},
		{"replicas 0", with(func(t *apiary.TenantControlPlane) { t.Spec.Replicas = ptr.To[int32](0) }),
			[]want{inv("spec.replicas", "must be between 1 and 7")}},
		{"replicas 8", with(func(t *apiary.TenantControlPlane) { t.Spec.Replicas = ptr.To[int32](8) }),
			[]want{inv("spec.replicas", "must be between 1 and 7")}},
		{"replicas negative", with(func(t *apiary.TenantControlPlane) { t.Spec.Replicas = ptr.To[int32](-1) }),
			[]want{inv("spec.replicas", "must be between 1 and 7")}},

		// spec.certificates
		{"certificates of minutes", with(func(t *apiary.TenantControlPlane) {
			t.Spec.Certificates = apiary.CertificatesSpec{Validity: &metav1.Duration{Duration: 2 * time.Minute}, RenewBefore: &metav1.Duration{Duration: time.Minute}}
		}), nil},
		{"certificates of ten years", with(func(t *apiary.TenantControlPlane) { t.Spec.Certificates.Validity.Duration = 87600 * time.Hour }), nil},
		{"certificates validity too short", with(func(t *apiary.TenantControlPlane) {
			t.Spec.Certificates = apiary.CertificatesSpec{Validity: &metav1.Duration{Duration: 119 * time.Second}, RenewBefore: &metav1.Duration{Duration: time.Minute}}
		}), []want{inv("spec.certificates.validity", "must be between 2m0s and 87600h0m0s"), inv("spec.certificates.renewBefore", "must be at most half")}},
		{"certificates validity too long", with(func(t *apiary.TenantControlPlane) { t.Spec.Certificates.Validity.Duration = 87601 * time.Hour }),
			[]want{inv("spec.certificates.validity", "must be between 2m0s and 87600h0m0s")}},
		{"certificates renewBefore too short", with(func(t *apiary.TenantControlPlane) { t.Spec.Certificates.RenewBefore.Duration = 59 * time.Second }),
			[]want{inv("spec.certificates.renewBefore", "must be at least 1m0s")}},
		{"certificates renewBefore over half the validity", with(func(t *apiary.TenantControlPlane) {
			t.Spec.Certificates = apiary.CertificatesSpec{Validity: &metav1.Duration{Duration: 10 * time.Minute}, RenewBefore: &metav1.Duration{Duration: 301 * time.Second}}
		}), []want{inv("spec.certificates.renewBefore", "must be at most half of spec.certificates.validity (10m0s)")}},

		// spec.network.serviceType
		{"serviceType NodePort", with(func(t *apiary.TenantControlPlane) { t.Spec.Network.ServiceType = "NodePort" }), nil},
		{"serviceType ClusterIP", with(func(t *apiary.TenantControlPlane) { t.Spec.Network.ServiceType = "ClusterIP" }), nil},
		{"serviceType ExternalName", with(func(t *apiary.TenantControlPlane) { t.Spec.Network.ServiceType = "ExternalName" }),
			[]want{{field: "spec.network.serviceType", typ: field.ErrorTypeNotSupported, detail: []string{`"LoadBalancer"`, `"NodePort"`, `"ClusterIP"`}}}},
		{"serviceType lower case", with(func(t *apiary.TenantControlPlane) { t.Spec.Network.ServiceType = "loadbalancer" }),
			[]want{{field: "spec.network.serviceType", typ: field.ErrorTypeNotSupported}}},

		// spec.network.address
		{"address IPv4", with(func(t *apiary.TenantControlPlane) { t.Spec.Network.Address = "192.0.2.10" }), nil},
		{"address IPv6", with(func(t *apiary.TenantControlPlane) { t.Spec.Network.Address = "2001:db8::10" }), nil},
		{"address host name", with(func(t *apiary.TenantControlPlane) { t.Spec.Network.Address = "api.example.com" }),
			[]want{inv("spec.network.address", "must be an IP address")}},
		{"address CIDR", with(func(t *apiary.TenantControlPlane) { t.Spec.Network.Address = "192.0.2.10/32" }),
			[]want{inv("spec.network.address", "must be an IP address")}},
		{"address with port", with(func(t *apiary.TenantControlPlane) { t.Spec.Network.Address = "192.0.2.10:6443" }),
			[]want{inv("spec.network.address", "must be an IP address")}},

		// spec.network.port
		{"port 1", with(func(t *apiary.TenantControlPlane) { t.Spec.Network.Port = 1 }), nil},
		{"port 65535", with(func(t *apiary.TenantControlPlane) { t.Spec.Network.Port = 65535 }), nil},
		{"port 0", with(func(t *apiary.TenantControlPlane) { t.Spec.Network.Port = 0 }),
			[]want{inv("spec.network.port", "must be between 1 and 65535")}},
		{"port 65536", with(func(t *apiary.TenantControlPlane) { t.Spec.Network.Port = 65536 }),
			[]want{inv("spec.network.port", "must be between 1 and 65535")}},
		{"port negative", with(func(t *apiary.TenantControlPlane) { t.Spec.Network.Port = -443 }),
			[]want{inv("spec.network.port", "must be between 1 and 65535")}},

		// spec.network.certSANs
		{"certSANs IPs, names and wildcard", with(func(t *apiary.TenantControlPlane) {
			t.Spec.Network.CertSANs = []string{"192.0.2.10", "2001:db8::10", "api.example.com", "*.tenants.example.com", "localhost"}
		}), nil},
		{"certSANs bad name", with(func(t *apiary.TenantControlPlane) {
			t.Spec.Network.CertSANs = []string{"api.example.com", "bad_name.example.com"}
		}), []want{inv("spec.network.certSANs[1]", sanRule)}},
		{"certSANs upper case", with(func(t *apiary.TenantControlPlane) { t.Spec.Network.CertSANs = []string{"API.example.com"} }),
			[]want{inv("spec.network.certSANs[0]", sanRule)}},
		{"certSANs bare wildcard", with(func(t *apiary.TenantControlPlane) { t.Spec.Network.CertSANs = []string{"*"} }),
			[]want{inv("spec.network.certSANs[0]", sanRule)}},
		{"certSANs wildcard in the middle", with(func(t *apiary.TenantControlPlane) { t.Spec.Network.CertSANs = []string{"api.*.example.com"} }),
			[]want{inv("spec.network.certSANs[0]", sanRule)}},
		{"certSANs double wildcard", with(func(t *apiary.TenantControlPlane) { t.Spec.Network.CertSANs = []string{"*.*.example.com"} }),
			[]want{inv("spec.network.certSANs[0]", sanRule)}},
		{"certSANs URL", with(func(t *apiary.TenantControlPlane) { t.Spec.Network.CertSANs = []string{"https://api.example.com"} }),
			[]want{inv("spec.network.certSANs[0]", sanRule)}},
		{"certSANs empty", with(func(t *apiary.TenantControlPlane) { t.Spec.Network.CertSANs = []string{""} }),
			[]want{inv("spec.network.certSANs[0]", sanRule)}},
		{"certSANs two bad", with(func(t *apiary.TenantControlPlane) {
			t.Spec.Network.CertSANs = []string{"-a.example.com", "10.0.0.1", "a..b"}
		}), []want{inv("spec.network.certSANs[0]", sanRule), inv("spec.network.certSANs[2]", sanRule)}},

		// spec.network.podCIDR and serviceCIDR
		{"podCIDR no prefix length", with(func(t *apiary.TenantControlPlane) { t.Spec.Network.PodCIDR = "10.244.0.0" }),
			[]want{inv("spec.network.podCIDR", "must be a CIDR such as 10.96.0.0/16")}},
		{"podCIDR prefix too long", with(func(t *apiary.TenantControlPlane) { t.Spec.Network.PodCIDR = "10.244.0.0/33" }),
			[]want{inv("spec.network.podCIDR", "must be a CIDR")}},
		{"podCIDR garbage", with(func(t *apiary.TenantControlPlane) { t.Spec.Network.PodCIDR = "pods" }),
			[]want{inv("spec.network.podCIDR", "must be a CIDR")}},
		{"podCIDR non-canonical", with(func(t *apiary.TenantControlPlane) { t.Spec.Network.PodCIDR = "10.244.1.0/16" }),
			[]want{inv("spec.network.podCIDR", "must be the network address of its range: 10.244.0.0/16")}},
		{"serviceCIDR garbage", with(func(t *apiary.TenantControlPlane) { t.Spec.Network.ServiceCIDR = "10.96.0.0/" }),
			[]want{inv("spec.network.serviceCIDR", "must be a CIDR")}},
		{"serviceCIDR non-canonical", with(func(t *apiary.TenantControlPlane) { t.Spec.Network.ServiceCIDR = "10.96.0.5/16" }),
			[]want{inv("spec.network.serviceCIDR", "must be the network address of its range: 10.96.0.0/16")}},
		{"serviceCIDR IPv4 /12", with(func(t *apiary.TenantControlPlane) { t.Spec.Network.ServiceCIDR = "10.96.0.0/12" }), nil},
		{"serviceCIDR IPv4 /11", with(func(t *apiary.TenantControlPlane) { t.Spec.Network.ServiceCIDR = "10.96.0.0/11" }),
			[]want{inv("spec.network.serviceCIDR", "must not be larger than /12")}},
		{"serviceCIDR IPv4 /8", with(func(t *apiary.TenantControlPlane) {
			t.Spec.Network.PodCIDR = "172.16.0.0/16"
			t.Spec.Network.ServiceCIDR = "10.0.0.0/8"
			t.Spec.Network.DNSServiceIP = "10.0.0.10"
		}), []want{inv("spec.network.serviceCIDR", "must not be larger than /12")}},
		{"IPv6 networks", with(func(t *apiary.TenantControlPlane) {
			t.Spec.Network.PodCIDR = "fd00:10:244::/56"
			t.Spec.Network.ServiceCIDR = "fd00:10:96::/108"
			t.Spec.Network.DNSServiceIP = "fd00:10:96::a"
		}), nil},
		{"serviceCIDR IPv6 /107", with(func(t *apiary.TenantControlPlane) {
			t.Spec.Network.PodCIDR = "fd00:10:244::/56"
			t.Spec.Network.ServiceCIDR = "fd00:10:96::/107"
			t.Spec.Network.DNSServiceIP = "fd00:10:96::a"
		}), []want{inv("spec.network.serviceCIDR", "must not be larger than /108")}},
		{"serviceCIDR IPv6 /64", with(func(t *apiary.TenantControlPlane) {
			t.Spec.Network.PodCIDR = "fd00:10:244::/56"
			t.Spec.Network.ServiceCIDR = "fd00:10:96::/64"
			t.Spec.Network.DNSServiceIP = "fd00:10:96::a"
		}), []want{inv("spec.network.serviceCIDR", "must not be larger than /108")}},
		{"IPv4 pods, IPv6 services", with(func(t *apiary.TenantControlPlane) {
			t.Spec.Network.ServiceCIDR = "fd00:10:96::/112"
			t.Spec.Network.DNSServiceIP = "fd00:10:96::a"
		}), []want{inv("spec.network.serviceCIDR", "must be of the same IP family as podCIDR 10.244.0.0/16")}},
		{"IPv6 pods, IPv4 services", with(func(t *apiary.TenantControlPlane) { t.Spec.Network.PodCIDR = "fd00:10:244::/56" }),
			[]want{inv("spec.network.serviceCIDR", "must be of the same IP family as podCIDR fd00:10:244::/56")}},
		{"podCIDR contains serviceCIDR", with(func(t *apiary.TenantControlPlane) { t.Spec.Network.PodCIDR = "10.64.0.0/10" }),
			[]want{inv("spec.network.serviceCIDR", "must not overlap podCIDR 10.64.0.0/10")}},
		{"serviceCIDR contains podCIDR", with(func(t *apiary.TenantControlPlane) { t.Spec.Network.PodCIDR = "10.96.128.0/24" }),
			[]want{inv("spec.network.serviceCIDR", "must not overlap podCIDR 10.96.128.0/24")}},
		{"same CIDRs", with(func(t *apiary.TenantControlPlane) { t.Spec.Network.PodCIDR = apiary.DefaultServiceCIDR }),
			[]want{inv("spec.network.serviceCIDR", "must not overlap podCIDR")}},
		{"adjacent CIDRs", with(func(t *apiary.TenantControlPlane) { t.Spec.Network.PodCIDR = "10.97.0.0/16" }), nil},
		{"IPv6 overlap", with(func(t *apiary.TenantControlPlane) {
			t.Spec.Network.PodCIDR = "fd00::/48"
			t.Spec.Network.ServiceCIDR = "fd00::/112"
			t.Spec.Network.DNSServiceIP = "fd00::a"
		}), []want{inv("spec.network.serviceCIDR", "must not overlap podCIDR fd00::/48")}},

		// spec.network.dnsServiceIP
		{"dnsServiceIP second address", with(func(t *apiary.TenantControlPlane) { t.Spec.Network.DNSServiceIP = "10.96.0.2" }), nil},
		{"dnsServiceIP high address", with(func(t *apiary.TenantControlPlane) { t.Spec.Network.DNSServiceIP = "10.96.255.254" }), nil},
		{"dnsServiceIP empty", with(func(t *apiary.TenantControlPlane) { t.Spec.Network.DNSServiceIP = "" }),
			[]want{{field: "spec.network.dnsServiceIP", typ: field.ErrorTypeRequired, detail: []string{"must be set", "10th address of serviceCIDR"}}}},
		{"dnsServiceIP not defaulted in a tiny serviceCIDR", func() *apiary.TenantControlPlane {
			tcp := &apiary.TenantControlPlane{ObjectMeta: metav1.ObjectMeta{Name: "tiny"}}
			tcp.Spec.Network.ServiceCIDR = "10.96.0.0/29"
			tcp.Default()
			return tcp
		}(), []want{{field: "spec.network.dnsServiceIP", typ: field.ErrorTypeRequired}}},
		{"dnsServiceIP not an IP", with(func(t *apiary.TenantControlPlane) { t.Spec.Network.DNSServiceIP = "kube-dns" }),
			[]want{inv("spec.network.dnsServiceIP", "must be an IP address")}},
		{"dnsServiceIP CIDR", with(func(t *apiary.TenantControlPlane) { t.Spec.Network.DNSServiceIP = "10.96.0.10/32" }),
			[]want{inv("spec.network.dnsServiceIP", "must be an IP address")}},
		{"dnsServiceIP outside", with(func(t *apiary.TenantControlPlane) { t.Spec.Network.DNSServiceIP = "10.97.0.10" }),
			[]want{inv("spec.network.dnsServiceIP", "must be inside serviceCIDR 10.96.0.0/16")}},
		{"dnsServiceIP in podCIDR", with(func(t *apiary.TenantControlPlane) { t.Spec.Network.DNSServiceIP = "10.244.0.10" }),
			[]want{inv("spec.network.dnsServiceIP", "must be inside serviceCIDR")}},
		{"dnsServiceIP other family", with(func(t *apiary.TenantControlPlane) { t.Spec.Network.DNSServiceIP = "fd00::a" }),
			[]want{inv("spec.network.dnsServiceIP", "must be inside serviceCIDR")}},
		{"dnsServiceIP network address", with(func(t *apiary.TenantControlPlane) { t.Spec.Network.DNSServiceIP = "10.96.0.0" }),
			[]want{inv("spec.network.dnsServiceIP", "must not be the network address of serviceCIDR")}},
		{"dnsServiceIP first address", with(func(t *apiary.TenantControlPlane) { t.Spec.Network.DNSServiceIP = "10.96.0.1" }),
			[]want{inv("spec.network.dnsServiceIP", "must not be the first address of serviceCIDR", "kubernetes Service")}},
		{"dnsServiceIP IPv6 network address", with(func(t *apiary.TenantControlPlane) {
			t.Spec.Network.PodCIDR = "fd00:10:244::/56"
			t.Spec.Network.ServiceCIDR = "fd00:10:96::/112"
			t.Spec.Network.DNSServiceIP = "fd00:10:96::"
		}), []want{inv("spec.network.dnsServiceIP", "must not be the network address")}},
		{"dnsServiceIP IPv6 first address", with(func(t *apiary.TenantControlPlane) {
			t.Spec.Network.PodCIDR = "fd00:10:244::/56"
			t.Spec.Network.ServiceCIDR = "fd00:10:96::/112"
			t.Spec.Network.DNSServiceIP = "fd00:10:96::1"
		}), []want{inv("spec.network.dnsServiceIP", "must not be the first address")}},
		{"dnsServiceIP not checked against an unparsable serviceCIDR", with(func(t *apiary.TenantControlPlane) {
			t.Spec.Network.ServiceCIDR = "services"
			t.Spec.Network.DNSServiceIP = "192.0.2.1"
		}), []want{inv("spec.network.serviceCIDR", "must be a CIDR")}},

		// spec.network.clusterDomain
		{"clusterDomain custom", with(func(t *apiary.TenantControlPlane) { t.Spec.Network.ClusterDomain = "tenant-a.example" }), nil},
		{"clusterDomain empty", with(func(t *apiary.TenantControlPlane) { t.Spec.Network.ClusterDomain = "" }),
			[]want{inv("spec.network.clusterDomain", "must be a DNS subdomain")}},
		{"clusterDomain upper case", with(func(t *apiary.TenantControlPlane) { t.Spec.Network.ClusterDomain = "Cluster.Local" }),
			[]want{inv("spec.network.clusterDomain", "must be a DNS subdomain")}},
		{"clusterDomain underscore", with(func(t *apiary.TenantControlPlane) { t.Spec.Network.ClusterDomain = "cluster_local" }),
			[]want{inv("spec.network.clusterDomain", "must be a DNS subdomain")}},
		{"clusterDomain trailing dot", with(func(t *apiary.TenantControlPlane) { t.Spec.Network.ClusterDomain = "cluster.local." }),
			[]want{inv("spec.network.clusterDomain", "must be a DNS subdomain")}},

		// extraArgs
		{"extraArgs allowed", with(func(t *apiary.TenantControlPlane) {
			t.Spec.APIServer.ExtraArgs = map[string]string{"audit-log-maxage": "30", "v": "2", "oidc-issuer-url": "https://issuer.example/path"}
			t.Spec.ControllerManager.ExtraArgs = map[string]string{"node-monitor-grace-period": "50s"}
			t.Spec.Scheduler.ExtraArgs = map[string]string{"v": "4"}
		}), nil},
		{"extraArgs leading dashes", with(func(t *apiary.TenantControlPlane) {
			t.Spec.APIServer.ExtraArgs = map[string]string{"--audit-log-maxage": "30"}
		}), []want{inv("spec.apiServer.extraArgs[--audit-log-maxage]", dashes, "audit-log-maxage")}},
		{"extraArgs leading dash", with(func(t *apiary.TenantControlPlane) {
			t.Spec.Scheduler.ExtraArgs = map[string]string{"-v": "4"}
		}), []want{inv("spec.scheduler.extraArgs[-v]", dashes)}},
		{"extraArgs empty key", with(func(t *apiary.TenantControlPlane) {
			t.Spec.ControllerManager.ExtraArgs = map[string]string{"": "x"}
		}), []want{inv("spec.controllerManager.extraArgs[]", dashes)}},
		{"extraArgs dashed protected key", with(func(t *apiary.TenantControlPlane) {
			t.Spec.APIServer.ExtraArgs = map[string]string{"--etcd-servers": "https://other:2379"}
		}), []want{{field: "spec.apiServer.extraArgs[--etcd-servers]", typ: field.ErrorTypeForbidden, detail: []string{"--etcd-servers cannot be set", protected}}}},
		{"extraArgs every protected key", with(func(t *apiary.TenantControlPlane) {
			t.Spec.APIServer.ExtraArgs = map[string]string{
				"etcd-servers": "https://other:2379", "etcd-prefix": "/other", "etcd-cafile": "/x",
				"etcd-certfile": "/x", "etcd-keyfile": "/x", "audit-log-maxage": "30",
			}
		}), []want{
			{field: "spec.apiServer.extraArgs[etcd-servers]", typ: field.ErrorTypeForbidden, detail: []string{protected}},
			{field: "spec.apiServer.extraArgs[etcd-prefix]", typ: field.ErrorTypeForbidden, detail: []string{protected}},
			{field: "spec.apiServer.extraArgs[etcd-cafile]", typ: field.ErrorTypeForbidden, detail: []string{protected}},
			{field: "spec.apiServer.extraArgs[etcd-certfile]", typ: field.ErrorTypeForbidden, detail: []string{protected}},
			{field: "spec.apiServer.extraArgs[etcd-keyfile]", typ: field.ErrorTypeForbidden, detail: []string{protected}},
		}},
		{"extraArgs protected in every component", with(func(t *apiary.TenantControlPlane) {
			t.Spec.ControllerManager.ExtraArgs = map[string]string{"etcd-servers": "x"}
			t.Spec.Scheduler.ExtraArgs = map[string]string{"etcd-prefix": "x"}
		}), []want{
			{field: "spec.controllerManager.extraArgs[etcd-servers]", typ: field.ErrorTypeForbidden, detail: []string{protected}},
			{field: "spec.scheduler.extraArgs[etcd-prefix]", typ: field.ErrorTypeForbidden, detail: []string{protected}},
		}},

		// metadata.name
		{"name one letter", with(func(t *apiary.TenantControlPlane) { t.Name = "a" }), nil},
		{"name 63 characters", with(func(t *apiary.TenantControlPlane) { t.Name = "a" + strings.Repeat("b", 62) }), nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			expect(t, Validate(tt.tcp), tt.wants...)
		})
	}
}

func TestValidateName(t *testing.T) {
	for _, name := range []string{
		"",
		"Tenant",
		"1tenant",
		"tenant_a",
		"tenant-",
		"-tenant",
		"tenant.a", // a DNS-1123 subdomain, but not a label
		"a" + strings.Repeat("b", 63),
	} {
		t.Run(fmt.Sprintf("%q", name), func(t *testing.T) {
			tcp := with(func(t *apiary.TenantControlPlane) { t.Name = name })
			errs := Validate(tcp)
			if len(errs) == 0 {
				t.Fatalf("Validate accepted metadata.name %q", name)
			}
			for _, e := range errs {
				if e.Field != "metadata.name" || e.Type != field.ErrorTypeInvalid || !strings.HasPrefix(e.Detail, "must be a DNS-1035 label: ") {
					t.Errorf("error %s %s %q, want metadata.name Invalid \"must be a DNS-1035 label: ...\"", e.Field, e.Type, e.Detail)
				}
			}
		})
	}
}

func TestValidateUpdate(t *testing.T) {
	version := func(v string) *apiary.TenantControlPlane {
		return with(func(t *apiary.TenantControlPlane) { t.Spec.Version = v })
	}
	dataStore := func(spec, status string) *apiary.TenantControlPlane {
		return with(func(t *apiary.TenantControlPlane) {
			t.Spec.DataStore = spec
			t.Status.DataStore = apiary.DataStoreBinding{Name: status, Prefix: "/tenants/x", User: "tenant-x"}
		})
	}
	upgrading := func(running, spec string) *apiary.TenantControlPlane {
		return with(func(t *apiary.TenantControlPlane) { t.Spec.Version, t.Status.Version = spec, running })
	}
	mode := func(m apiary.Mode, v string) *apiary.TenantControlPlane {
		return with(func(t *apiary.TenantControlPlane) { t.Spec.Mode, t.Spec.Version = m, v })
	}
	switchingTo := func(m apiary.Mode, phase string) *apiary.TenantControlPlane {
		return with(func(t *apiary.TenantControlPlane) {
			t.Spec.Mode, t.Spec.Version, t.Status.Version = m, "v1.37.2", "v1.37.2"
			t.Status.ModeSwitch = &apiary.ModeSwitchStatus{Target: m, From: apiary.ModeStandalone, Phase: phase}
		})
	}
	const downgrade = "downgrades are not supported"
	tests := []struct {
		name     string
		old, new *apiary.TenantControlPlane
		wants    []want
	}{
		{"unchanged", valid(), valid(), nil},

		// spec.version
		{"same version", version("v1.36.2"), version("v1.36.2"), nil},
		{"patch upgrade", version("v1.36.2"), version("v1.36.5"), nil},
		{"one-minor upgrade", version("v1.35.3"), version("v1.36.0"), nil},
		{"one-minor upgrade to a higher patch", version("v1.36.0"), version("v1.37.9"), nil},
		{"patch downgrade", version("v1.37.2"), version("v1.37.1"),
			[]want{inv("spec.version", "must not be lower than the current version v1.37.2", downgrade)}},
		{"minor downgrade", version("v1.36.5"), version("v1.35.9"),
			[]want{inv("spec.version", "must not be lower than the current version v1.36.5", downgrade)}},
		{"minor downgrade to a higher patch", version("v1.37.0"), version("v1.36.9"),
			[]want{inv("spec.version", downgrade)}},
		{"skipped minor", version("v1.35.3"), version("v1.37.0"),
			[]want{inv("spec.version", "must not skip a minor version: upgrade from v1.35.3 to v1.36 first")}},
		{"skipped minor from an unsupported version", version("v1.34.0"), version("v1.36.0"),
			[]want{inv("spec.version", "must not skip a minor version: upgrade from v1.34.0 to v1.35 first")}},
		{"upgrade from an unsupported version", version("v1.34.0"), version("v1.35.0"), nil},
		{"unparsable old version", version("garbage"), version("v1.37.0"), nil},
		// An upgrade that has not completed may be taken back to what runs,
		// not below it.
		{"back to the running version", upgrading("v1.37.2", "v1.37.3"), version("v1.37.2"), nil},
		{"below the running version", upgrading("v1.37.2", "v1.37.3"), version("v1.37.1"),
			[]want{inv("spec.version", "must not be lower than the current version v1.37.2", downgrade)}},
		{"below the spec, above what runs", upgrading("v1.36.2", "v1.37.3"), version("v1.37.0"), nil},
		// An invalid new version is Validate's business; no second error.
		{"invalid new version", version("v1.37.0"), version("v1.38.0"), nil},

		// spec.version and spec.mode, one at a time
		{"version during a switch", switchingTo(apiary.ModeRegistered, apiary.SwitchStartingHosts), mode(apiary.ModeRegistered, "v1.37.3"),
			[]want{forbidden("spec.version", "must not change while the control plane switches to registered", "phase StartingHosts", "once the phase is Completed")}},
		{"version before a requested switch starts", with(func(t *apiary.TenantControlPlane) {
			t.Spec.Mode, t.Status.Mode, t.Status.Version = apiary.ModeRegistered, apiary.ModeStandalone, "v1.37.2"
		}), mode(apiary.ModeRegistered, "v1.37.3"),
			[]want{forbidden("spec.version", "about to switch from standalone to registered")}},
		{"version after a switch", switchingTo(apiary.ModeRegistered, apiary.SwitchCompleted), mode(apiary.ModeRegistered, "v1.37.3"), nil},
		{"mode during an upgrade", upgrading("v1.37.2", "v1.37.3"), mode(apiary.ModeRegistered, "v1.37.3"),
			[]want{forbidden("spec.mode", "must not change while the control plane upgrades from v1.37.2 to v1.37.3", "set spec.version back to v1.37.2")}},
		{"mode after an upgrade", upgrading("v1.37.3", "v1.37.3"), mode(apiary.ModeRegistered, "v1.37.3"), nil},
		{"mode before the first rollout", upgrading("", "v1.37.3"), mode(apiary.ModeRegistered, "v1.37.3"), nil},
		{"version and mode together", version("v1.37.2"), mode(apiary.ModeRegistered, "v1.37.3"),
			[]want{forbidden("spec.version", "must not change together with spec.mode")}},

		// spec.dataStore
		{"dataStore unchanged", dataStore("ds-a", "ds-a"), dataStore("ds-a", "ds-a"), nil},
		{"dataStore set, changed", dataStore("ds-a", "ds-a"), dataStore("ds-b", "ds-a"),
			[]want{inv("spec.dataStore", "is immutable", `DataStore "ds-a"`, "migration is not supported")}},
		{"dataStore set, changed before binding", dataStore("ds-a", ""), dataStore("ds-b", ""),
			[]want{inv("spec.dataStore", "is immutable", `"ds-a"`)}},
		{"dataStore set, cleared", dataStore("ds-a", "ds-a"), dataStore("", "ds-a"),
			[]want{inv("spec.dataStore", "is immutable", `"ds-a"`)}},
		{"dataStore set, cleared before binding", dataStore("ds-a", ""), dataStore("", ""),
			[]want{inv("spec.dataStore", "is immutable", `"ds-a"`)}},
		{"dataStore empty stays empty while bound", dataStore("", "ds-a"), dataStore("", "ds-a"), nil},
		{"dataStore empty stays empty, unbound", dataStore("", ""), dataStore("", ""), nil},
		{"dataStore empty set to the bound name", dataStore("", "ds-a"), dataStore("ds-a", "ds-a"), nil},
		{"dataStore empty set to another name while bound", dataStore("", "ds-a"), dataStore("ds-b", "ds-a"),
			[]want{inv("spec.dataStore", "is immutable", `the tenant's state lives in DataStore "ds-a"`)}},
		{"dataStore empty set to anything while unbound", dataStore("", ""), dataStore("ds-b", ""), nil},

		// immutable network fields
		{"podCIDR changed", valid(), with(func(t *apiary.TenantControlPlane) { t.Spec.Network.PodCIDR = "10.245.0.0/16" }),
			[]want{inv("spec.network.podCIDR", `is immutable (was "10.244.0.0/16")`)}},
		{"serviceCIDR changed", valid(), with(func(t *apiary.TenantControlPlane) {
			t.Spec.Network.ServiceCIDR = "10.96.0.0/15"
		}), []want{inv("spec.network.serviceCIDR", `is immutable (was "10.96.0.0/16")`)}},
		{"dnsServiceIP changed", valid(), with(func(t *apiary.TenantControlPlane) { t.Spec.Network.DNSServiceIP = "10.96.0.11" }),
			[]want{inv("spec.network.dnsServiceIP", `is immutable (was "10.96.0.10")`)}},
		{"clusterDomain changed", valid(), with(func(t *apiary.TenantControlPlane) { t.Spec.Network.ClusterDomain = "tenant.example" }),
			[]want{inv("spec.network.clusterDomain", `is immutable (was "cluster.local")`)}},
		{"all network fields changed", valid(), with(func(t *apiary.TenantControlPlane) {
			t.Spec.Network.PodCIDR = "10.1.0.0/16"
			t.Spec.Network.ServiceCIDR = "10.2.0.0/16"
			t.Spec.Network.DNSServiceIP = "10.2.0.10"
			t.Spec.Network.ClusterDomain = "tenant.example"
		}), []want{
			inv("spec.network.podCIDR", "is immutable"),
			inv("spec.network.serviceCIDR", "is immutable"),
			inv("spec.network.dnsServiceIP", "is immutable"),
			inv("spec.network.clusterDomain", "is immutable"),
		}},
		{"network fields set where they were unset", func() *apiary.TenantControlPlane {
			old := valid()
			old.Spec.Network = apiary.NetworkSpec{}
			return old
		}(), valid(), nil},

		// mutable fields
		{"mutable fields changed", valid(), with(func(t *apiary.TenantControlPlane) {
			t.Spec.Replicas = ptr.To[int32](5)
			t.Spec.Network.Port = 443
			t.Spec.Network.ServiceType = "NodePort"
			t.Spec.Network.Address = "192.0.2.1"
			t.Spec.Network.CertSANs = []string{"api.example.com"}
			t.Spec.Mode = apiary.ModeRegistered
			t.Spec.APIServer.ExtraArgs = map[string]string{"v": "2"}
			t.Spec.Addons.CoreDNS.Enabled = ptr.To(false)
		}), nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			expect(t, ValidateUpdate(tt.old, tt.new), tt.wants...)
		})
	}
}

func TestWebhookDefault(t *testing.T) {
	tcp := &apiary.TenantControlPlane{ObjectMeta: metav1.ObjectMeta{Name: "tenant-a"}}
	if err := (TenantControlPlane{}).Default(context.Background(), tcp); err != nil {
		t.Fatalf("Default: %v", err)
	}
	want := valid().Spec
	if tcp.Spec.Version != want.Version || tcp.Spec.Mode != want.Mode || *tcp.Spec.Replicas != *want.Replicas ||
		tcp.Spec.Network.ServiceType != want.Network.ServiceType || tcp.Spec.Network.Port != want.Network.Port ||
		tcp.Spec.Network.PodCIDR != want.Network.PodCIDR || tcp.Spec.Network.ServiceCIDR != want.Network.ServiceCIDR ||
		tcp.Spec.Network.DNSServiceIP != want.Network.DNSServiceIP || tcp.Spec.Network.ClusterDomain != want.Network.ClusterDomain {
		t.Errorf("webhook Default gave %+v, want %+v", tcp.Spec, want)
	}
	if tcp.Spec.Version != apiary.DefaultVersion || tcp.Spec.Network.DNSServiceIP != "10.96.0.10" {
		t.Errorf("webhook Default: version %q, dnsServiceIP %q", tcp.Spec.Version, tcp.Spec.Network.DNSServiceIP)
	}
	if errs := Validate(tcp); len(errs) != 0 {
		t.Errorf("Validate after webhook Default: %s", describe(errs))
	}
}

func TestValidateCreateError(t *testing.T) {
	tcp := with(func(t *apiary.TenantControlPlane) { t.Spec.Replicas = ptr.To[int32](0) })
	warns, err := TenantControlPlane{}.ValidateCreate(context.Background(), tcp)
	if warns != nil {
		t.Errorf("warnings = %v, want none", warns)
	}
	if err == nil {
		t.Fatal("ValidateCreate accepted replicas 0")
	}
	if !apierrors.IsInvalid(err) {
		t.Fatalf("error %v (%T) is not an Invalid status error", err, err)
	}
	var se *apierrors.StatusError
	if !errors.As(err, &se) {
		t.Fatalf("error %T is not a *StatusError", err)
	}
	st := se.Status()
	if st.Code != 422 || st.Reason != metav1.StatusReasonInvalid {
		t.Errorf("status code %d reason %s, want 422 Invalid", st.Code, st.Reason)
	}
	d := st.Details
	if d == nil {
		t.Fatal("status has no details")
	}
	if d.Kind != "TenantControlPlane" || d.Group != "apiary.dev" || d.Name != "tenant-a" {
		t.Errorf("details name %s.%s %q, want TenantControlPlane.apiary.dev \"tenant-a\"", d.Kind, d.Group, d.Name)
	}
	if len(d.Causes) != 1 || d.Causes[0].Field != "spec.replicas" || !strings.Contains(d.Causes[0].Message, "must be between 1 and 7") {
		t.Errorf("causes = %+v, want one on spec.replicas", d.Causes)
	}
	if !strings.Contains(err.Error(), `TenantControlPlane.apiary.dev "tenant-a" is invalid`) ||
		!strings.Contains(err.Error(), "spec.replicas") {
		t.Errorf("message %q does not name the kind, object and field", err.Error())
	}
}

func TestValidateReportsAllProblems(t *testing.T) {
	tcp := with(func(t *apiary.TenantControlPlane) {
		t.Name = "Tenant"
		t.Spec.Version = "v1.30.0"
		t.Spec.Mode = "hosted"
		t.Spec.Replicas = ptr.To[int32](9)
		t.Spec.Network.ServiceType = "ExternalName"
		t.Spec.Network.Address = "nowhere"
		t.Spec.Network.Port = 70000
		t.Spec.Network.CertSANs = []string{"bad_san"}
		t.Spec.Network.PodCIDR = "10.244.0.1/16"
		t.Spec.Network.DNSServiceIP = "10.96.0.1"
		t.Spec.Network.ClusterDomain = "Cluster"
		t.Spec.APIServer.ExtraArgs = map[string]string{"etcd-prefix": "/", "--v": "2"}
	})
	wants := []want{
		inv("metadata.name", "DNS-1035"),
		inv("spec.version", "is not supported"),
		{field: "spec.mode", typ: field.ErrorTypeNotSupported},
		inv("spec.replicas", "between 1 and 7"),
		{field: "spec.network.serviceType", typ: field.ErrorTypeNotSupported},
		inv("spec.network.address", "IP address"),
		inv("spec.network.port", "between 1 and 65535"),
		inv("spec.network.certSANs[0]", "DNS name"),
		inv("spec.network.podCIDR", "network address of its range"),
		inv("spec.network.dnsServiceIP", "first address"),
		inv("spec.network.clusterDomain", "DNS subdomain"),
		{field: "spec.apiServer.extraArgs[etcd-prefix]", typ: field.ErrorTypeForbidden},
		inv("spec.apiServer.extraArgs[--v]", "leading dashes"),
	}
	expect(t, Validate(tcp), wants...)

	_, err := TenantControlPlane{}.ValidateCreate(context.Background(), tcp)
	var se *apierrors.StatusError
	if !errors.As(err, &se) || se.Status().Details == nil {
		t.Fatalf("ValidateCreate error %v is not a status error with details", err)
	}
	if got := len(se.Status().Details.Causes); got != len(wants) {
		t.Errorf("status has %d causes, want %d: %+v", got, len(wants), se.Status().Details.Causes)
	}
	for _, w := range wants {
		if !strings.Contains(err.Error(), w.field) {
			t.Errorf("error message does not mention %s: %s", w.field, err)
		}
	}

	// An update reports the object's own problems and the change's.
	old := valid()
	old.Spec.Version = "v1.37.0"
	upd := with(func(t *apiary.TenantControlPlane) {
		t.Spec.Version = "v1.36.0"
		t.Spec.Replicas = ptr.To[int32](0)
		t.Spec.Network.ClusterDomain = "other.example"
	})
	_, err = TenantControlPlane{}.ValidateUpdate(context.Background(), old, upd)
	if !apierrors.IsInvalid(err) {
		t.Fatalf("ValidateUpdate error %v is not Invalid", err)
	}
	se = nil
	errors.As(err, &se)
	fields := map[string]bool{}
	for _, c := range se.Status().Details.Causes {
		fields[c.Field] = true
	}
	for _, f := range []string{"spec.version", "spec.replicas", "spec.network.clusterDomain"} {
		if !fields[f] {
			t.Errorf("ValidateUpdate causes %v lack %s", se.Status().Details.Causes, f)
		}
	}
	if len(se.Status().Details.Causes) != 3 {
		t.Errorf("ValidateUpdate causes = %+v, want 3", se.Status().Details.Causes)
	}
}

func TestValidateUpdateNoDuplicateVersionError(t *testing.T) {
	old := valid()
	upd := with(func(t *apiary.TenantControlPlane) { t.Spec.Version = "v1.38.0" })
	_, err := TenantControlPlane{}.ValidateUpdate(context.Background(), old, upd)
	var se *apierrors.StatusError
	if !errors.As(err, &se) {
		t.Fatalf("ValidateUpdate error = %v, want a status error", err)
	}
	causes := se.Status().Details.Causes
	if len(causes) != 1 || causes[0].Field != "spec.version" || !strings.Contains(causes[0].Message, "is not supported") {
		t.Errorf("causes = %+v, want one unsupported-version error", causes)
	}
}

func TestWarnings(t *testing.T) {
	ctx := context.Background()
	registered := with(func(t *apiary.TenantControlPlane) { t.Spec.Mode = apiary.ModeRegistered })
	check := func(name string, warns []string, err error) {
		t.Helper()
		if err != nil {
			t.Errorf("%s: %v", name, err)
		}
		if len(warns) != 1 || !strings.Contains(warns[0], "spec.mode") || !strings.Contains(warns[0], "runs the control plane on the tenant's Hosts with role control-plane") {
			t.Errorf("%s warnings = %q, want one about registered mode", name, warns)
		}
	}
	warns, err := TenantControlPlane{}.ValidateCreate(ctx, registered)
	check("ValidateCreate", warns, err)
	warns, err = TenantControlPlane{}.ValidateUpdate(ctx, valid(), registered)
	check("ValidateUpdate", warns, err)

	// The warning accompanies a rejection too.
	bad := registered.DeepCopy()
	bad.Spec.Replicas = ptr.To[int32](0)
	warns, err = TenantControlPlane{}.ValidateCreate(ctx, bad)
	if !apierrors.IsInvalid(err) || len(warns) != 1 {
		t.Errorf("ValidateCreate(registered, invalid) = %q, %v; want a warning and an Invalid error", warns, err)
	}

	if warns, err := (TenantControlPlane{}).ValidateCreate(ctx, valid()); warns != nil || err != nil {
		t.Errorf("ValidateCreate(standalone) = %q, %v; want no warning", warns, err)
	}
	if warns, err := (TenantControlPlane{}).ValidateDelete(ctx, bad); warns != nil || err != nil {
		t.Errorf("ValidateDelete = %q, %v; want nil, nil", warns, err)
	}
}

// Regression tests for bugs found while writing these tests.

// A version with trailing white space passes (version.ParseSemantic trims
// it) but is rendered verbatim into the image tag.
func TestVersionTrailingWhitespace(t *testing.T) {
	for _, v := range []string{"v1.37.2 ", "v1.37.2\n", "v1.37.2\t"} {
		errs := Validate(with(func(t *apiary.TenantControlPlane) { t.Spec.Version = v }))
		expect(t, errs, inv("spec.version", "vMAJOR.MINOR.PATCH"))
	}
}

// kube-apiserver normalises '_' to '-' in flag names (component-base/cli.Run
// sets cliflag.WordSepNormalizeFunc), and render sorts flags so that
// --etcd_prefix comes after --etcd-prefix and wins.
func TestProtectedArgsUnderscore(t *testing.T) {
	errs := Validate(with(func(t *apiary.TenantControlPlane) {
		t.Spec.APIServer.ExtraArgs = map[string]string{"etcd_prefix": "/other-tenant"}
	}))
	expect(t, errs, want{field: "spec.apiServer.extraArgs[etcd_prefix]", typ: field.ErrorTypeForbidden})
}

// The controller renders from a defaulted copy and never writes defaults
// back, so an object stored while the webhook was down has empty fields
// whose effective value is the default. Immutability and downgrade checks
// compare with the raw old object and miss changes to those values.
func TestUpdateComparesUndefaultedOld(t *testing.T) {
	old := &apiary.TenantControlPlane{ObjectMeta: metav1.ObjectMeta{Name: "tenant-a"}}
	upd := with(func(t *apiary.TenantControlPlane) {
		t.Spec.Version = "v1.35.0" // effective old version is DefaultVersion
		t.Spec.Network.PodCIDR = "10.200.0.0/16"
	})
	errs := ValidateUpdate(old, upd)
	expect(t, errs, inv("spec.version", "downgrades"), inv("spec.network.podCIDR", "is immutable"))
}

// The skip check compares with the old spec, not with the version running:
// v1.35 running, spec set to v1.36, then to v1.37 before the upgrade rolled
// out, jumps the control plane from v1.35 to v1.37.
func TestSkipMinorAgainstRunningVersion(t *testing.T) {
	old := with(func(t *apiary.TenantControlPlane) {
		t.Spec.Version = "v1.36.0"
		t.Status.Version = "v1.35.4"
	})
	upd := with(func(t *apiary.TenantControlPlane) {
		t.Spec.Version = "v1.37.0"
		t.Status.Version = "v1.35.4"
	})
	errs := ValidateUpdate(old, upd)
	expect(t, errs, inv("spec.version", "must not skip a minor version"))
}

// kube-apiserver never allocates the broadcast address of an IPv4 Service
// range (pkg/registry/core/service/ipallocator), so the CoreDNS Service
// cannot get it.
func TestDNSServiceIPBroadcast(t *testing.T) {
	errs := Validate(with(func(t *apiary.TenantControlPlane) { t.Spec.Network.DNSServiceIP = "10.96.255.255" }))
	expect(t, errs, inv("spec.network.dnsServiceIP", "broadcast"))
}

// Flags derived from immutable or operator-owned fields cannot be
// overridden either, in any spelling.
func TestProtectedArgsBeyondEtcd(t *testing.T) {
	errs := Validate(with(func(t *apiary.TenantControlPlane) {
		t.Spec.APIServer.ExtraArgs = map[string]string{"service_cluster_ip_range": "10.0.0.0/16", "etcd-servers-overrides": "x", "secure-port": "1"}
		t.Spec.ControllerManager.ExtraArgs = map[string]string{"cluster-cidr": "10.0.0.0/8"}
	}))
	expect(t, errs,
		want{field: "spec.apiServer.extraArgs[etcd-servers-overrides]", typ: field.ErrorTypeForbidden, detail: []string{"datastore credentials"}},
		want{field: "spec.apiServer.extraArgs[secure-port]", typ: field.ErrorTypeForbidden, detail: []string{"spec.network.port"}},
		want{field: "spec.apiServer.extraArgs[service_cluster_ip_range]", typ: field.ErrorTypeForbidden, detail: []string{"serviceCIDR, which is immutable"}},
		want{field: "spec.controllerManager.extraArgs[cluster-cidr]", typ: field.ErrorTypeForbidden, detail: []string{"podCIDR, which is immutable"}},
	)
}

// A spec stored before a rule existed (or while the webhook was off) must
// not wedge finalizer removal or other metadata-only updates, nor any
// update of an object being deleted; changing it is still checked.
func TestValidateUpdateSkipsUnchangedSpec(t *testing.T) {
	stored := with(func(t *apiary.TenantControlPlane) {
		t.Spec.APIServer.ExtraArgs = map[string]string{"etcd-servers": "https://elsewhere:2379"}
		t.Finalizers = []string{"apiary.dev/tenant-cleanup"}
	})
	stored.Spec.Network.DNSServiceIP = "" // as stored without the mutating webhook
	metadataOnly := stored.DeepCopy()
	metadataOnly.Finalizers = nil
	metadataOnly.Default()
	if _, err := (TenantControlPlane{}).ValidateUpdate(context.Background(), stored, metadataOnly); err != nil {
		t.Errorf("finalizer removal refused: %v", err)
	}
	deleting := stored.DeepCopy()
	deleting.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	deleting.Spec.Replicas = ptr.To[int32](3)
	if _, err := (TenantControlPlane{}).ValidateUpdate(context.Background(), stored, deleting); err != nil {
		t.Errorf("update of a tenant being deleted refused: %v", err)
	}
	changed := stored.DeepCopy()
	changed.Spec.Replicas = ptr.To[int32](3)
	if _, err := (TenantControlPlane{}).ValidateUpdate(context.Background(), stored, changed); err == nil || !strings.Contains(err.Error(), "--etcd-servers cannot be set") {
		t.Errorf("a spec change of an invalid tenant: %v, want refused", err)
	}
}

// Every minor the webhook admits has the CoreDNS kubeadm pairs with it:
// widening the window without a pair would give a tenant another minor's.
func TestEverySupportedMinorHasACoreDNSPair(t *testing.T) {
	for minor := uint(MinSupportedMinor); minor <= MaxSupportedMinor; minor++ {
		if _, ok := tenant.CoreDNSPair(minor); !ok {
			t.Errorf("v1.%d is supported, but tenant has no CoreDNS paired with it", minor)
		}
	}
}
