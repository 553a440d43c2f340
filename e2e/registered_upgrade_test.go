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
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/apiaryhq/apiary/e2e/framework"
	"github.com/apiaryhq/apiary/e2e/sshhost"
	images "github.com/apiaryhq/apiary/hack/images"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/operator/controllers"
)

// testRegisteredUpgrade upgrades the registered tenant a minor under a
// poller and a writer: the static Pods move host by host, status.version
// moves once both hosts serve the new version, then every Host's kubelet
// follows, one at a time; a control-plane Host's only once the tenant has
// taken it out of its Service (a new kubelet restarts the static Pods
// there). Sampled a few times a second: no kubelet is newer than the
// oldest kube-apiserver answering on a host, and no control-plane host is
// a ready backend while its kubelet is replaced. The operator's leader is
// killed during the first control-plane Host's upgrade-node step (its
// static Pods held aside). It returns the worker's
// workload pods as they are after the drain.
func (e *env) testRegisteredUpgrade(t *testing.T, machines map[string]*sshhost.Host, workload []corev1.Pod) []corev1.Pod {
	const name = registeredTenant
	from, to := images.PreviousKubeVersion, images.KubeVersion
	all := []string{"reg-cp-1", "reg-cp-2", "reg-worker"}
	tcp := e.TCP(t, name)
	if tcp.Status.Version != from {
		t.Fatalf("tenant %s runs %q, want %s", name, tcp.Status.Version, from)
	}
	kc := e.ExportKubeconfig(t, name)
	cs := e.tenantClient(t, kc)
	// A client per control-plane host, straight to its kube-apiserver.
	direct := map[string]kubernetes.Interface{}
	for _, hn := range all[:2] {
		cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfigAt(t, kc, tcp.Status.Endpoint, machines[hn].Address))
		if err != nil {
			t.Fatal(err)
		}
		cfg.Timeout = 2 * time.Second
		direct[hn] = kubernetes.NewForConfigOrDie(cfg)
	}
	c := e.startClients(t, name, "reg-upgrade")
	tcp.Spec.Version = to
	if err := e.C.Update(e.Ctx, tcp); err != nil {
		t.Fatalf("spec.version %s: %v", to, err)
	}
	start := time.Now()
	var statusMoved time.Duration
	var violations []string
	samples, maxUpgrading := 0, 0
	kubeletSteps := map[string]int{}
	var killed string
	framework.Eventually(t, "the control plane, then every Host, at "+to, 10*time.Minute, func() error {
		samples++
		at := time.Since(start).Round(100 * time.Millisecond)
		cur := e.TCP(t, name)
		// The oldest kube-apiserver answering on a host (one being
		// replaced does not answer).
		var oldest *version.Version
		serving := map[string]string{}
		for hn, dc := range direct {
			v, err := dc.Discovery().ServerVersion()
			if err != nil {
				continue
			}
			serving[hn] = v.GitVersion
			if pv := version.MustParseSemantic(v.GitVersion); oldest == nil || pv.LessThan(oldest) {
				oldest = pv
			}
		}
		if cur.Status.Version == to {
			if statusMoved == 0 {
				statusMoved = time.Since(start)
			}
			for hn, v := range serving {
				if v != to {
					violations = append(violations, fmt.Sprintf("%s: status.version %s while %s's kube-apiserver answers %s", at, to, hn, v))
				}
			}
		}
		nodes, err := cs.CoreV1().Nodes().List(e.Ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, n := range nodes.Items {
			if oldest != nil && version.MustParseSemantic(n.Status.NodeInfo.KubeletVersion).GreaterThan(oldest) {
				violations = append(violations, fmt.Sprintf("%s: Node %s kubelet %s while a kube-apiserver at %s answers", at, n.Name, n.Status.NodeInfo.KubeletVersion, oldest))
			}
		}
		// One list, so that the Hosts are seen at one moment (a Host
		// read after another could have started as it ended).
		var hostList apiary.HostList
		if err := e.C.List(e.Ctx, &hostList, client.InNamespace(framework.TenantsNS)); err != nil {
			return err
		}
		upgrading := 0
		for _, hn := range all {
			i := slices.IndexFunc(hostList.Items, func(h apiary.Host) bool { return h.Name == hn })
			if i < 0 {
				return fmt.Errorf("no Host %s", hn)
			}
			h := &hostList.Items[i]
			if h.Status.UpgradingTo == "" {
				continue
			}
			upgrading++
			if v := e.TCP(t, name).Status.Version; v != to {
				violations = append(violations, fmt.Sprintf("%s: Host %s upgrading its kubelet while the control plane runs %s", at, hn, v))
			}
			// The kubelet is replaced and restarted in these two steps.
			for _, st := range h.Status.Journal {
				if h.Spec.Role != apiary.HostRoleControlPlane || st.Result != controllers.StepRunning ||
					st.Name != controllers.StepUpgradeInstall && st.Name != controllers.StepUpgradeNode {
					continue
				}
				kubeletSteps[hn]++
				// Once, while a control-plane host's static Pods are held
				// aside: the new leader resumes the Host's step and the
				// tenant's.
				if killed == "" && st.Name == controllers.StepUpgradeNode {
					killed = fmt.Sprintf("%s during Host %s's %s, at %s", e.killLeader(t), hn, st.Name, at)
				}
				backends, err := e.serviceBackends(cur, "https")
				if err != nil {
					return err
				}
				for _, b := range backends {
					if strings.Contains(b, ":"+machines[hn].Address+":true") {
						violations = append(violations, fmt.Sprintf("%s: Host %s at step %s while a ready backend of the Service (%v)", at, hn, st.Name, backends))
					}
				}
			}
		}
		maxUpgrading = max(maxUpgrading, upgrading)
		if cur.Status.Version != to {
			return fmt.Errorf("status.version %s; hosts answer %v", cur.Status.Version, serving)
		}
		return upgradingDone(e, t, all, to)
	})
	t.Logf("FIGURE registered tenant %s → %s on 2 control-plane Hosts and a worker: status.version moved after %s, every kubelet at %s after %s (%d samples; control-plane kubelet steps sampled %v)",
		from, to, statusMoved.Round(100*time.Millisecond), to, time.Since(start).Round(100*time.Millisecond), samples, kubeletSteps)
	t.Logf("FIGURE registered upgrade: operator leader killed %s", killed)
	if killed == "" {
		t.Error("the operator leader was never killed during a control-plane Host's upgrade-node: the sampler missed it")
	}
	if len(kubeletSteps) != 2 {
		t.Errorf("the control-plane Hosts' kubelet steps were sampled %v times: the Service check saw not both", kubeletSteps)
	}
	for _, v := range violations {
		t.Error("skew: " + v)
	}
	if maxUpgrading != 1 {
		t.Errorf("at most %d Hosts upgrading at once, want 1", maxUpgrading)
	}
	framework.Eventually(t, "HostsUpToDate True", time.Minute, func() error {
		return framework.ConditionIs(e.TCP(t, name).Status.Conditions, apiary.ConditionHostsUpToDate, metav1.ConditionTrue, controllers.ReasonAtVersion)
	})
	for _, hn := range all {
		h := e.host(t, hn)
		var split []string
		for _, st := range h.Status.Journal {
			if !strings.HasPrefix(st.Name, "upgrade-") || st.Finished == nil {
				continue
			}
			if st.Name == controllers.StepUpgradeDrain {
				split = append(split, fmt.Sprintf("began at %s:", st.Started.Sub(start).Round(100*time.Millisecond)))
			}
			split = append(split, fmt.Sprintf("%s %s", strings.TrimPrefix(st.Name, "upgrade-"), st.Finished.Sub(st.Started.Time).Round(100*time.Millisecond)))
		}
		if len(split) > 0 {
			t.Logf("FIGURE Host %s (%s) kubelet upgraded: %s", hn, h.Spec.Role, strings.Join(split, ", "))
		}
		n, err := cs.CoreV1().Nodes().Get(e.Ctx, hn, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if n.Status.NodeInfo.KubeletVersion != to || n.Spec.Unschedulable {
			t.Errorf("Node %s: kubelet %s, unschedulable %v; want %s, schedulable", hn, n.Status.NodeInfo.KubeletVersion, n.Spec.Unschedulable, to)
		}
	}
	// Each host's mirror Pods run the new images.
	framework.Eventually(t, "every control-plane host's mirror Pods running at "+to, time.Minute, func() error {
		pods, err := cs.CoreV1().Pods("kube-system").List(e.Ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, hn := range all[:2] {
			for _, comp := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler"} {
				i := slices.IndexFunc(pods.Items, func(p corev1.Pod) bool { return p.Name == comp+"-"+hn })
				if i < 0 {
					return fmt.Errorf("no mirror Pod %s-%s", comp, hn)
				}
				p := &pods.Items[i]
				if !strings.HasSuffix(p.Spec.Containers[0].Image, ":"+to) {
					return fmt.Errorf("mirror Pod %s runs %s", p.Name, p.Spec.Containers[0].Image)
				}
				if len(p.Status.ContainerStatuses) == 0 || p.Status.ContainerStatuses[0].State.Running == nil {
					return fmt.Errorf("mirror Pod %s: container not running", p.Name)
				}
			}
		}
		return nil
	})
	time.Sleep(2 * time.Second)
	t.Logf("FIGURE registered minor upgrade: %s", c.check(t))

	// The worker was drained: its workload is back on it.
	var after []corev1.Pod
	framework.Eventually(t, fmt.Sprintf("%d workload pods ready again", len(workload)), 3*time.Minute, func() error {
		var err error
		after, err = readyPods(context.Background(), cs, "reg-app", "app=web")
		if err != nil {
			return err
		}
		if len(after) != len(workload) {
			return fmt.Errorf("%d ready", len(after))
		}
		return nil
	})
	return after
}
