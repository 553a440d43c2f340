package controllers

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	appsv1ac "k8s.io/client-go/applyconfigurations/apps/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/apiaryhq/apiary/datastore"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/operator/render/managedetcd"
)

// Reasons of a managed DataStore's MembersUpdated condition, and of the
// events of a roll.
const (
	ReasonMembersUpdated = "Updated"
	ReasonRolling        = "Rolling"
	// ReasonRestartLosesData: the members keep their data in emptyDirs,
	// which a restart empties.
	ReasonRestartLosesData = "RestartLosesData"
	ReasonMemberRestart    = "RestartingMember"
	ReasonLeaderMoved      = "LeaderMoved"
)

// Gates of a roll.
const (
	// rollMaxLag is how many raft entries a member may have left to apply
	// (behind the leader's log) and still count as caught up.
	rollMaxLag = 1000
	// rollSettle is how long every member must have been Ready before the
	// next is restarted: the tenants' clients reconnect to a member that
	// came back (and the network policies learn its new address) only
	// after it is Ready.
	rollSettle = 10 * time.Second
	// rollRequeue is how often a roll looks again while it waits.
	rollRequeue = 3 * time.Second
)

// memberPod is one etcd pod as the roll sees it.
type memberPod struct {
	Name string
	UID  types.UID
	// Updated: it runs the StatefulSet's update revision.
	Updated    bool
	Ready      bool
	ReadySince time.Time
	Deleting   bool
	// LostData: etcd's last words say the member lost its data.
	LostData bool
}

// memberPods lists a managed etcd's pods; Updated compares with the
// StatefulSet's update revision rev.
func (r *DataStoreReconciler) memberPods(ctx context.Context, ds *apiary.DataStore, rev string) ([]memberPod, error) {
	var list corev1.PodList
	if err := r.APIReader.List(ctx, &list, client.InNamespace(ds.Spec.Managed.Namespace), client.MatchingLabels(managedetcd.Selector(ds))); err != nil {
		return nil, fmt.Errorf("listing the etcd member pods: %w", err)
	}
	pods := make([]memberPod, 0, len(list.Items))
	for _, p := range list.Items {
		mp := memberPod{
			Name: p.Name, UID: p.UID, Updated: p.Labels[appsv1.ControllerRevisionHashLabelKey] == rev,
			Deleting: !p.DeletionTimestamp.IsZero(), LostData: lostData(&p),
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
				mp.Ready, mp.ReadySince = true, c.LastTransitionTime.Time
			}
		}
		pods = append(pods, mp)
	}
	return pods, nil
}

// rollStep is the one thing a roll does now.
type rollStep struct {
	// Done: every member runs the update revision.
	Done bool
	// Wait says why nothing is restarted now.
	Wait string
	// MoveLeader hands the leadership from the member at endpoint From to
	// member To (pod ToPod) before the leader is restarted.
	MoveLeader *moveLeader
	// Restart is the pod to delete (its StatefulSet recreates it).
	Restart *memberPod
	// Updated counts the members on the update revision.
	Updated int
}

type moveLeader struct {
	From  string
	To    uint64
	ToPod string
}

