package webhooks

import (
	"fmt"
	"slices"
	"sort"

	"k8s.io/apimachinery/pkg/util/validation/field"

	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/operator/render"
)

// NameCollisions refuses a tenant whose objects would share a name with
// those of another tenant of its namespace (others): the operator never
// adopts an object it did not make for the tenant, so the later tenant
// would never get its credentials, and the earlier would be at the mercy
// of a name chosen against it.
func NameCollisions(tcp *apiary.TenantControlPlane, others []apiary.TenantControlPlane) field.ErrorList {
	mine := render.ObjectNames(tcp)
	var errs field.ErrorList
	for i := range others {
		o := &others[i]
		if o.Namespace != tcp.Namespace || o.Name == tcp.Name {
			continue
		}
		theirs := render.ObjectNames(o)
		kinds := make([]string, 0, len(mine))
		for k := range mine {
			kinds = append(kinds, k)
		}
		sort.Strings(kinds)
		for _, kind := range kinds {
			for _, n := range mine[kind] {
				if slices.Contains(theirs[kind], n) {
					errs = append(errs, field.Invalid(field.NewPath("metadata", "name"), tcp.Name,
						fmt.Sprintf("tenant %s/%s already has a %s named %s, which this tenant would need too: choose a name that is not another tenant's name followed by a suffix Apiary uses", o.Namespace, o.Name, kind, n)))
				}
			}
		}
	}
	return errs
}
