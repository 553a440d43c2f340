// Package webhookcerts gives the operator's admission webhooks a serving
// certificate without cert-manager: a CA and a certificate for the webhook
// Service, kept in a Secret shared by every operator replica, written to the
// directory the webhook server reads (it reloads changed files), and the CA
// injected into the webhook configurations' caBundle. Certificates are
// renewed when less than 30 days remain.
package webhookcerts

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/apiaryhq/apiary/pki"
)

// Keys of the Secret.
const (
	keyCACert = "ca.crt"
	keyCAKey  = "ca.key"
	keyCert   = corev1.TLSCertKey
	keyKey    = corev1.TLSPrivateKeyKey
)

// Options say where the certificate lives and whom it serves.
type Options struct {
	// Secret holding the CA and the serving certificate.
	SecretNamespace, SecretName string
	// Service the API server calls the webhooks through.
	ServiceNamespace, ServiceName string
	// ClusterDomain of the cluster (for the Service's full DNS name).
	ClusterDomain string
	// CertDir is where the webhook server reads tls.crt and tls.key.
	CertDir string
	// MutatingConfiguration and ValidatingConfiguration name the webhook
	// configurations whose webhooks call ServiceName: their caBundle is set
	// to the CA. Either may be empty.
	MutatingConfiguration, ValidatingConfiguration string
	// Interval between checks (default one hour).
	Interval time.Duration
	// Now is the clock (tests).
	Now func() time.Time
}

// Manager keeps the webhook certificate valid. Every replica runs it: each
// needs the files, and the Secret's resourceVersion arbitrates between
// replicas that renew at the same moment.
type Manager struct {
	Client client.Client
	Options
}

// NeedLeaderElection is false: non-leader replicas serve webhooks too.
func (m *Manager) NeedLeaderElection() bool { return false }

// Start checks the certificate every Interval until ctx ends. Call Ensure
// once before starting the webhook server, so that it starts with files.
func (m *Manager) Start(ctx context.Context) error {
	interval := m.Interval
	if interval == 0 {
		interval = time.Hour
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			if err := m.Ensure(ctx); err != nil {
				log.FromContext(ctx).Error(err, "keeping the webhook serving certificate valid")
			}
		}
	}
}

func (m *Manager) now() time.Time {
	if m.Now != nil {
		return m.Now()
	}
	return time.Now()
}

func (m *Manager) request() pki.Request {
	svc := m.ServiceName + "." + m.ServiceNamespace + ".svc"
	return pki.Request{
		CommonName: svc,
		DNSNames:   []string{svc, svc + "." + m.ClusterDomain},
		Usages:     []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
}

// Ensure makes the Secret, the files and the caBundles agree on a valid
// certificate, writing only what differs.
func (m *Manager) Ensure(ctx context.Context) error {
	data, err := m.ensureSecret(ctx)
	if err != nil {
		return err
	}
	if err := m.writeFiles(data); err != nil {
		return err
	}
	return m.injectCABundle(ctx, data[keyCACert])
}

// ensureSecret returns valid Secret data, issuing what is missing or due.
func (m *Manager) ensureSecret(ctx context.Context) (map[string][]byte, error) {
	for attempt := 0; attempt < 5; attempt++ {
		var s corev1.Secret
		err := m.Client.Get(ctx, client.ObjectKey{Namespace: m.SecretNamespace, Name: m.SecretName}, &s)
		exists := err == nil
		if err != nil && !apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("reading webhook certificate Secret %s/%s: %w", m.SecretNamespace, m.SecretName, err)
		}
		data, issued, err := m.issue(s.Data)
		if err != nil {
			return nil, err
		}
		if !issued {
			return data, nil
		}
		s.Data = data
		s.Type = corev1.SecretTypeTLS
		if exists {
			// The resourceVersion read above makes concurrent renewals by
			// other replicas fail here instead of overwriting each other.
			err = m.Client.Update(ctx, &s)
		} else {
			s.ObjectMeta = metav1.ObjectMeta{Namespace: m.SecretNamespace, Name: m.SecretName,
				Labels: map[string]string{"app.kubernetes.io/managed-by": "apiary", "app.kubernetes.io/component": "webhook"}}
			err = m.Client.Create(ctx, &s)
		}
		switch {
		case err == nil:
			log.FromContext(ctx).Info("issued webhook serving certificate", "secret", m.SecretNamespace+"/"+m.SecretName, "dnsNames", m.request().DNSNames)
			return data, nil
		case apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err):
			continue // another replica won: use its certificate
		default:
			return nil, fmt.Errorf("writing webhook certificate Secret %s/%s: %w", m.SecretNamespace, m.SecretName, err)
		}
	}
	return nil, errors.New("webhook certificate Secret keeps changing under us")
}

