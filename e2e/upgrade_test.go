//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/apiaryhq/apiary/e2e/framework"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/operator/controllers"
	"github.com/apiaryhq/apiary/operator/render"
)

// testUpgradeToMissingImages asks for a patch release whose images the
// local registry does not have: the rollout stops at the first new pod
// with a condition naming the image, the old replicas keep serving, a mode
// switch is refused meanwhile, and setting spec.version back cancels it.
func (e *env) testUpgradeToMissingImages(t *testing.T) {
	const name, missing = "alpha", "v1.37.99"
	before := e.TCP(t, name)
	running := before.Status.Version
	if running == "" || running != before.Spec.Version {
		t.Fatalf("tenant %s runs %q, spec.version %q: want a rolled-out tenant", name, running, before.Spec.Version)
	}
	readySince := framework.FindCondition(before.Status.Conditions, apiary.ConditionReady).LastTransitionTime
	p := e.newPoller(t, name)
	ctx, cancel := context.WithCancel(e.Ctx)
	done := make(chan struct{})
	go func() { p.run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	setVersion := func(v string) error {
		for {
			tcp := e.TCP(t, name)
			tcp.Spec.Version = v
			err := e.C.Update(e.Ctx, tcp)
			if !apierrors.IsConflict(err) {
				return err
			}
		}
	}
	if err := setVersion(missing); err != nil {
		t.Fatalf("spec.version %s: %v", missing, err)
	}
	start := time.Now()
	var stopped metav1.Condition
	framework.Eventually(t, "VersionRolledOut False ImagePullFailed", 2*time.Minute, func() error {
		stopped = framework.FindCondition(e.TCP(t, name).Status.Conditions, apiary.ConditionVersionRolledOut)
		if stopped.Status != metav1.ConditionFalse || stopped.Reason != controllers.ReasonImagePullFailed {
			return fmt.Errorf("VersionRolledOut %s %s: %s", stopped.Status, stopped.Reason, stopped.Message)
		}
		return nil
	})
	t.Logf("FIGURE upgrade to %s (no images): stopped with the reason after %s: %s", missing, time.Since(start).Round(100*time.Millisecond), stopped.Message)
	for _, s := range []string{"kube-apiserver:" + missing, "cannot pull", "0 of 2 replicas run it", "status.version stays " + running, "set spec.version back to " + running} {
		if !strings.Contains(stopped.Message, s) {
			t.Errorf("VersionRolledOut message does not say %q: %s", s, stopped.Message)
		}
	}
	tcp := e.TCP(t, name)
	if tcp.Status.Version != running {
		t.Errorf("status.version %s during the stopped upgrade, want %s", tcp.Status.Version, running)
	}
	if !e.eventNoteContains(t, name, controllers.ReasonImagePullFailed, "kube-apiserver:"+missing) {
		t.Error("no event says the new version's image cannot be pulled")
	}

	// A hostile or hurried admin: a mode switch on top of a stuck upgrade.
	tcp.Spec.Mode = apiary.ModeRegistered
	err := e.C.Update(e.Ctx, tcp)
	if err == nil || !strings.Contains(err.Error(), "spec.mode: Forbidden: must not change while the control plane upgrades from "+running+" to "+missing) {
		t.Errorf("spec.mode during the upgrade: %v, want Forbidden naming both versions", err)
	}

	// Cancelled: back to what runs.
	if err := setVersion(running); err != nil {
		t.Fatalf("spec.version back to %s: %v", running, err)
	}
	start = time.Now()
	framework.Eventually(t, "VersionRolledOut True", 2*time.Minute, func() error {
		if c := framework.FindCondition(e.TCP(t, name).Status.Conditions, apiary.ConditionVersionRolledOut); c.Status != metav1.ConditionTrue {
			return fmt.Errorf("VersionRolledOut %s %s: %s", c.Status, c.Reason, c.Message)
		}
		return nil
	})
	e.waitReplicas(t, name, 2)
	framework.Eventually(t, "no pod of "+missing+" left", time.Minute, func() error {
		var pods corev1.PodList
		if err := e.C.List(e.Ctx, &pods, client.InNamespace(framework.TenantsNS), client.MatchingLabels(render.SelectorLabels(e.TCP(t, name)))); err != nil {
			return err
		}
		for _, pod := range pods.Items {
			for _, c := range pod.Spec.Containers {
				if strings.HasSuffix(c.Image, ":"+missing) {
					return fmt.Errorf("pod %s still runs %s", pod.Name, c.Image)
				}
			}
		}
		return nil
	})
	t.Logf("FIGURE upgrade cancelled: back at %s after %s", running, time.Since(start).Round(100*time.Millisecond))
	if c := framework.FindCondition(e.TCP(t, name).Status.Conditions, apiary.ConditionReady); c.Status != metav1.ConditionTrue || !c.LastTransitionTime.Equal(&readySince) {
		t.Errorf("Ready %s %s (%s) since %s, want True since %s: it changed during the stopped upgrade", c.Status, c.Reason, c.Message, c.LastTransitionTime, readySince)
	}
	cancel()
	<-done
	p.mu.Lock()
	defer p.mu.Unlock()
	t.Logf("FIGURE stopped and cancelled upgrade: /version %d OK, %d failed, longest gap %s", p.ok.Load(), p.failed.Load(), p.longest.Round(time.Millisecond))
	if p.failed.Load() > 0 {
		t.Errorf("%d of %d requests failed while the upgrade was stopped: %v", p.failed.Load(), p.ok.Load()+p.failed.Load(), p.failures)
	}
	if p.ok.Load() < 50 {
		t.Errorf("only %d successful requests: the poll did not run", p.ok.Load())
	}
}
