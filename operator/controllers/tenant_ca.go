package controllers

// A tenant's cluster CA is replaced without cutting anyone off, in three
// phases (status.caRotation), each waiting until everything has taken the
// last one in:
//
//   - TrustNew: a new CA (the ca-next Secret) joins the trust bundle (the
//     ca-trust Secret) that the API servers, the controller-manager (and
//     through it every pod's kube-root-ca.crt), the kubeconfigs,
//     cluster-info and each Host's kubelet trust; the old CA still issues.
//   - Reissue: the new CA becomes the tenant's CA: every leaf is re-issued
//     (their check finds them signed by a CA that was replaced), the
//     controller-manager signs with it, and once the control plane runs
//     the new leaves each Host's kubelet gets new client and serving
//     certificates through CSRs. Both CAs are still trusted.
//   - DropOld: the bundle holds the new CA alone; once everything runs
//     with it, a certificate of the old CA is refused everywhere.
//
// The phase is derived from the Secrets (ca-next exists: TrustNew; the
// bundle holds more than the CA: Reissue) and recorded in the status,
// which also tells the Hosts what to hold (Trust, KubeletIssuer).

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/operator/render"
	"github.com/apiaryhq/apiary/pki"
	"github.com/apiaryhq/apiary/tenant"
)

// Events of a CA rotation, one reason per phase: events.k8s.io merges an
// object's events of one reason into a series that keeps the first note.
const (
	ReasonCARotationStarted = "CARotationStarted"
	ReasonCARotationReissue = "CARotationReissue"
	ReasonCARotationDropOld = "CARotationDropOld"
	ReasonCARotated         = "CARotated"
)

// caRotationPoll is how often a rotation that waits for the tenant's
// pods or Hosts looks again.
const caRotationPoll = 3 * time.Second

// caTrust keeps the trust bundle (the ca-trust Secret) consistent with
// the tenant's CAs: the CA, the next one while it is being introduced, and
// the CA being replaced until the rotation drops it. A bundle that does
// not hold the CA (a new tenant, a CA re-issued because it was unreadable)
// becomes the CA alone.
func (r *TenantControlPlaneReconciler) caTrust(ctx context.Context, tcp *apiary.TenantControlPlane, cr *credentials, ca *pki.KeyPair) error {
	next := cr.caNext()
	data, why := cr.existing(render.SecretCATrust)
	have, _ := pki.ParseBundle(data[render.KeyCACert])
	want := data[render.KeyCACert]
	switch {
	case next != nil:
		want = pki.Bundle(ca.Cert, next.Cert)
	case !slices.ContainsFunc(have, ca.Cert.Equal):
		want = pki.Bundle(ca.Cert)
	}
	if data != nil && bytes.Equal(want, data[render.KeyCACert]) {
		cr.data[render.SecretCATrust] = data
		cr.trust = want
		return nil
	}
	if data != nil {
		why = "trust bundle changed"
	}
	if err := cr.write(ctx, render.SecretCATrust, map[string][]byte{render.KeyCACert: want}, why, false); err != nil {
		return err
	}
	cr.trust = want
	return nil
}

// caNext reads the CA a rotation moves to (nil when there is none). An
// unreadable one is left out: the rotation issues another (advanceCA).
func (cr *credentials) caNext() *pki.KeyPair {
	data, _ := cr.existing(render.SecretCANext)
	if data == nil {
		return nil
	}
	kp, err := pki.ParseKeyPair(data[render.KeyTLSCert], data[render.KeyTLSKey])
	if err != nil || pki.CAProblem(kp.Cert, cr.now) != "" {
		return nil
	}
	cr.data[render.SecretCANext] = data
	return kp
}