// issue keeps valid material and replaces what is missing or due. It
// reports whether it issued anything.
func (m *Manager) issue(old map[string][]byte) (map[string][]byte, bool, error) {
	now := m.now()
	ca, err := pki.ParseKeyPair(old[keyCACert], old[keyCAKey])
	newCA := err != nil || pki.CAProblem(ca.Cert, now) != ""
	if newCA {
		if ca, err = pki.NewCA("apiary webhook CA"); err != nil {
			return nil, false, err
		}
	}
	if !newCA {
		if cert, err := pki.ParseKeyPair(old[keyCert], old[keyKey]); err == nil && pki.Problem(cert.Cert, ca.Cert, m.request(), now) == "" {
			return old, false, nil
		}
	}
	leaf, err := ca.Sign(m.request())
	if err != nil {
		return nil, false, err
	}
	caKey, err := ca.KeyPEM()
	if err != nil {
		return nil, false, err
	}
	key, err := leaf.KeyPEM()
	if err != nil {
		return nil, false, err
	}
	return map[string][]byte{keyCACert: ca.CertPEM(), keyCAKey: caKey, keyCert: leaf.CertPEM(), keyKey: key}, true, nil
}

// writeFiles replaces the files the webhook server reads when they differ.
func (m *Manager) writeFiles(data map[string][]byte) error {
	if err := os.MkdirAll(m.CertDir, 0o700); err != nil {
		return fmt.Errorf("creating webhook certificate directory: %w", err)
	}
	// Key first: the server reloads on the certificate's change.
	for _, name := range []string{keyKey, keyCert} {
		path := filepath.Join(m.CertDir, name)
		if cur, err := os.ReadFile(path); err == nil && bytes.Equal(cur, data[name]) {
			continue
		}
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, data[name], 0o600); err != nil {
			return fmt.Errorf("writing %s: %w", tmp, err)
		}
		if err := os.Rename(tmp, path); err != nil {
			return fmt.Errorf("replacing %s: %w", path, err)
		}
	}
	return nil
}

// injectCABundle sets the CA on every webhook of the configurations that
// calls the Service. Replicas may do it at the same moment: conflicts are
// retried on a fresh read.
func (m *Manager) injectCABundle(ctx context.Context, ca []byte) error {
	for _, c := range []struct {
		name string
		obj  client.Object
	}{
		{m.MutatingConfiguration, &admissionregistrationv1.MutatingWebhookConfiguration{}},
		{m.ValidatingConfiguration, &admissionregistrationv1.ValidatingWebhookConfiguration{}},
	} {
		if c.name == "" {
			continue
		}
		if err := m.inject(ctx, c.name, c.obj, func(o client.Object) bool {
			changed := false
			for _, cc := range clientConfigs(o) {
				changed = m.setCA(cc, ca) || changed
			}
			return changed
		}); err != nil {
			return err
		}
	}
	return nil
}

// clientConfigs are the client configurations of every webhook of a
// mutating or validating configuration.
func clientConfigs(o client.Object) []*admissionregistrationv1.WebhookClientConfig {
	var out []*admissionregistrationv1.WebhookClientConfig
	switch c := o.(type) {
	case *admissionregistrationv1.MutatingWebhookConfiguration:
		for i := range c.Webhooks {
			out = append(out, &c.Webhooks[i].ClientConfig)
		}
	case *admissionregistrationv1.ValidatingWebhookConfiguration:
		for i := range c.Webhooks {
			out = append(out, &c.Webhooks[i].ClientConfig)
		}
	}
	return out
}

// inject updates one configuration when set changes it.
func (m *Manager) inject(ctx context.Context, name string, obj client.Object, set func(client.Object) bool) error {
	kind := strings.TrimPrefix(fmt.Sprintf("%T", obj), "*v1.")
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := m.Client.Get(ctx, client.ObjectKey{Name: name}, obj); err != nil {
			return err
		}
		if !set(obj) {
			return nil
		}
		return m.Client.Update(ctx, obj)
	})
	if err != nil {
		return fmt.Errorf("setting caBundle of %s %s: %w", kind, name, err)
	}
	return nil
}

func (m *Manager) setCA(cc *admissionregistrationv1.WebhookClientConfig, ca []byte) bool {
	if cc.Service == nil || cc.Service.Name != m.ServiceName || cc.Service.Namespace != m.ServiceNamespace || bytes.Equal(cc.CABundle, ca) {
		return false
	}
	cc.CABundle = ca
	return true
}
