//go:build integration

package webhookcerts_test

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/apiaryhq/apiary/internal/testenv"
	"github.com/apiaryhq/apiary/operator"
	"github.com/apiaryhq/apiary/operator/webhookcerts"
)

const ns = "apiary-system"

func webhook(name, service string) admissionregistrationv1.WebhookClientConfig {
	return admissionregistrationv1.WebhookClientConfig{Service: &admissionregistrationv1.ServiceReference{Namespace: ns, Name: service, Path: ptr.To("/" + name)}}
}

func TestWebhookCertificates(t *testing.T) {
	_, cfg := testenv.Start(t, testenv.Options{})
	scheme, err := operator.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}))
	none := admissionregistrationv1.SideEffectClassNone
	ignore := admissionregistrationv1.Ignore
	rules := []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{"CREATE"},
		Rule: admissionregistrationv1.Rule{APIGroups: []string{"apiary.dev"}, APIVersions: []string{"v1alpha1"}, Resources: []string{"tenantcontrolplanes"}}}}
	must(c.Create(ctx, &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "apiary-mutating"},
		Webhooks: []admissionregistrationv1.MutatingWebhook{
			{Name: "m.apiary.dev", ClientConfig: webhook("m", "apiary-webhook"), SideEffects: &none, FailurePolicy: &ignore, AdmissionReviewVersions: []string{"v1"}, Rules: rules},
			{Name: "other.example.com", ClientConfig: webhook("o", "someone-else"), SideEffects: &none, FailurePolicy: &ignore, AdmissionReviewVersions: []string{"v1"}, Rules: rules},
		},
	}))
	must(c.Create(ctx, &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "apiary-validating"},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{
			{Name: "v.apiary.dev", ClientConfig: webhook("v", "apiary-webhook"), SideEffects: &none, FailurePolicy: &ignore, AdmissionReviewVersions: []string{"v1"}, Rules: rules},
		},
	}))
	clock := time.Now()
	newManager := func(dir string) *webhookcerts.Manager {
		return &webhookcerts.Manager{Client: c, Options: webhookcerts.Options{
			SecretNamespace: ns, SecretName: "apiary-webhook-cert",
			ServiceNamespace: ns, ServiceName: "apiary-webhook",
			ClusterDomain: "cluster.local", CertDir: dir,
			MutatingConfiguration:   "apiary-mutating",
			ValidatingConfiguration: "apiary-validating",
			Now:                     func() time.Time { return clock },
		}}
	}
	dir := t.TempDir()
	m := newManager(dir)
	must(m.Ensure(ctx))

	var secret corev1.Secret
	must(c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "apiary-webhook-cert"}, &secret))
	caPEM := secret.Data["ca.crt"]
	certPEM, _ := os.ReadFile(filepath.Join(dir, "tls.crt"))
	keyPEM, _ := os.ReadFile(filepath.Join(dir, "tls.key"))
	if !bytes.Equal(certPEM, secret.Data["tls.crt"]) || !bytes.Equal(keyPEM, secret.Data["tls.key"]) {
		t.Fatal("files differ from the Secret")
	}
	leaf := parse(t, certPEM)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	for _, name := range []string{"apiary-webhook.apiary-system.svc", "apiary-webhook.apiary-system.svc.cluster.local"} {
		if _, err := leaf.Verify(x509.VerifyOptions{DNSName: name, Roots: pool}); err != nil {
			t.Errorf("serving certificate for %s: %v", name, err)
		}
	}
	caBundles := func() (ours, other, validating []byte, rvs [2]string) {
		var mwc admissionregistrationv1.MutatingWebhookConfiguration
		must(c.Get(ctx, client.ObjectKey{Name: "apiary-mutating"}, &mwc))
		var vwc admissionregistrationv1.ValidatingWebhookConfiguration
		must(c.Get(ctx, client.ObjectKey{Name: "apiary-validating"}, &vwc))
		return mwc.Webhooks[0].ClientConfig.CABundle, mwc.Webhooks[1].ClientConfig.CABundle, vwc.Webhooks[0].ClientConfig.CABundle, [2]string{mwc.ResourceVersion, vwc.ResourceVersion}
	}
	ours, other, validating, rvs := caBundles()
	if !bytes.Equal(ours, caPEM) || !bytes.Equal(validating, caPEM) {
		t.Errorf("caBundle not injected")
	}
	if len(other) != 0 {
		t.Errorf("caBundle injected into a webhook of another service")
	}

	t.Run("unchanged: no writes", func(t *testing.T) {
		rv := secret.ResourceVersion
		fi, _ := os.Stat(filepath.Join(dir, "tls.crt"))
		must(newManager(dir).Ensure(ctx))
		var again corev1.Secret
		must(c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "apiary-webhook-cert"}, &again))
		_, _, _, rvs2 := caBundles()
		fi2, _ := os.Stat(filepath.Join(dir, "tls.crt"))
		if again.ResourceVersion != rv || rvs2 != rvs || !fi2.ModTime().Equal(fi.ModTime()) {
			t.Errorf("a second Ensure wrote something: secret %s→%s, configurations %v→%v", rv, again.ResourceVersion, rvs, rvs2)
		}
	})

	t.Run("replicas agree", func(t *testing.T) {
		must(c.Delete(ctx, &secret))
		dirs := []string{t.TempDir(), t.TempDir(), t.TempDir()}
		var wg sync.WaitGroup
		errs := make([]error, len(dirs))
		for i, d := range dirs {
			wg.Go(func() { errs[i] = newManager(d).Ensure(ctx) })
		}
		wg.Wait()
		var first []byte
		for i, d := range dirs {
			if errs[i] != nil {
				t.Fatalf("replica %d: %v", i, errs[i])
			}
			b, _ := os.ReadFile(filepath.Join(d, "tls.crt"))
			if first == nil {
				first = b
			} else if !bytes.Equal(first, b) {
				t.Errorf("replica %d serves another certificate", i)
			}
		}
		must(c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "apiary-webhook-cert"}, &secret))
		if !bytes.Equal(first, secret.Data["tls.crt"]) {
			t.Errorf("replicas serve a certificate that is not the Secret's")
		}
	})

	t.Run("renewal", func(t *testing.T) {
		must(c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "apiary-webhook-cert"}, &secret))
		before := parse(t, secret.Data["tls.crt"])
		caBefore := secret.Data["ca.crt"]
		clock = before.NotAfter.Add(-10 * 24 * time.Hour)
		must(m.Ensure(ctx))
		must(c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "apiary-webhook-cert"}, &secret))
		after := parse(t, secret.Data["tls.crt"])
		if after.SerialNumber.Cmp(before.SerialNumber) == 0 {
			t.Fatal("certificate 10 days from expiry was not renewed")
		}
		if !bytes.Equal(secret.Data["ca.crt"], caBefore) {
			t.Errorf("renewing the leaf replaced the CA")
		}
		files, _ := os.ReadFile(filepath.Join(dir, "tls.crt"))
		if !bytes.Equal(files, secret.Data["tls.crt"]) {
			t.Errorf("renewed certificate not written to the serving directory")
		}
		// A CA near its end is replaced, and the caBundles follow.
		clock = parse(t, caBefore).NotAfter.Add(-24 * time.Hour)
		must(m.Ensure(ctx))
		must(c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "apiary-webhook-cert"}, &secret))
		if bytes.Equal(secret.Data["ca.crt"], caBefore) {
			t.Fatal("expiring CA was not replaced")
		}
		ours, _, validating, _ := caBundles()
		if !bytes.Equal(ours, secret.Data["ca.crt"]) || !bytes.Equal(validating, secret.Data["ca.crt"]) {
			t.Errorf("caBundles do not follow the new CA")
		}
	})
}

func parse(t *testing.T, pemBytes []byte) *x509.Certificate {
	t.Helper()
	block, _ := pem.Decode(pemBytes)
	if block == nil {
		t.Fatal("no PEM")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}
