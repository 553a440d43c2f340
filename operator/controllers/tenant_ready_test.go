package controllers

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/pki"
)

// readyzServer serves /readyz over TLS with a certificate of a new CA,
// answering 500 to the first refusals requests, then 200; it counts the
// requests and the connections they came on.
func readyzServer(t *testing.T, refusals int32) (*pki.KeyPair, string, *atomic.Int32, *atomic.Int32) {
	t.Helper()
	ca, err := pki.NewCA("readyz-test")
	if err != nil {
		t.Fatal(err)
	}
	kp, err := ca.Sign(pki.Request{CommonName: "kube-apiserver", IPs: []net.IP{net.ParseIP("127.0.0.1")}, Usages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	if err != nil {
		t.Fatal(err)
	}
	var requests, conns atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/readyz" {
			http.NotFound(w, r)
			return
		}
		if requests.Add(1) <= refusals {
			http.Error(w, "[-]shutdown failed: reason withheld", http.StatusInternalServerError)
			return
		}
		_, _ = w.Write([]byte("ok"))
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the other-CA case's handshake error
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{kp.Cert.Raw}, PrivateKey: kp.Key}}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return ca, srv.URL, &requests, &conns
}

func TestGetReadyzAsksARefusalAgain(t *testing.T) {
	ctx := context.Background()
	// A replica shutting down refused twice; the third connection reached
	// one that serves.
	ca, url, requests, conns := readyzServer(t, 2)
	if err := getReadyz(ctx, ca.CertPEM(), "", url, readyzAttempts); err != nil {
		t.Errorf("two refusals, then 200: %v", err)
	}
	if requests.Load() != 3 || conns.Load() != 3 {
		t.Errorf("%d requests on %d connections, want 3 on 3 (a new connection each)", requests.Load(), conns.Load())
	}
	// Refused every time: the refusal counts.
	ca, url, requests, _ = readyzServer(t, 100)
	if err := getReadyz(ctx, ca.CertPEM(), "", url, readyzAttempts); err == nil || !strings.Contains(err.Error(), "500") {
		t.Errorf("always refused: %v, want the 500", err)
	} else if requests.Load() != readyzAttempts {
		t.Errorf("%d requests, want %d", requests.Load(), readyzAttempts)
	}
	// A single host's refusal is final.
	ca, url, requests, _ = readyzServer(t, 1)
	if err := getReadyz(ctx, ca.CertPEM(), "", url, 1); err == nil || requests.Load() != 1 {
		t.Errorf("one attempt: %v after %d requests, want the refusal after 1", err, requests.Load())
	}
	// Another CA's server is refused at once, not asked again.
	_, url, requests, _ = readyzServer(t, 0)
	other, _ := pki.NewCA("other")
	if err := getReadyz(ctx, other.CertPEM(), "", url, readyzAttempts); err == nil || requests.Load() != 0 {
		t.Errorf("server of another CA: %v after %d requests, want a TLS error before any", err, requests.Load())
	}
}

func TestBriefRefusal(t *testing.T) {
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	r := &TenantControlPlaneReconciler{Now: func() time.Time { return now }}
	tcp := &apiary.TenantControlPlane{ObjectMeta: metav1.ObjectMeta{UID: "u1"}}
	meta.SetStatusCondition(&tcp.Status.Conditions, metav1.Condition{Type: apiary.ConditionReady, Status: metav1.ConditionTrue, Reason: ReasonAPIAnswering})
	refused := &readyzRefused{url: "https://192.0.2.1:6443/readyz", status: "500 Internal Server Error"}

	if !r.briefRefusal(tcp, refused) {
		t.Error("a Ready tenant's first refusal is not brief")
	}
	now = now.Add(readyRefusalGrace - time.Second)
	if !r.briefRefusal(tcp, refused) {
		t.Error("a refusal within the grace is not brief")
	}
	now = now.Add(time.Second)
	if r.briefRefusal(tcp, refused) {
		t.Error("a refusal lasting the whole grace is still brief")
	}
	// No answer at all counts at once, and ends the grace.
	if r.briefRefusal(tcp, errors.New("dial tcp 192.0.2.1:6443: connect: connection refused")) {
		t.Error("no answer counted as a brief refusal")
	}
	if !r.briefRefusal(tcp, refused) {
		t.Error("after no answer, a new refusal does not start a new grace")
	}
	// A tenant not Ready gets no grace.
	meta.SetStatusCondition(&tcp.Status.Conditions, metav1.Condition{Type: apiary.ConditionReady, Status: metav1.ConditionFalse, Reason: ReasonAPIUnreachable})
	if r.briefRefusal(tcp, refused) {
		t.Error("a tenant not Ready got a grace")
	}
}
