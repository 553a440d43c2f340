package webhooks

import (
	"context"
	"net/netip"

	"golang.org/x/crypto/ssh"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	corev1 "k8s.io/api/core/v1"

	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

// +kubebuilder:webhook:path=/validate-apiary-dev-v1alpha1-host,mutating=false,failurePolicy=fail,sideEffects=None,groups=apiary.dev,resources=hosts,verbs=create;update,versions=v1alpha1,name=vhost.apiary.dev,admissionReviewVersions=v1

// Host validates Hosts beyond what the CRD schema and its CEL rules say:
// the pinned host key must parse, the address must be an IP or a DNS name,
// and the Node labels and taints must be valid.
type Host struct{}

// Setup registers the webhook.
func (w Host) Setup(mgr ctrl.Manager) error {
	return ctrl.NewWebhookManagedBy(mgr, &apiary.Host{}).WithValidator(w).Complete()
}

func (Host) ValidateCreate(_ context.Context, h *apiary.Host) (admission.Warnings, error) {
	return hostWarnings(h), invalidHost(h, ValidateHost(h))
}

func (Host) ValidateUpdate(_ context.Context, _, h *apiary.Host) (admission.Warnings, error) {
	return hostWarnings(h), invalidHost(h, ValidateHost(h))
}

func (Host) ValidateDelete(context.Context, *apiary.Host) (admission.Warnings, error) {
	return nil, nil
}

func hostWarnings(h *apiary.Host) admission.Warnings {
	if h.Spec.InsecureSkipHostKeyCheck {
		return admission.Warnings{"spec.insecureSkipHostKeyCheck: the host's identity is not checked; anyone on the path can impersonate it (labs only)"}
	}
	return nil
}

func invalidHost(h *apiary.Host, errs field.ErrorList) error {
	if len(errs) == 0 {
		return nil
	}
	return apierrors.NewInvalid(apiary.GroupVersion.WithKind("Host").GroupKind(), h.Name, errs)
}

// ValidateHost checks a Host on its own.
func ValidateHost(h *apiary.Host) field.ErrorList {
	var errs field.ErrorList
	spec := field.NewPath("spec")
	s := h.Spec
	if _, err := netip.ParseAddr(s.Address); err != nil {
		for _, msg := range validation.IsDNS1123Subdomain(s.Address) {
			errs = append(errs, field.Invalid(spec.Child("address"), s.Address, "must be an IP address or a DNS name: "+msg))
		}
	}
	if s.HostKey != "" {
		if _, _, _, _, err := ssh.ParseAuthorizedKey([]byte(s.HostKey)); err != nil {
			errs = append(errs, field.Invalid(spec.Child("hostKey"), s.HostKey,
				"must be the host's public key in authorized_keys format (e.g. the output of ssh-keyscan without the host name: \"ssh-ed25519 AAAA...\"): "+err.Error()))
		}
	}
	if s.SSHKeySecretRef.Name == "" {
		errs = append(errs, field.Required(spec.Child("sshKeySecretRef", "name"), "name the Secret holding the SSH private key (key \"ssh-privatekey\")"))
	}
	errs = append(errs, metav1validation.ValidateLabels(s.Labels, spec.Child("labels"))...)
	for i, t := range s.Taints {
		p := spec.Child("taints").Index(i)
		for _, msg := range validation.IsQualifiedName(t.Key) {
			errs = append(errs, field.Invalid(p.Child("key"), t.Key, msg))
		}
		if t.Value != "" {
			for _, msg := range validation.IsValidLabelValue(t.Value) {
				errs = append(errs, field.Invalid(p.Child("value"), t.Value, msg))
			}
		}
		switch t.Effect {
		case corev1.TaintEffectNoSchedule, corev1.TaintEffectPreferNoSchedule, corev1.TaintEffectNoExecute:
		default:
			errs = append(errs, field.NotSupported(p.Child("effect"), t.Effect,
				[]corev1.TaintEffect{corev1.TaintEffectNoSchedule, corev1.TaintEffectPreferNoSchedule, corev1.TaintEffectNoExecute}))
		}
	}
	return errs
}
