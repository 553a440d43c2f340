// Package webhooks holds Apiary's admission webhooks: defaulting and
// validation of TenantControlPlanes. Every rejection names the field and the
// rule it breaks.
package webhooks

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apimachinery/pkg/util/version"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/operator/render"
)

// Supported Kubernetes minor versions (major 1).
const (
	MinSupportedMinor = 35
	MaxSupportedMinor = 37
)

// versionPattern is the only form accepted: version.ParseSemantic alone
// tolerates surrounding white space, which would end up in image tags.
var versionPattern = regexp.MustCompile(`^v[0-9]+\.[0-9]+\.[0-9]+$`)

// +kubebuilder:webhook:path=/mutate-apiary-dev-v1alpha1-tenantcontrolplane,mutating=true,failurePolicy=fail,sideEffects=None,groups=apiary.dev,resources=tenantcontrolplanes,verbs=create;update,versions=v1alpha1,name=mtenantcontrolplane.apiary.dev,admissionReviewVersions=v1
// +kubebuilder:webhook:path=/validate-apiary-dev-v1alpha1-tenantcontrolplane,mutating=false,failurePolicy=fail,sideEffects=None,groups=apiary.dev,resources=tenantcontrolplanes,verbs=create;update,versions=v1alpha1,name=vtenantcontrolplane.apiary.dev,admissionReviewVersions=v1

// TenantControlPlane defaults and validates TenantControlPlanes.
type TenantControlPlane struct {
	// Policy is what the platform admin allows tenants.
	Policy TenantPolicy
	// Reader lists the other tenants of a namespace (object names must
	// not collide); nil skips that check.
	Reader client.Reader
	// Namespaces the operator works in (empty: all).
	Namespaces []string
	// Reviews creates SubjectAccessReviews (the author of an issuer's
	// certificateAuthorityRef must be allowed to read it); nil skips that
	// check.
	Reviews client.Client
}

// Setup registers the webhooks with the manager.
func (w TenantControlPlane) Setup(mgr ctrl.Manager) error {
	w.Reader = mgr.GetClient()
	w.Reviews = mgr.GetClient()
	return ctrl.NewWebhookManagedBy(mgr, &apiary.TenantControlPlane{}).
		WithDefaulter(w).
		WithValidator(w).
		Complete()
}

// Default fills unset fields.
func (TenantControlPlane) Default(_ context.Context, tcp *apiary.TenantControlPlane) error {
	tcp.Default()
	return nil
}

// ValidateCreate checks a new TenantControlPlane.
func (w TenantControlPlane) ValidateCreate(ctx context.Context, tcp *apiary.TenantControlPlane) (admission.Warnings, error) {
	errs := append(Validate(tcp), w.Policy.Validate(tcp)...)
	if nsErrs := namespaceManaged(w.Namespaces, "TenantControlPlane", tcp.Namespace); len(nsErrs) > 0 {
		// The operator's cache holds nothing of that namespace.
		return warnings(tcp), invalid(tcp, append(errs, nsErrs...))
	}
	if w.Reader != nil {
		var others apiary.TenantControlPlaneList
		if err := w.Reader.List(ctx, &others, client.InNamespace(tcp.Namespace)); err != nil {
			return nil, apierrors.NewInternalError(fmt.Errorf("listing the tenants of namespace %s: %w", tcp.Namespace, err))
		}
		errs = append(errs, NameCollisions(tcp, others.Items)...)
	}
	dsErrs, err := w.dataStoreAdmits(ctx, tcp)
	if err != nil {
		return nil, err
	}
	errs = append(errs, dsErrs...)
	if len(errs) == 0 {
		refErrs, err := w.mayReadCARefs(ctx, nil, tcp)
		if err != nil {
			return nil, err
		}
		errs = append(errs, refErrs...)
	}
	return warnings(tcp), invalid(tcp, errs)
}

