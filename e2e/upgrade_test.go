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
	"k8s.io/apimachinery/pkg/util/version"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/apiaryhq/apiary/e2e/framework"
	images "github.com/apiaryhq/apiary/hack/images"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/operator/controllers"
	"github.com/apiaryhq/apiary/operator/render"
	"github.com/apiaryhq/apiary/tenant"
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

// testMinorUpgrade upgrades a tenant from the previous minor to the
// current one under a poller, sampling every half second that nothing the
// tenant runs inside (kube-proxy, kubeadm-config) is newer than the oldest
// serving kube-apiserver, and that status.version moves only once every
// replica runs the new version.
func (e *env) testMinorUpgrade(t *testing.T) {
	const name = "upgrade"
	from, to := images.PreviousKubeVersion, images.KubeVersion
	took := e.CreateTenant(t, name, func(tcp *apiary.TenantControlPlane) { tcp.Spec.Version = from })
	t.Logf("FIGURE tenant %s at %s: create → Ready in %s", name, from, took.Round(100*time.Millisecond))
	defer e.deleteTenant(t, name)
	framework.Eventually(t, "status.version "+from, time.Minute, func() error {
		if v := e.TCP(t, name).Status.Version; v != from {
			return fmt.Errorf("status.version %q", v)
		}
		return nil
	})
	tc := e.tenantClient(t, e.ExportKubeconfig(t, name))
	inside := func() (proxy, kubeadm string, err error) {
		ds, err := tc.AppsV1().DaemonSets("kube-system").Get(e.Ctx, "kube-proxy", metav1.GetOptions{})
		if err != nil {
			return "", "", fmt.Errorf("kube-proxy DaemonSet: %w", err)
		}
		if img := ds.Spec.Template.Spec.Containers[0].Image; strings.Contains(img, ":") {
			proxy = img[strings.LastIndex(img, ":")+1:]
		}
		cm, err := tc.CoreV1().ConfigMaps("kube-system").Get(e.Ctx, tenant.KubeadmConfigMap, metav1.GetOptions{})
		if err != nil {
			return "", "", fmt.Errorf("kubeadm-config: %w", err)
		}
		for _, l := range strings.Split(cm.Data[tenant.ClusterConfigurationKey], "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(l), "kubernetesVersion:"); ok {
				kubeadm = strings.Trim(strings.TrimSpace(v), `"`)
			}
		}
		return proxy, kubeadm, nil
	}
	if proxy, kubeadm, err := inside(); err != nil || proxy != from || kubeadm != from {
		t.Fatalf("before the upgrade: kube-proxy %q, kubeadm-config %q (%v), want %s", proxy, kubeadm, err, from)
	}
	sel := client.MatchingLabels(render.SelectorLabels(e.TCP(t, name)))
	// servingVersions: the versions of the ready, not deleted
	// control-plane pods.
	servingVersions := func() ([]*version.Version, error) {
		var pods corev1.PodList
		if err := e.C.List(e.Ctx, &pods, client.InNamespace(framework.TenantsNS), sel); err != nil {
			return nil, err
		}
		var out []*version.Version
		for _, pod := range pods.Items {
			if !pod.DeletionTimestamp.IsZero() || !podIsReady(&pod) {
				continue
			}
			for _, c := range pod.Spec.Containers {
				if c.Name == render.ContainerAPIServer {
					out = append(out, version.MustParseSemantic(c.Image[strings.LastIndex(c.Image, ":")+1:]))
				}
			}
		}
		return out, nil
	}

	p := e.newPoller(t, name)
	ctx, cancel := context.WithCancel(e.Ctx)
	done := make(chan struct{})
	go func() { p.run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	tcp := e.TCP(t, name)
	tcp.Spec.Version = to
	if err := e.C.Update(e.Ctx, tcp); err != nil {
		t.Fatalf("spec.version %s: %v", to, err)
	}
	start := time.Now()
	var samples, progress int
	var violations []string
	var statusMoved time.Duration
	framework.Eventually(t, "status.version "+to+", kube-proxy and kubeadm-config at "+to, 5*time.Minute, func() error {
		samples++
		cur := e.TCP(t, name)
		if c := framework.FindCondition(cur.Status.Conditions, apiary.ConditionVersionRolledOut); c.Reason == controllers.ReasonUpgrading {
			progress++
		}
		serving, err := servingVersions()
		if err != nil {
			return err
		}
		proxy, kubeadm, err := inside()
		if err != nil {
			// The tenant API through its LoadBalancer; the poller counts
			// failures, this only samples.
			return err
		}
		oldest := version.MustParseSemantic(to)
		for _, v := range serving {
			if v.LessThan(oldest) {
				oldest = v
			}
		}
		at := time.Since(start).Round(100 * time.Millisecond)
		for what, v := range map[string]string{"kube-proxy": proxy, "kubeadm-config": kubeadm} {
			if version.MustParseSemantic(v).GreaterThan(oldest) {
				violations = append(violations, fmt.Sprintf("%s: %s at %s while a kube-apiserver at %s serves", at, what, v, oldest))
			}
		}
		if cur.Status.Version == to {
			if statusMoved == 0 {
				statusMoved = time.Since(start)
			}
			for _, v := range serving {
				if v.String() != strings.TrimPrefix(to, "v") {
					violations = append(violations, fmt.Sprintf("%s: status.version %s while a replica at %s serves", at, to, v))
				}
			}
		}
		if cur.Status.Version != to || proxy != to || kubeadm != to {
			return fmt.Errorf("status.version %s, kube-proxy %s, kubeadm-config %s; serving %v", cur.Status.Version, proxy, kubeadm, serving)
		}
		return nil
	})
	t.Logf("FIGURE upgrade %s → %s, 2 replicas: status.version moved after %s, kube-proxy and kubeadm-config followed by %s (%d samples, %d saying Upgrading)",
		from, to, statusMoved.Round(100*time.Millisecond), time.Since(start).Round(100*time.Millisecond), samples, progress)
	for _, v := range violations {
		t.Error("skew: " + v)
	}
	if c := framework.FindCondition(e.TCP(t, name).Status.Conditions, apiary.ConditionVersionRolledOut); c.Status != metav1.ConditionTrue || !strings.Contains(c.Message, to) {
		t.Errorf("VersionRolledOut %s %s: %s, want True naming %s", c.Status, c.Reason, c.Message, to)
	}
	if out, err := framework.KubectlErr(e.ExportKubeconfig(t, name), "version", "-o", "json"); err != nil || !strings.Contains(out, `"gitVersion": "`+to+`"`) {
		t.Errorf("kubectl version after the upgrade: %v: %s", err, out)
	}
	cancel()
	<-done
	p.mu.Lock()
	defer p.mu.Unlock()
	t.Logf("FIGURE minor upgrade: /version %d OK, %d failed, longest gap %s, slowest answer %s",
		p.ok.Load(), p.failed.Load(), p.longest.Round(time.Millisecond), p.slowest.Round(time.Millisecond))
	if p.failed.Load() > 0 {
		t.Errorf("%d of %d requests failed during the upgrade: %v", p.failed.Load(), p.ok.Load()+p.failed.Load(), p.failures)
	}
	if p.ok.Load() < 50 {
		t.Errorf("only %d successful requests: the poll did not run", p.ok.Load())
	}
}

func podIsReady(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
