package controllers

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/apiaryhq/apiary/tenant"
)

// A deletion inside the tenant re-applies the bootstrap only when the object
// belongs to a part the last bootstrap applied; the removal of a disabled
// addon's objects (the bootstrap's own deletes) does not.
func TestForgetDeleted(t *testing.T) {
	const uid = types.UID("u1")
	obj := func(p tenant.Part) *metav1.PartialObjectMetadata {
		return &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Name: "x", Labels: map[string]string{
			tenant.LabelManagedBy: tenant.ManagedBy, tenant.LabelPart: string(p)}}}
	}
	for _, c := range []struct {
		name    string
		memo    bool
		deleted any
		want    bool
	}{
		{"object of an applied part", true, obj(tenant.PartBootstrap), true},
		{"tombstone of an applied part", true, cache.DeletedFinalStateUnknown{Key: "kube-system/x", Obj: obj(tenant.PartBootstrap)}, true},
		{"object of a disabled part", true, obj(tenant.PartCoreDNS), false},
		{"no memo (nothing to keep)", false, obj(tenant.PartCoreDNS), true},
	} {
		b := &tenantBootstrapper{}
		if c.memo {
			b.applied = map[types.UID]appliedBootstrap{uid: {result: bootstrapResult{parts: []tenant.Part{tenant.PartBootstrap}}}}
		}
		if got := b.forgetDeleted(uid, c.deleted); got != c.want {
			t.Errorf("%s: re-apply %v, want %v", c.name, got, c.want)
		}
		if _, kept := b.applied[uid]; c.memo && kept == c.want {
			t.Errorf("%s: memo kept %v, want %v", c.name, kept, !c.want)
		}
	}
}

// A deletion seen while an apply runs (the object may have been applied
// just before it was deleted) keeps that apply from being remembered, so
// the reconcile the deletion queued applies again instead of skipping.
func TestDeletionDuringApplyIsNotLost(t *testing.T) {
	const uid = types.UID("u1")
	deleted := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Name: "coredns", Labels: map[string]string{
		tenant.LabelManagedBy: tenant.ManagedBy, tenant.LabelPart: string(tenant.PartCoreDNS)}}}
	b := &tenantBootstrapper{}
	seen := b.deletions[uid] // an apply starts
	if !b.forgetDeleted(uid, deleted) {
		t.Fatal("deletion not queued")
	}
	b.remember(uid, seen, appliedBootstrap{result: bootstrapResult{parts: []tenant.Part{tenant.PartCoreDNS}}}) // and ends
	if _, ok := b.applied[uid]; ok {
		t.Fatal("the overtaken apply was remembered: the queued reconcile would skip the re-apply")
	}
	// The next apply, with no deletion during it, is remembered.
	b.remember(uid, b.deletions[uid], appliedBootstrap{})
	if _, ok := b.applied[uid]; !ok {
		t.Fatal("an apply without deletions was not remembered")
	}
}