// caObserved is what the rotation waits for, as seen in this reconcile.
type caObserved struct {
	// controlPlane: every control-plane replica (pod or host) runs the
	// current credentials; else why not.
	controlPlane string
	// rootCA is the fingerprint of the bundle the tenant publishes to its
	// pods (kube-system/kube-root-ca.crt); "" when not read.
	rootCA string
	// rootCAErr says why it could not be read.
	rootCAErr error
	// addons says which addons' pods have not restarted with the bundle
	// of fingerprint addonsFor ("" when none lags).
	addons, addonsFor string
	// signerSince is when the controller-manager that leads now took the
	// lead (zero when not read): in the Reissue phase the kubelets ask
	// for certificates only from one that started with the new CA, so
	// that a CSR does not wait out the hand-over of the lease.
	signerSince time.Time
}

// signerSettle bounds the wait for a controller-manager that took the
// lead in the Reissue phase: one that never changes hands (nothing rolled
// it) does not hold the rotation.
const signerSettle = 90 * time.Second

// caRotationActive says whether a CA rotation is under way.
func caRotationActive(tcp *apiary.TenantControlPlane) bool {
	rot := tcp.Status.CARotation
	return rot != nil && rot.Completed == nil
}

// rootCAInput is the fingerprint the addons' pods carry
// (tenant.AnnotationRootCA): none before any CA rotation (nothing to roll
// for), then the bundle they were last restarted to read.
func rootCAInput(tcp *apiary.TenantControlPlane) string {
	if rot := tcp.Status.CARotation; rot != nil {
		return rot.AddonsTrust
	}
	return ""
}

// caRotationWanted says whether a CA rotation runs or is asked for: only
// then is what it waits for observed (the tenant reads below, and in
// registered mode a render of the static Pods).
func caRotationWanted(tcp *apiary.TenantControlPlane) bool {
	token := tcp.Annotations[apiary.AnnotationRotateCA]
	rot := tcp.Status.CARotation
	return caRotationActive(tcp) || token != "" && (rot == nil || rot.Token != token)
}

// observeCA reads what a running rotation waits for: whether the control
// plane runs the current credentials, the bundle the tenant publishes to
// its pods, whether its addons restarted with the current bundle and, in
// the Reissue phase, when the controller-manager lease last changed hands.
func (r *TenantControlPlaneReconciler) observeCA(ctx context.Context, tcp *apiary.TenantControlPlane, cr *credentials, in modeInputs, depRolled bool, api apiState) caObserved {
	var obs caObserved
	if !caRotationWanted(tcp) {
		return obs
	}
	obs.controlPlane = r.controlPlaneLag(tcp, in, depRolled)
	if !caRotationActive(tcp) || !api.answering() {
		return obs
	}
	tc, err := r.Tenants.For(tcp.UID, cr.data[render.SecretOperatorKubeconfig][apiary.KubeconfigKey])
	if err != nil {
		obs.rootCAErr = err
		return obs
	}
	cs := tc.Clientset
	if cm, err := cs.CoreV1().ConfigMaps(metav1.NamespaceSystem).Get(ctx, "kube-root-ca.crt", metav1.GetOptions{}); err != nil {
		obs.rootCAErr = fmt.Errorf("reading kube-system/kube-root-ca.crt inside the tenant: %w", err)
	} else {
		obs.rootCA = pki.Fingerprint([]byte(cm.Data["ca.crt"]))
	}
	obs.addonsFor = pki.Fingerprint(cr.trust)
	obs.addons = addonsLagging(ctx, cs, tcp, obs.addonsFor)
	if rot := tcp.Status.CARotation; rot.Phase == apiary.CARotationReissue && rot.KubeletIssuer == "" {
		if l, err := cs.CoordinationV1().Leases(metav1.NamespaceSystem).Get(ctx, "kube-controller-manager", metav1.GetOptions{}); err == nil && l.Spec.AcquireTime != nil {
			obs.signerSince = l.Spec.AcquireTime.Time
		}
	}
	return obs
}

