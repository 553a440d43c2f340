package render

import (
	"fmt"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/version"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/apiaryhq/apiary/datastore"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

// The tenant's datastore quota is enforced inside its own API server by a
// ValidatingAdmissionPolicy loaded from a file (manifest-based admission,
// Kubernetes 1.36+): unlike a policy stored in the tenant's API, its admin
// cannot delete or change it. The operator writes the policy into a
// ConfigMap mounted as the static manifests directory while the tenant is
// over quota and empties it when it is back under; the kubelet updates the
// mounted file and kube-apiserver reloads it, so no pod restarts.
const (
	admissionDir = "/etc/apiary"
	// pathAdmissionConfig is the AdmissionConfiguration (in the API
	// server's projected volume: it never changes).
	pathAdmissionConfig = kubernetesDir + "/admission-configuration.yaml"
	// policiesDir is a volume of its own, so that kube-apiserver's
	// watch on it sees the kubelet's atomic swap of the files.
	policiesDir = admissionDir + "/admission-policies"

	// KeyAdmissionConfig and KeyQuotaPolicy are the keys of the tenant's
	// admission ConfigMap.
	KeyAdmissionConfig = "admission-configuration.yaml"
	KeyQuotaPolicy     = "datastore-quota.yaml"

	volumePolicies = "admission-policies"

	// QuotaPolicyName names the static policy and its binding (static
	// manifests must end in .static.k8s.io, a suffix the tenant's API
	// refuses for its own objects).
	QuotaPolicyName = "apiary-datastore-quota.static.k8s.io"

	// manifestGate is the feature gate of manifest-based admission: alpha
	// (off) in 1.36, beta (on) in 1.37.
	manifestGate = "ManifestBasedAdmissionControlConfig"
)

// StaticAdmissionSupported says whether a Kubernetes version loads
// admission policies from files (1.36 and newer).
func StaticAdmissionSupported(v string) bool {
	parsed, err := version.ParseGeneric(v)
	return err == nil && parsed.AtLeast(version.MajorMinor(1, 36))
}

// AdmissionConfigMapName holds the tenant's AdmissionConfiguration and its
// static policies.
func AdmissionConfigMapName(tcp *apiary.TenantControlPlane) string {
	return tcp.Name + "-admission"
}

// AdmissionConfiguration points the ValidatingAdmissionPolicy plugin at
// the static manifests directory.
const AdmissionConfiguration = `apiVersion: apiserver.config.k8s.io/v1
kind: AdmissionConfiguration
plugins:
- name: ValidatingAdmissionPolicy
  configuration:
    apiVersion: apiserver.config.k8s.io/v1
    kind: ValidatingAdmissionPolicyConfiguration
    staticManifestsDir: ` + policiesDir + `
`

// QuotaExceeded is what the quota policy says, fixed while the tenant is
// over quota (the file changes only when the state or the budget does).
type QuotaExceeded struct {
	// Quota is the budget the tenant went over.
	Quota apiary.TenantQuota
}

// AdmissionConfigMap holds the AdmissionConfiguration and, while exceeded
// is set, the quota policy; otherwise the policy file is empty.
func AdmissionConfigMap(tcp *apiary.TenantControlPlane, exceeded *QuotaExceeded) (*corev1ac.ConfigMapApplyConfiguration, error) {
	policy := ""
	if exceeded != nil {
		var err error
		if policy, err = QuotaPolicy(tcp, exceeded.Quota); err != nil {
			return nil, err
		}
	}
	return corev1ac.ConfigMap(AdmissionConfigMapName(tcp), tcp.Namespace).
		WithLabels(Labels(tcp)).
		WithOwnerReferences(OwnerReference(tcp)).
		WithData(map[string]string{KeyAdmissionConfig: AdmissionConfiguration, KeyQuotaPolicy: policy}), nil
}

// QuotaPolicy refuses creates and updates of everything the tenant stores,
// with a message that names the quota. It lets through what keeps the
// cluster alive and what lets the tenant get back under its quota:
//   - deletes (not matched), and updates of objects being deleted
//     (finalizers must come off for a deletion to finish);
//   - lease renewals (node heartbeats, leader election);
//   - what is not stored: token and access reviews, token requests,
//     evictions (which delete a pod).
func QuotaPolicy(tcp *apiary.TenantControlPlane, q apiary.TenantQuota) (string, error) {
	var limits []string
	if q.Bytes != nil {
		limits = append(limits, datastore.FormatBytes(q.Bytes.Value()))
	}
	if q.Objects != nil {
		limits = append(limits, fmt.Sprintf("%d objects", *q.Objects))
	}
	msg := fmt.Sprintf("tenant %s/%s is over its datastore quota (%s): creates and updates are refused until its usage is back under %d %% of it; deletes are allowed",
		tcp.Namespace, tcp.Name, strings.Join(limits, ", "), QuotaLiftPercent)
	ops := func(o ...admissionregistrationv1.OperationType) []admissionregistrationv1.OperationType { return o }
	rule := func(o []admissionregistrationv1.OperationType, groups []string, resources ...string) admissionregistrationv1.NamedRuleWithOperations {
		return admissionregistrationv1.NamedRuleWithOperations{RuleWithOperations: admissionregistrationv1.RuleWithOperations{
			Operations: o,
			Rule:       admissionregistrationv1.Rule{APIGroups: groups, APIVersions: []string{"*"}, Resources: resources},
		}}
	}
	create, update := admissionregistrationv1.Create, admissionregistrationv1.Update
	policy := admissionregistrationv1.ValidatingAdmissionPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: admissionregistrationv1.SchemeGroupVersion.String(), Kind: "ValidatingAdmissionPolicy"},
		ObjectMeta: metav1.ObjectMeta{Name: QuotaPolicyName},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: ptr.To(admissionregistrationv1.Fail),
			MatchConstraints: &admissionregistrationv1.MatchResources{
				ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{
					rule(ops(create, update), []string{"*"}, "*/*"),
				},
				ExcludeResourceRules: []admissionregistrationv1.NamedRuleWithOperations{
					rule(ops(create), []string{"authentication.k8s.io", "authorization.k8s.io"}, "*"),
					rule(ops(create), []string{""}, "serviceaccounts/token", "pods/eviction"),
					rule(ops(update), []string{"coordination.k8s.io"}, "leases"),
				},
			},
			Validations: []admissionregistrationv1.Validation{{
				Expression: "request.operation == 'UPDATE' && object != null && has(object.metadata.deletionTimestamp)",
				Message:    msg,
				Reason:     ptr.To(metav1.StatusReasonForbidden),
			}},
		},
	}
	binding := admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		TypeMeta:   metav1.TypeMeta{APIVersion: admissionregistrationv1.SchemeGroupVersion.String(), Kind: "ValidatingAdmissionPolicyBinding"},
		ObjectMeta: metav1.ObjectMeta{Name: QuotaPolicyName},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        QuotaPolicyName,
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
		},
	}
	var docs []string
	for _, obj := range []any{policy, binding} {
		b, err := yaml.Marshal(obj)
		if err != nil {
			return "", fmt.Errorf("rendering the quota policy: %w", err)
		}
		docs = append(docs, string(b))
	}
	return strings.Join(docs, "---\n"), nil
}

// QuotaLiftPercent is how far under its quota a tenant must get before
// writes are allowed again, so that a tenant at its limit does not flap.
const QuotaLiftPercent = 95

// admissionVolumes are the API server's policies volume, and the items its
// projected volume takes from the admission ConfigMap.
func admissionPoliciesVolume(tcp *apiary.TenantControlPlane) *corev1ac.VolumeApplyConfiguration {
	return corev1ac.Volume().WithName(volumePolicies).WithConfigMap(corev1ac.ConfigMapVolumeSource().
		WithName(AdmissionConfigMapName(tcp)).
		WithDefaultMode(0o440).
		WithItems(corev1ac.KeyToPath().WithKey(KeyQuotaPolicy).WithPath(KeyQuotaPolicy)))
}
