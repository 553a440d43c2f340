package v1alpha1

import (
	"net/netip"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// Defaults applied to a TenantControlPlane by the defaulting webhook, and by
// the controller before rendering (so that an object written while the
// webhook was unavailable still renders the same).
const (
	DefaultVersion       = "v1.37.2"
	DefaultReplicas      = int32(2)
	DefaultPort          = int32(6443)
	DefaultPodCIDR       = "10.244.0.0/16"
	DefaultServiceCIDR   = "10.96.0.0/16"
	DefaultClusterDomain = "cluster.local"
	// DefaultCertificateValidity is kubeadm's lifetime of leaf certificates.
	DefaultCertificateValidity = 365 * 24 * time.Hour
	// DefaultCertificateRenewBefore is kubeadm's warning threshold
	// ("kubeadm certs check-expiration"): a month to notice a failure.
	DefaultCertificateRenewBefore = 30 * 24 * time.Hour
	// dnsServiceIPOffset is the position of the cluster DNS Service IP in the
	// Service CIDR, as kubeadm does (10.96.0.10).
	dnsServiceIPOffset = 10
)

// Default fills every unset field of the spec with its default.
func (t *TenantControlPlane) Default() {
	s := &t.Spec
	if s.Version == "" {
		s.Version = DefaultVersion
	}
	if s.Mode == "" {
		s.Mode = ModeStandalone
	}
	if s.Replicas == nil {
		s.Replicas = ptr.To(DefaultReplicas)
	}
	n := &s.Network
	if n.ServiceType == "" {
		n.ServiceType = corev1.ServiceTypeLoadBalancer
	}
	if n.Port == 0 {
		n.Port = DefaultPort
	}
	if n.PodCIDR == "" {
		n.PodCIDR = DefaultPodCIDR
	}
	if n.ServiceCIDR == "" {
		n.ServiceCIDR = DefaultServiceCIDR
	}
	if n.DNSServiceIP == "" {
		if ip, ok := NthIP(n.ServiceCIDR, dnsServiceIPOffset); ok {
			n.DNSServiceIP = ip.String()
		}
	}
	if n.ClusterDomain == "" {
		n.ClusterDomain = DefaultClusterDomain
	}
	c := &s.Certificates
	if c.Validity == nil {
		c.Validity = &metav1.Duration{Duration: DefaultCertificateValidity}
	}
	if c.RenewBefore == nil {
		c.RenewBefore = &metav1.Duration{Duration: DefaultRenewBefore(c.Validity.Duration)}
	}
	for _, a := range []*AddonSpec{&s.Addons.CoreDNS, &s.Addons.KubeProxy, &s.Addons.Konnectivity} {
		if a.Enabled == nil {
			a.Enabled = ptr.To(true)
		}
	}
}

// DefaultRenewBefore is renewBefore when unset: 30 days, or a third of a
// shorter validity (at least a minute), so that setting only a short
// validity is valid.
func DefaultRenewBefore(validity time.Duration) time.Duration {
	return max(min(DefaultCertificateRenewBefore, validity/3), time.Minute)
}

// NthIP returns the n-th address of a CIDR (0 is the network address), and
// false when the CIDR does not parse or is too small.
func NthIP(cidr string, n int) (netip.Addr, bool) {
	prefix, err := netip.ParsePrefix(cidr)
	if err != nil {
		return netip.Addr{}, false
	}
	ip := prefix.Masked().Addr()
	for range n {
		ip = ip.Next()
	}
	if !ip.IsValid() || !prefix.Contains(ip) {
		return netip.Addr{}, false
	}
	return ip, true
}
