package controllers

// A joined Host follows its tenant's CA rotation (tenant_ca.go): it trusts
// the bundle the tenant publishes in status.caRotation.trust (step
// ca-trust), and once the tenant signs with the new CA its kubelet asks
// for new client and serving certificates through CSRs (step ca-kubelet).
// One Host of a tenant at a time: each step restarts the kubelet.

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	bootstraputil "k8s.io/cluster-bootstrap/token/util"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	"github.com/apiaryhq/apiary/hosts"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/operator/render"
	"github.com/apiaryhq/apiary/pki"
)

// The journal steps of a CA rotation on a Host.
const (
	StepCATrust   = "ca-trust"
	StepCAKubelet = "ca-kubelet"
)

// Reasons of a Host's CAUpToDate condition.
const (
	ReasonCAHeld        = "Held"
	ReasonCARotating    = "Rotating"
	ReasonCAStepFailed  = "CARotationFailed"
	ReasonCAWaitingTurn = "WaitingForTurn"
)

const (
	// caKubeletWait bounds the wait for the kubelet's new client
	// certificate (a bootstrap CSR the tenant approves by itself).
	caKubeletWait = 90
	// caServingWait bounds the wait for its new serving certificate.
	caServingWait = 90 * time.Second
	// kubeletAnswerWait bounds the wait for a restarted kubelet to answer
	// through the tenant's API server again.
	kubeletAnswerWait = 2 * time.Minute
	caTurnPoll        = 5 * time.Second
)

// caWorker moves a joined Host to what its tenant's CA rotation asks. It
// returns busy while a step is under way.
func (r *HostReconciler) caWorker(ctx context.Context, orig, h *apiary.Host) (ctrl.Result, bool, error) {
	st := &h.Status
	if join := journalStep(st, StepJoin); st.NodeName == "" || join == nil || join.Result != StepSucceeded {
		return ctrl.Result{}, false, nil
	}
	var tcp apiary.TenantControlPlane
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: h.Namespace, Name: h.Spec.TenantControlPlane}, &tcp); err != nil {
		return ctrl.Result{}, false, client.IgnoreNotFound(err)
	}
	rot := tcp.Status.CARotation
	active := rot != nil && rot.Completed == nil
	if st.CA == nil {
		if active {
			// Joined before Hosts recorded it: every step runs (each is
			// idempotent).
			st.CA = &apiary.HostCA{}
		} else if held, err := r.heldCA(ctx, &tcp); err == nil {
			st.CA = held
		}
	}
	name := ""
	switch {
	case !active:
	case st.CA.Trust != rot.Trust:
		name = StepCATrust
	case rot.KubeletIssuer != "" && st.CA.KubeletIssuer != rot.KubeletIssuer:
		name = StepCAKubelet
	}
	if name == "" {
		// Nothing to do, or a step of ours that was Running is done.
		if st.CA != nil && st.CA.Trust != "" {
			r.setCondition(h, apiary.HostConditionCAUpToDate, metav1.ConditionTrue, ReasonCAHeld,
				fmt.Sprintf("trusts CA bundle %s; kubelet certificates of CA %s", st.CA.Trust, st.CA.KubeletIssuer))
		}
		return ctrl.Result{}, false, nil
	}
	step := journalStep(st, name)
	if step == nil || step.Result == StepSucceeded {
		// A new step of this rotation: one Host of the tenant at a time.
		r.upgradeSlots.Lock()
		defer r.upgradeSlots.Unlock()
		ahead, err := r.caPeers(ctx, h)
		if err != nil {
			return ctrl.Result{}, false, err
		}
		if len(ahead) > 0 {
			r.setCondition(h, apiary.HostConditionCAUpToDate, metav1.ConditionFalse, ReasonCAWaitingTurn,
				fmt.Sprintf("waits for its turn in CA rotation %q (%s): %s", rot.Token, rot.Phase, strings.Join(ahead, ", ")))
			return ctrl.Result{RequeueAfter: caTurnPoll}, false, nil
		}
		st.Journal = slices.DeleteFunc(st.Journal, func(s apiary.HostStep) bool { return s.Name == name })
		r.startStep(h, name)
		r.setCondition(h, apiary.HostConditionCAUpToDate, metav1.ConditionFalse, ReasonCARotating,
			fmt.Sprintf("CA rotation %q (%s): %s", rot.Token, rot.Phase, name))
		if err := r.writeStatus(ctx, orig, h); err != nil {
			return ctrl.Result{}, false, err
		}
		return ctrl.Result{Requeue: true}, true, nil
	}
	wait, start := r.stepDue(h.UID, step)
	if wait > 0 {
		return ctrl.Result{RequeueAfter: wait}, true, nil
	}
	if start {
		r.startStep(h, name)
		return ctrl.Result{Requeue: true}, true, nil
	}
	fn := r.caTrustStep
	if name == StepCAKubelet {
		fn = r.caKubeletStep
	}
	res, ended := r.runStep(ctx, h, step, fn)
	if !ended {
		return res, true, nil
	}
	if step = journalStep(st, name); step.Result == StepSucceeded {
		return ctrl.Result{Requeue: true}, true, nil
	}
	return res, true, nil
}

