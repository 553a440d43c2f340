//go:build e2e

package e2e

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/apiaryhq/apiary/cli"
	"github.com/apiaryhq/apiary/e2e/framework"
	"github.com/apiaryhq/apiary/e2e/sshhost"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/operator/render"
)

// setHostRole changes a Host's role.
func (e *env) setHostRole(t *testing.T, name string, role apiary.HostRole) {
	t.Helper()
	framework.Eventually(t, "Host "+name+" role "+string(role), 30*time.Second, func() error {
		var host apiary.Host
		if err := e.C.Get(e.Ctx, client.ObjectKey{Namespace: framework.TenantsNS, Name: name}, &host); err != nil {
			return err
		}
		host.Spec.Role = role
		return e.C.Update(e.Ctx, &host)
	})
}

// waitHostAdmitted waits until the DataStore's NetworkPolicy admits a
// control-plane Host's address (the agent installed it).
func (e *env) waitHostAdmitted(t *testing.T, name, address string) {
	t.Helper()
	framework.Eventually(t, "Host "+name+" admitted to the DataStore", 3*time.Minute, func() error {
		var ds apiary.DataStore
		if err := e.C.Get(e.Ctx, client.ObjectKey{Name: "default"}, &ds); err != nil {
			return err
		}
		if c := framework.FindCondition(ds.Status.Conditions, apiary.ConditionHostAccessReady); !strings.Contains(c.Message, address+"/32") {
			return fmt.Errorf("DataStore HostAccessReady: %+v", c)
		}
		return nil
	})
}

// waitStandby waits until a control-plane Host of a standalone tenant has
// left it (phase Standby) and checks what a standalone tenant must not
// have (issue 10, test 2): its Node, a kubelet or a kubelet kubeconfig on
// the host, a control-plane process or file there.
func (e *env) waitStandby(t *testing.T, d *sshhost.Docker, m *sshhost.Host, cs kubernetes.Interface, name string) time.Duration {
	t.Helper()
	start := time.Now()
	framework.Eventually(t, "Host "+name+" in Standby", 4*time.Minute, func() error {
		var host apiary.Host
		if err := e.C.Get(e.Ctx, client.ObjectKey{Namespace: framework.TenantsNS, Name: name}, &host); err != nil {
			return err
		}
		if host.Status.Phase != apiary.HostPhaseStandby {
			return fmt.Errorf("phase %s, Joined %+v", host.Status.Phase, framework.FindCondition(host.Status.Conditions, apiary.HostConditionJoined))
		}
		if host.Status.NodeName != "" {
			return fmt.Errorf("status.nodeName %s", host.Status.NodeName)
		}
		return nil
	})
	took := time.Since(start)
	if n, err := cs.CoreV1().Nodes().Get(e.Ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("Host %s in Standby, and its Node is there (%v): labels %v", name, err, n.Labels)
	}
	if out, _ := e.hostExec(d, m, "pgrep -l -x kubelet; test -e /etc/kubernetes/kubelet.conf && echo kubelet.conf"); strings.TrimSpace(out) != "" {
		t.Errorf("Host %s in Standby, and the host has: %s", name, out)
	}
	if left := e.controlPlaneLeft(d, m); left != "" {
		t.Errorf("Host %s in Standby, and the host has:\n%s", name, left)
	}
	if out, err := e.hostExec(d, m, "command -v kubeadm kubelet"); err != nil {
		t.Errorf("Host %s in Standby lost its node software: %v: %s", name, err, out)
	}
	return took
}

// setMode changes a tenant's spec.mode.
func (e *env) setMode(t *testing.T, name string, mode apiary.Mode) {
	t.Helper()
	framework.Eventually(t, name+" spec.mode "+string(mode), 30*time.Second, func() error {
		tcp := e.TCP(t, name)
		tcp.Spec.Mode = mode
		return e.C.Update(e.Ctx, tcp)
	})
}

