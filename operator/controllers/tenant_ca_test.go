package controllers

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/operator/render"
	"github.com/apiaryhq/apiary/pki"
)

// TestCARotationPhases walks a rotation through its phases against a fake
// API server: each phase waits for what lags (the control plane, the
// published root CA, the addons, a Host), then moves on; the Secrets say
// what the CA and the trust bundle are at each point.
func TestCARotationPhases(t *testing.T) {
	ctx := context.Background()
	scheme := builtinAndApiary(t)
	tcp := &apiary.TenantControlPlane{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "dev", UID: "uid-1",
		Annotations: map[string]string{apiary.AnnotationRotateCA: "t1"}}}
	host := &apiary.Host{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "w1"},
		Spec:   apiary.HostSpec{TenantControlPlane: "dev"},
		Status: apiary.HostStatus{NodeName: "w1"}}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(host).WithStatusSubresource(host).Build()
	now := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	rec := events.NewFakeRecorder(20)
	r := &TenantControlPlaneReconciler{Client: c, APIReader: c, Recorder: rec, Now: func() time.Time { return now }}

	// One reconcile's credentials part: the CA and the bundle.
	issue := func() (*credentials, *pki.KeyPair) {
		t.Helper()
		cr, err := newCredentials(ctx, c, c, tenantSecrets{tcp}, now)
		if err != nil {
			t.Fatal(err)
		}
		ca, err := cr.ca(ctx, render.SecretCA, render.CACommonName(tcp))
		if err != nil {
			t.Fatal(err)
		}
		if err := r.caTrust(ctx, tcp, cr, ca); err != nil {
			t.Fatal(err)
		}
		return cr, ca
	}
	caughtUp := func(cr *credentials) caObserved {
		fp := pki.Fingerprint(cr.trust)
		return caObserved{rootCA: fp, addonsFor: fp, signerSince: now.Add(time.Second)}
	}
	advance := func(cr *credentials, ca *pki.KeyPair, obs caObserved) {
		t.Helper()
		if _, err := r.advanceCA(ctx, tcp, cr, ca, obs); err != nil {
			t.Fatal(err)
		}
	}
	setHost := func(ca apiary.HostCA) {
		t.Helper()
		host.Status.CA = &ca
		if err := c.Status().Update(ctx, host); err != nil {
			t.Fatal(err)
		}
	}
	certs := func(pemData []byte) int { return strings.Count(string(pemData), "BEGIN CERTIFICATE") }

	cr, oldCA := issue()
	if certs(cr.trust) != 1 || pki.Fingerprint(cr.trust) != pki.Fingerprint(oldCA.CertPEM()) {
		t.Fatalf("a new tenant's bundle holds %d certificates, want its CA alone", certs(cr.trust))
	}
	oldFP := pki.Fingerprint(oldCA.CertPEM())
	setHost(apiary.HostCA{Trust: oldFP, KubeletIssuer: oldFP})

	// Asked for: TrustNew, with the new CA beside the old one.
	advance(cr, oldCA, caughtUp(cr))
	rot := tcp.Status.CARotation
	if rot == nil || rot.Phase != apiary.CARotationTrustNew || rot.Token != "t1" {
		t.Fatalf("after the request: %+v, want phase TrustNew of t1", rot)
	}
	if certs(cr.trust) != 2 || rot.Trust != pki.Fingerprint(cr.trust) {
		t.Fatalf("TrustNew: bundle of %d certificates, status trust %s", certs(cr.trust), rot.Trust)
	}
	// Waits for the tenant to publish the bundle, the addons, the Host.
	cr, ca := issue()
	if ca.Cert.Equal(oldCA.Cert) != true {
		t.Fatal("the old CA stopped issuing in TrustNew")
	}
	advance(cr, ca, caObserved{rootCA: oldFP, addonsFor: pki.Fingerprint(cr.trust)})
	if rot.Phase != apiary.CARotationTrustNew || !strings.Contains(rot.Message, "kube-root-ca.crt") {
		t.Errorf("root CA not published: phase %s (%s), want TrustNew waiting for kube-root-ca.crt", rot.Phase, rot.Message)
	}
	if rot.AddonsTrust != "" {
		t.Errorf("addons asked to restart with %q before the bundle was published", rot.AddonsTrust)
	}
	obs := caughtUp(cr)
	obs.addons = "the pods of kube-system/kube-proxy have restarted with it"
	advance(cr, ca, obs)
	if rot.AddonsTrust != rot.Trust || !strings.Contains(rot.Message, "kube-proxy") {
		t.Errorf("published, addons lagging: addons trust %q, message %q", rot.AddonsTrust, rot.Message)
	}
	advance(cr, ca, caughtUp(cr))
	if rot.Phase != apiary.CARotationTrustNew || !strings.Contains(rot.Message, "w1") {
		t.Errorf("Host lagging: phase %s (%s), want TrustNew naming w1", rot.Phase, rot.Message)
	}
	setHost(apiary.HostCA{Trust: rot.Trust, KubeletIssuer: oldFP})
	obs = caughtUp(cr)
	obs.controlPlane = "the control-plane Deployment rolls"
	advance(cr, ca, obs)
	if rot.Phase != apiary.CARotationTrustNew {
		t.Errorf("control plane rolling: phase %s, want TrustNew", rot.Phase)
	}
	advance(cr, ca, caughtUp(cr))
	if rot.Phase != apiary.CARotationReissue {
		t.Fatalf("everything caught up: phase %s (%s), want Reissue", rot.Phase, rot.Message)
	}
	var next corev1.Secret
	if err := c.Get(ctx, client.ObjectKey{Namespace: "ns", Name: render.SecretName(tcp, render.SecretCANext)}, &next); !apierrors.IsNotFound(err) {
		t.Errorf("ca-next after the swap: %v", err)
	}

	// Reissue: the new CA issues; the kubelets follow once the control
	// plane runs the new leaves.
	cr, ca = issue()
	if ca.Cert.Equal(oldCA.Cert) || certs(cr.trust) != 2 {
		t.Fatalf("Reissue: the CA did not change (%t) or the bundle holds %d", ca.Cert.Equal(oldCA.Cert), certs(cr.trust))
	}
	newFP := pki.Fingerprint(ca.CertPEM())
	obs = caughtUp(cr)
	obs.controlPlane = "the control-plane Deployment rolls"
	advance(cr, ca, obs)
	if rot.KubeletIssuer != "" {
		t.Errorf("kubelets asked to move to %s before the control plane signs with it", rot.KubeletIssuer)
	}
	obs = caughtUp(cr)
	obs.signerSince = now.Add(-time.Minute) // the lead has not changed hands yet
	advance(cr, ca, obs)
	if rot.KubeletIssuer != "" || !strings.Contains(rot.Message, "lease") {
		t.Errorf("kubelets asked to move (%q) while the controller-manager lease is still the old one's: %s", rot.KubeletIssuer, rot.Message)
	}
	advance(cr, ca, caughtUp(cr))
	if rot.KubeletIssuer != newFP || rot.Phase != apiary.CARotationReissue || !strings.Contains(rot.Message, "w1") {
		t.Errorf("Reissue, control plane done: issuer %s phase %s (%s), want %s, still Reissue for w1", rot.KubeletIssuer, rot.Phase, rot.Message, newFP)
	}
	setHost(apiary.HostCA{Trust: rot.Trust, KubeletIssuer: newFP})
	advance(cr, ca, caughtUp(cr))
	if rot.Phase != apiary.CARotationDropOld || certs(cr.trust) != 1 || rot.Trust != newFP {
		t.Fatalf("DropOld: phase %s, bundle of %d, trust %s want %s", rot.Phase, certs(cr.trust), rot.Trust, newFP)
	}

	// DropOld: done once everything holds the new CA alone.
	cr, ca = issue()
	advance(cr, ca, caughtUp(cr))
	if rot.Completed != nil {
		t.Fatal("completed while the Host still trusts the old CA")
	}
	setHost(apiary.HostCA{Trust: newFP, KubeletIssuer: newFP})
	advance(cr, ca, caughtUp(cr))
	if rot.Completed == nil || rot.Phase != apiary.CARotationCompleted || rot.AddonsTrust != newFP {
		t.Fatalf("end: %+v", rot)
	}
	// The same token again: nothing; a new one: another rotation.
	advance(cr, ca, caughtUp(cr))
	if tcp.Status.CARotation.Token != "t1" || tcp.Status.CARotation.Completed == nil {
		t.Errorf("the answered token started again: %+v", tcp.Status.CARotation)
	}
	tcp.Annotations[apiary.AnnotationRotateCA] = "t2"
	advance(cr, ca, caughtUp(cr))
	if r2 := tcp.Status.CARotation; r2.Token != "t2" || r2.Phase != apiary.CARotationTrustNew || r2.AddonsTrust != newFP {
		t.Errorf("a second rotation: %+v, want TrustNew of t2 keeping the addons' trust", r2)
	}
	var reasons []string
	for len(rec.Events) > 0 {
		reasons = append(reasons, strings.Fields(<-rec.Events)[1])
	}
	if got := strings.Join(reasons, ","); got != "CARotationStarted,CARotationReissue,CARotationDropOld,CARotated,CARotationStarted" {
		t.Errorf("events %s", got)
	}
}