// advanceCA starts a CA rotation asked for with the apiary.dev/rotate-ca
// annotation, and moves a running one to its next phase once everything
// has caught up with the current one. It returns how soon to look again.
func (r *TenantControlPlaneReconciler) advanceCA(ctx context.Context, tcp *apiary.TenantControlPlane, cr *credentials, ca *pki.KeyPair, obs caObserved) (time.Duration, error) {
	st := &tcp.Status
	now := metav1.NewTime(r.Now().UTC())
	token := tcp.Annotations[apiary.AnnotationRotateCA]
	rot := st.CARotation
	started := false
	if !caRotationActive(tcp) {
		if token == "" || rot != nil && rot.Token == token {
			return 0, nil
		}
		if st.Switching() {
			// Started once the switch is done (its watch brings us back).
			return 0, nil
		}
		addons := ""
		if rot != nil {
			addons = rot.AddonsTrust
		}
		st.CARotation = &apiary.CARotation{Token: token, Requested: now, Phase: apiary.CARotationTrustNew, PhaseStarted: now, AddonsTrust: addons}
		r.Recorder.Eventf(tcp, nil, corev1.EventTypeNormal, ReasonCARotationStarted, "RotateCA",
			"rotation %q: a new cluster CA is trusted alongside the old one, then issues every certificate, then the old one is dropped", token)
		rot, started = st.CARotation, true
	}
	enter := func(phase, reason, msg string) {
		rot.Phase, rot.PhaseStarted, rot.Message = phase, now, msg
		r.Recorder.Eventf(tcp, nil, corev1.EventTypeNormal, reason, "RotateCA", "rotation %q: %s: %s", rot.Token, phase, msg)
	}
	// Once the tenant publishes the current bundle to its pods, the
	// addons restart to read it (the next bootstrap).
	// (Not in the pass that starts a rotation: what was observed then is
	// from before it.)
	if trust := pki.Fingerprint(cr.trust); !started && obs.rootCAErr == nil && obs.rootCA == trust {
		rot.AddonsTrust = trust
	}
	switch rot.Phase {
	case apiary.CARotationTrustNew:
		next := cr.caNext()
		if next == nil {
			var err error
			if next, err = r.issueCANext(ctx, tcp, cr); err != nil {
				return 0, err
			}
			// The bundle takes it in at once.
			if err := r.caTrust(ctx, tcp, cr, ca); err != nil {
				return 0, err
			}
		}
		rot.Trust = pki.Fingerprint(cr.trust)
		if why := r.caLagging(ctx, tcp, cr, obs, true); why != "" {
			rot.Message = "the new CA is trusted alongside the old one once " + why
			return caRotationPoll, nil
		}
		// The new CA becomes the tenant's: written before ca-next goes,
		// so that a failure in between leaves both the same (caNext of
		// an equal CA is dropped below on the next pass).
		keyPEM, err := next.KeyPEM()
		if err != nil {
			return 0, err
		}
		if err := cr.write(ctx, render.SecretCA, map[string][]byte{render.KeyTLSCert: next.CertPEM(), render.KeyTLSKey: keyPEM}, fmt.Sprintf("CA rotation %q", rot.Token), false); err != nil {
			return 0, err
		}
		if err := r.deleteOwned(ctx, tcp, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: tcp.Namespace, Name: render.SecretName(tcp, render.SecretCANext)}}); err != nil {
			return 0, err
		}
		delete(cr.byKind, render.SecretCANext)
		delete(cr.data, render.SecretCANext)
		rot.KubeletIssuer = ""
		enter(apiary.CARotationReissue, ReasonCARotationReissue, "the new CA issues: every leaf certificate is re-issued and the control plane rolls; then each Host's kubelet gets new certificates")
		return time.Millisecond, nil
	case apiary.CARotationReissue:
		rot.Trust = pki.Fingerprint(cr.trust)
		if obs.controlPlane != "" {
			rot.Message = "waits for the control plane to run the re-issued certificates: " + obs.controlPlane
			return caRotationPoll, nil
		}
		// The controller-manager signs with the new CA now: the kubelets
		// may ask for their certificates, once the lead has passed to a
		// controller-manager started in this phase.
		if rot.KubeletIssuer == "" && !obs.signerSince.After(rot.PhaseStarted.Time) && now.Sub(rot.PhaseStarted.Time) < signerSettle {
			rot.Message = "waits for a controller-manager with the new CA to take the lead (kube-system/kube-controller-manager lease)"
			return time.Second, nil
		}
		rot.KubeletIssuer = pki.Fingerprint(ca.CertPEM())
		if why := r.caLagging(ctx, tcp, cr, obs, false); why != "" {
			rot.Message = "the old CA is dropped once " + why
			return caRotationPoll, nil
		}
		if err := cr.write(ctx, render.SecretCATrust, map[string][]byte{render.KeyCACert: ca.CertPEM()}, fmt.Sprintf("CA rotation %q: old CA dropped", rot.Token), false); err != nil {
			return 0, err
		}
		cr.trust = ca.CertPEM()
		rot.Trust = pki.Fingerprint(cr.trust)
		enter(apiary.CARotationDropOld, ReasonCARotationDropOld, "only the new CA is trusted: the control plane, the addons and each Host take the bundle without the old CA")
		return time.Millisecond, nil
	case apiary.CARotationDropOld:
		rot.Trust = pki.Fingerprint(cr.trust)
		if why := r.caLagging(ctx, tcp, cr, obs, true); why != "" {
			rot.Message = "the rotation ends once " + why
			return caRotationPoll, nil
		}
		rot.Phase, rot.PhaseStarted, rot.Message = apiary.CARotationCompleted, now, "the old CA is trusted nowhere"
		rot.Completed = ptr.To(now)
		r.Recorder.Eventf(tcp, nil, corev1.EventTypeNormal, ReasonCARotated, "RotateCA",
			"rotation %q completed in %s: certificates of the old CA are refused", rot.Token, now.Sub(rot.Requested.Time).Round(time.Second))
		return 0, nil
	}
	return 0, nil
}