// heldCA is what a Host joined before Hosts recorded it holds, outside a
// rotation: the tenant's bundle and CA.
func (r *HostReconciler) heldCA(ctx context.Context, tcp *apiary.TenantControlPlane) (*apiary.HostCA, error) {
	trust, ca, err := r.tenantCAs(ctx, tcp)
	if err != nil {
		return nil, err
	}
	return &apiary.HostCA{Trust: pki.Fingerprint(trust), KubeletIssuer: pki.Fingerprint(ca)}, nil
}

// tenantCAs reads the tenant's trust bundle and CA certificate.
func (r *HostReconciler) tenantCAs(ctx context.Context, tcp *apiary.TenantControlPlane) (trust, ca []byte, err error) {
	var t, c corev1.Secret
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: tcp.Namespace, Name: render.SecretName(tcp, render.SecretCATrust)}, &t); err != nil {
		return nil, nil, fmt.Errorf("reading the tenant's CA bundle: %w", err)
	}
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: tcp.Namespace, Name: render.SecretName(tcp, render.SecretCA)}, &c); err != nil {
		return nil, nil, fmt.Errorf("reading the tenant CA: %w", err)
	}
	return t.Data[render.KeyCACert], c.Data[render.KeyTLSCert], nil
}

// caPeers names the other Hosts of h's tenant with a CA step under way
// (or failed), read from the API server.
func (r *HostReconciler) caPeers(ctx context.Context, h *apiary.Host) ([]string, error) {
	var list apiary.HostList
	if err := r.APIReader.List(ctx, &list, client.InNamespace(h.Namespace)); err != nil {
		return nil, fmt.Errorf("listing the tenant's Hosts: %w", err)
	}
	var out []string
	for _, o := range list.Items {
		if o.UID == h.UID || o.Spec.TenantControlPlane != h.Spec.TenantControlPlane || !o.DeletionTimestamp.IsZero() {
			continue
		}
		for _, name := range []string{StepCATrust, StepCAKubelet} {
			if s := journalStep(&o.Status, name); s != nil && s.Result != StepSucceeded {
				out = append(out, o.Name)
				break
			}
		}
	}
	return out, nil
}

// failCA ends a CA step as failed; it is tried again after the backoff,
// and the tenant's rotation waits meanwhile.
func (r *HostReconciler) failCA(ctx context.Context, h *apiary.Host, step *apiary.HostStep, msg string) ctrl.Result {
	return r.failStep(ctx, h, step, apiary.HostConditionCAUpToDate, ReasonCAStepFailed,
		fmt.Sprintf("CA rotation step %s failed: %s; the tenant's rotation waits and the step is tried again", step.Name, msg))
}

// caTrustStep writes the tenant's current trust bundle to the host.
func (r *HostReconciler) caTrustStep(ctx context.Context, h *apiary.Host, step *apiary.HostStep) ctrl.Result {
	ta, _, err := r.tenant(ctx, h)
	if err != nil {
		return r.failCA(ctx, h, step, err.Error())
	}
	rot := ta.tcp.Status.CARotation
	if rot == nil || pki.Fingerprint(ta.trustPEM) != rot.Trust {
		// The Secret read is older or newer than the tenant's status.
		step.Message = "waiting for the tenant's CA bundle to match its status"
		return ctrl.Result{RequeueAfter: time.Second}
	}
	c, _, err := r.connect(ctx, h)
	if err != nil {
		return r.failCA(ctx, h, step, err.Error())
	}
	defer c.Close()
	runCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	restarted, err := hosts.TrustCA(runCtx, c, ta.trustPEM)
	if err != nil {
		return r.failCA(ctx, h, step, err.Error())
	}
	// Checked on a retry too: the restart may be what failed.
	away, err := kubeletAnswers(ctx, ta.cs, h.Status.NodeName, kubeletAnswerWait)
	if err != nil {
		return r.failCA(ctx, h, step, err.Error())
	}
	msg := fmt.Sprintf("trusts CA bundle %s (%s)", rot.Trust, hosts.KubeletCAFile)
	if restarted {
		msg += fmt.Sprintf("; kubelet restarted with it in its kubeconfig, answering through the API server %s later", away.Round(100*time.Millisecond))
	}
	r.succeedStep(step, msg)
	held := heldOrNone(h)
	held.Trust = rot.Trust
	h.Status.CA = held
	return ctrl.Result{}
}