// TestCATrustRepairs: a bundle that does not hold the CA (the CA was
// re-issued) becomes the CA alone; one that holds it is kept.
func TestCATrustRepairs(t *testing.T) {
	ctx := context.Background()
	tcp := &apiary.TenantControlPlane{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "dev", UID: "uid-1"}}
	c := fake.NewClientBuilder().WithScheme(builtinAndApiary(t)).Build()
	r := &TenantControlPlaneReconciler{Client: c, APIReader: c, Recorder: events.NewFakeRecorder(5), Now: time.Now}
	cr, err := newCredentials(ctx, c, c, tenantSecrets{tcp}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	stranger, _ := pki.NewCA("other")
	ca, _ := pki.NewCA("dev")
	if err := cr.write(ctx, render.SecretCATrust, map[string][]byte{render.KeyCACert: stranger.CertPEM()}, "test", false); err != nil {
		t.Fatal(err)
	}
	if err := r.caTrust(ctx, tcp, cr, ca); err != nil {
		t.Fatal(err)
	}
	if string(cr.trust) != string(ca.CertPEM()) {
		t.Errorf("a bundle without the CA was kept: %d certificates", strings.Count(string(cr.trust), "BEGIN"))
	}
	both := pki.Bundle(stranger.Cert, ca.Cert)
	if err := cr.write(ctx, render.SecretCATrust, map[string][]byte{render.KeyCACert: both}, "test", false); err != nil {
		t.Fatal(err)
	}
	if err := r.caTrust(ctx, tcp, cr, ca); err != nil {
		t.Fatal(err)
	}
	if string(cr.trust) != string(both) {
		t.Error("a bundle holding the CA (a rotation's) was not kept")
	}
}

// builtinAndApiary is a scheme of the built-in kinds and Apiary's.
func builtinAndApiary(t *testing.T) *runtime.Scheme {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := apiary.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	return scheme
}