// planRoll decides the next step of restarting the members that do not run
// the update revision, given the pods and what each member (by pod name)
// says about raft. A member is restarted only while all want members are
// Ready, settled, answer, follow one leader and are caught up with its log,
// so that losing it leaves a quorum that is not behind; followers first
// (highest ordinal first, as a StatefulSet would), the leader last and only
// after it handed the leadership to an updated, caught-up follower.
func planRoll(pods []memberPod, members map[string]datastore.MemberState, want int, now time.Time) rollStep {
	var step rollStep
	var stale []memberPod
	for _, p := range pods {
		if p.Updated {
			step.Updated++
		} else {
			stale = append(stale, p)
		}
	}
	if len(stale) == 0 && len(pods) == want {
		step.Done = true
		return step
	}
	if len(pods) < want {
		step.Wait = fmt.Sprintf("%d of %d member pods exist", len(pods), want)
		return step
	}
	for _, p := range pods {
		switch {
		case p.Deleting:
			step.Wait = fmt.Sprintf("member %s is stopping", p.Name)
		case !p.Ready:
			step.Wait = fmt.Sprintf("member %s is not Ready", p.Name)
		case now.Sub(p.ReadySince) < rollSettle:
			step.Wait = fmt.Sprintf("member %s turned Ready less than %s ago", p.Name, rollSettle)
		}
		if step.Wait != "" {
			return step
		}
	}
	var leader datastore.MemberState
	var leaderPod string
	for _, p := range pods {
		m, ok := members[p.Name]
		if !ok {
			step.Wait = fmt.Sprintf("member %s does not answer", p.Name)
			return step
		}
		if m.Leader == 0 {
			step.Wait = fmt.Sprintf("member %s has no leader", p.Name)
			return step
		}
		if m.ID == m.Leader {
			leader, leaderPod = m, p.Name
		}
	}
	if leaderPod == "" {
		step.Wait = "no member says it leads"
		return step
	}
	for _, p := range pods {
		m := members[p.Name]
		if m.Leader != leader.ID {
			step.Wait = fmt.Sprintf("members disagree on the leader (%s follows %x, %s leads)", p.Name, m.Leader, leaderPod)
			return step
		}
		if lag := int64(leader.RaftIndex) - int64(m.AppliedIndex); lag > rollMaxLag {
			step.Wait = fmt.Sprintf("member %s is %d entries behind the leader", p.Name, lag)
			return step
		}
	}
	// Followers first, highest ordinal first.
	slices.SortFunc(stale, func(a, b memberPod) int { return cmp.Compare(ordinal(b.Name), ordinal(a.Name)) })
	for i := range stale {
		if stale[i].Name != leaderPod {
			step.Restart = &stale[i]
			return step
		}
	}
	// Only the leader is left. A lone member has no one to hand over to.
	if want == 1 {
		step.Restart = &stale[0]
		return step
	}
	var to string
	for _, p := range pods {
		m := members[p.Name]
		if p.Name == leaderPod || m.Learner {
			continue
		}
		if to == "" || m.AppliedIndex > members[to].AppliedIndex || (m.AppliedIndex == members[to].AppliedIndex && p.Updated) {
			to = p.Name
		}
	}
	if to == "" {
		step.Wait = "no follower to hand the leadership to"
		return step
	}
	step.MoveLeader = &moveLeader{From: leader.Endpoint, To: members[to].ID, ToPod: to}
	return step
}

// ordinal is the StatefulSet ordinal ending a pod name, -1 when none.
func ordinal(pod string) int {
	n, err := strconv.Atoi(pod[strings.LastIndexByte(pod, '-')+1:])
	if err != nil || n < 0 || !strings.Contains(pod, "-") {
		return -1
	}
	return n
}

// +kubebuilder:rbac:groups="",resources=pods,verbs=list;delete

// rollMembers takes the next step of restarting the members that do not
// run the StatefulSet's current template, and says whether a roll is under
// way (the caller looks again soon). The StatefulSet's update strategy is
// OnDelete: this is the only place members are restarted for a change.
// What it waits for, and what failed, is in MembersUpdated: a roll never
// makes the DataStore less Ready than its members are.
func (r *DataStoreReconciler) rollMembers(ctx context.Context, ds *apiary.DataStore, sts *appsv1ac.StatefulSetApplyConfiguration, dc *datastore.Client, all []memberPod, members map[string]datastore.MemberState) bool {
	if err := r.rollStep(ctx, ds, sts, dc, all, members); err != nil {
		log.FromContext(ctx).Error(err, "rolling the etcd members")
		r.set(ds, apiary.ConditionMembersUpdated, metav1.ConditionFalse, ReasonRolling, "the next step of the roll failed: "+err.Error())
		return true
	}
	c := meta.FindStatusCondition(ds.Status.Conditions, apiary.ConditionMembersUpdated)
	return c == nil || c.Status != metav1.ConditionTrue && c.Reason == ReasonRolling
}