// mayReadCARefs refuses a certificateAuthorityRef its author may not get
// (the operator would copy what it names into the tenant's API server
// configuration): on create, and on update for references that changed.
func (w TenantControlPlane) mayReadCARefs(ctx context.Context, old, tcp *apiary.TenantControlPlane) (field.ErrorList, error) {
	if w.Reviews == nil || !render.AuthenticationEnabled(tcp) {
		return nil, nil
	}
	before := map[apiary.CertificateAuthorityReference]bool{}
	if old != nil && old.Spec.Authentication != nil {
		for _, a := range old.Spec.Authentication.JWT {
			if a.CertificateAuthorityRef != nil {
				before[*a.CertificateAuthorityRef] = true
			}
		}
	}
	var errs field.ErrorList
	for i, a := range tcp.Spec.Authentication.JWT {
		ref := a.CertificateAuthorityRef
		if ref == nil || before[*ref] {
			continue
		}
		resource := "configmaps"
		if ref.Kind == "Secret" {
			resource = "secrets"
		}
		ok, user, err := authorMay(ctx, w.Reviews, tcp.Namespace, resource, ref.Name)
		if err != nil {
			return nil, err
		}
		if !ok {
			errs = append(errs, field.Forbidden(field.NewPath("spec", "authentication", "jwt").Index(i).Child("certificateAuthorityRef"),
				fmt.Sprintf("%s may not get %s %s/%s: an issuer may only name certificates its author may read", user, ref.Kind, tcp.Namespace, ref.Name)))
		}
	}
	return errs, nil
}

// dataStoreAdmits refuses a spec.dataStore whose namespaceSelector does not
// take the tenant's namespace (the controller checks again, at every
// reconcile). A DataStore that does not exist yet is the controller's to
// report.
func (w TenantControlPlane) dataStoreAdmits(ctx context.Context, tcp *apiary.TenantControlPlane) (field.ErrorList, error) {
	if w.Reader == nil || tcp.Spec.DataStore == "" {
		return nil, nil
	}
	var ds apiary.DataStore
	if err := w.Reader.Get(ctx, client.ObjectKey{Name: tcp.Spec.DataStore}, &ds); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, apierrors.NewInternalError(fmt.Errorf("reading DataStore %s: %w", tcp.Spec.DataStore, err))
	}
	if ds.Spec.NamespaceSelector == nil {
		return nil, nil
	}
	var ns corev1.Namespace
	if err := w.Reader.Get(ctx, client.ObjectKey{Name: tcp.Namespace}, &ns); err != nil {
		return nil, apierrors.NewInternalError(fmt.Errorf("reading namespace %s: %w", tcp.Namespace, err))
	}
	ok, err := ds.Admits(ns.Labels)
	if err != nil {
		return nil, apierrors.NewInternalError(err)
	}
	if ok {
		return nil, nil
	}
	return field.ErrorList{field.Forbidden(field.NewPath("spec", "dataStore"),
		fmt.Sprintf("DataStore %s does not take tenants of namespace %s: its spec.namespaceSelector (%s) does not match the namespace's labels", ds.Name, tcp.Namespace, metav1.FormatLabelSelector(ds.Spec.NamespaceSelector)))}, nil
}

// ValidateUpdate checks a change, including the rules that compare with the
// previous object (no downgrade, no skipped minor, immutable fields).
func (w TenantControlPlane) ValidateUpdate(ctx context.Context, old, tcp *apiary.TenantControlPlane) (admission.Warnings, error) {
	// Updates that leave the spec alone (finalizers, labels, annotations,
	// and every update of an object being deleted) are not checked: a
	// spec stored before a rule existed, or while the webhook was off,
	// must not wedge the finalizer's removal.
	// Compared defaulted: the stored object may predate a default.
	oldD, newD := old.DeepCopy(), tcp.DeepCopy()
	oldD.Default()
	newD.Default()
	if !tcp.DeletionTimestamp.IsZero() || equality.Semantic.DeepEqual(oldD.Spec, newD.Spec) {
		return nil, nil
	}
	errs := Validate(tcp)
	errs = append(errs, w.Policy.Validate(tcp)...)
	errs = append(errs, ValidateUpdate(old, tcp)...)
	if old.Spec.DataStore != tcp.Spec.DataStore {
		dsErrs, err := w.dataStoreAdmits(ctx, tcp)
		if err != nil {
			return nil, err
		}
		errs = append(errs, dsErrs...)
	}
	if len(errs) == 0 {
		refErrs, err := w.mayReadCARefs(ctx, old, tcp)
		if err != nil {
			return nil, err
		}
		errs = append(errs, refErrs...)
	}
	return warnings(tcp), invalid(tcp, errs)
}