// issueCANext makes the CA a rotation moves to.
func (r *TenantControlPlaneReconciler) issueCANext(ctx context.Context, tcp *apiary.TenantControlPlane, cr *credentials) (*pki.KeyPair, error) {
	kp, err := pki.NewCA(render.CACommonName(tcp))
	if err != nil {
		return nil, err
	}
	keyPEM, err := kp.KeyPEM()
	if err != nil {
		return nil, err
	}
	if err := cr.write(ctx, render.SecretCANext, map[string][]byte{render.KeyTLSCert: kp.CertPEM(), render.KeyTLSKey: keyPEM}, fmt.Sprintf("CA rotation %q", tcp.Status.CARotation.Token), false); err != nil {
		return nil, err
	}
	return kp, nil
}

// caLagging names what has not yet taken in the current trust bundle (and
// the addons' restart when pods must re-read it), or "" when nothing lags.
func (r *TenantControlPlaneReconciler) caLagging(ctx context.Context, tcp *apiary.TenantControlPlane, cr *credentials, obs caObserved, addons bool) string {
	trust := pki.Fingerprint(cr.trust)
	switch {
	case tcp.Status.Switching():
		return "the mode switch under way has ended"
	case obs.controlPlane != "":
		return "the control plane runs it (" + obs.controlPlane + ")"
	case obs.rootCAErr != nil:
		return "the tenant publishes it to its pods (" + obs.rootCAErr.Error() + ")"
	case obs.rootCA != trust:
		return "the tenant's controller-manager publishes it to the pods (kube-root-ca.crt)"
	}
	if addons {
		switch {
		case obs.addonsFor != trust:
			return "the addons' pods have restarted with it (not checked yet)"
		case obs.addons != "":
			return obs.addons
		}
	}
	hosts, err := r.hostsLagging(ctx, tcp)
	if err != nil {
		return err.Error()
	}
	if len(hosts) > 0 {
		return "Hosts " + strings.Join(hosts, ", ") + " have taken it in (status.ca of each Host)"
	}
	return ""
}

