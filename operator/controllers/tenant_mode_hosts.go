package controllers

// The host side of the mode switch: which Hosts should run the tenant's
// control plane, and one journaled step at a time on one of them (start,
// update, stop) over SSH.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/apiaryhq/apiary/hosts"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/operator/render"
)

// wantedHosts are the tenant's Hosts that should run its control plane:
// its control-plane Hosts (spec.role, not being deleted) for which
// wantsControlPlane says so.
func (r *TenantControlPlaneReconciler) wantedHosts(ctx context.Context, tcp *apiary.TenantControlPlane) (map[string]*apiary.Host, error) {
	var list apiary.HostList
	if err := r.Client.List(ctx, &list, client.InNamespace(tcp.Namespace)); err != nil {
		return nil, fmt.Errorf("listing the Hosts of %s: %w", tcp.Namespace, err)
	}
	on := controlPlaneOn(tcp)
	out := map[string]*apiary.Host{}
	for i := range list.Items {
		h := &list.Items[i]
		if h.Spec.TenantControlPlane != tcp.Name || h.Spec.Role != apiary.HostRoleControlPlane || !h.DeletionTimestamp.IsZero() {
			continue
		}
		if wantsControlPlane(h, slices.Contains(on, h.Name)) {
			out[h.Name] = h
		}
	}
	return out, nil
}

// wantsControlPlane says whether a control-plane Host should run its
// tenant's control plane. One that does not yet (runs false) starts once
// joined with its Node Ready (phase Ready). One that runs it keeps it for
// as long as it stays joined, whatever its phase says meanwhile: its Node
// NotReady for a while (its kubelet restarting in a CA step, heartbeats
// lost while another host's control plane restarts), a kubelet upgrade
// under way, a failed upgrade or CA step (retried). Taking the control
// plane off then would remove a backend just when the tenant is short of
// one, and make the Node's trouble worse; a host that no longer answers
// leaves the Service by its probe instead. It stops when the Host leaves
// (role, deletion, standby: NodeName cleared, phase Draining or
// Resetting).
func wantsControlPlane(h *apiary.Host, runs bool) bool {
	st := &h.Status
	if st.Phase == apiary.HostPhaseReady {
		return true
	}
	if !runs || st.NodeName == "" {
		return false
	}
	switch st.Phase {
	case apiary.HostPhaseJoining, apiary.HostPhaseUpgrading, apiary.HostPhaseFailed:
		return true
	}
	return false
}

// joiningHosts names the tenant's control-plane Hosts on their way to
// joining (Standby, Joining, or finishing a leave first), with their
// phase: a switch to registered waits for them, so that every
// control-plane Host serves before the hosted pods go. A Host that fails
// to join (phase Failed) is not waited for.
func (r *TenantControlPlaneReconciler) joiningHosts(ctx context.Context, tcp *apiary.TenantControlPlane) ([]string, error) {
	var list apiary.HostList
	if err := r.Client.List(ctx, &list, client.InNamespace(tcp.Namespace)); err != nil {
		return nil, fmt.Errorf("listing the Hosts of %s: %w", tcp.Namespace, err)
	}
	var out []string
	for _, h := range list.Items {
		if h.Spec.TenantControlPlane != tcp.Name || h.Spec.Role != apiary.HostRoleControlPlane || !h.DeletionTimestamp.IsZero() {
			continue
		}
		switch h.Status.Phase {
		case apiary.HostPhaseStandby, apiary.HostPhaseJoining, apiary.HostPhaseDraining, apiary.HostPhaseResetting:
			out = append(out, fmt.Sprintf("%s (%s)", h.Name, h.Status.Phase))
		}
	}
	slices.Sort(out)
	return out, nil
}