// waitMode waits until mode is in effect and no switch runs.
func (e *env) waitMode(t *testing.T, name string, mode apiary.Mode, timeout time.Duration) *apiary.TenantControlPlane {
	t.Helper()
	var tcp *apiary.TenantControlPlane
	framework.Eventually(t, name+" in mode "+string(mode), timeout, func() error {
		tcp = e.TCP(t, name)
		if tcp.Status.Mode != mode {
			c := framework.FindCondition(tcp.Status.Conditions, apiary.ConditionModeSwitched)
			return fmt.Errorf("status.mode %s; ModeSwitched %+v", tcp.Status.Mode, c)
		}
		return framework.ConditionIs(tcp.Status.Conditions, apiary.ConditionModeSwitched, metav1.ConditionTrue, "")
	})
	return tcp
}

// testSwitchBothWays switches the shared tenant alpha from standalone to
// registered on one control-plane Host (in Standby, joined by the switch),
// first reversed mid-way and then through, and back, while a client
// polls /version and another writes and reads ConfigMaps through the
// endpoint every 100 ms: no request fails, the endpoint, CA and exported
// kubeconfig do not change, what was stored before is still there, and
// afterwards the host has left the tenant: no control-plane Node, process
// or file.
func (e *env) testSwitchBothWays(t *testing.T, d *sshhost.Docker, h *sshhost.Host, hostName string) {
	const name = "alpha"
	ns := framework.TenantsNS
	before := e.TCP(t, name)
	kcBefore := e.ExportKubeconfig(t, name)
	kubeconfigBefore := readFile(t, kcBefore)
	caBefore := tenantSecret(t, e, before, render.SecretCA)[render.KeyTLSCert]
	framework.Kubectl(t, kcBefore, "create", "namespace", "switch-e2e")
	framework.Kubectl(t, kcBefore, "-n", "switch-e2e", "create", "configmap", "before-switch", "--from-literal=k=v")
	t.Cleanup(func() { _, _ = framework.KubectlErr(kcBefore, "delete", "namespace", "switch-e2e", "--wait=false") })

	cs := e.tenantClient(t, kcBefore)
	// A control-plane Host of the standalone tenant: installed, not
	// joined (StandaloneControlPlaneHostStandsBy made it one).
	e.setHostRole(t, hostName, apiary.HostRoleControlPlane)
	e.waitStandby(t, d, h, cs, hostName)
	e.waitHostAdmitted(t, hostName, h.Address)
	e.testSwitchCheckOnly(t, d, h, hostName)
	restored := false
	t.Cleanup(func() {
		if !restored {
			e.setMode(t, name, apiary.ModeStandalone)
			e.waitMode(t, name, apiary.ModeStandalone, 6*time.Minute)
			e.setHostRole(t, hostName, apiary.HostRoleWorker)
			e.waitHostReady(t, hostName)
		}
	})

	c := e.startClients(t, name, "switch-e2e")

	// Reversed mid-way: spec.mode goes back to standalone while the host
	// starts (joined, its start step running). The switch turns round from
	// where it is: the host is stopped instead, status.mode never leaves
	// standalone, and the host leaves the tenant again.
	e.setMode(t, name, apiary.ModeRegistered)
	framework.Eventually(t, "Host "+hostName+" starting", 4*time.Minute, func() error {
		tcp := e.TCP(t, name)
		for _, h := range tcp.Status.ControlPlaneHosts {
			if h.Host == hostName && h.Step == apiary.HostStepStart && h.Result == "Running" {
				return nil
			}
		}
		return fmt.Errorf("status.controlPlaneHosts %+v", tcp.Status.ControlPlaneHosts)
	})
	start := time.Now()
	e.setMode(t, name, apiary.ModeStandalone)
	rev := e.waitMode(t, name, apiary.ModeStandalone, 6*time.Minute)
	reversed := time.Since(start)
	if sw := rev.Status.ModeSwitch; sw == nil || sw.Reversed != 1 || sw.From != apiary.ModeStandalone || sw.Target != apiary.ModeStandalone {
		t.Errorf("after the reversal status.modeSwitch %+v, want from and to standalone, reversed once", sw)
	}
	if len(rev.Status.ControlPlaneHosts) != 1 || rev.Status.ControlPlaneHosts[0].Step != apiary.HostStepStop || rev.Status.ControlPlaneHosts[0].Result != "Succeeded" {
		t.Errorf("after the reversal status.controlPlaneHosts %+v, want %s stopped", rev.Status.ControlPlaneHosts, hostName)
	}
	e.waitStandby(t, d, h, cs, hostName)
	t.Logf("FIGURE switch to registered reversed while the host started: back in standalone %s later", reversed.Round(100*time.Millisecond))

	// standalone → registered.
	start = time.Now()
	e.setMode(t, name, apiary.ModeRegistered)
	reg := e.waitMode(t, name, apiary.ModeRegistered, 8*time.Minute)
	toRegistered := time.Since(start)
	if len(reg.Status.ControlPlaneHosts) != 1 || reg.Status.ControlPlaneHosts[0].Host != hostName ||
		reg.Status.ControlPlaneHosts[0].Step != apiary.HostStepStart || !reg.Status.ControlPlaneHosts[0].Serving {
		t.Errorf("status.controlPlaneHosts %+v, want %s started and serving", reg.Status.ControlPlaneHosts, hostName)
	}
	if sw := reg.Status.ModeSwitch; sw == nil || sw.From != apiary.ModeStandalone || sw.Target != apiary.ModeRegistered || sw.Phase != apiary.SwitchCompleted {
		t.Errorf("status.modeSwitch %+v", sw)
	}
	// No control-plane pod in the management cluster; the host alone,
	// ready, behind the Service (the operator's slice).
	e.checkHostsOnly(t, reg, h.Address)
	// The tenant sees its control plane as mirror Pods of the host's Node.
	framework.Eventually(t, "mirror Pods of the control plane", 2*time.Minute, func() error {
		out, err := framework.KubectlErr(kcBefore, "-n", "kube-system", "get", "pods", "-l", "tier=control-plane", "-o", "jsonpath={range .items[*]}{.metadata.name}={.status.phase} {end}")
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		for _, comp := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler"} {
			if !strings.Contains(out, comp+"-") {
				return fmt.Errorf("no mirror Pod of %s: %s", comp, out)
			}
		}
		return nil
	})
	// The control plane's files on the host: root's alone.
	defaulted := reg.DeepCopy()
	defaulted.Default()
	files, manifests := render.StaticPodPaths(render.Inputs{TCP: defaulted, Version: defaulted.Spec.Version})
	if out, err := e.hostExec(d, h, "stat -c '%a %U %n' "+strings.Join(append(files, manifests...), " ")); err != nil {
		t.Errorf("stat on the host: %v: %s", err, out)
	} else {
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			if !strings.HasPrefix(line, "600 root ") {
				t.Errorf("on the host: %s, want 600 root", line)
			}
		}
	}
	time.Sleep(3 * time.Second)

	// registered → standalone.
	start = time.Now()
	e.setMode(t, name, apiary.ModeStandalone)
	back := e.waitMode(t, name, apiary.ModeStandalone, 8*time.Minute)
	toStandalone := time.Since(start)
	time.Sleep(3 * time.Second)
	figures := c.check(t)

	if len(back.Status.ControlPlaneHosts) != 1 || back.Status.ControlPlaneHosts[0].Step != apiary.HostStepStop || back.Status.ControlPlaneHosts[0].Result != "Succeeded" {
		t.Errorf("status.controlPlaneHosts %+v, want %s stopped", back.Status.ControlPlaneHosts, hostName)
	}
	// Nothing of the control plane on the host, and no control-plane
	// Node: the host left the tenant.
	left := e.waitStandby(t, d, h, cs, hostName)
	var slices discoveryv1.EndpointSliceList
	if err := e.C.List(e.Ctx, &slices, client.InNamespace(ns), client.MatchingLabels{discoveryv1.LabelManagedBy: render.EndpointSliceManager}); err != nil || len(slices.Items) != 0 {
		t.Errorf("the operator's EndpointSlices left: %d (%v)", len(slices.Items), err)
	}
	// The same tenant to its clients.
	if back.Status.Endpoint != before.Status.Endpoint {
		t.Errorf("endpoint %s, was %s", back.Status.Endpoint, before.Status.Endpoint)
	}
	if !bytes.Equal(tenantSecret(t, e, back, render.SecretCA)[render.KeyTLSCert], caBefore) {
		t.Error("the tenant CA changed")
	}
	if !bytes.Equal(readFile(t, e.ExportKubeconfig(t, name)), kubeconfigBefore) {
		t.Error("the exported kubeconfig changed")
	}
	framework.Kubectl(t, kcBefore, "-n", "switch-e2e", "get", "configmap", "before-switch")
	t.Logf("FIGURE switch standalone→registered (1 control-plane host, joined first) in %s, registered→standalone in %s (host in Standby %s later); %s",
		toRegistered.Round(100*time.Millisecond), toStandalone.Round(100*time.Millisecond), left.Round(100*time.Millisecond), figures)

	// A worker again: it joins (the next tests run pods on it).
	e.setHostRole(t, hostName, apiary.HostRoleWorker)
	restored = true
	e.waitHostReady(t, hostName)
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// switchCLI runs "apiary switch" as a user would, returning its output and
// error.
func (e *env) switchCLI(args ...string) (string, error) {
	var out, errOut bytes.Buffer
	cmd := cli.NewSwitchCommand(&cli.ConfigFlags{Kubeconfig: e.Kubeconfig, Namespace: framework.TenantsNS})
	cmd.SilenceUsage = true
	cmd.SetArgs(args)
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetIn(strings.NewReader(""))
	err := cmd.ExecuteContext(e.Ctx)
	return out.String() + errOut.String(), err
}

