package controllers

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/apiaryhq/apiary/datastore"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

// Reasons of SpaceAvailable.
const (
	ReasonNoAlarm        = "NoAlarm"
	ReasonSpaceReclaimed = "SpaceReclaimed"
)

// reclaimSpaceTimeout bounds the defragmentations of one check.
const reclaimSpaceTimeout = 2 * time.Minute

// reclaimSpace defragments members that need it, one at a time, and
// disarms a NOSPACE alarm once there is room again; SpaceAvailable says
// what it found.
func (r *DataStoreReconciler) reclaimSpace(ctx context.Context, ds *apiary.DataStore) {
	ctx, cancel := context.WithTimeout(ctx, reclaimSpaceTimeout)
	defer cancel()
	dc, err := r.client(ctx, ds)
	var res datastore.Reclaimed
	if err == nil {
		res, err = dc.ReclaimSpace(ctx)
	}
	if len(res.Defragmented) > 0 {
		r.Recorder.Eventf(ds, nil, corev1.EventTypeNormal, "Defragmented", "ReclaimSpace", "defragmented etcd members one at a time: %s", strings.Join(res.Defragmented, ", "))
	}
	switch {
	case err != nil:
		r.set(ds, apiary.ConditionSpaceAvailable, metav1.ConditionUnknown, datastore.ReasonOf(err), fmt.Sprintf("cannot read etcd's alarms and backend sizes: %v", err))
	case res.StillFull:
		r.set(ds, apiary.ConditionSpaceAvailable, metav1.ConditionFalse, datastore.ReasonNoSpace,
			"etcd raised NOSPACE: writes of every tenant of this DataStore are refused (reads and deletes are served); even defragmented the data takes more than 90 % of the backend quota, so tenants must delete data or the members need more space")
	case res.Disarmed:
		r.set(ds, apiary.ConditionSpaceAvailable, metav1.ConditionTrue, ReasonSpaceReclaimed, "the NOSPACE alarm was disarmed after defragmentation: tenants can write again")
	default:
		r.set(ds, apiary.ConditionSpaceAvailable, metav1.ConditionTrue, ReasonNoAlarm, "no etcd member has raised NOSPACE")
	}
}
