package controllers

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/apiaryhq/apiary/datastore"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/operator/render/managedetcd"
)

// Reasons of MembersReady while the membership moves, and of its events.
const (
	ReasonScaling         = "Scaling"
	ReasonReplacingMember = "ReplacingMember"
	// ReasonMemberLostData: a member lost its data and Apiary cannot
	// replace it (it is the quorum, or part of it).
	ReasonMemberLostData = "MemberLostData"

	ReasonMemberAdded    = "MemberAdded"
	ReasonMemberPromoted = "MemberPromoted"
	ReasonMemberRemoved  = "MemberRemoved"
	ReasonMemberReplaced = "MemberReplaced"
)

// lostDataWords are what etcd (3.6) says last when a member starts without
// the data its cluster expects it to have: started as a new cluster over a
// volume that already holds one, or into the existing cluster with an
// empty (or other) log. Tenants cannot plant these words in the log: etcd
// logs key names and value sizes, never values, and Kubernetes object
// names have no spaces, capitals or "?".
var lostDataWords = []string{
	"has already been bootstrapped",
	"Was the raft log corrupted, truncated, or lost?",
}

// lostData tells from the etcd container's last exit whether the member
// lost its data. The termination message is the tail of its log
// (FallbackToLogsOnError); a clean exit is never a loss.
func lostData(p *corev1.Pod) bool {
	for _, cs := range p.Status.ContainerStatuses {
		for _, t := range []*corev1.ContainerStateTerminated{cs.State.Terminated, cs.LastTerminationState.Terminated} {
			if t == nil || t.ExitCode == 0 {
				continue
			}
			for _, w := range lostDataWords {
				if strings.Contains(t.Message, w) {
					return true
				}
			}
		}
	}
	return false
}

// etcdMember is a member of etcd's list, with its pod when there is one.
type etcdMember struct {
	Name    string
	Ordinal int32
	ID      uint64
	Learner bool
	Pod     *memberPod
}

// memberStep is the one membership change to make now, or why none is.
type memberStep struct {
	// Done: the voting members are exactly ordinals 0 to replicas-1 and
	// there is no learner.
	Done bool
	// Wait says why nothing changes now; Reason is MembersReady's reason
	// meanwhile.
	Wait, Reason string
	// Replace a member that lost its data: remove it, add it back as a
	// learner, and restart its pod on an empty volume.
	Replace *etcdMember
	// Promote the learner, asking the leader at LeaderEndpoint.
	Promote        *etcdMember
	LeaderEndpoint string
	// Add the member of this ordinal as a learner.
	Add *int32
	// Remove the member; MoveLeader first when it leads.
	Remove     *etcdMember
	MoveLeader *moveLeader
}