// heldOrNone is a copy of what the Host records it holds (empty when
// nothing), to change one field of.
func heldOrNone(h *apiary.Host) *apiary.HostCA {
	if h.Status.CA == nil {
		return &apiary.HostCA{}
	}
	return h.Status.CA.DeepCopy()
}

// caKubeletStep gives the kubelet client and serving certificates of the
// tenant's new CA through CSRs.
func (r *HostReconciler) caKubeletStep(ctx context.Context, h *apiary.Host, step *apiary.HostStep) ctrl.Result {
	st := &h.Status
	ta, _, err := r.tenant(ctx, h)
	if err != nil {
		return r.failCA(ctx, h, step, err.Error())
	}
	rot := ta.tcp.Status.CARotation
	if rot == nil || rot.KubeletIssuer == "" || pki.Fingerprint(ta.caPEM) != rot.KubeletIssuer {
		step.Message = "waiting for the tenant's CA to match its status"
		return ctrl.Result{RequeueAfter: time.Second}
	}
	if st.BootstrapTokenID == "" {
		// The token's ID is recorded (the caller writes the status)
		// before the token exists, as at the join.
		token, err := bootstraputil.GenerateBootstrapToken()
		if err != nil {
			return r.failCA(ctx, h, step, err.Error())
		}
		st.BootstrapTokenID, _, _ = strings.Cut(token, ".")
		step.Message = "bootstrap token " + st.BootstrapTokenID + " recorded"
		return ctrl.Result{Requeue: true}
	}
	c, _, err := r.connect(ctx, h)
	if err != nil {
		return r.failCA(ctx, h, step, err.Error())
	}
	defer c.Close()
	ca, err := pki.ParseBundle(ta.caPEM)
	if err != nil {
		return r.failCA(ctx, h, step, "the tenant CA: "+err.Error())
	}
	signed := func(pemData []byte) bool {
		certs, err := pki.ParseBundle(pemData)
		return err == nil && certs[0].CheckSignatureFrom(ca[0]) == nil
	}
	clientPEM, servingPEM, err := hosts.KubeletCertificates(ctx, c)
	if err != nil {
		return r.failCA(ctx, h, step, err.Error())
	}
	began := time.Now()
	var clientAfter time.Duration
	if !signed(clientPEM) || !signed(servingPEM) {
		token, err := r.joinToken(ctx, h, ta)
		if err != nil {
			return r.failCA(ctx, h, step, err.Error())
		}
		// The new CA alone: every API server serves a certificate of it
		// by now (the tenant publishes KubeletIssuer only then), so the
		// kubelet's kubeconfig need not trust the old one, and the
		// DropOld phase has no kubelet restart to make.
		runCtx, cancel := context.WithTimeout(ctx, 3*time.Minute)
		err = hosts.RenewKubeletCredentials(runCtx, c, ta.caPEM, token, caKubeletWait)
		cancel()
		if err != nil {
			return r.failCA(ctx, h, step, err.Error())
		}
		clientAfter = time.Since(began)
	}
	// The serving certificate's CSR is checked and approved here, as the
	// Host's observation does, without waiting for its next poll.
	deadline := time.Now().Add(caServingWait)
	for {
		if clientPEM, servingPEM, err = hosts.KubeletCertificates(ctx, c); err != nil {
			return r.failCA(ctx, h, step, err.Error())
		}
		if signed(clientPEM) && signed(servingPEM) {
			break
		}
		if time.Now().After(deadline) {
			return r.failCA(ctx, h, step, fmt.Sprintf("the kubelet has no client and serving certificates of the new CA after %s (client: %t, serving: %t)", caServingWait, signed(clientPEM), signed(servingPEM)))
		}
		if node, err := ta.cs.CoreV1().Nodes().Get(ctx, st.NodeName, metav1.GetOptions{}); err == nil {
			if _, err := r.approveServingCSRs(ctx, h, ta, node); err != nil {
				step.Message = "approving the kubelet's serving CSR: " + err.Error()
			}
		}
		select {
		case <-ctx.Done():
			return r.failCA(ctx, h, step, ctx.Err().Error())
		case <-time.After(500 * time.Millisecond):
		}
	}
	servingAfter := time.Since(began)
	if _, err := kubeletAnswers(ctx, ta.cs, st.NodeName, kubeletAnswerWait); err != nil {
		return r.failCA(ctx, h, step, err.Error())
	}
	if err := r.deleteJoinToken(ctx, h, ta); err != nil {
		return r.failCA(ctx, h, step, err.Error())
	}
	r.succeedStep(step, fmt.Sprintf("kubelet client and serving certificates of CA %s, through CSRs (client certificate after %s, serving certificate after %s, answering through the API server after %s)",
		rot.KubeletIssuer, clientAfter.Round(100*time.Millisecond), servingAfter.Round(100*time.Millisecond), time.Since(began).Round(100*time.Millisecond)))
	held := heldOrNone(h)
	held.KubeletIssuer = rot.KubeletIssuer
	st.CA = held
	return ctrl.Result{}
}