// ValidateDelete allows every deletion; the finalizer cleans up.
func (TenantControlPlane) ValidateDelete(context.Context, *apiary.TenantControlPlane) (admission.Warnings, error) {
	return nil, nil
}

func warnings(tcp *apiary.TenantControlPlane) admission.Warnings {
	if tcp.Spec.Mode == apiary.ModeRegistered {
		return admission.Warnings{"spec.mode: registered runs the control plane on the tenant's Hosts with role control-plane; until one has joined it runs hosted (the ModeSwitched condition and status.modeSwitch show the switch)"}
	}
	return nil
}

func invalid(tcp *apiary.TenantControlPlane, errs field.ErrorList) error {
	if len(errs) == 0 {
		return nil
	}
	return apierrors.NewInvalid(apiary.GroupVersion.WithKind("TenantControlPlane").GroupKind(), tcp.Name, errs)
}

// Validate checks a defaulted TenantControlPlane on its own.
func Validate(tcp *apiary.TenantControlPlane) field.ErrorList {
	var errs field.ErrorList
	for _, msg := range validation.IsDNS1035Label(tcp.Name) {
		errs = append(errs, field.Invalid(field.NewPath("metadata", "name"), tcp.Name, "must be a DNS-1035 label: "+msg))
	}
	spec := field.NewPath("spec")
	s := tcp.Spec
	if _, err := parseVersion(s.Version); err != nil {
		errs = append(errs, field.Invalid(spec.Child("version"), s.Version, err.Error()))
	}
	switch s.Mode {
	case apiary.ModeStandalone, apiary.ModeRegistered:
	default:
		errs = append(errs, field.NotSupported(spec.Child("mode"), s.Mode, []string{string(apiary.ModeStandalone), string(apiary.ModeRegistered)}))
	}
	if s.Replicas != nil && (*s.Replicas < 1 || *s.Replicas > 7) {
		errs = append(errs, field.Invalid(spec.Child("replicas"), *s.Replicas, "must be between 1 and 7"))
	}
	errs = append(errs, validateNetwork(spec.Child("network"), s.Network)...)
	errs = append(errs, validateCertificates(spec.Child("certificates"), s.Certificates)...)
	for _, c := range render.Components {
		errs = append(errs, validateExtraArgs(spec.Child(string(c), "extraArgs"), c, render.ExtraArgs(c, &s))...)
	}
	errs = append(errs, ValidateAuthentication(tcp)...)
	return errs
}

// Bounds of spec.certificates. A validity of minutes is for tests and
// demonstrations; renewal at half the lifetime at the latest leaves the
// control plane time to roll before the old certificates expire.
const (
	minCertificateValidity    = 2 * time.Minute
	maxCertificateValidity    = 10 * 365 * 24 * time.Hour
	minCertificateRenewBefore = time.Minute
)

