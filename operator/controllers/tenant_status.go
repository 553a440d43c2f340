package controllers

import (
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/operator/metrics"
)

// waiting marks conditions that cannot be evaluated until an earlier step
// succeeds.
func (r *TenantControlPlaneReconciler) waiting(tcp *apiary.TenantControlPlane, why string, conditions ...string) {
	for _, c := range conditions {
		r.setCondition(tcp, c, metav1.ConditionFalse, ReasonWaitingForPrerequisites, why)
	}
}

func (r *TenantControlPlaneReconciler) setCondition(tcp *apiary.TenantControlPlane, typ string, status metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(&tcp.Status.Conditions, metav1.Condition{
		Type: typ, Status: status, Reason: reason, Message: msg, ObservedGeneration: tcp.Generation,
	})
}

// writeStatus derives the phase, emits events for condition transitions and
// patches the status only when it changed.
func (r *TenantControlPlaneReconciler) writeStatus(ctx context.Context, orig, tcp *apiary.TenantControlPlane) error {
	st := &tcp.Status
	switch {
	case !tcp.DeletionTimestamp.IsZero():
		st.Phase = apiary.PhaseDeleting
	case meta.IsStatusConditionTrue(st.Conditions, apiary.ConditionReady):
		st.Phase = apiary.PhaseReady
	case st.Version == "":
		st.Phase = apiary.PhaseProvisioning
	default:
		st.Phase = apiary.PhaseNotReady
	}
	base := r.statuses.base(orig.UID, orig.ResourceVersion, orig.Status)
	firstReady := false
	if ready := meta.FindStatusCondition(st.Conditions, apiary.ConditionReady); st.Phase == apiary.PhaseReady && st.FirstReady == nil && ready != nil {
		// Ready before: a tenant Ready when an operator without this
		// field last wrote it. Its Ready condition's time is the best
		// known, and it is not a first Ready to observe.
		at := ready.LastTransitionTime
		if !meta.IsStatusConditionTrue(base.Conditions, apiary.ConditionReady) {
			now := time.Now
			if r.Now != nil {
				now = r.Now
			}
			at, firstReady = metav1.NewTime(now().UTC()), true
		}
		st.FirstReady = &at
	}
	if equality.Semantic.DeepEqual(base, *st) {
		return nil
	}
	recordTransitions(r.Recorder, tcp, base.Conditions, st.Conditions, func(c metav1.Condition) bool {
		return c.Status != metav1.ConditionTrue && c.Reason != ReasonWaitingForPrerequisites && c.Reason != ReasonWaitingForAddress && c.Reason != ReasonNoReadyReplicas &&
			c.Reason != ReasonUpgrading && c.Reason != ReasonHeldForModeSwitch
	})
	before := orig.DeepCopy()
	before.Status = base
	updated := before.DeepCopy()
	updated.Status = *st
	if err := r.Client.Status().Patch(ctx, updated, client.MergeFrom(before), client.FieldOwner(FieldOwner)); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("writing status: %w", err)
	}
	r.statuses.remember(orig.UID, updated.ResourceVersion, *st.DeepCopy())
	if firstReady {
		metrics.TenantFirstReady(st.FirstReady.Sub(tcp.CreationTimestamp.Time))
	}
	return nil
}