// driveHosts takes one step on one host towards the wanted set (the
// control-plane Hosts when the target is registered, none when it is
// standalone), probes the serving ones and applies the slice. It returns
// when to look again (0 when every host is where it should be) and what it
// waits for. keepOne refuses to stop the last serving host (registered
// mode in effect: nothing else serves).
func (r *TenantControlPlaneReconciler) driveHosts(ctx context.Context, tcp *apiary.TenantControlPlane, in modeInputs, keepOne bool) (time.Duration, string, error) {
	st := &tcp.Status
	target := st.Mode
	if st.ModeSwitch != nil {
		target = st.ModeSwitch.Target
	}
	wanted := map[string]*apiary.Host{}
	if target == apiary.ModeRegistered {
		var err error
		if wanted, err = r.wantedHosts(ctx, tcp); err != nil {
			return 0, "", err
		}
	}
	files, manifests, err := r.hostControlPlane(tcp, in)
	if err != nil {
		return 0, "", err
	}
	configHash := hostConfigHash(files, manifests)

	// Probe what serves: a host that stops answering leaves the slice.
	for i := range st.ControlPlaneHosts {
		h := &st.ControlPlaneHosts[i]
		if h.Step != apiary.HostStepStop && h.Result == resultSucceeded {
			h.Serving = probeHost(ctx, in.cr.trust, in.ep, h.Address) == nil
		}
	}

	next, why, err := r.hostStep(ctx, tcp, in, wanted, files, manifests, configHash, keepOne)
	if err != nil {
		return 0, "", err
	}
	slices.SortFunc(st.ControlPlaneHosts, func(a, b apiary.ControlPlaneHostStatus) int { return strings.Compare(a.Host, b.Host) })
	return next, why, r.applySlices(ctx, tcp)
}

// hostStep picks the one host step to take now and takes it.
func (r *TenantControlPlaneReconciler) hostStep(ctx context.Context, tcp *apiary.TenantControlPlane, in modeInputs, wanted map[string]*apiary.Host,
	files, manifests []render.HostFile, configHash string, keepOne bool) (time.Duration, string, error) {
	st := &tcp.Status
	now := r.Now()
	// A step under way goes on.
	for i := range st.ControlPlaneHosts {
		if h := &st.ControlPlaneHosts[i]; h.Result == resultRunning {
			return r.continueHost(ctx, tcp, in, h, wanted[h.Host], files, manifests, configHash)
		}
	}
	begin := func(h *apiary.ControlPlaneHostStatus, step, address string) (time.Duration, string, error) {
		if h.Step != step || h.Result == resultSucceeded {
			h.Attempts = 0
		}
		h.Step, h.Result, h.Attempts = step, resultRunning, h.Attempts+1
		h.Started, h.Finished, h.Message = metav1.NewTime(now), nil, ""
		h.Address = address
		switch {
		case step == apiary.HostStepStart:
		case (step == apiary.HostStepUpdate || step == apiary.HostStepKubelet) && h.Serving && servingHosts(st) == 1 && st.ReadyReplicas == 0:
			// The only backend: taking it out would leave the address
			// with nothing behind it for the drain and the restart. It
			// is rewritten (or its kubelet upgraded) in place: clients
			// see its restart.
		default:
			// Out of the Service before anything changes on the host.
			h.Serving = false
		}
		// The journal is written before the host is touched.
		return time.Millisecond, fmt.Sprintf("Host %s: %s", h.Host, step), nil
	}
	// New entries are appended; driveHosts sorts the list once the step
	// is taken (no pointer into it is kept past that).
	entry := func(name string) *apiary.ControlPlaneHostStatus {
		for i := range st.ControlPlaneHosts {
			if st.ControlPlaneHosts[i].Host == name {
				return &st.ControlPlaneHosts[i]
			}
		}
		st.ControlPlaneHosts = append(st.ControlPlaneHosts, apiary.ControlPlaneHostStatus{Host: name})
		return &st.ControlPlaneHosts[len(st.ControlPlaneHosts)-1]
	}
	// A failed step stops everything else until it is tried again.
	if f := failedHost(st); f != nil {
		if left := hostRetryAfter - now.Sub(f.Finished.Time); left > 0 {
			return left, "", nil
		}
		address := f.Address
		if h, ok := wanted[f.Host]; ok {
			address = h.Spec.Address
		} else if f.Step != apiary.HostStepStop {
			// No longer wanted: stop it rather than start it again.
			return begin(f, apiary.HostStepStop, address)
		}
		return begin(f, f.Step, address)
	}
	// Hosts to stop: no longer wanted.
	for i := range st.ControlPlaneHosts {
		h := &st.ControlPlaneHosts[i]
		if _, ok := wanted[h.Host]; ok || h.Step == apiary.HostStepStop || h.Step == "" {
			continue
		}
		if keepOne && h.Serving && servingHosts(st) == 1 {
			return 0, fmt.Sprintf("Host %s is no longer a joined control-plane Host but is the last one serving: it keeps the control plane until another serves", h.Host), nil
		}
		return begin(h, apiary.HostStepStop, h.Address)
	}
	// Hosts to start or bring up to date, in name order.
	names := make([]string, 0, len(wanted))
	for name := range wanted {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		h, address := entry(name), wanted[name].Spec.Address
		switch {
		case h.Step == apiary.HostStepStop || h.Step == "":
			return begin(h, apiary.HostStepStart, address)
		case h.ConfigHash == configHash && h.Address == address:
			continue
		case manifestsOf(h.ConfigHash) == manifestsOf(configHash) && h.Address == address:
			// Only files changed (the quota policy, which kube-apiserver
			// reloads): written in place, nothing restarts.
			if err := r.rewriteFiles(ctx, tcp, h, files, manifests); err != nil {
				return 0, "", err
			}
			h.ConfigHash = configHash
		default:
			// Renewed credentials, a new version, a moved host: rewrite,
			// one host at a time, out of the Service while it restarts.
			return begin(h, apiary.HostStepUpdate, address)
		}
	}
	// Hosts whose kubelet asks to upgrade (up to date otherwise): out of
	// the Service first, one at a time.
	for _, name := range names {
		if wanted[name].Status.UpgradingTo != "" {
			return begin(entry(name), apiary.HostStepKubelet, wanted[name].Spec.Address)
		}
	}
	for _, h := range st.ControlPlaneHosts {
		if h.Step != apiary.HostStepStop && !h.Serving {
			return hostProbeEvery, fmt.Sprintf("Host %s does not answer /readyz: out of the Service until it does", h.Host), nil
		}
	}
	return 0, "", nil
}