func validateCertificates(p *field.Path, c apiary.CertificatesSpec) field.ErrorList {
	var errs field.ErrorList
	if c.Validity != nil {
		if v := c.Validity.Duration; v < minCertificateValidity || v > maxCertificateValidity {
			errs = append(errs, field.Invalid(p.Child("validity"), c.Validity.Duration.String(),
				fmt.Sprintf("must be between %s and %s", minCertificateValidity, maxCertificateValidity)))
		}
	}
	if c.RenewBefore != nil {
		r := c.RenewBefore.Duration
		switch {
		case r < minCertificateRenewBefore:
			errs = append(errs, field.Invalid(p.Child("renewBefore"), r.String(), fmt.Sprintf("must be at least %s", minCertificateRenewBefore)))
		case c.Validity != nil && 2*r > c.Validity.Duration:
			errs = append(errs, field.Invalid(p.Child("renewBefore"), r.String(),
				fmt.Sprintf("must be at most half of spec.certificates.validity (%s)", c.Validity.Duration)))
		}
	}
	return errs
}

// parseVersion parses vMAJOR.MINOR.PATCH and checks that it is supported.
func parseVersion(v string) (*version.Version, error) {
	parsed, err := version.ParseSemantic(v)
	if err != nil || !strings.HasPrefix(v, "v") {
		return nil, fmt.Errorf("must be a Kubernetes version of the form vMAJOR.MINOR.PATCH, such as %s", apiary.DefaultVersion)
	}
	if parsed.PreRelease() != "" || parsed.BuildMetadata() != "" {
		return nil, fmt.Errorf("must be a released version without pre-release or build suffix, such as %s", apiary.DefaultVersion)
	}
	if !versionPattern.MatchString(v) {
		return nil, fmt.Errorf("must be a Kubernetes version of the form vMAJOR.MINOR.PATCH, such as %s", apiary.DefaultVersion)
	}
	if parsed.Major() != 1 || parsed.Minor() < MinSupportedMinor || parsed.Minor() > MaxSupportedMinor {
		return nil, fmt.Errorf("is not supported: supported versions are v1.%d.x to v1.%d.x", MinSupportedMinor, MaxSupportedMinor)
	}
	return parsed, nil
}

