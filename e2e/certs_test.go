//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/apiaryhq/apiary/cli"
	"github.com/apiaryhq/apiary/e2e/framework"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/operator/controllers"
	"github.com/apiaryhq/apiary/operator/render"
	"github.com/apiaryhq/apiary/pki"
)

// testCertRenewal (issue 12, certificates): with spec.certificates at a
// validity of two minutes, renewed one minute before expiry, the leaves
// are re-issued at once (they were valid for a year), then renewed by the
// timer on time, each time in one roll of the control plane that a client
// polling through the endpoint does not notice; the running replicas serve
// the renewed certificate and the renewed admin kubeconfig works. Back to
// the defaults, they are issued for a year again; "apiary certs rotate"
// re-issues them on request. The CA stays throughout.
func (e *env) testCertRenewal(t *testing.T) {
	const name = "alpha"
	const validity, renewBefore = 2 * time.Minute, time.Minute
	ns := framework.TenantsNS

	serving := func() *x509.Certificate {
		t.Helper()
		data := tenantSecret(t, e, e.TCP(t, name), render.SecretAPIServer)
		kp, err := pki.ParseKeyPair(data[render.KeyTLSCert], data[render.KeyTLSKey])
		if err != nil {
			t.Fatal(err)
		}
		return kp.Cert
	}
	deployment := func() *appsv1.Deployment {
		t.Helper()
		var dep appsv1.Deployment
		if err := e.C.Get(e.Ctx, client.ObjectKey{Namespace: ns, Name: name}, &dep); err != nil {
			t.Fatal(err)
		}
		return &dep
	}
	// rolledOut waits for a generation after the given one, rolled out.
	rolledOut := func(what string, after int64) (*appsv1.Deployment, time.Duration) {
		t.Helper()
		start := time.Now()
		var dep *appsv1.Deployment
		framework.Eventually(t, what+": rolled out", 3*time.Minute, func() error {
			dep = deployment()
			st := dep.Status
			want := *dep.Spec.Replicas
			if dep.Generation <= after {
				return fmt.Errorf("the Deployment is still at generation %d", dep.Generation)
			}
			if st.ObservedGeneration != dep.Generation || st.UpdatedReplicas != want || st.ReadyReplicas != want || st.Replicas != want {
				return fmt.Errorf("generation %d observed %d, replicas %d updated %d ready %d", dep.Generation, st.ObservedGeneration, st.Replicas, st.UpdatedReplicas, st.ReadyReplicas)
			}
			return nil
		})
		return dep, time.Since(start)
	}
	// What a client sees: the certificate the endpoint presents.
	presented := func() *x509.Certificate {
		t.Helper()
		u, err := url.Parse(e.TCP(t, name).Status.Endpoint)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(e.Ctx, 5*time.Second)
		defer cancel()
		conn, err := (&tls.Dialer{Config: &tls.Config{InsecureSkipVerify: true}}).DialContext(ctx, "tcp", u.Host) //nolint:gosec // reads the presented certificate only
		if err != nil {
			t.Fatalf("TLS to %s: %v", u.Host, err)
		}
		defer conn.Close()
		return conn.(*tls.Conn).ConnectionState().PeerCertificates[0]
	}
	// servesOnly waits until ten connections in a row get c (or a later
	// renewal): the old replicas are gone from the load balancer, which
	// follows the rollout within a moment.
	servesOnly := func(c *x509.Certificate, what string) {
		t.Helper()
		framework.Eventually(t, "the endpoint presents "+what, 30*time.Second, func() error {
			for range 10 {
				if got := presented(); got.NotAfter.Before(c.NotAfter) {
					return fmt.Errorf("a connection got the certificate valid until %s, older than %s valid until %s", got.NotAfter, what, c.NotAfter)
				}
			}
			return nil
		})
	}
	setCertificates := func(c apiary.CertificatesSpec) {
		t.Helper()
		framework.Eventually(t, "spec.certificates", 30*time.Second, func() error {
			tcp := e.TCP(t, name)
			tcp.Spec.Certificates = c
			return e.C.Update(e.Ctx, tcp)
		})
	}
	dep, _ := rolledOut("before", 0)
	caBefore := tenantSecret(t, e, e.TCP(t, name), render.SecretCA)[render.KeyTLSCert]

	readySince := framework.FindCondition(e.TCP(t, name).Status.Conditions, apiary.ConditionReady).LastTransitionTime
	p := e.newPoller(t, name)
	ctx, cancel := context.WithCancel(e.Ctx)
	done := make(chan struct{})
	go func() { p.run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	// 1. Shortened: re-issued at once.
	yearLong := serving()
	setCertificates(apiary.CertificatesSpec{Validity: &metav1.Duration{Duration: validity}, RenewBefore: &metav1.Duration{Duration: renewBefore}})
	var first *x509.Certificate
	framework.Eventually(t, "the leaves re-issued for "+validity.String(), time.Minute, func() error {
		if first = serving(); first.SerialNumber.Cmp(yearLong.SerialNumber) == 0 {
			return fmt.Errorf("serving certificate still the one valid until %s", first.NotAfter)
		}
		return nil
	})
	if life := first.NotAfter.Sub(first.NotBefore) - 5*time.Minute; life != validity {
		t.Errorf("re-issued serving certificate valid for %s (after 5m backdating), want %s", life, validity)
	}
	dep, took := rolledOut("re-issued", dep.Generation)
	t.Logf("FIGURE certificates re-issued for %s: control plane rolled in %s", validity, took.Round(100*time.Millisecond))
	gen := dep.Generation
	renewAt := e.renewAtOf(t, name, "apiserver")
	if want := pki.RenewAt(first, pki.Request{Validity: validity, RenewBefore: renewBefore}); !renewAt.Equal(want) {
		t.Errorf("status.certificates apiserver renewAt %s, want %s", renewAt, want)
	}
	servesOnly(first, "the re-issued certificate")

	// 2. Renewed by the timer, nothing else happening.
	var renewed *x509.Certificate
	framework.Eventually(t, "renewal at "+renewAt.Format(time.TimeOnly), time.Until(renewAt)+time.Minute, func() error {
		if renewed = serving(); renewed.SerialNumber.Cmp(first.SerialNumber) == 0 {
			return fmt.Errorf("not renewed (renewAt %s)", renewAt.Format(time.TimeOnly))
		}
		return nil
	})
	issued := renewed.NotBefore.Add(5 * time.Minute)
	late := issued.Sub(renewAt)
	t.Logf("FIGURE renewal issued %s after its renewAt (%s before the old certificate expired)", late.Round(100*time.Millisecond), first.NotAfter.Sub(issued).Round(100*time.Millisecond))
	// Up to the renewal window (2m/20 = 6 s) early: renewed with another
	// leaf issued a second before it.
	if late < -pki.RenewWindow(validity) || late > 15*time.Second {
		t.Errorf("renewed at %s, %s after renewAt %s (want from %s before to 15 s after)", issued.Format(time.TimeOnly), late, renewAt.Format(time.TimeOnly), pki.RenewWindow(validity))
	}
	dep, took = rolledOut("renewed", gen)
	t.Logf("FIGURE renewal: control plane rolled in %s", took.Round(100*time.Millisecond))
	// One roll for every certificate (they are due together). The next
	// renewal may have started by now: count the generations up to here.
	if dep.Generation-gen != 1 && !e.renewedSince(t, name, renewed) {
		t.Errorf("the Deployment went from generation %d to %d for one renewal, want one roll", gen, dep.Generation)
	}
	servesOnly(renewed, "the renewed certificate")
	if out, err := framework.KubectlErr(e.ExportKubeconfig(t, name), "get", "namespace", "default", "-o", "name"); err != nil || strings.TrimSpace(out) != "namespace/default" {
		t.Errorf("kubectl with the renewed admin kubeconfig: %v: %s", err, out)
	}
	if !e.eventNoteContains(t, name, controllers.ReasonRenewed, "due for renewal") {
		t.Error("no event says the certificates were due for renewal")
	}

	// 3. Back to the defaults: the short leaves are due, issued for a year.
	setCertificates(apiary.CertificatesSpec{})
	framework.Eventually(t, "the leaves issued for a year", time.Minute, func() error {
		if c := serving(); time.Until(c.NotAfter) < 300*24*time.Hour {
			return fmt.Errorf("serving certificate expires %s", c.NotAfter)
		}
		return nil
	})
	dep, took = rolledOut("back to a year", dep.Generation)
	t.Logf("FIGURE back to a year: control plane rolled in %s", took.Round(100*time.Millisecond))

	// 4. Rotated on request, with the CLI.
	yearLong = serving()
	var out, errOut strings.Builder
	cmd := cli.NewCertsCommand(&cli.ConfigFlags{Kubeconfig: e.Kubeconfig, Namespace: ns})
	cmd.SetArgs([]string{"rotate", name, "--yes", "--wait", "1m"})
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	start := time.Now()
	if err := cmd.ExecuteContext(e.Ctx); err != nil {
		t.Fatalf("apiary certs rotate: %v\n%s%s", err, out.String(), errOut.String())
	}
	t.Logf("apiary certs rotate %s --yes --wait 1m (%s):\n%s", name, time.Since(start).Round(time.Millisecond), out.String())
	rotated := serving()
	if rotated.SerialNumber.Cmp(yearLong.SerialNumber) == 0 || time.Until(rotated.NotAfter) < 300*24*time.Hour {
		t.Errorf("after the rotation the serving certificate is valid until %s (serial changed: %t)", rotated.NotAfter, rotated.SerialNumber.Cmp(yearLong.SerialNumber) != 0)
	}
	if rot := e.TCP(t, name).Status.CertificateRotation; rot == nil || rot.Completed == nil {
		t.Errorf("status.certificateRotation %+v", rot)
	}
	_, took = rolledOut("rotated", dep.Generation)
	t.Logf("FIGURE rotation on request: control plane rolled in %s", took.Round(100*time.Millisecond))
	if !e.eventNoteContains(t, name, controllers.ReasonRotated, "rotation") {
		t.Error("no event says the certificates were re-issued for the rotation")
	}
	servesOnly(rotated, "the rotated certificate")
	if !bytes.Equal(tenantSecret(t, e, e.TCP(t, name), render.SecretCA)[render.KeyTLSCert], caBefore) {
		t.Error("the tenant CA changed across renewals and a rotation of the leaves")
	}
	// The operator's own probe went through the rolls too: Ready never
	// flapped (a replica shutting down refuses /readyz on purpose).
	if c := framework.FindCondition(e.TCP(t, name).Status.Conditions, apiary.ConditionReady); c.Status != metav1.ConditionTrue || !c.LastTransitionTime.Equal(&readySince) {
		t.Errorf("Ready %s %s (%s) since %s, want True since %s: it changed during the rolls", c.Status, c.Reason, c.Message, c.LastTransitionTime, readySince)
	}
	time.Sleep(2 * time.Second)
	cancel()
	<-done
	p.verdict(t, "certificate renewals and a rotation (4 rolls)", "across the renewals")
}

// renewAtOf reads status.certificates[name].renewAt.
func (e *env) renewAtOf(t *testing.T, tenant, cert string) time.Time {
	t.Helper()
	for _, c := range e.TCP(t, tenant).Status.Certificates {
		if c.Name == cert && c.RenewAt != nil {
			return c.RenewAt.Time
		}
	}
	t.Fatalf("status.certificates of %s has no renewAt for %s", tenant, cert)
	return time.Time{}
}

// renewedSince: the serving certificate is newer than c (a later renewal
// came, whose roll counts too).
func (e *env) renewedSince(t *testing.T, tenant string, c *x509.Certificate) bool {
	t.Helper()
	data := tenantSecret(t, e, e.TCP(t, tenant), render.SecretAPIServer)
	kp, err := pki.ParseKeyPair(data[render.KeyTLSCert], data[render.KeyTLSKey])
	return err == nil && kp.Cert.NotAfter.After(c.NotAfter)
}

// eventNoteContains reports an event about the tenant with the reason and
// a note containing text.
func (e *env) eventNoteContains(t *testing.T, tenant, reason, text string) bool {
	t.Helper()
	var list eventsv1.EventList
	if err := e.C.List(e.Ctx, &list, client.InNamespace(framework.TenantsNS)); err != nil {
		t.Fatal(err)
	}
	for _, ev := range list.Items {
		if ev.Regarding.Name == tenant && ev.Reason == reason && strings.Contains(ev.Note, text) {
			return true
		}
	}
	return false
}