// continueHost carries on with a running step.
func (r *TenantControlPlaneReconciler) continueHost(ctx context.Context, tcp *apiary.TenantControlPlane, in modeInputs, h *apiary.ControlPlaneHostStatus, host *apiary.Host,
	files, manifests []render.HostFile, configHash string) (time.Duration, string, error) {
	logger := log.FromContext(ctx).WithValues("host", h.Host, "step", h.Step, "attempt", h.Attempts)
	now := r.Now()
	fail := func(err error) (time.Duration, string, error) {
		t := metav1.NewTime(now)
		h.Result, h.Finished, h.Message = resultFailed, &t, err.Error()
		logger.Info("control-plane host step failed", "error", err.Error())
		r.Recorder.Eventf(tcp, nil, corev1.EventTypeWarning, "HostStepFailed", "SwitchMode", "Host %s, step %s, attempt %d: %s", h.Host, h.Step, h.Attempts, err.Error())
		return time.Millisecond, "", nil
	}
	succeed := func(msg string) (time.Duration, string, error) {
		t := metav1.NewTime(now)
		h.Result, h.Finished, h.Message = resultSucceeded, &t, msg
		logger.Info("control-plane host step done", "took", now.Sub(h.Started.Time).String())
		r.Recorder.Eventf(tcp, nil, corev1.EventTypeNormal, "HostStepSucceeded", "SwitchMode", "Host %s, step %s: %s", h.Host, h.Step, msg)
		return time.Millisecond, "", nil
	}
	// Connections drain off a host that left the Service before it
	// changes.
	if h.Step == apiary.HostStepStop || (h.Step == apiary.HostStepUpdate || h.Step == apiary.HostStepKubelet) && !h.Serving {
		if left := drainFor - now.Sub(h.Started.Time); left > 0 {
			return left, fmt.Sprintf("Host %s left the Service; draining for %s", h.Host, left.Round(time.Second)), nil
		}
	}
	if host == nil && h.Step != apiary.HostStepStop {
		// No longer wanted mid-start: stop it instead.
		h.Step, h.Attempts, h.Started = apiary.HostStepStop, 1, metav1.NewTime(now)
		return drainFor, fmt.Sprintf("Host %s is no longer wanted: stopping it", h.Host), nil
	}
	if h.Step == apiary.HostStepKubelet {
		// The Host upgrades its kubelet (its own journal); the host
		// comes back once that ends and its kube-apiserver answers.
		if host.Status.UpgradingTo != "" {
			h.Message = fmt.Sprintf("Host %s upgrades its kubelet to %s (phase %s)", h.Host, host.Status.UpgradingTo, host.Status.Phase)
			return hostProbeEvery, h.Message, nil
		}
		since := h.Started.Time
		if done := journalStep(&host.Status, StepUpgradeReady); done != nil && done.Finished != nil && done.Finished.After(since) {
			since = done.Finished.Time
		}
		return r.backInService(ctx, tcp, in, h, since, now, fail, succeed)
	}
	c, err := r.dialHost(ctx, tcp, h.Host)
	if err != nil {
		return fail(err)
	}
	defer c.Close()
	if h.Step == apiary.HostStepStop {
		if err := hosts.RemoveControlPlane(ctx, c, pathsOf(manifests), render.WithEarlierSpecFiles(pathsOf(files)), []string{render.KubeletCAPath}, hostRemoveWait); err != nil {
			return fail(err)
		}
		h.ConfigHash = ""
		return succeed("static Pods and files removed; no control-plane process left")
	}
	if h.Step == apiary.HostStepStart && h.ConfigHash == "" {
		// A port something else holds would leave a component crash
		// looping on the host: refused before anything is written. Once
		// the journal has the write (ConfigHash), the polls for /readyz
		// skip it; PortsTaken itself covers a write the journal missed.
		ports := render.StaticPodPorts(r.hostInputs(tcp, in))
		used, err := hosts.PortsTaken(ctx, c, ports, pathsOf(manifests))
		if err != nil {
			return fail(err)
		}
		if len(used) > 0 {
			return fail(fmt.Errorf("ports %v are in use on the host (the control plane listens on %v); nothing was written; free them and the step is retried within %s",
				used, ports, hostRetryAfter))
		}
	}
	written, err := hosts.WriteControlPlane(ctx, c, toHostFiles(files), toHostFiles(manifests))
	if err != nil {
		return fail(err)
	}
	h.ConfigHash = configHash
	if written > 0 {
		// A rewritten manifest restarts its pod: look again once the
		// kubelet has stopped the old one.
		h.Message = fmt.Sprintf("%d files written; waiting for kube-apiserver /readyz", written)
		return 3 * time.Second, fmt.Sprintf("Host %s: control plane written, starting", h.Host), nil
	}
	return r.backInService(ctx, tcp, in, h, h.Started.Time, now, fail, succeed)
}

