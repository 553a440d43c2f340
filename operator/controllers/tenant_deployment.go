package controllers

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	appsv1ac "k8s.io/client-go/applyconfigurations/apps/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/apiaryhq/apiary/datastore"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/operator/render"
)

// reconcileDeployment applies the control-plane Deployment and the
// non-secret files it mounts (the egress configuration; the admission
// configuration with the quota policy; the authentication configuration
// is applied before, by reconcileAuthentication), and observes its
// replicas.
func (r *TenantControlPlaneReconciler) reconcileDeployment(ctx context.Context, tcp *apiary.TenantControlPlane, cr *credentials, ds *apiary.DataStore, dsCfg datastore.Config, ep render.Endpoint, authn string) (quotaState, bool, error) {
	if err := r.konnectivityConfigMap(ctx, tcp); err != nil {
		return quotaState{}, false, err
	}
	quota := r.reconcileQuota(ctx, tcp, ds, dsCfg)
	if err := r.applyAdmission(ctx, tcp, quota.exceeded); err != nil {
		return quota, false, err
	}
	dep := render.Deployment(render.Inputs{
		TCP:             tcp,
		Version:         targetVersion(tcp),
		Endpoint:        ep,
		EtcdServers:     dsCfg.Endpoints,
		EtcdPrefix:      tcp.Status.DataStore.Prefix,
		Secrets:         cr.data,
		ImageRepository: r.ImageRepository,
		HostsOnly:       hostsOnly(&tcp.Status),
		Authentication:  authn,
	})
	if err := r.Client.Apply(ctx, dep, client.FieldOwner(FieldOwner), client.ForceOwnership); err != nil {
		return quota, false, fmt.Errorf("applying Deployment: %w", err)
	}
	return quota, r.observeDeployment(tcp, dep), nil
}

// konnectivityConfigMap applies the egress selector configuration the API
// server mounts, or removes it when konnectivity is off.
func (r *TenantControlPlaneReconciler) konnectivityConfigMap(ctx context.Context, tcp *apiary.TenantControlPlane) error {
	if render.KonnectivityEnabled(tcp) {
		if err := r.Client.Apply(ctx, render.KonnectivityConfigMap(tcp), client.FieldOwner(FieldOwner), client.ForceOwnership); err != nil {
			return fmt.Errorf("applying ConfigMap %s: %w", render.KonnectivityConfigMapName(tcp), err)
		}
		return nil
	}
	return r.deleteOwned(ctx, tcp, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: tcp.Namespace, Name: render.KonnectivityConfigMapName(tcp)}})
}

// observeDeployment records the replicas and says whether the Deployment
// runs only its current template.
func (r *TenantControlPlaneReconciler) observeDeployment(tcp *apiary.TenantControlPlane, dep *appsv1ac.DeploymentApplyConfiguration) bool {
	st := &tcp.Status
	st.Selector = labels.SelectorFromSet(render.SelectorLabels(tcp)).String()
	var replicas, ready, updated int32
	var observed, generation int64
	if dep.Status != nil {
		replicas, ready, updated = deref(dep.Status.Replicas), deref(dep.Status.ReadyReplicas), deref(dep.Status.UpdatedReplicas)
		observed = deref(dep.Status.ObservedGeneration)
	}
	if dep.Generation != nil {
		generation = *dep.Generation
	}
	st.Replicas, st.ReadyReplicas = replicas, ready
	if ready > 0 {
		r.setCondition(tcp, apiary.ConditionControlPlaneAvailable, metav1.ConditionTrue, ReasonReplicasReady,
			fmt.Sprintf("%d of %d control-plane replicas ready", ready, *tcp.Spec.Replicas))
	} else {
		r.setCondition(tcp, apiary.ConditionControlPlaneAvailable, metav1.ConditionFalse, ReasonNoReadyReplicas,
			fmt.Sprintf("0 of %d control-plane replicas ready", *tcp.Spec.Replicas))
	}
	// The version runs once the rollout of the current template is complete:
	// every pod left is of the new template and ready. readyReplicas alone
	// counts old pods too, which serve until the Deployment removes them.
	rolled := rolledOutDeployment(observed, generation, replicas, updated, ready, *tcp.Spec.Replicas)
	if rolled {
		st.Version = targetVersion(tcp)
	}
	return rolled
}

// rolledOutDeployment says whether a Deployment runs only its current
// template, want replicas of it, all ready.
func rolledOutDeployment(observed, generation int64, replicas, updated, ready, want int32) bool {
	return observed >= generation && replicas == updated && updated == want && ready == want
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}