// all are the member pods (Updated against the StatefulSet's update
// revision) and members what each answering member says, both read once by
// the caller for the membership and the roll.
func (r *DataStoreReconciler) rollStep(ctx context.Context, ds *apiary.DataStore, sts *appsv1ac.StatefulSetApplyConfiguration, dc *datastore.Client, all []memberPod, members map[string]datastore.MemberState) error {
	want := int(ds.Spec.Managed.Replicas)
	if sts.Status == nil || sts.Generation == nil || deref(sts.Status.ObservedGeneration) < *sts.Generation {
		r.set(ds, apiary.ConditionMembersUpdated, metav1.ConditionFalse, ReasonRolling, "waiting for the StatefulSet controller to see the new template")
		return nil
	}
	if int(deref(sts.Status.UpdatedReplicas)) == want && int(deref(sts.Status.Replicas)) == want {
		r.set(ds, apiary.ConditionMembersUpdated, metav1.ConditionTrue, ReasonMembersUpdated, fmt.Sprintf("all %d etcd members run the current configuration", want))
		return nil
	}
	if ds.Spec.Managed.Storage.EmptyDir {
		// A restarted member would come back empty: a lone member with
		// every tenant's data gone, or one that etcd refuses to bootstrap
		// again. Nothing is restarted; the user decides.
		r.set(ds, apiary.ConditionMembersUpdated, metav1.ConditionFalse, ReasonRestartLosesData, fmt.Sprintf(
			"%d of %d members run the current configuration; the members keep their data in emptyDirs and a restart would lose it, so Apiary does not restart them: delete the pods of StatefulSet %s/%s yourself to accept the loss",
			deref(sts.Status.UpdatedReplicas), want, ds.Spec.Managed.Namespace, managedetcd.Name(ds)))
		return nil
	}
	// A pod past the members (a scale-down the StatefulSet controller has
	// not finished) is not rolled.
	pods := slices.DeleteFunc(slices.Clone(all), func(p memberPod) bool { return managedetcd.MemberOrdinal(ds, p.Name) >= int32(want) })
	step := planRoll(pods, members, want, r.now())
	progress := fmt.Sprintf("%d of %d members run the current configuration", step.Updated, want)
	switch {
	case step.Done:
		r.set(ds, apiary.ConditionMembersUpdated, metav1.ConditionTrue, ReasonMembersUpdated, fmt.Sprintf("all %d etcd members run the current configuration", want))
		return nil
	case step.Wait != "":
		if len(members) == 0 {
			step.Wait += ": no member answers"
		}
		r.set(ds, apiary.ConditionMembersUpdated, metav1.ConditionFalse, ReasonRolling, progress+"; next restart waits: "+step.Wait)
		return nil
	case step.MoveLeader != nil:
		callCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := dc.MoveLeader(callCtx, step.MoveLeader.From, step.MoveLeader.To); err != nil {
			return err
		}
		r.Recorder.Eventf(ds, nil, corev1.EventTypeNormal, ReasonLeaderMoved, "MoveLeader", "moved the etcd leadership to %s before restarting the leader", step.MoveLeader.ToPod)
		r.set(ds, apiary.ConditionMembersUpdated, metav1.ConditionFalse, ReasonRolling, progress+"; leadership moved to "+step.MoveLeader.ToPod+" before the leader restarts")
		return nil
	}
	p := step.Restart
	pod := &corev1.Pod{}
	pod.Namespace, pod.Name = ds.Spec.Managed.Namespace, p.Name
	// The UID precondition: never a pod that was replaced since the list.
	if err := r.Client.Delete(ctx, pod, client.Preconditions{UID: &p.UID}); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("restarting etcd member %s: %w", p.Name, err)
	}
	r.Recorder.Eventf(ds, nil, corev1.EventTypeNormal, ReasonMemberRestart, "RestartMember", "restarting etcd member %s on the current configuration (%s)", p.Name, progress)
	r.set(ds, apiary.ConditionMembersUpdated, metav1.ConditionFalse, ReasonRolling, progress+"; restarting "+p.Name)
	return nil
}
