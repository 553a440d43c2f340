package controllers

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/apiaryhq/apiary/datastore"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/operator/render"
)

// DefaultUsageInterval is how often a tenant's usage is written to its
// status when nothing else changes; the quota itself follows every write
// (usageTracker).
const DefaultUsageInterval = 30 * time.Second

// Reasons of WithinQuota.
const (
	ReasonWithinQuota     = "WithinQuota"
	ReasonNoQuota         = "NoQuota"
	ReasonQuotaExceeded   = "QuotaExceeded"
	ReasonUsageUnmeasured = "UsageUnmeasured"
)

// quotaState is what the quota step decided.
type quotaState struct {
	// exceeded, when set, is what the tenant's admission policy refuses
	// writes for.
	exceeded *render.QuotaExceeded
	// next is when status should show usage again.
	next time.Duration
}

// reconcileQuota reads the tenant's usage of its DataStore (followed by
// an etcd watch), records it in status.dataStore.usage and sets
// WithinQuota. Over quota,
// the tenant's API server refuses creates and updates (render.QuotaPolicy)
// until usage is under QuotaLiftPercent of the quota. A failed measurement
// keeps the previous decision: a tenant over quota stays refused.
func (r *TenantControlPlaneReconciler) reconcileQuota(ctx context.Context, tcp *apiary.TenantControlPlane, ds *apiary.DataStore, cfg datastore.Config) quotaState {
	st := &tcp.Status
	quota, capped := ds.Spec.TenantQuota.QuotaFor(tcp.Spec.DataStoreQuota)
	wasExceeded := false
	if c := meta.FindStatusCondition(st.Conditions, apiary.ConditionWithinQuota); c != nil && c.Reason == ReasonQuotaExceeded {
		wasExceeded = true
	}
	every := r.UsageInterval
	if every <= 0 {
		every = DefaultUsageInterval
	}
	usage, ok, err := r.usages.observe(ctx, tcp, ds.Name, cfg)
	if err != nil || !ok {
		msg := "measuring the tenant's keys on DataStore " + ds.Name
		next := time.Second
		if err != nil {
			msg = fmt.Sprintf("cannot measure the tenant's keys on DataStore %s: %v", ds.Name, err)
			next = every
		}
		r.setCondition(tcp, apiary.ConditionWithinQuota, metav1.ConditionUnknown, ReasonUsageUnmeasured, msg)
		state := quotaState{next: next}
		if wasExceeded {
			state.exceeded = &render.QuotaExceeded{Quota: quota}
		}
		return state
	}
	next := every
	over, lifted := overQuota(apiary.DataStoreUsage{Bytes: usage.Bytes, Objects: usage.Objects}, quota)
	exceeded := !quota.IsZero() && (over || (wasExceeded && !lifted))
	// Status shows usage when it changed enough to matter, or the decision
	// changed: a lease renewal changes a tenant's bytes by a few every few
	// seconds, which is not worth a status write.
	if shown := st.DataStore.Usage; shown == nil || exceeded != wasExceeded || significantChange(*shown, usage, quota) {
		st.DataStore.Usage = &apiary.DataStoreUsage{Bytes: usage.Bytes, Objects: usage.Objects}
	}
	st.DataStore.Usage.Quota = quota
	u := *st.DataStore.Usage
	used := datastore.Usage{Bytes: u.Bytes, Objects: u.Objects}.String()
	note := ""
	if capped {
		note = fmt.Sprintf(" (spec.dataStoreQuota asks for more than DataStore %s allows: held to its spec.tenantQuota.max)", ds.Name)
	}
	if quota.IsZero() {
		r.usages.decided(tcp.UID, quota, false)
		r.setCondition(tcp, apiary.ConditionWithinQuota, metav1.ConditionTrue, ReasonNoQuota,
			fmt.Sprintf("DataStore %s sets no quota for its tenants; the tenant stores %s", ds.Name, used))
		return quotaState{next: next}
	}
	if !exceeded {
		r.usages.decided(tcp.UID, quota, false)
		r.setCondition(tcp, apiary.ConditionWithinQuota, metav1.ConditionTrue, ReasonWithinQuota,
			fmt.Sprintf("the tenant stores %s%s", describeUsage(u, quota), note))
		return quotaState{next: next}
	}
	r.usages.decided(tcp.UID, quota, true)
	msg := fmt.Sprintf("over quota: the tenant stores %s%s; its API server refuses creates and updates (deletes are allowed) until it is back under %d %%", describeUsage(u, quota), note, render.QuotaLiftPercent)
	if !render.StaticAdmissionSupported(tcp.Spec.Version) {
		msg = fmt.Sprintf("over quota: the tenant stores %s%s, and Kubernetes %s cannot enforce it (the quota's admission policy needs 1.36 or newer)", describeUsage(u, quota), note, tcp.Spec.Version)
	}
	r.setCondition(tcp, apiary.ConditionWithinQuota, metav1.ConditionFalse, ReasonQuotaExceeded, msg)
	return quotaState{exceeded: &render.QuotaExceeded{Quota: quota}, next: next}
}

