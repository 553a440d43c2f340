package webhooks

import (
	"context"
	"fmt"
	"net/netip"

	"golang.org/x/crypto/ssh"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	corev1 "k8s.io/api/core/v1"

	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

// +kubebuilder:webhook:path=/validate-apiary-dev-v1alpha1-host,mutating=false,failurePolicy=fail,sideEffects=None,groups=apiary.dev,resources=hosts,verbs=create;update,versions=v1alpha1,name=vhost.apiary.dev,admissionReviewVersions=v1

// Host validates Hosts beyond what the CRD schema and its CEL rules say:
// the pinned host key must parse, the address must be an IP or a DNS name,
// and the Node labels and taints must be valid.
//
// It also refuses a Host whose creator (or an update's author, when the
// key or the address changes) may not read its SSH key Secret: otherwise
// whoever may write Hosts could send a key they cannot see to an address
// of their choosing, and have the agent install and join a machine that
// key opens.
type Host struct {
	// Client creates SubjectAccessReviews; nil skips that check.
	Client client.Client
	// Namespaces the operator works in (empty: all).
	Namespaces []string
}

// Setup registers the webhook.
func (w Host) Setup(mgr ctrl.Manager) error {
	w.Client = mgr.GetClient()
	return ctrl.NewWebhookManagedBy(mgr, &apiary.Host{}).WithValidator(w).Complete()
}

func (w Host) ValidateCreate(ctx context.Context, h *apiary.Host) (admission.Warnings, error) {
	errs := append(ValidateHost(h), namespaceManaged(w.Namespaces, "Host", h.Namespace)...)
	if len(errs) == 0 {
		var err error
		if errs, err = w.mayReadKey(ctx, h); err != nil {
			return nil, err
		}
	}
	return hostWarnings(h), invalidHost(h, errs)
}

func (w Host) ValidateUpdate(ctx context.Context, old, h *apiary.Host) (admission.Warnings, error) {
	errs := ValidateHost(h)
	if len(errs) == 0 && (old.Spec.SSHKeySecretRef != h.Spec.SSHKeySecretRef || old.Spec.Address != h.Spec.Address) {
		var err error
		if errs, err = w.mayReadKey(ctx, h); err != nil {
			return nil, err
		}
	}
	return hostWarnings(h), invalidHost(h, errs)
}

// mayReadKey refuses a Host whose author may not get its SSH key Secret.
func (w Host) mayReadKey(ctx context.Context, h *apiary.Host) (field.ErrorList, error) {
	if w.Client == nil {
		return nil, nil
	}
	ok, user, err := authorMay(ctx, w.Client, h.Namespace, "secrets", h.Spec.SSHKeySecretRef.Name)
	if err != nil || ok {
		return nil, err
	}
	return field.ErrorList{field.Forbidden(field.NewPath("spec", "sshKeySecretRef", "name"),
		fmt.Sprintf("%s may not get Secret %s/%s: a Host may only use an SSH key its author may read", user, h.Namespace, h.Spec.SSHKeySecretRef.Name))}, nil
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
