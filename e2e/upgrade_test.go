//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/apiaryhq/apiary/e2e/framework"
	"github.com/apiaryhq/apiary/e2e/sshhost"
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
	p.verdict(t, "stopped and cancelled upgrade", "while the upgrade was stopped")
}

// testMinorUpgrade upgrades a tenant with two worker Hosts and a workload
// under a PodDisruptionBudget from the previous minor to the current one
// under a poller, sampling a few times a second that nothing the tenant
// runs inside (kube-proxy, kubeadm-config, CoreDNS, kubelets) is newer than the
// oldest serving kube-apiserver, that status.version moves only once every
// replica runs the new version, and that the Hosts follow one at a time,
// each drained and back Ready at the new version. The second Host is added
// when the upgrade starts: it joins during the control plane's roll with
// the old version's bundle, then follows. The operator's leader is killed
// while the first Host upgrades.
func (e *env) testMinorUpgrade(t *testing.T, d *sshhost.Docker, image string) {
	const name = "upgrade"
	from, to := images.PreviousKubeVersion, images.KubeVersion
	took := e.CreateTenant(t, name, func(tcp *apiary.TenantControlPlane) { tcp.Spec.Version = from })
	t.Logf("FIGURE tenant %s at %s: create → Ready in %s", name, from, took.Round(100*time.Millisecond))
	defer e.deleteTenant(t, name)
	kc := e.ExportKubeconfig(t, name)
	installCNI(t, kc)
	hostNames := []string{"up-1", "up-2"}
	var hosts []*apiary.Host
	for i, hn := range hostNames {
		m := e.startHost(t, d, image, fmt.Sprintf("e2e-up-%d", i+1))
		hosts = append(hosts, e.newHostFor(t, hn, m, name))
	}
	// up-1 now, up-2 once the upgrade has started.
	if err := e.C.Create(e.Ctx, hosts[0]); err != nil {
		t.Fatal(err)
	}
	defer deleteHostAndWait(t, e, hosts[0])
	e.waitHostReady(t, hostNames[0])
	if v := e.host(t, hostNames[0]).Status.Version; v != from {
		t.Fatalf("Host %s: status.version %q, want %s", hostNames[0], v, from)
	}
	tc := e.tenantClient(t, kc)
	// One web pod runs on up-1; the other waits for a second Node.
	e.webWithPDB(t, tc, 1)
	// Gone before the Hosts are removed (deferred earlier, so run later):
	// the budget would hold the last web pod's eviction.
	// With a client of the kubeconfig as it is then: RotatesItsCA
	// replaces the CA, and a client made before it is refused (the
	// workload stayed, its budget held the last Host's drain for its
	// 2 minutes).
	dropWorkload := func() {
		_ = e.tenantClient(t, e.ExportKubeconfig(t, name)).CoreV1().Namespaces().Delete(context.Background(), upgradeWorkloadNS, metav1.DeleteOptions{})
	}
	defer dropWorkload()
	framework.Eventually(t, "status.version "+from, time.Minute, func() error {
		if v := e.TCP(t, name).Status.Version; v != from {
			return fmt.Errorf("status.version %q", v)
		}
		return nil
	})
	tagOf := func(img string) string { return img[strings.LastIndex(img, ":")+1:] }
	// inside: kube-proxy's and kubeadm-config's Kubernetes version, and
	// CoreDNS's tag.
	inside := func() (proxy, kubeadm, dns string, err error) {
		ds, err := tc.AppsV1().DaemonSets("kube-system").Get(e.Ctx, "kube-proxy", metav1.GetOptions{})
		if err != nil {
			return "", "", "", fmt.Errorf("kube-proxy DaemonSet: %w", err)
		}
		proxy = tagOf(ds.Spec.Template.Spec.Containers[0].Image)
		cm, err := tc.CoreV1().ConfigMaps("kube-system").Get(e.Ctx, tenant.KubeadmConfigMap, metav1.GetOptions{})
		if err != nil {
			return "", "", "", fmt.Errorf("kubeadm-config: %w", err)
		}
		for _, l := range strings.Split(cm.Data[tenant.ClusterConfigurationKey], "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(l), "kubernetesVersion:"); ok {
				kubeadm = strings.Trim(strings.TrimSpace(v), `"`)
			}
		}
		dep, err := tc.AppsV1().Deployments("kube-system").Get(e.Ctx, "coredns", metav1.GetOptions{})
		if err != nil {
			return "", "", "", fmt.Errorf("coredns Deployment: %w", err)
		}
		return proxy, kubeadm, tagOf(dep.Spec.Template.Spec.Containers[0].Image), nil
	}
	// CoreDNS as kubeadm pairs it with each version.
	dnsFrom, dnsTo := tenant.CoreDNSVersion(from), tenant.CoreDNSVersion(to)
	if dnsFrom == dnsTo {
		t.Fatalf("%s and %s pair with one CoreDNS (%s): the test would not see it move", from, to, dnsFrom)
	}
	if proxy, kubeadm, dns, err := inside(); err != nil || proxy != from || kubeadm != from || dns != dnsFrom {
		t.Fatalf("before the upgrade: kube-proxy %q, kubeadm-config %q, CoreDNS %q (%v), want %s, %s, %s", proxy, kubeadm, dns, err, from, from, dnsFrom)
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
	// A Host added while the control plane rolls: it must join with what
	// runs (the old version), not with what is wanted.
	if err := e.C.Create(e.Ctx, hosts[1]); err != nil {
		t.Fatal(err)
	}
	defer deleteHostAndWait(t, e, hosts[1])
	defer dropWorkload()
	var samples, progress, maxUpgrading int
	var violations []string
	var statusMoved, insideMoved time.Duration
	var killed string
	framework.Eventually(t, "status.version "+to+", kube-proxy, kubeadm-config and CoreDNS at "+to+", then every Host", 10*time.Minute, func() error {
		samples++
		cur := e.TCP(t, name)
		if c := framework.FindCondition(cur.Status.Conditions, apiary.ConditionVersionRolledOut); c.Reason == controllers.ReasonUpgrading {
			progress++
		}
		serving, err := servingVersions()
		if err != nil {
			return err
		}
		proxy, kubeadm, dns, err := inside()
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
		if dns == dnsTo && oldest.LessThan(version.MustParseSemantic(to)) {
			violations = append(violations, fmt.Sprintf("%s: CoreDNS %s (paired with %s) while a kube-apiserver at %s serves", at, dns, to, oldest))
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
		// The Hosts: kubelets never ahead of the API server, upgrades
		// only once the control plane is done, one at a time.
		nodes, err := tc.CoreV1().Nodes().List(e.Ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, n := range nodes.Items {
			if version.MustParseSemantic(n.Status.NodeInfo.KubeletVersion).GreaterThan(oldest) {
				violations = append(violations, fmt.Sprintf("%s: Node %s kubelet %s while a kube-apiserver at %s serves", at, n.Name, n.Status.NodeInfo.KubeletVersion, oldest))
			}
		}
		// One List, one snapshot: a Get per Host could read one just
		// before it finished and the next just after it took the slot.
		var hostList apiary.HostList
		if err := e.C.List(e.Ctx, &hostList, client.InNamespace(framework.TenantsNS)); err != nil {
			return err
		}
		var upgrading []string
		for i := range hostList.Items {
			h, hn := &hostList.Items[i], hostList.Items[i].Name
			if !slices.Contains(hostNames, hn) || h.Status.UpgradingTo == "" {
				continue
			}
			upgrading = append(upgrading, fmt.Sprintf("%s (%s)", hn, upgradeStepsOf(h)))
			// The tenant read again, after the Host: a Host may start
			// between an earlier read of the tenant and this one.
			if v := e.TCP(t, name).Status.Version; v != to {
				violations = append(violations, fmt.Sprintf("%s: Host %s upgrading while the control plane runs %s", at, hn, v))
			}
			// Kill the leader once, while the first Host's node software
			// is being replaced.
			if killed == "" {
				for _, st := range h.Status.Journal {
					if (st.Name == controllers.StepUpgradeInstall || st.Name == controllers.StepUpgradeNode) && st.Result == controllers.StepRunning {
						killed = fmt.Sprintf("%s during Host %s's %s, at %s", e.killLeader(t), hn, st.Name, at)
					}
				}
			}
		}
		maxUpgrading = max(maxUpgrading, len(upgrading))
		if len(upgrading) > 1 {
			violations = append(violations, fmt.Sprintf("%s: %d Hosts upgrading at once at resourceVersion %s: %s", at, len(upgrading), hostList.ResourceVersion, strings.Join(upgrading, "; ")))
		}
		if proxy == to && kubeadm == to && dns == dnsTo && insideMoved == 0 {
			insideMoved = time.Since(start)
		}
		if cur.Status.Version != to || proxy != to || kubeadm != to || dns != dnsTo {
			return fmt.Errorf("status.version %s, kube-proxy %s, kubeadm-config %s, CoreDNS %s; serving %v", cur.Status.Version, proxy, kubeadm, dns, serving)
		}
		return upgradingDone(e, t, hostNames, to)
	})
	t.Logf("FIGURE upgrade %s → %s, 2 replicas: status.version moved after %s, kube-proxy, kubeadm-config and CoreDNS followed by %s (%d samples, %d saying Upgrading)",
		from, to, statusMoved.Round(100*time.Millisecond), insideMoved.Round(100*time.Millisecond), samples, progress)
	t.Logf("FIGURE upgrade %s → %s with 2 worker Hosts: all Hosts at %s after %s; operator leader killed %s", from, to, to, time.Since(start).Round(100*time.Millisecond), killed)
	if killed == "" {
		t.Error("the operator leader was never killed during a Host upgrade: the sampler missed the install and node steps")
	}
	if maxUpgrading != 1 {
		t.Errorf("at most %d Hosts upgrading at once, want 1 (spec.hostUpgrades.maxParallel defaults to 1)", maxUpgrading)
	}
	// up-2 was installed and joined at the old version before the control
	// plane was done, and upgraded after.
	var installed, joined *apiary.HostStep
	late := e.host(t, hostNames[1])
	for i, st := range late.Status.Journal {
		switch st.Name {
		case controllers.StepInstall:
			installed = &late.Status.Journal[i]
		case controllers.StepJoin:
			joined = &late.Status.Journal[i]
		}
	}
	if installed == nil || joined == nil || joined.Finished == nil {
		t.Errorf("Host %s: no install and join steps in its journal %+v", late.Name, late.Status.Journal)
	} else {
		installAt, joinedAt := installed.Started.Sub(start), joined.Finished.Sub(start)
		t.Logf("FIGURE Host %s added with the upgrade: install began %s and join ended %s after spec.version %s; status.version moved at %s",
			late.Name, installAt.Round(100*time.Millisecond), joinedAt.Round(100*time.Millisecond), to, statusMoved.Round(100*time.Millisecond))
		if installAt >= statusMoved {
			t.Errorf("Host %s's install began %s after the upgrade started, once the control plane ran %s (at %s): it did not test a Host added during the roll", late.Name, installAt, to, statusMoved)
		}
		if !strings.Contains(installed.Message, "kubectl "+from+" ") {
			t.Errorf("Host %s, added while the control plane ran %s: installed %q, want the %s bundle", late.Name, from, installed.Message, from)
		}
	}
	// The journals say it too, whatever the sampler saw: each Host's
	// upgrade (drain started to Ready finished) ends before the next one's
	// begins. Journal times are whole seconds, rounded down alike, so an
	// honest hand-over never shows as an overlap.
	type window struct {
		host       string
		begin, end time.Time
	}
	var windows []window
	for _, hn := range hostNames {
		h := e.host(t, hn)
		var split []string
		w := window{host: hn}
		for _, st := range h.Status.Journal {
			if strings.HasPrefix(st.Name, "upgrade-") && st.Finished != nil {
				split = append(split, fmt.Sprintf("%s %s (%d attempt(s))", st.Name, st.Finished.Sub(st.Started.Time).Round(100*time.Millisecond), st.Attempts))
			}
			switch st.Name {
			case controllers.StepUpgradeDrain:
				w.begin = st.Started.Time
			case controllers.StepUpgradeReady:
				if st.Finished != nil {
					w.end = st.Finished.Time
				}
			}
		}
		windows = append(windows, w)
		t.Logf("FIGURE Host %s upgraded: %s", hn, strings.Join(split, ", "))
	}
	slices.SortFunc(windows, func(a, b window) int { return a.begin.Compare(b.begin) })
	for i := 1; i < len(windows); i++ {
		if prev, next := windows[i-1], windows[i]; next.begin.Before(prev.end) {
			t.Errorf("Host %s began its upgrade at %s, before Host %s had finished its own at %s (maxParallel 1)",
				next.host, next.begin.Format(time.TimeOnly), prev.host, prev.end.Format(time.TimeOnly))
		}
	}
	framework.Eventually(t, "HostsUpToDate True", time.Minute, func() error {
		return framework.ConditionIs(e.TCP(t, name).Status.Conditions, apiary.ConditionHostsUpToDate, metav1.ConditionTrue, controllers.ReasonAtVersion)
	})
	// The workload is back on both Nodes.
	framework.Eventually(t, "two web pods ready on two nodes after the upgrade", 3*time.Minute, func() error {
		pods, err := readyPods(e.Ctx, tc, upgradeWorkloadNS, "app=web")
		if err != nil {
			return err
		}
		if len(pods) != 2 || pods[0].Spec.NodeName == pods[1].Spec.NodeName {
			return fmt.Errorf("%d ready web pods", len(pods))
		}
		return nil
	})
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
	p.verdict(t, "minor upgrade", "during the upgrade")
	// The same tenant, Hosts and workload: its CA replaced.
	t.Run("RotatesItsCA", func(t *testing.T) {
		e.testCARotation(t, name, "2 replicas, 2 worker Hosts", hostNames, kc, upgradeWorkloadNS)
	})
}

// upgradingDone says whether every Host runs version, uncordoned, with its
// Node Ready at it.
func upgradingDone(e *env, t *testing.T, names []string, version string) error {
	for _, hn := range names {
		h := e.host(t, hn)
		if h.Status.Version != version || h.Status.UpgradingTo != "" {
			return fmt.Errorf("Host %s at %q, upgrading to %q, phase %s", hn, h.Status.Version, h.Status.UpgradingTo, h.Status.Phase)
		}
		if err := framework.ConditionIs(h.Status.Conditions, apiary.HostConditionUpToDate, metav1.ConditionTrue, controllers.ReasonAtVersion); err != nil {
			return fmt.Errorf("Host %s: %w", hn, err)
		}
	}
	return nil
}

// upgradeStepsOf lists a Host's upgrade steps with their results.
func upgradeStepsOf(h *apiary.Host) string {
	var out []string
	for _, st := range h.Status.Journal {
		if strings.HasPrefix(st.Name, "upgrade-") {
			out = append(out, st.Name+":"+st.Result)
		}
	}
	return strings.Join(out, " ")
}

func (e *env) host(t *testing.T, name string) *apiary.Host {
	t.Helper()
	var h apiary.Host
	if err := e.C.Get(e.Ctx, client.ObjectKey{Namespace: framework.TenantsNS, Name: name}, &h); err != nil {
		t.Fatal(err)
	}
	return &h
}

const upgradeWorkloadNS = "upgrade-e2e"

// webWithPDB runs two web pods, one per Node, under a PodDisruptionBudget
// that lets one be evicted at a time: a drain must wait for the evicted
// one to be back before it may take the other. It waits for ready pods on
// as many Nodes (a second pod waits for a second Node).
func (e *env) webWithPDB(t *testing.T, cs kubernetes.Interface, ready int) {
	t.Helper()
	if _, err := cs.CoreV1().Namespaces().Create(e.Ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: upgradeWorkloadNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{"app": "web"}
	dep := spreadWeb(upgradeWorkloadNS, labels)
	// httpd as PID 1 ignores SIGTERM: without this each eviction takes
	// the default 30 s grace period.
	dep.Spec.Template.Spec.TerminationGracePeriodSeconds = ptr.To[int64](2)
	if _, err := cs.AppsV1().Deployments(upgradeWorkloadNS).Create(e.Ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pdb := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Namespace: upgradeWorkloadNS, Name: "web"},
		Spec: policyv1.PodDisruptionBudgetSpec{
			MinAvailable: ptr.To(intstr.FromInt32(1)),
			Selector:     &metav1.LabelSelector{MatchLabels: labels},
		},
	}
	if _, err := cs.PolicyV1().PodDisruptionBudgets(upgradeWorkloadNS).Create(e.Ctx, pdb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	framework.Eventually(t, fmt.Sprintf("%d web pods ready", ready), 3*time.Minute, func() error {
		pods, err := readyPods(e.Ctx, cs, upgradeWorkloadNS, "app=web")
		if err != nil {
			return err
		}
		if len(pods) != ready {
			return fmt.Errorf("%d ready web pods; %s", len(pods), describePods(e.Ctx, cs, upgradeWorkloadNS))
		}
		return nil
	})
}

// describePods says where each pod of a namespace is and what it waits
// for, for a failure's message.
func describePods(ctx context.Context, cs kubernetes.Interface, ns string) string {
	list, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err.Error()
	}
	var out []string
	for _, p := range list.Items {
		d := fmt.Sprintf("%s on %q %s", p.Name, p.Spec.NodeName, p.Status.Phase)
		for _, c := range p.Status.Conditions {
			if c.Status != corev1.ConditionTrue {
				d += fmt.Sprintf(" %s=%s(%s)", c.Type, c.Reason, c.Message)
			}
		}
		for _, c := range p.Status.ContainerStatuses {
			if c.State.Waiting != nil {
				d += fmt.Sprintf(" waiting %s: %s", c.State.Waiting.Reason, c.State.Waiting.Message)
			}
		}
		out = append(out, d)
	}
	if evs, err := cs.CoreV1().Events(ns).List(ctx, metav1.ListOptions{}); err == nil {
		for _, ev := range evs.Items {
			if ev.Type == corev1.EventTypeWarning {
				out = append(out, fmt.Sprintf("event %s %s: %s", ev.InvolvedObject.Name, ev.Reason, ev.Message))
			}
		}
	}
	return strings.Join(out, "; ")
}

func podIsReady(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