// planMembership decides the next membership step from etcd's list (the
// truth, not the spec), the member pods, the claims that exist (names) and
// what each answering member says about raft (by pod name). One step at a
// time, in this order:
//
//  1. replace a member that lost its data, while the others keep a quorum;
//  2. promote a learner (etcd refuses while it is behind);
//  3. only while every voting member is Ready, answers and follows one
//     leader: add the lowest missing ordinal as a learner, or remove the
//     highest (after handing its leadership over).
//
// So a count never changes by more than one and an even count lasts one
// step.
func planMembership(ds *apiary.DataStore, clusterDomain string, members []datastore.Member, pods []memberPod, claims []string, states map[string]datastore.MemberState) memberStep {
	want := ds.Spec.Managed.Replicas
	podOf := map[string]*memberPod{}
	for i := range pods {
		podOf[pods[i].Name] = &pods[i]
	}
	var voters, learners []etcdMember
	for _, m := range members {
		name := memberOf(ds, m, clusterDomain)
		if name == "" {
			return memberStep{Reason: ReasonScaling, Wait: fmt.Sprintf(
				"etcd lists member %x at %s, which is none of this DataStore's members: remove it (etcdctl member remove %x)", m.ID, strings.Join(m.PeerURLs, ","), m.ID)}
		}
		e := etcdMember{Name: name, Ordinal: managedetcd.MemberOrdinal(ds, name), ID: m.ID, Learner: m.Learner, Pod: podOf[name]}
		if m.Learner {
			learners = append(learners, e)
		} else {
			voters = append(voters, e)
		}
	}
	byOrdinal := func(a, b etcdMember) int { return cmp.Compare(a.Ordinal, b.Ordinal) }
	slices.SortFunc(voters, byOrdinal)
	slices.SortFunc(learners, byOrdinal)
	answers := func(e etcdMember) bool {
		_, ok := states[e.Name]
		return e.Pod != nil && e.Pod.Ready && !e.Pod.Deleting && ok
	}

	// 1. A member that lost its data crashes at every start; etcd holds
	// its identity, so it is removed and added back under a new one.
	quorum := len(voters)/2 + 1
	for _, e := range slices.Concat(voters, learners) {
		if e.Pod == nil || !e.Pod.LostData {
			continue
		}
		others := 0
		for _, v := range voters {
			if v.Name != e.Name && answers(v) {
				others++
			}
		}
		if others < quorum {
			return memberStep{Reason: ReasonMemberLostData, Wait: fmt.Sprintf(
				"member %s lost its data and only %d other of %d voting members answer, no quorum without it: Apiary does not replace it (see docs/operations.md, etcd membership)", e.Name, others, len(voters))}
		}
		return memberStep{Replace: &e, Reason: ReasonReplacingMember}
	}

	// 2. A learner votes once it has caught up; only the leader can tell.
	if len(learners) > 0 {
		for _, v := range voters {
			if st, ok := states[v.Name]; ok && st.ID == st.Leader && answers(v) {
				return memberStep{Promote: &learners[0], LeaderEndpoint: st.Endpoint, Reason: ReasonScaling}
			}
		}
		return memberStep{Reason: ReasonScaling, Wait: fmt.Sprintf("no voting member says it leads, to promote %s", learners[0].Name)}
	}

	var have []int32
	for _, v := range voters {
		have = append(have, v.Ordinal)
	}
	var target []int32
	for i := range want {
		target = append(target, i)
	}
	if slices.Equal(have, target) {
		return memberStep{Done: true}
	}

	// 3. A change only when every voting member is up and agrees on a
	// leader: a new learner must not meet a cluster that is electing,
	// and a removal must not take a quorum member that is down.
	var leader uint64
	for _, v := range voters {
		if !answers(v) {
			return memberStep{Reason: ReasonScaling, Wait: fmt.Sprintf("member %s is not Ready or does not answer", v.Name)}
		}
		l := states[v.Name].Leader
		switch {
		case l == 0:
			return memberStep{Reason: ReasonScaling, Wait: fmt.Sprintf("member %s has no leader", v.Name)}
		case leader != 0 && l != leader:
			return memberStep{Reason: ReasonScaling, Wait: "the members do not agree on a leader yet"}
		}
		leader = l
	}
	if len(voters) <= int(want) {
		k := int32(0)
		for slices.Contains(have, k) {
			k++
		}
		name := managedetcd.MemberName(ds, k)
		// A removed member's pod or claim still going: the StatefulSet
		// controller must be done with it before the ordinal comes back.
		if _, ok := podOf[name]; ok {
			return memberStep{Reason: ReasonScaling, Wait: fmt.Sprintf("pod %s of a removed member still exists", name)}
		}
		if slices.Contains(claims, managedetcd.ClaimName(ds, k)) {
			return memberStep{Reason: ReasonScaling, Wait: fmt.Sprintf("claim %s of a removed member still exists", managedetcd.ClaimName(ds, k))}
		}
		return memberStep{Add: &k, Reason: ReasonScaling}
	}
	last := voters[len(voters)-1]
	step := memberStep{Remove: &last, Reason: ReasonScaling}
	if last.ID == leader {
		var to *etcdMember
		for i, v := range voters[:len(voters)-1] {
			if to == nil || states[v.Name].AppliedIndex > states[to.Name].AppliedIndex {
				to = &voters[i]
			}
		}
		step.Remove = nil
		step.MoveLeader = &moveLeader{From: states[last.Name].Endpoint, To: to.ID, ToPod: to.Name}
	}
	return step
}

// memberOf names a listed member by its peer URL: a member added but not
// started has no name yet.
func memberOf(ds *apiary.DataStore, m datastore.Member, clusterDomain string) string {
	for _, u := range m.PeerURLs {
		if name := managedetcd.MemberOfURL(ds, u, clusterDomain); name != "" {
			return name
		}
	}
	return ""
}

