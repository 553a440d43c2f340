package webhooks

import (
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/util/validation/field"

	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/operator/render"
)

// TenantPolicy is what the platform admin decides for tenants, and a
// tenant's spec cannot: operator flags, set by the chart.
type TenantPolicy struct {
	// KonnectivityOptionalNamespaces are the namespaces whose tenants may
	// turn konnectivity off ("*": every namespace). Without konnectivity a
	// tenant's API server connects to the addresses its Nodes name, from
	// the management network; with it, that traffic leaves through the
	// tenant's own nodes.
	KonnectivityOptionalNamespaces []string
}

// Validate checks a defaulted TenantControlPlane against the policy.
func (p TenantPolicy) Validate(tcp *apiary.TenantControlPlane) field.ErrorList {
	var errs field.ErrorList
	if !render.KonnectivityEnabled(tcp) && !slices.Contains(p.KonnectivityOptionalNamespaces, "*") &&
		!slices.Contains(p.KonnectivityOptionalNamespaces, tcp.Namespace) {
		errs = append(errs, field.Forbidden(field.NewPath("spec", "addons", "konnectivity", "enabled"),
			fmt.Sprintf("turning konnectivity off is the platform admin's decision: namespace %s is not among the operator's --konnectivity-optional-namespaces (chart value tenantPolicy.konnectivityOptionalNamespaces); without it the tenant's API server connects to node addresses from the management network", tcp.Namespace)))
	}
	return errs
}

// namespaceManaged refuses an object outside the operator's namespaces
// (--tenant-namespaces; none given: every namespace). The operator neither
// watches nor may touch anything there.
func namespaceManaged(namespaces []string, kind, namespace string) field.ErrorList {
	if len(namespaces) == 0 || slices.Contains(namespaces, namespace) {
		return nil
	}
	return field.ErrorList{field.Forbidden(field.NewPath("metadata", "namespace"),
		fmt.Sprintf("the Apiary operator manages %ss in namespaces %v only (--tenant-namespaces, chart value operator.tenantNamespaces): one in namespace %s would never be reconciled", kind, namespaces, namespace))}
}
