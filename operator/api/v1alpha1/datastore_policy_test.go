package v1alpha1

import (
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"
)

func TestQuotaFor(t *testing.T) {
	mi := func(n int64) *resource.Quantity { return resource.NewQuantity(n<<20, resource.BinarySI) }
	str := func(q TenantQuota) string {
		b, o := "-", "-"
		if q.Bytes != nil {
			b = q.Bytes.String()
		}
		if q.Objects != nil {
			o = resource.NewQuantity(*q.Objects, resource.DecimalSI).String()
		}
		return b + "/" + o
	}
	policy := &TenantQuotaPolicy{
		Default: TenantQuota{Bytes: mi(100), Objects: ptr.To[int64](1000)},
		Max:     &TenantQuota{Bytes: mi(500)},
	}
	for _, tc := range []struct {
		name     string
		policy   *TenantQuotaPolicy
		override *TenantQuota
		want     string
		capped   bool
	}{
		{"no policy, no override", nil, nil, "-/-", false},
		{"no policy: the tenant limits itself", nil, &TenantQuota{Objects: ptr.To[int64](5)}, "-/5", false},
		{"default", policy, nil, "100Mi/1k", false},
		{"override within max", policy, &TenantQuota{Bytes: mi(300)}, "300Mi/1k", false},
		{"override above max", policy, &TenantQuota{Bytes: mi(900)}, "500Mi/1k", true},
		{"objects capped by the default where max leaves them", policy, &TenantQuota{Objects: ptr.To[int64](5000)}, "100Mi/1k", true},
		{"smaller than the default", policy, &TenantQuota{Objects: ptr.To[int64](10)}, "100Mi/10", false},
		{"no default, no max: the override stands", &TenantQuotaPolicy{}, &TenantQuota{Bytes: mi(1)}, "1Mi/-", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, capped := tc.policy.QuotaFor(tc.override)
			if str(got) != tc.want || capped != tc.capped {
				t.Fatalf("got %s capped=%t, want %s capped=%t", str(got), capped, tc.want, tc.capped)
			}
		})
	}
	// The result shares nothing with the policy.
	got, _ := policy.QuotaFor(nil)
	got.Bytes.Add(*mi(1))
	if policy.Default.Bytes.Cmp(*mi(100)) != 0 {
		t.Fatal("QuotaFor returned the policy's own quantity")
	}
}