// addonsLagging names the addons whose pods have not all restarted with
// the trust bundle (their AnnotationRootCA).
func addonsLagging(ctx context.Context, cs kubernetes.Interface, tcp *apiary.TenantControlPlane, trust string) string {
	in := tenant.Inputs{TCP: tcp}
	var lag []string
	for _, a := range tenant.RootCAReaders {
		if !in.Enabled(a.Part) {
			continue
		}
		var tmpl corev1.PodTemplateSpec
		var rolled bool
		switch a.Kind {
		case "DaemonSet":
			ds, err := cs.AppsV1().DaemonSets(a.Namespace).Get(ctx, a.Name, metav1.GetOptions{})
			if err != nil {
				if apierrors.IsNotFound(err) {
					continue
				}
				return err.Error()
			}
			tmpl, rolled = ds.Spec.Template, daemonSetRolledOut(ds)
		case "Deployment":
			dep, err := cs.AppsV1().Deployments(a.Namespace).Get(ctx, a.Name, metav1.GetOptions{})
			if err != nil {
				if apierrors.IsNotFound(err) {
					continue
				}
				return err.Error()
			}
			st := dep.Status
			rolled = rolledOutDeployment(st.ObservedGeneration, dep.Generation, st.Replicas, st.UpdatedReplicas, st.ReadyReplicas, ptr.Deref(dep.Spec.Replicas, 1))
			tmpl = dep.Spec.Template
		}
		if tmpl.Annotations[tenant.AnnotationRootCA] != trust || !rolled {
			lag = append(lag, a.Namespace+"/"+a.Name)
		}
	}
	if len(lag) > 0 {
		return "the pods of " + strings.Join(lag, ", ") + " have restarted with it"
	}
	return ""
}

// daemonSetRolledOut: every scheduled pod runs the current template and
// is available.
func daemonSetRolledOut(ds *appsv1.DaemonSet) bool {
	s := ds.Status
	return s.ObservedGeneration >= ds.Generation && s.UpdatedNumberScheduled == s.DesiredNumberScheduled && s.NumberAvailable == s.DesiredNumberScheduled
}

// hostsLagging names the tenant's joined Hosts that do not hold what the
// rotation asks (status.caRotation's Trust and KubeletIssuer).
func (r *TenantControlPlaneReconciler) hostsLagging(ctx context.Context, tcp *apiary.TenantControlPlane) ([]string, error) {
	rot := tcp.Status.CARotation
	var list apiary.HostList
	if err := r.Client.List(ctx, &list, client.InNamespace(tcp.Namespace)); err != nil {
		return nil, fmt.Errorf("listing the tenant's Hosts: %w", err)
	}
	var out []string
	for _, h := range list.Items {
		if h.Spec.TenantControlPlane != tcp.Name || h.Status.NodeName == "" || !h.DeletionTimestamp.IsZero() {
			continue
		}
		if !hostHoldsCA(&h, rot) {
			out = append(out, h.Name)
		}
	}
	slices.Sort(out)
	return out, nil
}

// hostHoldsCA says whether a joined Host holds what the rotation asks.
func hostHoldsCA(h *apiary.Host, rot *apiary.CARotation) bool {
	c := h.Status.CA
	return c != nil && c.Trust == rot.Trust && (rot.KubeletIssuer == "" || c.KubeletIssuer == rot.KubeletIssuer)
}

// controlPlaneLag says why the control plane does not yet run only the
// current credentials and configuration ("" when it does): the hosted
// Deployment until it has rolled out, and in registered mode each
// control-plane Host until it runs what is rendered now and serves.
func (r *TenantControlPlaneReconciler) controlPlaneLag(tcp *apiary.TenantControlPlane, in modeInputs, depRolled bool) string {
	st := &tcp.Status
	if st.Switching() {
		return "a mode switch is under way"
	}
	if !hostsOnly(st) {
		if !depRolled {
			return fmt.Sprintf("the control-plane Deployment rolls (%d of %d replicas ready)", st.ReadyReplicas, ptr.Deref(tcp.Spec.Replicas, 0))
		}
		return ""
	}
	files, manifests, err := r.hostControlPlane(tcp, in)
	if err != nil {
		return err.Error()
	}
	want := hostConfigHash(files, manifests)
	for _, h := range st.ControlPlaneHosts {
		if h.Step == apiary.HostStepStop {
			continue
		}
		if h.ConfigHash != want || h.Result != resultSucceeded || !h.Serving {
			return "control-plane Host " + h.Host + " is rewritten"
		}
	}
	return ""
}
