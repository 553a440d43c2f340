package tenant

import (
	"maps"
	"net"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/version"

	"github.com/apiaryhq/apiary/images"
	"github.com/apiaryhq/apiary/konnectivity"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

// coreDNSVersions pairs each supported Kubernetes minor with the CoreDNS
// its kubeadm deploys (cmd/kubeadm/app/constants.CoreDNSVersion of that
// release), so that a tenant runs the CoreDNS of the version it runs, never
// one made for a newer kube-apiserver. The webhook's supported window
// (webhooks.MinSupportedMinor to MaxSupportedMinor) must have a pair each,
// which its tests check. (konnectivity-agent's version is
// konnectivity.Version.)
var coreDNSVersions = map[uint]string{35: "v1.13.1", 36: "v1.14.2", 37: "v1.14.6"}

// CoreDNSPair is the CoreDNS version kubeadm pairs with Kubernetes minor
// 1.minor, if Apiary knows it.
func CoreDNSPair(minor uint) (string, bool) {
	v, ok := coreDNSVersions[minor]
	return v, ok
}

// CoreDNSVersion is the CoreDNS image tag for Kubernetes version v
// (vMAJOR.MINOR.PATCH): its minor's pair, or the newest pair for a version
// outside them (the webhook admits none).
func CoreDNSVersion(v string) string {
	if parsed, err := version.ParseSemantic(v); err == nil {
		if tag, ok := coreDNSVersions[parsed.Minor()]; ok && parsed.Major() == 1 {
			return tag
		}
	}
	return coreDNSVersions[slices.Max(slices.Collect(maps.Keys(coreDNSVersions)))]
}

// Labels on every object applied inside a tenant.
const (
	LabelManagedBy = "app.kubernetes.io/managed-by"
	ManagedBy      = "apiary"
	// LabelPart names the part an object belongs to (bootstrap or an
	// addon), so that a disabled addon's objects can be found and removed.
	LabelPart = "apiary.dev/part"
)

// Part is a group of objects that is applied or removed together.
type Part string

const (
	PartBootstrap    Part = "bootstrap"
	PartCoreDNS      Part = "coredns"
	PartKubeProxy    Part = "kube-proxy"
	PartKonnectivity Part = "konnectivity-agent"
)

// Parts lists every part in the order it is applied.
var Parts = []Part{PartBootstrap, PartCoreDNS, PartKubeProxy, PartKonnectivity}

// Inputs are what the objects inside a tenant depend on.
type Inputs struct {
	TCP *apiary.TenantControlPlane
	// Version is the Kubernetes version the tenant runs
	// (TenantControlPlane.RunningVersion): kubeadm-config and kube-proxy
	// follow it, not spec.version, so that an upgrade in progress never
	// puts anything newer than a running kube-apiserver inside the tenant.
	Version string
	// Server is the URL nodes and in-cluster components reach the tenant
	// API at (the tenant Service's public endpoint).
	Server string
	// CACert is the PEM of the CA bundle the tenant trusts (its cluster
	// CA; two during a CA rotation): cluster-info carries it to joins.
	CACert []byte
	// RootCA is the fingerprint of the CA bundle the tenant's controller
	// manager publishes to pods (kube-root-ca.crt), set once the tenant
	// has had a CA rotation: the addons that talk to the API server read
	// it at start, so their pods carry it (AnnotationRootCA) and roll when
	// it changes. Empty: no annotation.
	RootCA string
	// ImageRepository replaces registry.k8s.io in addon images ("" keeps it).
	ImageRepository string
}

// Enabled says whether a part is deployed for this tenant. The bootstrap is
// always; addons are unless spec.addons.<name>.enabled is false.
func (in Inputs) Enabled(p Part) bool {
	a := in.TCP.Spec.Addons
	var s apiary.AddonSpec
	switch p {
	case PartCoreDNS:
		s = a.CoreDNS
	case PartKubeProxy:
		s = a.KubeProxy
	case PartKonnectivity:
		s = a.Konnectivity
	default:
		return true
	}
	return s.Enabled == nil || *s.Enabled
}

// serverHost is the host part of Server.
func (in Inputs) serverHost() string {
	hostPort := strings.TrimPrefix(in.Server, "https://")
	if h, _, err := net.SplitHostPort(hostPort); err == nil {
		return h
	}
	return hostPort
}

// controlPlaneEndpoint is Server without the scheme, as kubeadm writes it.
func (in Inputs) controlPlaneEndpoint() string {
	return strings.TrimPrefix(in.Server, "https://")
}

func (in Inputs) image(name, tag string) string {
	return images.Ref(in.ImageRepository, name, tag)
}

// AnnotationRootCA on an addon's pod template is Inputs.RootCA.
const AnnotationRootCA = "apiary.dev/root-ca"

// templateAnnotations are the annotations of the addons' pod templates.
func (in Inputs) templateAnnotations() map[string]string {
	if in.RootCA == "" {
		return nil
	}
	return map[string]string{AnnotationRootCA: in.RootCA}
}

func labels(p Part, extra map[string]string) map[string]string {
	l := map[string]string{LabelManagedBy: ManagedBy, LabelPart: string(p)}
	for k, v := range extra {
		l[k] = v
	}
	return l
}

// Workload is an addon's DaemonSet or Deployment.
type Workload struct {
	Part            Part
	Kind            string
	Namespace, Name string
}

// RootCAReaders are the addons whose pods read the CA bundle of their
// service-account volume (kube-root-ca.crt) once, at start: they carry
// AnnotationRootCA.
var RootCAReaders = []Workload{
	{PartKonnectivity, "DaemonSet", konnectivity.Namespace, konnectivity.AgentName},
	{PartKubeProxy, "DaemonSet", "kube-system", "kube-proxy"},
	{PartCoreDNS, "Deployment", "kube-system", "coredns"},
}
