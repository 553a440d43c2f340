//go:build integration

package operator_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	apiserverv1 "k8s.io/apiserver/pkg/apis/apiserver/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/operator/controllers"
	"github.com/apiaryhq/apiary/operator/render"
	"github.com/apiaryhq/apiary/pki"
)

// testAuthentication: spec.authentication reaches the API server as the
// file its flag names, with the certificates a reference holds; a
// reference its author may not read is refused at admission, one that
// holds a key is never copied (the issuer keeps what was read last), and
// removing the field takes the file and the flag away.
func (s *suite) testAuthentication(t *testing.T) {
	idpCA, err := pki.NewCA("idp")
	s.must(err)
	newCA, err := pki.NewCA("idp-next")
	s.must(err)
	key, err := newCA.KeyPEM()
	s.must(err)
	s.must(s.c.Create(s.ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "idp-ca", Namespace: tenantsNS},
		Data: map[string]string{"ca.crt": string(idpCA.CertPEM())}}))
	s.must(s.c.Create(s.ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "idp-tls", Namespace: tenantsNS}, Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{corev1.TLSCertKey: newCA.CertPEM(), corev1.TLSPrivateKeyKey: key}}))

	issuer := func(ref apiary.CertificateAuthorityReference) *apiary.AuthenticationSpec {
		return &apiary.AuthenticationSpec{JWT: []apiary.JWTAuthenticator{{
			JWTAuthenticator: apiserverv1.JWTAuthenticator{
				Issuer: apiserverv1.Issuer{URL: "https://idp.example.test", Audiences: []string{"kubernetes"}},
				ClaimMappings: apiserverv1.ClaimMappings{
					Username: apiserverv1.PrefixedClaimOrExpression{Claim: "email", Prefix: new("oidc:")},
				},
			},
			CertificateAuthorityRef: &ref,
		}}}
	}

	// mallory may write tenants, not read the tenant's Secrets: she may
	// not have the operator copy one into an API server's configuration.
	s.must(s.c.Create(s.ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "tenant-writer", Namespace: tenantsNS}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{apiary.GroupVersion.Group}, Resources: []string{"tenantcontrolplanes"}, Verbs: []string{"create", "update", "get"}},
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get"}},
	}}))
	s.must(s.c.Create(s.ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "mallory-tenants", Namespace: tenantsNS},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "tenant-writer"},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: "mallory"}}}))
	cfg := rest.CopyConfig(s.cfg)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "mallory"}
	mallory, err := client.New(cfg, client.Options{Scheme: s.c.Scheme()})
	s.must(err)
	borrowed := newTCP("borrowed", "default")
	borrowed.Spec.Authentication = issuer(apiary.CertificateAuthorityReference{Kind: "Secret", Name: "idp-tls", Key: corev1.TLSCertKey})
	err = mallory.Create(s.ctx, borrowed.DeepCopy(), client.DryRunAll)
	if err == nil || !strings.Contains(err.Error(), "spec.authentication.jwt[0].certificateAuthorityRef") || !strings.Contains(err.Error(), "mallory may not get Secret tenants/idp-tls") {
		t.Fatalf("an issuer naming a Secret its author may not read: %v", err)
	}
	// The control: a ConfigMap she may read passes.
	borrowed.Spec.Authentication = issuer(apiary.CertificateAuthorityReference{Kind: "ConfigMap", Name: "idp-ca"})
	s.eventually("mallory names a ConfigMap she may read", 10*time.Second, func() error {
		return mallory.Create(s.ctx, borrowed.DeepCopy(), client.DryRunAll)
	})
	// kube-apiserver's own validation, at admission.
	bad := newTCP("bad-issuer", "default")
	bad.Spec.Authentication = issuer(apiary.CertificateAuthorityReference{Kind: "ConfigMap", Name: "idp-ca"})
	bad.Spec.Authentication.JWT[0].Issuer.URL = "https://kubernetes.default.svc.cluster.local"
	wantRejected(t, s.c.Create(s.ctx, bad, client.DryRunAll), "spec.authentication.jwt[0].issuer.url", "tenant's own ServiceAccount tokens")

	tcp := newTCP("oidc", "default")
	tcp.Spec.Authentication = issuer(apiary.CertificateAuthorityReference{Kind: "ConfigMap", Name: "idp-ca"})
	s.must(s.c.Create(s.ctx, tcp))
	file := func() (*apiserverv1.AuthenticationConfiguration, string, error) {
		var cm corev1.ConfigMap
		if err := s.c.Get(s.ctx, client.ObjectKey{Namespace: tenantsNS, Name: "oidc-authentication"}, &cm); err != nil {
			return nil, "", err
		}
		var cfg apiserverv1.AuthenticationConfiguration
		raw := cm.Data[render.KeyAuthenticationConfig]
		if err := yaml.UnmarshalStrict([]byte(raw), &cfg); err != nil {
			return nil, raw, err
		}
		return &cfg, raw, nil
	}
	apiServer := func() (*corev1.Container, *appsv1.Deployment, error) {
		var dep appsv1.Deployment
		if err := s.c.Get(s.ctx, client.ObjectKey{Namespace: tenantsNS, Name: "oidc"}, &dep); err != nil {
			return nil, nil, err
		}
		for i, c := range dep.Spec.Template.Spec.Containers {
			if c.Name == render.ContainerAPIServer {
				return &dep.Spec.Template.Spec.Containers[i], &dep, nil
			}
		}
		return nil, nil, fmt.Errorf("no %s container", render.ContainerAPIServer)
	}
	const flag = "--authentication-config=/etc/kubernetes/authentication-configuration.yaml"
	var hash string
	s.eventually("the issuer in the API server's configuration", 30*time.Second, func() error {
		cfg, _, err := file()
		if err != nil {
			return err
		}
		if len(cfg.JWT) != 1 || cfg.JWT[0].Issuer.CertificateAuthority != string(idpCA.CertPEM()) {
			return fmt.Errorf("the file holds %+v", cfg.JWT)
		}
		c, dep, err := apiServer()
		if err != nil {
			return err
		}
		if !slices.Contains(c.Args, flag) {
			return fmt.Errorf("kube-apiserver args lack %s", flag)
		}
		hash = dep.Spec.Template.Annotations[render.AnnotationConfigHash]
		return s.tcpCondition("oidc", apiary.ConditionAuthenticationConfigured, metav1.ConditionTrue, controllers.ReasonIssuersConfigured)
	})

	// The reference now holds a key beside a certificate: nothing of it
	// is copied, the issuer keeps the certificate read last, the
	// condition says which key and why without quoting it.
	var cm corev1.ConfigMap
	s.must(s.c.Get(s.ctx, client.ObjectKey{Namespace: tenantsNS, Name: "idp-ca"}, &cm))
	cm.Data["ca.crt"] = string(newCA.CertPEM()) + string(key)
	s.must(s.c.Update(s.ctx, &cm))
	s.eventually("a key in the reference refused", 30*time.Second, func() error {
		return s.tcpCondition("oidc", apiary.ConditionAuthenticationConfigured, metav1.ConditionFalse, controllers.ReasonCertificatesUnreadable)
	})
	got := meta.FindStatusCondition(s.getTCP("oidc").Status.Conditions, apiary.ConditionAuthenticationConfigured)
	if !strings.Contains(got.Message, "spec.authentication.jwt[0]") || !strings.Contains(got.Message, "key ca.crt of ConfigMap idp-ca") ||
		!strings.Contains(got.Message, "keeps the certificates read last") {
		t.Errorf("condition message %q", got.Message)
	}
	cfgNow, raw, err := file()
	s.must(err)
	if cfgNow.JWT[0].Issuer.CertificateAuthority != string(idpCA.CertPEM()) || strings.Contains(raw, "PRIVATE KEY") || strings.Contains(got.Message, "PRIVATE KEY-----") {
		t.Errorf("after a key in the reference: the file holds %q; the condition says %q", raw, got.Message)
	}
	// The same through a Secret's private key, named as the reference.
	s.must(s.updateTCP("oidc", func(tcp *apiary.TenantControlPlane) {
		tcp.Spec.Authentication = issuer(apiary.CertificateAuthorityReference{Kind: "Secret", Name: "idp-tls", Key: corev1.TLSPrivateKeyKey})
	}))
	s.eventually("a private key as the reference refused", 30*time.Second, func() error {
		c := meta.FindStatusCondition(s.getTCP("oidc").Status.Conditions, apiary.ConditionAuthenticationConfigured)
		if c == nil || !strings.Contains(c.Message, "key tls.key of Secret idp-tls") {
			return fmt.Errorf("condition %+v", c)
		}
		return nil
	})
	_, raw, err = file()
	s.must(err)
	if strings.Contains(raw, "PRIVATE KEY") || strings.Contains(raw, string(newCA.CertPEM())) {
		t.Errorf("the file took something of the Secret: %q", raw)
	}
	if c, dep, err := apiServer(); err != nil || dep.Spec.Template.Annotations[render.AnnotationConfigHash] != hash || !slices.Contains(c.Args, flag) {
		t.Errorf("the pods changed although the file did not (hash %s → %s): %v", hash, dep.Spec.Template.Annotations[render.AnnotationConfigHash], err)
	}

	// The Secret's certificate: the file follows, the pods roll.
	s.must(s.updateTCP("oidc", func(tcp *apiary.TenantControlPlane) {
		tcp.Spec.Authentication = issuer(apiary.CertificateAuthorityReference{Kind: "Secret", Name: "idp-tls", Key: corev1.TLSCertKey})
	}))
	s.eventually("the new certificates in the file and the pods rolled", 30*time.Second, func() error {
		cfg, _, err := file()
		if err != nil {
			return err
		}
		if cfg.JWT[0].Issuer.CertificateAuthority != string(newCA.CertPEM()) {
			return fmt.Errorf("the file still holds the old certificate")
		}
		if _, dep, err := apiServer(); err != nil || dep.Spec.Template.Annotations[render.AnnotationConfigHash] == hash {
			return fmt.Errorf("the pods' hash did not change: %v", err)
		}
		return s.tcpCondition("oidc", apiary.ConditionAuthenticationConfigured, metav1.ConditionTrue, controllers.ReasonIssuersConfigured)
	})

	// Without spec.authentication: no file, no flag, no condition.
	s.must(s.updateTCP("oidc", func(tcp *apiary.TenantControlPlane) { tcp.Spec.Authentication = nil }))
	s.eventually("the configuration removed", 30*time.Second, func() error {
		if _, _, err := file(); !apierrors.IsNotFound(err) {
			return fmt.Errorf("the ConfigMap is still there: %v", err)
		}
		c, _, err := apiServer()
		if err != nil {
			return err
		}
		if slices.ContainsFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--authentication-config") }) {
			return fmt.Errorf("kube-apiserver still has --authentication-config")
		}
		if meta.FindStatusCondition(s.getTCP("oidc").Status.Conditions, apiary.ConditionAuthenticationConfigured) != nil {
			return fmt.Errorf("the condition is still there")
		}
		return nil
	})
	s.must(s.c.Delete(s.ctx, s.getTCP("oidc")))
}
