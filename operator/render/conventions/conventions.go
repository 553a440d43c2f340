// Package conventions holds what every object Apiary renders in the
// management cluster follows, whoever owns it (a tenant or a DataStore):
// the labels and annotations the operator finds its objects by, the kinds
// and keys of the Secrets its credentials issuer writes, the command-line
// format, and how its pods are hardened, sized and spread.
//
// It is the small place operator/render (a tenant's control plane) and
// operator/render/managedetcd (a DataStore's etcd) share, so that neither
// copies the other; it imports neither. operator/render re-exports the
// names code outside the render packages uses (render.LabelManagedBy,
// render.SecretKind, render.KeyTLSCert, ...).
package conventions

import (
	"fmt"
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"
)

// Labels and annotations on the objects of tenants and managed etcds.
const (
	LabelManagedBy = "app.kubernetes.io/managed-by"
	ManagedBy      = "apiary"
	LabelComponent = "app.kubernetes.io/component"
	// LabelSecret on a Secret is its SecretKind.
	LabelSecret = "apiary.dev/secret"

	// AnnotationConfigHash on a pod template is a hash of every Secret
	// mounted into the pods: a change to any of them rolls the pods.
	AnnotationConfigHash = "apiary.dev/config-hash"
	// AnnotationMetalLBIPs asks MetalLB for specific LoadBalancer
	// addresses; spec.loadBalancerIP is deprecated upstream.
	AnnotationMetalLBIPs = "metallb.io/loadBalancerIPs"
)

// SecretKind names one of the Secrets of a tenant or a managed etcd; the
// Secret's name is "<owner>-<kind>".
type SecretKind string

// Keys inside the Secrets.
const (
	KeyTLSCert = "tls.crt"
	KeyTLSKey  = "tls.key"
	KeyCACert  = "ca.crt"
)

// NonRootUID is the distroless "nonroot" user: the control-plane binaries
// and etcd need no privileges, only to read their mounted Secrets.
const NonRootUID = int64(65532)

// FlagFeatureGates is merged, not replaced, by Flags.
const FlagFeatureGates = "feature-gates"

// Flags renders defaults overridden by extra as sorted --key=value
// arguments, so that the same spec always gives the same command line (a
// different order would roll the pods for nothing).
//
// feature-gates is merged rather than replaced: extra's gates come first
// and the defaults' after them, so the defaults win (the components read
// the list in order, the last setting of a gate wins) and extra cannot
// drop a gate Apiary pins.
func Flags(defaults, extra map[string]string) []string {
	merged := maps.Clone(defaults)
	maps.Copy(merged, extra)
	if d, e := defaults[FlagFeatureGates], extra[FlagFeatureGates]; d != "" && e != "" {
		merged[FlagFeatureGates] = e + "," + d
	}
	keys := slices.Sorted(maps.Keys(merged))
	args := make([]string, 0, len(keys))
	for _, k := range keys {
		args = append(args, fmt.Sprintf("--%s=%s", k, merged[k]))
	}
	return args
}

// Harden sets what every container of Apiary's pods has: no privilege
// escalation, a read-only root filesystem, no capabilities, images pulled
// only when missing, and the log's tail as the termination message.
func Harden(c *corev1ac.ContainerApplyConfiguration) *corev1ac.ContainerApplyConfiguration {
	return c.
		WithImagePullPolicy(corev1.PullIfNotPresent).
		WithSecurityContext(corev1ac.SecurityContext().
			WithAllowPrivilegeEscalation(false).
			WithReadOnlyRootFilesystem(true).
			WithCapabilities(corev1ac.Capabilities().WithDrop("ALL"))).
		WithTerminationMessagePolicy(corev1.TerminationMessageFallbackToLogsOnError)
}

// PodSecurityContext runs every container of a pod as NonRootUID, with the
// runtime's default seccomp profile.
func PodSecurityContext() *corev1ac.PodSecurityContextApplyConfiguration {
	return corev1ac.PodSecurityContext().
		WithRunAsNonRoot(true).
		WithRunAsUser(NonRootUID).
		WithRunAsGroup(NonRootUID).
		WithFSGroup(NonRootUID).
		WithSeccompProfile(corev1ac.SeccompProfile().WithType(corev1.SeccompProfileTypeRuntimeDefault))
}

// SpreadOverNodes prefers to put the pods that selector selects on
// different nodes, when there are several.
func SpreadOverNodes(selector map[string]string) *corev1ac.AffinityApplyConfiguration {
	return corev1ac.Affinity().WithPodAntiAffinity(corev1ac.PodAntiAffinity().
		WithPreferredDuringSchedulingIgnoredDuringExecution(corev1ac.WeightedPodAffinityTerm().
			WithWeight(100).
			WithPodAffinityTerm(corev1ac.PodAffinityTerm().
				WithTopologyKey(corev1.LabelHostname).
				WithLabelSelector(metav1ac.LabelSelector().WithMatchLabels(selector)))))
}

// Resources are a container's resources: the spec's requests over
// defaults, and the spec's limits (none by default).
func Resources(defaults corev1.ResourceList, spec corev1.ResourceRequirements) *corev1ac.ResourceRequirementsApplyConfiguration {
	requests := maps.Clone(defaults)
	maps.Copy(requests, spec.Requests)
	r := corev1ac.ResourceRequirements().WithRequests(requests)
	if len(spec.Limits) > 0 {
		r.WithLimits(spec.Limits)
	}
	return r
}