func validateNetwork(p *field.Path, n apiary.NetworkSpec) field.ErrorList {
	var errs field.ErrorList
	switch n.ServiceType {
	case "LoadBalancer", "NodePort", "ClusterIP":
	default:
		errs = append(errs, field.NotSupported(p.Child("serviceType"), n.ServiceType, []string{"LoadBalancer", "NodePort", "ClusterIP"}))
	}
	if n.Address != "" {
		if _, err := netip.ParseAddr(n.Address); err != nil {
			errs = append(errs, field.Invalid(p.Child("address"), n.Address, "must be an IP address"))
		}
	}
	if n.Port < 1 || n.Port > 65535 {
		errs = append(errs, field.Invalid(p.Child("port"), n.Port, "must be between 1 and 65535"))
	}
	for i, san := range n.CertSANs {
		if net.ParseIP(san) != nil {
			continue
		}
		name := strings.TrimPrefix(san, "*.")
		if msgs := validation.IsDNS1123Subdomain(name); len(msgs) > 0 {
			errs = append(errs, field.Invalid(p.Child("certSANs").Index(i), san, "must be an IP address or a DNS name (optionally starting with *.): "+strings.Join(msgs, "; ")))
		}
	}
	pods, podErr := parseCIDR(p.Child("podCIDR"), n.PodCIDR)
	errs = append(errs, podErr...)
	services, svcErr := parseCIDR(p.Child("serviceCIDR"), n.ServiceCIDR)
	errs = append(errs, svcErr...)
	if svcErr == nil && services.Addr().Is4() && services.Bits() < 12 {
		errs = append(errs, field.Invalid(p.Child("serviceCIDR"), n.ServiceCIDR, "must not be larger than /12 (kube-apiserver refuses larger IPv4 Service ranges)"))
	}
	if svcErr == nil && services.Addr().Is6() && services.Bits() < 108 {
		errs = append(errs, field.Invalid(p.Child("serviceCIDR"), n.ServiceCIDR, "must not be larger than /108 (kube-apiserver refuses larger IPv6 Service ranges)"))
	}
	if podErr == nil && svcErr == nil {
		if pods.Addr().Is4() != services.Addr().Is4() {
			errs = append(errs, field.Invalid(p.Child("serviceCIDR"), n.ServiceCIDR, fmt.Sprintf("must be of the same IP family as podCIDR %s", n.PodCIDR)))
		} else if pods.Overlaps(services) {
			errs = append(errs, field.Invalid(p.Child("serviceCIDR"), n.ServiceCIDR, fmt.Sprintf("must not overlap podCIDR %s", n.PodCIDR)))
		}
	}
	if n.DNSServiceIP == "" {
		errs = append(errs, field.Required(p.Child("dnsServiceIP"), "must be set (it defaults to the 10th address of serviceCIDR)"))
	} else if dns, err := netip.ParseAddr(n.DNSServiceIP); err != nil {
		errs = append(errs, field.Invalid(p.Child("dnsServiceIP"), n.DNSServiceIP, "must be an IP address"))
	} else if svcErr == nil {
		first, _ := apiary.NthIP(n.ServiceCIDR, 1)
		switch {
		case !services.Contains(dns):
			errs = append(errs, field.Invalid(p.Child("dnsServiceIP"), n.DNSServiceIP, fmt.Sprintf("must be inside serviceCIDR %s", n.ServiceCIDR)))
		case dns == services.Addr():
			errs = append(errs, field.Invalid(p.Child("dnsServiceIP"), n.DNSServiceIP, "must not be the network address of serviceCIDR"))
		case dns == first:
			errs = append(errs, field.Invalid(p.Child("dnsServiceIP"), n.DNSServiceIP, "must not be the first address of serviceCIDR: it belongs to the kubernetes Service"))
		case dns.Is4() && dns == lastAddr(services):
			errs = append(errs, field.Invalid(p.Child("dnsServiceIP"), n.DNSServiceIP, "must not be the broadcast address of serviceCIDR: kube-apiserver never allocates it"))
		}
	}
	for _, msg := range validation.IsDNS1123Subdomain(n.ClusterDomain) {
		errs = append(errs, field.Invalid(p.Child("clusterDomain"), n.ClusterDomain, "must be a DNS subdomain: "+msg))
	}
	return errs
}