// testSwitchCheckOnly: "apiary switch --check-only" with the installed
// control-plane host (Standby) and two control-plane Hosts that cannot be used (one
// at a blackholed address, one refusing the tenant's SSH key) names both,
// fails, passes every check of the good one, and changes nothing.
func (e *env) testSwitchCheckOnly(t *testing.T, d *sshhost.Docker, h *sshhost.Host, hostName string) {
	bad := []string{"unreachable", "wrong-ssh-key"}
	for _, name := range bad {
		e.setHostRole(t, name, apiary.HostRoleControlPlane)
	}
	defer func() {
		for _, name := range bad {
			e.setHostRole(t, name, apiary.HostRoleWorker)
		}
	}()
	before := e.TCP(t, "alpha")
	// A host in Standby has no /etc/kubernetes at all.
	files := func() string {
		out, err := d.Exec(e.Ctx, h.Name, "sh", "-c", "ls -la --time-style=full-iso /etc/kubernetes /etc/kubernetes/manifests /etc/kubernetes/pki 2>&1; pgrep -l -x 'kube-apiserver|proxy-server|kubelet'; true")
		if err != nil {
			t.Fatalf("listing the host: %v: %s", err, out)
		}
		return out
	}
	filesBefore := files()
	start := time.Now()
	out, err := e.switchCLI("alpha", "registered", "--check-only")
	took := time.Since(start)
	t.Logf("apiary switch alpha registered --check-only (%s):\n%s", took.Round(time.Millisecond), out)
	if err == nil {
		t.Error("--check-only passed with two unusable control-plane Hosts")
	}
	for _, want := range []string{
		"✗ Host unreachable (", "✗ Host wrong-ssh-key (",
		"✓ Host " + hostName + " (" + h.Address + "): node software installed",
		"✗ Host wrong-ssh-key (",
		"✓ Host " + hostName + " (" + h.Address + "): SSH with the pinned host key",
		"✓ Host " + hostName + " (" + h.Address + "): control-plane ports free",
		"✓ Host " + hostName + " (" + h.Address + "): reaches the DataStore with the tenant's etcd certificate",
		"✓ Host " + hostName + " (" + h.Address + "): reaches the tenant endpoint with the tenant's credentials",
		"✓ tenant alpha: spec.mode registered accepted (server-side dry run)",
		"nothing was changed",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("--check-only output lacks %q", want)
		}
	}
	after := e.TCP(t, "alpha")
	if after.Generation != before.Generation || after.Spec.Mode != before.Spec.Mode {
		t.Errorf("--check-only changed the tenant: generation %d → %d, spec.mode %s → %s", before.Generation, after.Generation, before.Spec.Mode, after.Spec.Mode)
	}
	if got := files(); got != filesBefore {
		t.Errorf("--check-only changed the host:\nbefore:\n%s\nafter:\n%s", filesBefore, got)
	}
	t.Logf("FIGURE switch --check-only over 3 control-plane Hosts (1 usable) in %s", took.Round(time.Millisecond))
}
