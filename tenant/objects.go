package tenant

import (
	"fmt"

	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	rbacv1ac "k8s.io/client-go/applyconfigurations/rbac/v1"
	"sigs.k8s.io/yaml"
)

// Render returns the objects of one part, in apply order.
func Render(in Inputs, p Part) ([]*unstructured.Unstructured, error) {
	var objs []any
	var err error
	switch p {
	case PartBootstrap:
		objs, err = bootstrap(in)
	case PartCoreDNS:
		objs, err = coreDNS(in)
	case PartKubeProxy:
		objs, err = kubeProxy(in)
	case PartKonnectivity:
		objs, err = konnectivityAgent(in)
	default:
		return nil, fmt.Errorf("unknown part %q", p)
	}
	if err != nil {
		return nil, fmt.Errorf("rendering %s: %w", p, err)
	}
	out := make([]*unstructured.Unstructured, 0, len(objs))
	for _, o := range objs {
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(o)
		if err != nil {
			return nil, fmt.Errorf("rendering %s: %w", p, err)
		}
		out = append(out, &unstructured.Unstructured{Object: m})
	}
	return out, nil
}

// Helpers shared by the parts.

func configMap(p Part, ns, name string, data map[string]string) *corev1ac.ConfigMapApplyConfiguration {
	return corev1ac.ConfigMap(name, ns).WithLabels(labels(p, nil)).WithData(data)
}

func serviceAccount(p Part, ns, name string) *corev1ac.ServiceAccountApplyConfiguration {
	return corev1ac.ServiceAccount(name, ns).WithLabels(labels(p, nil))
}

// getConfigMapRole lets subjects read one ConfigMap, as kubeadm's roles do.
func getConfigMapRole(p Part, ns, name, configMap string, subjects ...*rbacv1ac.SubjectApplyConfiguration) []any {
	role := rbacv1ac.Role(name, ns).WithLabels(labels(p, nil)).WithRules(
		rbacv1ac.PolicyRule().WithAPIGroups("").WithResources("configmaps").WithResourceNames(configMap).WithVerbs("get"))
	return []any{role, roleBinding(p, ns, name, subjects...)}
}

// roleBinding binds the Role of the same name.
func roleBinding(p Part, ns, name string, subjects ...*rbacv1ac.SubjectApplyConfiguration) *rbacv1ac.RoleBindingApplyConfiguration {
	return rbacv1ac.RoleBinding(name, ns).WithLabels(labels(p, nil)).
		WithRoleRef(rbacv1ac.RoleRef().WithAPIGroup(rbacv1.GroupName).WithKind("Role").WithName(name)).
		WithSubjects(subjects...)
}

func clusterRoleBinding(p Part, name, clusterRole string, subjects ...*rbacv1ac.SubjectApplyConfiguration) *rbacv1ac.ClusterRoleBindingApplyConfiguration {
	return rbacv1ac.ClusterRoleBinding(name).WithLabels(labels(p, nil)).
		WithRoleRef(rbacv1ac.RoleRef().WithAPIGroup(rbacv1.GroupName).WithKind("ClusterRole").WithName(clusterRole)).
		WithSubjects(subjects...)
}

func group(name string) *rbacv1ac.SubjectApplyConfiguration {
	return rbacv1ac.Subject().WithAPIGroup(rbacv1.GroupName).WithKind(rbacv1.GroupKind).WithName(name)
}

func user(name string) *rbacv1ac.SubjectApplyConfiguration {
	return rbacv1ac.Subject().WithAPIGroup(rbacv1.GroupName).WithKind(rbacv1.UserKind).WithName(name)
}

func serviceAccountSubject(ns, name string) *rbacv1ac.SubjectApplyConfiguration {
	return rbacv1ac.Subject().WithKind(rbacv1.ServiceAccountKind).WithNamespace(ns).WithName(name)
}

// toYAML renders a configuration file; maps marshal with sorted keys, so
// the output is stable.
func toYAML(v any) (string, error) {
	b, err := yaml.Marshal(v)
	if err != nil {
		return "", err
	}
	return string(b), nil
}