// statusMembers is etcd's list as status.members has it, by ordinal.
func statusMembers(ds *apiary.DataStore, members []datastore.Member, clusterDomain string) []apiary.EtcdMember {
	out := make([]apiary.EtcdMember, 0, len(members))
	for _, m := range members {
		if name := memberOf(ds, m, clusterDomain); name != "" {
			out = append(out, apiary.EtcdMember{Name: name, ID: fmt.Sprintf("%x", m.ID), Learner: m.Learner})
		}
	}
	slices.SortFunc(out, func(a, b apiary.EtcdMember) int {
		return cmp.Compare(managedetcd.MemberOrdinal(ds, a.Name), managedetcd.MemberOrdinal(ds, b.Name))
	})
	return out
}

// +kubebuilder:rbac:groups="",resources=persistentvolumeclaims,verbs=list;delete

// reconcileMembership lists etcd's members into status.members and takes
// the next membership step. It says whether the membership is what the
// spec asks (the roll runs only then) and leaves MembersReady saying
// what it waits for otherwise.
func (r *DataStoreReconciler) reconcileMembership(ctx context.Context, ds *apiary.DataStore, dc *datastore.Client, pods []memberPod, states map[string]datastore.MemberState) (done bool, err error) {
	listed, err := dc.Members(ctx)
	if err != nil {
		return false, err
	}
	ds.Status.Members = statusMembers(ds, listed, r.ClusterDomain)
	var claims corev1.PersistentVolumeClaimList
	if err := r.APIReader.List(ctx, &claims, client.InNamespace(ds.Spec.Managed.Namespace)); err != nil {
		return false, fmt.Errorf("listing the etcd members' claims: %w", err)
	}
	var claimNames []string
	for _, c := range claims.Items {
		if managedetcd.ClaimOrdinal(ds, c.Name) >= 0 {
			claimNames = append(claimNames, c.Name)
		}
	}
	if err := r.deleteLeftClaims(ctx, ds, claimNames); err != nil {
		return false, err
	}
	step := planMembership(ds, r.ClusterDomain, listed, pods, claimNames, states)
	if step.Done {
		return true, nil
	}
	msg, err := r.takeMemberStep(ctx, ds, dc, step)
	if err != nil {
		msg = "the next membership step failed: " + err.Error()
	}
	if relisted, lerr := dc.Members(ctx); lerr == nil {
		ds.Status.Members = statusMembers(ds, relisted, r.ClusterDomain)
	}
	r.set(ds, apiary.ConditionMembersReady, metav1.ConditionFalse, step.Reason, fmt.Sprintf(
		"%s; spec.managed.replicas is %d: %s", describeMembers(ds.Status.Members), ds.Spec.Managed.Replicas, msg))
	return false, err
}

// takeMemberStep carries out one step and says what it did or waits for.
func (r *DataStoreReconciler) takeMemberStep(ctx context.Context, ds *apiary.DataStore, dc *datastore.Client, step memberStep) (string, error) {
	switch {
	case step.Wait != "":
		return "waiting: " + step.Wait, nil
	case step.Replace != nil:
		e := step.Replace
		if err := dc.RemoveMember(ctx, e.ID); err != nil {
			return "", err
		}
		if _, err := dc.AddLearner(ctx, managedetcd.PeerURL(ds, e.Ordinal, r.ClusterDomain)); err != nil {
			return "", err
		}
		// Its volume may hold a log under the removed identity (a start
		// that failed wrote one): it starts over on a new claim, now
		// rather than after its crash back-off.
		if err := r.restartMember(ctx, ds, e); err != nil {
			return "", err
		}
		r.Recorder.Eventf(ds, nil, corev1.EventTypeWarning, ReasonMemberReplaced, "ReplaceMember",
			"etcd member %s (%x) lost its data: removed it and added it back as a learner on an empty volume", e.Name, e.ID)
		return fmt.Sprintf("replacing %s, which lost its data", e.Name), nil
	case step.Promote != nil:
		e := step.Promote
		err := dc.Promote(ctx, step.LeaderEndpoint, e.ID)
		if errors.Is(err, datastore.ErrLearnerBehind) {
			return fmt.Sprintf("learner %s is catching up with the leader", e.Name), nil
		}
		if err != nil {
			return "", err
		}
		r.Recorder.Eventf(ds, nil, corev1.EventTypeNormal, ReasonMemberPromoted, "PromoteMember", "etcd learner %s caught up and votes now", e.Name)
		return fmt.Sprintf("promoted %s", e.Name), nil
	case step.Add != nil:
		name := managedetcd.MemberName(ds, *step.Add)
		if _, err := dc.AddLearner(ctx, managedetcd.PeerURL(ds, *step.Add, r.ClusterDomain)); err != nil {
			return "", err
		}
		r.Recorder.Eventf(ds, nil, corev1.EventTypeNormal, ReasonMemberAdded, "AddMember", "added etcd member %s as a learner", name)
		return fmt.Sprintf("added %s as a learner", name), nil
	case step.MoveLeader != nil:
		if err := dc.MoveLeader(ctx, step.MoveLeader.From, step.MoveLeader.To); err != nil {
			return "", err
		}
		r.Recorder.Eventf(ds, nil, corev1.EventTypeNormal, ReasonLeaderMoved, "MoveLeader", "moved the etcd leadership to %s before removing the leader", step.MoveLeader.ToPod)
		return "moved the leadership to " + step.MoveLeader.ToPod + " before removing the leader", nil
	case step.Remove != nil:
		e := step.Remove
		if err := dc.RemoveMember(ctx, e.ID); err != nil {
			return "", err
		}
		r.Recorder.Eventf(ds, nil, corev1.EventTypeNormal, ReasonMemberRemoved, "RemoveMember", "removed etcd member %s", e.Name)
		return fmt.Sprintf("removed %s", e.Name), nil
	}
	return "", nil
}

