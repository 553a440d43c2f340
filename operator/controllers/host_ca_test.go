package controllers

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/operator/render"
	"github.com/apiaryhq/apiary/pki"
)

// TestCAWorker: a joined Host follows its tenant's rotation one Host at a
// time: it waits while another Host of the tenant has a CA step under
// way, then journals its own before touching the host; one that holds
// what is asked says so; outside a rotation a Host that recorded nothing
// is taken to hold the tenant's CA.
func TestCAWorker(t *testing.T) {
	scheme := builtinAndApiary(t)
	now := metav1.Now()
	tcp := &apiary.TenantControlPlane{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "dev", UID: "t"},
		Status: apiary.TenantControlPlaneStatus{CARotation: &apiary.CARotation{Token: "t1", Phase: apiary.CARotationTrustNew, Trust: "new-bundle"}}}
	joined := func(name string, ca *apiary.HostCA, journal ...apiary.HostStep) *apiary.Host {
		return &apiary.Host{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("uid-" + name)},
			Spec: apiary.HostSpec{TenantControlPlane: "dev"},
			Status: apiary.HostStatus{NodeName: name, CA: ca,
				Journal: append([]apiary.HostStep{{Name: StepJoin, Result: StepSucceeded, Started: now}}, journal...)}}
	}
	a := joined("h-a", &apiary.HostCA{Trust: "old", KubeletIssuer: "old"})
	b := joined("h-b", &apiary.HostCA{Trust: "old", KubeletIssuer: "old"}, apiary.HostStep{Name: StepCATrust, Result: StepRunning, Started: now})
	done := joined("h-c", &apiary.HostCA{Trust: "new-bundle", KubeletIssuer: "old"})
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(tcp, a, b, done).WithStatusSubresource(&apiary.Host{}, &apiary.TenantControlPlane{}).Build()
	r := &HostReconciler{Client: c, APIReader: c, Recorder: events.NewFakeRecorder(20), Now: time.Now}
	run := func(name string) (*apiary.Host, bool, time.Duration) {
		t.Helper()
		var orig apiary.Host
		if err := c.Get(t.Context(), client.ObjectKey{Namespace: "ns", Name: name}, &orig); err != nil {
			t.Fatal(err)
		}
		h := orig.DeepCopy()
		res, busy, err := r.caWorker(t.Context(), &orig, h)
		if err != nil {
			t.Fatal(err)
		}
		return h, busy, res.RequeueAfter
	}
	cond := func(h *apiary.Host) string {
		c := meta.FindStatusCondition(h.Status.Conditions, apiary.HostConditionCAUpToDate)
		if c == nil {
			return "none"
		}
		return string(c.Status) + " " + c.Reason + ": " + c.Message
	}

	// h-b's step holds the tenant's turn.
	h, busy, after := run("h-a")
	if busy || after == 0 || !strings.Contains(cond(h), ReasonCAWaitingTurn) || !strings.Contains(cond(h), "h-b") {
		t.Errorf("while h-b rotates: busy %v, requeue %s, %s", busy, after, cond(h))
	}
	if journalStep(&h.Status, StepCATrust) != nil {
		t.Error("h-a journaled a CA step while h-b had one under way")
	}
	// h-b done: h-a's turn, journaled (and written) before the host is touched.
	b.Status.Journal[1].Result = StepSucceeded
	b.Status.CA.Trust = "new-bundle"
	if err := c.Status().Update(t.Context(), b); err != nil {
		t.Fatal(err)
	}
	h, busy, _ = run("h-a")
	if step := journalStep(&h.Status, StepCATrust); !busy || step == nil || step.Result != StepRunning || !strings.Contains(cond(h), ReasonCARotating) {
		t.Errorf("h-a's turn: busy %v, step %+v, %s", busy, step, cond(h))
	}
	var written apiary.Host
	if err := c.Get(t.Context(), client.ObjectKey{Namespace: "ns", Name: "h-a"}, &written); err != nil || journalStep(&written.Status, StepCATrust) == nil {
		t.Errorf("the step's start was not written before the host is touched: %v", err)
	}
	// A Host that holds the bundle, with no kubelet issuer asked for yet.
	h, busy, _ = run("h-c")
	if busy || !strings.HasPrefix(cond(h), "True "+ReasonCAHeld) {
		t.Errorf("h-c holds what is asked: busy %v, %s", busy, cond(h))
	}

	// No rotation: a Host that recorded nothing holds the tenant's CA.
	tcp.Status.CARotation = nil
	if err := c.Status().Update(t.Context(), tcp); err != nil {
		t.Fatal(err)
	}
	ca, _ := pki.NewCA("dev")
	for kind, data := range map[render.SecretKind]map[string][]byte{
		render.SecretCA: {render.KeyTLSCert: ca.CertPEM()}, render.SecretCATrust: {render.KeyCACert: ca.CertPEM()},
	} {
		if err := c.Create(t.Context(), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: render.SecretName(tcp, kind)}, Data: data}); err != nil {
			t.Fatal(err)
		}
	}
	legacy := joined("h-d", nil)
	if err := c.Create(t.Context(), legacy); err != nil {
		t.Fatal(err)
	}
	h, busy, _ = run("h-d")
	fp := pki.Fingerprint(ca.CertPEM())
	if busy || h.Status.CA == nil || h.Status.CA.Trust != fp || h.Status.CA.KubeletIssuer != fp {
		t.Errorf("a Host joined before status.ca: busy %v, %+v, want both %s", busy, h.Status.CA, fp)
	}
}

// TestKubeletAnswers: the wait ends when the kubelet's /healthz, read
// through the API server's nodes/proxy, says ok, and fails naming the
// Node and the API server's last answer when it never does.
func TestKubeletAnswers(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/v1/nodes/w-1/proxy/healthz" {
			http.NotFound(w, r)
			return
		}
		if calls.Add(1) < 3 {
			http.Error(w, `dial tcp 10.0.0.1:10250: connect: connection refused`, http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok"))
	}))
	defer srv.Close()
	cs, err := kubernetes.NewForConfig(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	waited, err := kubeletAnswers(t.Context(), cs, "w-1", 10*time.Second)
	if err != nil || calls.Load() != 3 || waited < time.Second {
		t.Errorf("kubeletAnswers = %s, %v after %d calls; want it to answer at the third call, a second later", waited, err, calls.Load())
	}
	_, err = kubeletAnswers(t.Context(), cs, "w-2", time.Second)
	if err == nil || !strings.Contains(err.Error(), "Node w-2") || !strings.Contains(err.Error(), "could not find") {
		t.Errorf("kubeletAnswers for a Node that never answers: %v, want an error naming it and the last answer", err)
	}
}