// backInService ends a host's step once its kube-apiserver answers /readyz
// and its konnectivity-server has its agents: the host serves again. The
// waits count from since: the step's start, or for a kubelet step the end
// of the Host's upgrade (which the host's owner paces).
func (r *TenantControlPlaneReconciler) backInService(ctx context.Context, tcp *apiary.TenantControlPlane, in modeInputs, h *apiary.ControlPlaneHostStatus, since, now time.Time,
	fail func(error) (time.Duration, string, error), succeed func(string) (time.Duration, string, error)) (time.Duration, string, error) {
	if err := probeHost(ctx, in.cr.trust, in.ep, h.Address); err != nil {
		if now.Sub(since) > hostStartTimeout {
			return fail(fmt.Errorf("kube-apiserver on %s did not answer /readyz within %s: %w", h.Address, hostStartTimeout, err))
		}
		h.Message = "waiting for kube-apiserver /readyz: " + err.Error()
		return 2 * time.Second, fmt.Sprintf("Host %s: waiting for its kube-apiserver", h.Host), nil
	}
	if why := r.agentsBehind(ctx, tcp, h, since, now); why != "" {
		h.Message = why
		return time.Second, fmt.Sprintf("Host %s: waiting for agents", h.Host), nil
	}
	h.Serving = true
	return succeed(fmt.Sprintf("kube-apiserver answers /readyz at %s after %s; in the Service", h.Address, now.Sub(h.Started.Time).Round(100*time.Millisecond)))
}