// restartMember deletes a member's claim, then its pod (the one listed
// before the step: a UID precondition), so that the StatefulSet starts
// it on a new volume. The claim goes once the pod has.
func (r *DataStoreReconciler) restartMember(ctx context.Context, ds *apiary.DataStore, e *etcdMember) error {
	if !ds.Spec.Managed.Storage.EmptyDir {
		claim := &corev1.PersistentVolumeClaim{}
		claim.Namespace, claim.Name = ds.Spec.Managed.Namespace, managedetcd.ClaimName(ds, e.Ordinal)
		if err := r.Client.Delete(ctx, claim); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("deleting the claim of etcd member %s: %w", e.Name, err)
		}
	}
	if e.Pod == nil {
		return nil
	}
	pod := &corev1.Pod{}
	pod.Namespace, pod.Name = ds.Spec.Managed.Namespace, e.Name
	if err := r.Client.Delete(ctx, pod, client.Preconditions{UID: &e.Pod.UID}); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("restarting etcd member %s: %w", e.Name, err)
	}
	return nil
}

// deleteLeftClaims deletes claims past the StatefulSet's pods: the
// StatefulSet controller deletes a scaled-down member's claim
// (whenScaled: Delete) but can leave one behind when its update
// conflicts, and a later member of that ordinal must start empty.
func (r *DataStoreReconciler) deleteLeftClaims(ctx context.Context, ds *apiary.DataStore, claims []string) error {
	pods := managedetcd.Pods(ds, ds.Status.Members, ds.Spec.Managed.Replicas)
	for _, name := range claims {
		if managedetcd.ClaimOrdinal(ds, name) < pods {
			continue
		}
		claim := &corev1.PersistentVolumeClaim{}
		claim.Namespace, claim.Name = ds.Spec.Managed.Namespace, name
		if err := r.Client.Delete(ctx, claim); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("deleting claim %s of a removed etcd member: %w", name, err)
		}
	}
	return nil
}

// memberStates asks each member about raft, by pod name; those that do not
// answer are left out.
func (r *DataStoreReconciler) memberStates(ctx context.Context, ds *apiary.DataStore, dc *datastore.Client) map[string]datastore.MemberState {
	out := map[string]datastore.MemberState{}
	callCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	states, _ := dc.MemberStates(callCtx)
	for _, m := range states {
		if name := managedetcd.MemberOfURL(ds, m.Endpoint, r.ClusterDomain); name != "" {
			out[name] = m
		}
	}
	return out
}

// describeMembers is status.members for a message: "a-0, a-1, a-2
// (learner)".
func describeMembers(members []apiary.EtcdMember) string {
	if len(members) == 0 {
		return "etcd lists no member"
	}
	names := make([]string, 0, len(members))
	for _, m := range members {
		n := m.Name
		if m.Learner {
			n += " (learner)"
		}
		names = append(names, n)
	}
	return "etcd members " + strings.Join(names, ", ")
}