// lastAddr is the highest address of a prefix.
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 1 << (7 - i%8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

func parseCIDR(p *field.Path, cidr string) (netip.Prefix, field.ErrorList) {
	prefix, err := netip.ParsePrefix(cidr)
	if err != nil {
		return prefix, field.ErrorList{field.Invalid(p, cidr, "must be a CIDR such as 10.96.0.0/16")}
	}
	if prefix.Masked() != prefix {
		return prefix, field.ErrorList{field.Invalid(p, cidr, fmt.Sprintf("must be the network address of its range: %s", prefix.Masked()))}
	}
	return prefix, nil
}

// ValidateUpdate checks the rules that compare a change with the previous
// object.
func ValidateUpdate(old, tcp *apiary.TenantControlPlane) field.ErrorList {
	// An object stored while the webhook was down has empty fields whose
	// effective value is the default (the controller renders it so):
	// compare with those.
	old = old.DeepCopy()
	old.Default()
	var errs field.ErrorList
	spec := field.NewPath("spec")
	oldV, oldErr := version.ParseSemantic(old.Spec.Version)
	newV, newErr := parseVersion(tcp.Spec.Version)
	if oldErr == nil && newErr == nil {
		// The minor must not run ahead of what runs, either: with v1.35
		// running and v1.36 asked for, v1.37 would skip v1.36.
		from, fromV := old.Spec.Version, oldV
		if running, err := version.ParseSemantic(old.Status.Version); err == nil && running.LessThan(oldV) {
			from, fromV = old.Status.Version, running
		}
		// Back to what runs is allowed: that cancels an upgrade that has
		// not completed (status.version moves only once every replica runs
		// the new version).
		switch {
		case newV.LessThan(fromV):
			errs = append(errs, field.Invalid(spec.Child("version"), tcp.Spec.Version, fmt.Sprintf("must not be lower than the current version %s: downgrades are not supported", from)))
		case newV.Minor() > fromV.Minor()+1:
			errs = append(errs, field.Invalid(spec.Child("version"), tcp.Spec.Version, fmt.Sprintf("must not skip a minor version: upgrade from %s to v1.%d first", from, fromV.Minor()+1)))
		}
	}
	errs = append(errs, versionAndModeApart(old, tcp)...)
	bound := old.Spec.DataStore
	if bound == "" {
		bound = old.Status.DataStore.Name
	}
	if bound != "" && tcp.Spec.DataStore != bound && !(tcp.Spec.DataStore == "" && old.Spec.DataStore == "") {
		errs = append(errs, field.Invalid(spec.Child("dataStore"), tcp.Spec.DataStore, fmt.Sprintf("is immutable: the tenant's state lives in DataStore %q (migration is not supported yet)", bound)))
	}
	netPath, oldNet := spec.Child("network"), old.Spec.Network
	for _, f := range []struct {
		name     string
		old, new string
	}{
		{"podCIDR", oldNet.PodCIDR, tcp.Spec.Network.PodCIDR},
		{"serviceCIDR", oldNet.ServiceCIDR, tcp.Spec.Network.ServiceCIDR},
		{"dnsServiceIP", oldNet.DNSServiceIP, tcp.Spec.Network.DNSServiceIP},
		{"clusterDomain", oldNet.ClusterDomain, tcp.Spec.Network.ClusterDomain},
	} {
		if f.old != "" && f.new != f.old {
			errs = append(errs, field.Invalid(netPath.Child(f.name), f.new, fmt.Sprintf("is immutable (was %q): nodes, Services and certificates of the tenant depend on it", f.old)))
		}
	}
	return errs
}

// versionAndModeApart keeps an upgrade and a mode switch from overlapping:
// a switch moves the control plane between pods and hosts, an upgrade
// rolls it, and each waits for the control plane to be whole before its
// next step. The controller holds spec.version during a switch all the
// same (an object that bypassed the webhook).
func versionAndModeApart(old, tcp *apiary.TenantControlPlane) field.ErrorList {
	spec := field.NewPath("spec")
	versionChanged := tcp.Spec.Version != old.Spec.Version
	modeChanged := tcp.Spec.Mode != "" && tcp.Spec.Mode != old.Spec.Mode
	st := old.Status
	switch {
	case versionChanged && modeChanged:
		return field.ErrorList{field.Forbidden(spec.Child("version"), "must not change together with spec.mode: change one, wait until it is done (status.version, status.modeSwitch), then the other")}
	case versionChanged && st.Switching():
		return field.ErrorList{field.Forbidden(spec.Child("version"), fmt.Sprintf("must not change while the control plane switches to %s (status.modeSwitch.phase %s): change it once the phase is %s", st.ModeSwitch.Target, st.ModeSwitch.Phase, apiary.SwitchCompleted))}
	case versionChanged && st.Mode != "" && old.Spec.Mode != st.Mode:
		// Asked for, not started yet: the next reconcile starts it.
		return field.ErrorList{field.Forbidden(spec.Child("version"), fmt.Sprintf("must not change while the control plane is about to switch from %s to %s: change it once status.mode is %s and the switch completed", st.Mode, old.Spec.Mode, old.Spec.Mode))}
	case modeChanged && st.Version != "" && st.Version != old.Spec.Version:
		return field.ErrorList{field.Forbidden(spec.Child("mode"), fmt.Sprintf("must not change while the control plane upgrades from %s to %s: switch once status.version is %s, or set spec.version back to %s first", st.Version, old.Spec.Version, old.Spec.Version, st.Version))}
	}
	return nil
}