// hostControlPlane renders what a control-plane host runs, from the same
// inputs as the Deployment but for the DataStore address hosts use.
func (r *TenantControlPlaneReconciler) hostControlPlane(tcp *apiary.TenantControlPlane, in modeInputs) (files, manifests []render.HostFile, err error) {
	return render.StaticPods(r.hostInputs(tcp, in), in.exceeded)
}

func (r *TenantControlPlaneReconciler) hostInputs(tcp *apiary.TenantControlPlane, in modeInputs) render.Inputs {
	return render.Inputs{
		TCP:             tcp,
		Version:         targetVersion(tcp),
		Endpoint:        in.ep,
		EtcdServers:     in.ds.Status.HostEndpoints,
		EtcdPrefix:      tcp.Status.DataStore.Prefix,
		Secrets:         in.cr.data,
		ImageRepository: r.ImageRepository,
		Authentication:  in.authn,
	}
}

func pathsOf(fs []render.HostFile) []string {
	out := make([]string, 0, len(fs))
	for _, f := range fs {
		out = append(out, f.Path)
	}
	return out
}

func (r *TenantControlPlaneReconciler) dialHost(ctx context.Context, tcp *apiary.TenantControlPlane, name string) (*hosts.Client, error) {
	var h apiary.Host
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: tcp.Namespace, Name: name}, &h); err != nil {
		return nil, fmt.Errorf("reading Host %s: %w", name, err)
	}
	target, _, err := hosts.TargetOf(ctx, r.APIReader, &h)
	if err != nil {
		return nil, err
	}
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	c, err := hosts.Dial(dctx, target)
	if err != nil {
		return nil, fmt.Errorf("connecting to Host %s over SSH: %w", name, err)
	}
	return c, nil
}

// probeHost asks a host's kube-apiserver for /readyz at its own address,
// verified as the endpoint (its serving certificate names the endpoint).
func probeHost(ctx context.Context, trust []byte, ep render.Endpoint, address string) error {
	// One host, no load balancer: its refusal is final.
	return getReadyz(ctx, trust, ep.Host, "https://"+net.JoinHostPort(address, strconv.Itoa(int(ep.Port))), 1)
}

// rewriteFiles writes changed files (no manifest) to a serving host.
func (r *TenantControlPlaneReconciler) rewriteFiles(ctx context.Context, tcp *apiary.TenantControlPlane, h *apiary.ControlPlaneHostStatus, files, manifests []render.HostFile) error {
	c, err := r.dialHost(ctx, tcp, h.Host)
	if err != nil {
		return err
	}
	defer c.Close()
	if _, err := hosts.WriteControlPlane(ctx, c, toHostFiles(files), toHostFiles(manifests)); err != nil {
		return fmt.Errorf("Host %s: %w", h.Host, err)
	}
	return nil
}

// hostConfigHash is the ConfigHash of what a control-plane host runs.
func hostConfigHash(files, manifests []render.HostFile) string {
	return hashFiles(manifests) + "." + hashFiles(files)[:16]
}

// manifestsOf is the manifests' part of a ConfigHash.
func manifestsOf(configHash string) string {
	m, _, _ := strings.Cut(configHash, ".")
	return m
}

func toHostFiles(fs []render.HostFile) []hosts.File {
	out := make([]hosts.File, 0, len(fs))
	for _, f := range fs {
		out = append(out, hosts.File{Path: f.Path, Data: f.Data})
	}
	return out
}

func hashFiles(fs []render.HostFile) string {
	h := sha256.New()
	for _, f := range fs {
		fmt.Fprintf(h, "%s\x00%d\x00", f.Path, len(f.Data))
		h.Write(f.Data)
	}
	return hex.EncodeToString(h.Sum(nil))[:32]
}