// significantChange: a different object count, or bytes that moved by
// 4 KiB or 1 % since what status shows (1 % of the byte quota, if that is
// less).
func significantChange(shown apiary.DataStoreUsage, now datastore.Usage, q apiary.TenantQuota) bool {
	if shown.Objects != now.Objects {
		return true
	}
	step := max(4<<10, shown.Bytes/100)
	if q.Bytes != nil {
		step = min(step, max(q.Bytes.Value()/100, 1))
	}
	d := now.Bytes - shown.Bytes
	if d < 0 {
		d = -d
	}
	return d >= step
}

// overQuota says whether usage exceeds a limit of the quota, and whether
// it is under QuotaLiftPercent of every limit (low enough to lift a
// refusal).
func overQuota(u apiary.DataStoreUsage, q apiary.TenantQuota) (over, lifted bool) {
	lifted = true
	check := func(used, limit int64) {
		if used > limit {
			over = true
		}
		if used*100 >= limit*render.QuotaLiftPercent {
			lifted = false
		}
	}
	if q.Bytes != nil {
		check(u.Bytes, q.Bytes.Value())
	}
	if q.Objects != nil {
		check(u.Objects, *q.Objects)
	}
	return over, lifted
}

// describeUsage: "1.2 MiB of 64.0 MiB, 345 of 5000 objects".
func describeUsage(u apiary.DataStoreUsage, q apiary.TenantQuota) string {
	var parts []string
	if q.Bytes != nil {
		parts = append(parts, fmt.Sprintf("%s of %s", datastore.FormatBytes(u.Bytes), datastore.FormatBytes(q.Bytes.Value())))
	} else {
		parts = append(parts, datastore.FormatBytes(u.Bytes))
	}
	if q.Objects != nil {
		parts = append(parts, fmt.Sprintf("%d of %d objects", u.Objects, *q.Objects))
	} else {
		parts = append(parts, fmt.Sprintf("%d objects", u.Objects))
	}
	return strings.Join(parts, ", ")
}

// +kubebuilder:rbac:groups="",resources=pods,verbs=list;patch

// applyAdmission applies the tenant's admission ConfigMap: the
// AdmissionConfiguration and, while exceeded, the quota policy. Versions
// without manifest-based admission mount none. When the policy changed, the
// control-plane pods are nudged so that their kubelets write it now.
func (r *TenantControlPlaneReconciler) applyAdmission(ctx context.Context, tcp *apiary.TenantControlPlane, exceeded *render.QuotaExceeded) error {
	if !render.StaticAdmissionSupported(tcp.Spec.Version) {
		return nil
	}
	cm, err := render.AdmissionConfigMap(tcp, exceeded)
	if err != nil {
		return err
	}
	if err := r.Client.Apply(ctx, cm, client.FieldOwner(FieldOwner), client.ForceOwnership); err != nil {
		return fmt.Errorf("applying ConfigMap %s: %w", render.AdmissionConfigMapName(tcp), err)
	}
	hash := render.ConfigHash(map[string]map[string][]byte{"": {render.KeyQuotaPolicy: []byte(cm.Data[render.KeyQuotaPolicy])}})
	if last, _ := r.nudged.get(tcp.UID); last == hash {
		return nil
	}
	if err := r.nudgePods(ctx, tcp, hash); err != nil {
		return err
	}
	r.nudged.set(tcp.UID, hash)
	return nil
}

// nudgePods annotates the tenant's control-plane pods with the policy's
// hash. The kubelet rewrites a ConfigMap volume when it syncs the pod,
// which a change of the pod does at once; otherwise it waits for its
// periodic sync, a minute or more, while a tenant over its quota keeps
// writing.
func (r *TenantControlPlaneReconciler) nudgePods(ctx context.Context, tcp *apiary.TenantControlPlane, hash string) error {
	var pods corev1.PodList
	if err := r.APIReader.List(ctx, &pods, client.InNamespace(tcp.Namespace), client.MatchingLabels(render.SelectorLabels(tcp))); err != nil {
		return fmt.Errorf("listing the control-plane pods: %w", err)
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Annotations[render.AnnotationAdmissionHash] == hash || !p.DeletionTimestamp.IsZero() {
			continue
		}
		patch := client.MergeFrom(p.DeepCopy())
		metav1.SetMetaDataAnnotation(&p.ObjectMeta, render.AnnotationAdmissionHash, hash)
		if err := r.Client.Patch(ctx, p, patch, client.FieldOwner(FieldOwner)); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("annotating pod %s: %w", p.Name, err)
		}
	}
	return nil
}
