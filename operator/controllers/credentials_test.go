package controllers

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

func TestNextRenewal(t *testing.T) {
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	at := func(d time.Duration) *metav1.Time { return ptr.To(metav1.NewTime(now.Add(d))) }
	cr := &credentials{}
	if got := cr.nextRenewal(); !got.IsZero() {
		t.Errorf("no certificates: next renewal %s, want none", got)
	}
	cr.certs = []apiary.CertificateStatus{
		{Name: "ca", NotAfter: metav1.NewTime(now.Add(time.Hour))}, // a CA: not on the timer, even when sooner
		{Name: "apiserver", RenewAt: at(3 * time.Hour)},
		{Name: "admin", RenewAt: at(2 * time.Hour)},
		{Name: "scheduler", RenewAt: at(4 * time.Hour)},
	}
	if got, want := cr.nextRenewal(), now.Add(2*time.Hour); !got.Equal(want) {
		t.Errorf("next renewal %s, want the admin certificate's %s", got, want)
	}
}

func TestTenantLifetime(t *testing.T) {
	tcp := &apiary.TenantControlPlane{}
	if v, r := (tenantSecrets{tcp}).lifetime(); v != apiary.DefaultCertificateValidity || r != apiary.DefaultCertificateRenewBefore {
		t.Errorf("undefaulted spec: lifetime %s/%s, want the defaults", v, r)
	}
	tcp.Spec.Certificates = apiary.CertificatesSpec{Validity: &metav1.Duration{Duration: 10 * time.Minute}, RenewBefore: &metav1.Duration{Duration: 3 * time.Minute}}
	if v, r := (tenantSecrets{tcp}).lifetime(); v != 10*time.Minute || r != 3*time.Minute {
		t.Errorf("lifetime %s/%s, want the spec's 10m/3m", v, r)
	}
}

func TestIssuedEvents(t *testing.T) {
	cr := &credentials{rotation: "r1", issued: map[string][]string{
		ReasonRotated: {"a-apiserver", "a-admin-kubeconfig"},
		ReasonIssued:  {"a-ca (created)"},
		ReasonRenewed: {strings.Repeat("x", 2000)},
	}}
	got := cr.issuedEvents()
	if len(got) != 3 || got[0] != [2]string{ReasonIssued, "issued a-ca (created)"} ||
		got[2] != [2]string{ReasonRotated, `rotated a-apiserver, a-admin-kubeconfig: rotation "r1"`} {
		t.Errorf("events %q", got)
	}
	if n := len(got[1][1]); got[1][0] != ReasonRenewed || n > maxEventNote || !strings.HasSuffix(got[1][1], " …") {
		t.Errorf("a long note: reason %s, %d bytes (limit %d), ends %q", got[1][0], n, maxEventNote, got[1][1][n-10:])
	}
	if again := cr.issuedEvents(); len(again) != 0 {
		t.Errorf("events returned twice: %q", again)
	}
}

func TestRenewTogether(t *testing.T) {
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	at := func(d time.Duration) *metav1.Time { return ptr.To(metav1.NewTime(now.Add(d))) }
	tcp := &apiary.TenantControlPlane{Spec: apiary.TenantControlPlaneSpec{Certificates: apiary.CertificatesSpec{
		Validity: &metav1.Duration{Duration: 2 * time.Minute}, RenewBefore: &metav1.Duration{Duration: time.Minute}}}}
	cr := &credentials{set: tenantSecrets{tcp}, now: now}
	// None due: judged now.
	cr.renewTogether([]apiary.CertificateStatus{{Name: "ca"}, {Name: "apiserver", RenewAt: at(time.Second)}})
	if !cr.judgeAt().Equal(now) {
		t.Errorf("nothing due: judged at %s, want now", cr.judgeAt())
	}
	// One due (issued a second before the others): all within the window
	// (2m/20 = 6 s) go with it.
	cr.renewTogether([]apiary.CertificateStatus{{Name: "apiserver", RenewAt: at(time.Second)}, {Name: "admin", RenewAt: at(0)}})
	if want := now.Add(6 * time.Second); !cr.judgeAt().Equal(want) {
		t.Errorf("one due: judged at %s, want %s", cr.judgeAt(), want)
	}
}
