package v1alpha1

import (
	"fmt"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// QuotaFor is the budget a tenant is held to on a DataStore with this
// policy: per field, the tenant's override capped by Max (or by Default
// where Max leaves the field unset), else Default. A nil policy sets no
// budget but the tenant's own override. capped says whether the override
// asked for more than the cap.
func (p *TenantQuotaPolicy) QuotaFor(override *TenantQuota) (q TenantQuota, capped bool) {
	var def, limit TenantQuota
	if p != nil {
		def = p.Default
		limit = p.Default
		if p.Max != nil {
			if p.Max.Bytes != nil {
				limit.Bytes = p.Max.Bytes
			}
			if p.Max.Objects != nil {
				limit.Objects = p.Max.Objects
			}
		}
	}
	var want TenantQuota
	if override != nil {
		want = *override
	}
	q.Bytes, capped = pick(want.Bytes, def.Bytes, limit.Bytes, func(a, b *resource.Quantity) bool { return a.Cmp(*b) > 0 })
	var cappedObjects bool
	q.Objects, cappedObjects = pick(want.Objects, def.Objects, limit.Objects, func(a, b *int64) bool { return *a > *b })
	return *q.DeepCopy(), capped || cappedObjects
}

// pick is one field of QuotaFor.
func pick[T any](want, def, limit *T, more func(a, b *T) bool) (*T, bool) {
	switch {
	case want == nil:
		return def, false
	case limit != nil && more(want, limit):
		return limit, true
	default:
		return want, false
	}
}

// IsZero says the budget limits nothing.
func (q TenantQuota) IsZero() bool { return q.Bytes == nil && q.Objects == nil }

// Admits says whether the DataStore takes tenants of a namespace with
// these labels (spec.namespaceSelector; unset admits all).
func (ds *DataStore) Admits(namespaceLabels map[string]string) (bool, error) {
	if ds.Spec.NamespaceSelector == nil {
		return true, nil
	}
	sel, err := metav1.LabelSelectorAsSelector(ds.Spec.NamespaceSelector)
	if err != nil {
		return false, fmt.Errorf("DataStore %s: spec.namespaceSelector: %w", ds.Name, err)
	}
	return sel.Matches(labels.Set(namespaceLabels)), nil
}