// kubeletAnswers waits until the Node's kubelet answers /healthz through
// the tenant's API server (nodes/proxy: API server, konnectivity, kubelet,
// the path of kubectl logs and exec, the API server verifying the
// kubelet's serving certificate against the tenant's bundle). A step that
// restarts the kubelet ends only then: one Host at a time then means one
// kubelet away at a time, and the journal says how long each was away.
// It returns how long it waited.
func kubeletAnswers(ctx context.Context, cs kubernetes.Interface, node string, wait time.Duration) (time.Duration, error) {
	began := time.Now()
	for {
		callCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		body, err := cs.CoreV1().RESTClient().Get().Resource("nodes").Name(node).SubResource("proxy").Suffix("healthz").DoRaw(callCtx)
		cancel()
		if err == nil && strings.TrimSpace(string(body)) == "ok" {
			return time.Since(began), nil
		}
		if err == nil {
			err = fmt.Errorf("it answered %q", firstLineOf(string(body), 200))
		}
		if time.Since(began) > wait {
			return 0, fmt.Errorf("the kubelet of Node %s does not answer /healthz through the tenant's API server after %s: %s", node, wait, firstLineOf(err.Error(), 300))
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// firstLineOf is s's first line, cut to at most n bytes.
func firstLineOf(s string, n int) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	if len(s) > n {
		s = strings.ToValidUTF8(s[:n], "") + "…"
	}
	return s
}

// tenantChangesCA passes a tenant change that asks its Hosts to hold
// another CA bundle or kubelet issuer.
func tenantChangesCA() predicate.Predicate {
	return predicate.Funcs{
		CreateFunc: func(event.CreateEvent) bool { return false },
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, ok1 := e.ObjectOld.(*apiary.TenantControlPlane)
			n, ok2 := e.ObjectNew.(*apiary.TenantControlPlane)
			return ok1 && ok2 && !equality.Semantic.DeepEqual(caAsk(o), caAsk(n))
		},
		DeleteFunc:  func(event.DeleteEvent) bool { return false },
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
}

func caAsk(t *apiary.TenantControlPlane) [3]string {
	rot := t.Status.CARotation
	if rot == nil {
		return [3]string{}
	}
	return [3]string{rot.Trust, rot.KubeletIssuer, fmt.Sprint(rot.Completed != nil)}
}

// caStepFreed passes a Host ending a CA step: the tenant's other Hosts
// take their turn now.
func caStepFreed() predicate.Predicate {
	return predicate.Funcs{
		CreateFunc: func(event.CreateEvent) bool { return false },
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, ok1 := e.ObjectOld.(*apiary.Host)
			n, ok2 := e.ObjectNew.(*apiary.Host)
			return ok1 && ok2 && !equality.Semantic.DeepEqual(o.Status.CA, n.Status.CA)
		},
		DeleteFunc:  func(event.DeleteEvent) bool { return false },
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
}
