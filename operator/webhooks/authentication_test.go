package webhooks

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation/field"
	apiserverv1 "k8s.io/apiserver/pkg/apis/apiserver/v1"

	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

func issuer(url string) apiary.JWTAuthenticator {
	return apiary.JWTAuthenticator{JWTAuthenticator: apiserverv1.JWTAuthenticator{
		Issuer: apiserverv1.Issuer{URL: url, Audiences: []string{"kubernetes"}},
		ClaimMappings: apiserverv1.ClaimMappings{
			Username: apiserverv1.PrefixedClaimOrExpression{Claim: "email", Prefix: new("oidc:")},
			Groups:   apiserverv1.PrefixedClaimOrExpression{Claim: "groups", Prefix: new("oidc:")},
		},
	}}
}

func withIssuers(f func(*apiary.TenantControlPlane, []apiary.JWTAuthenticator), urls ...string) *apiary.TenantControlPlane {
	return with(func(tcp *apiary.TenantControlPlane) {
		var jwt []apiary.JWTAuthenticator
		for _, u := range urls {
			jwt = append(jwt, issuer(u))
		}
		tcp.Spec.Authentication = &apiary.AuthenticationSpec{JWT: jwt}
		if f != nil {
			f(tcp, jwt)
		}
	})
}

// kube-apiserver's own validation of the AuthenticationConfiguration runs
// at admission, its errors under spec.authentication; Apiary's rules are
// checked beside it.
func TestValidateAuthentication(t *testing.T) {
	j0 := "spec.authentication.jwt[0]"
	cases := []struct {
		name string
		tcp  *apiary.TenantControlPlane
		want []want
	}{
		{name: "none", tcp: valid()},
		{name: "two issuers, one from a reference", tcp: withIssuers(func(_ *apiary.TenantControlPlane, j []apiary.JWTAuthenticator) {
			j[1].CertificateAuthorityRef = &apiary.CertificateAuthorityReference{Kind: "ConfigMap", Name: "idp-ca"}
			j[1].ClaimValidationRules = []apiserverv1.ClaimValidationRule{{Expression: "claims.email_verified == true", Message: "verify your email"}}
		}, "https://idp.example.com", "https://login.example.org/realms/acme")},
		{name: "plain http", tcp: withIssuers(nil, "http://idp.example.com"),
			want: []want{{j0 + ".issuer.url", field.ErrorTypeInvalid, []string{"https"}}}},
		{name: "the tenant's own ServiceAccount issuer", tcp: withIssuers(nil, "https://kubernetes.default.svc.cluster.local"),
			want: []want{{j0 + ".issuer.url", field.ErrorTypeInvalid, []string{"disallowed", "tenant's own ServiceAccount tokens"}}}},
		{name: "an overridden ServiceAccount issuer", tcp: withIssuers(func(tcp *apiary.TenantControlPlane, _ []apiary.JWTAuthenticator) {
			tcp.Spec.APIServer.ExtraArgs = map[string]string{"service-account-issuer": "https://sa.acme.example"}
		}, "https://sa.acme.example"),
			want: []want{{j0 + ".issuer.url", field.ErrorTypeInvalid, []string{"disallowed"}}}},
		{name: "the same issuer twice", tcp: withIssuers(nil, "https://idp.example.com", "https://idp.example.com"),
			want: []want{{"spec.authentication.jwt[1].issuer.url", field.ErrorTypeDuplicate, nil}}},
		{name: "no audience", tcp: withIssuers(func(_ *apiary.TenantControlPlane, j []apiary.JWTAuthenticator) { j[0].Issuer.Audiences = nil }, "https://idp.example.com"),
			want: []want{{j0 + ".issuer.audiences", field.ErrorTypeRequired, nil}}},
		{name: "a username claim without a prefix", tcp: withIssuers(func(_ *apiary.TenantControlPlane, j []apiary.JWTAuthenticator) {
			j[0].ClaimMappings.Username.Prefix = nil
		}, "https://idp.example.com"),
			want: []want{{j0 + ".claimMappings.username.prefix", field.ErrorTypeRequired, nil}}},
		{name: "CEL that does not compile", tcp: withIssuers(func(_ *apiary.TenantControlPlane, j []apiary.JWTAuthenticator) {
			j[0].ClaimMappings.Username = apiserverv1.PrefixedClaimOrExpression{Expression: "claims.email +"}
		}, "https://idp.example.com"),
			want: []want{{j0 + ".claimMappings.username.expression", field.ErrorTypeInvalid, []string{"compilation failed"}}}},
		{name: "certificates that are not PEM", tcp: withIssuers(func(_ *apiary.TenantControlPlane, j []apiary.JWTAuthenticator) {
			j[0].Issuer.CertificateAuthority = "not a certificate"
		}, "https://idp.example.com"),
			want: []want{{j0 + ".issuer.certificateAuthority", field.ErrorTypeInvalid, nil}}},
		{name: "certificates inline and from a reference", tcp: withIssuers(func(_ *apiary.TenantControlPlane, j []apiary.JWTAuthenticator) {
			j[0].Issuer.CertificateAuthority = "x"
			j[0].CertificateAuthorityRef = &apiary.CertificateAuthorityReference{Kind: "Secret", Name: "idp-ca"}
		}, "https://idp.example.com"),
			want: []want{{j0 + ".certificateAuthorityRef", field.ErrorTypeForbidden, []string{"issuer.certificateAuthority"}}}},
		{name: "a reference of another kind", tcp: withIssuers(func(_ *apiary.TenantControlPlane, j []apiary.JWTAuthenticator) {
			j[0].CertificateAuthorityRef = &apiary.CertificateAuthorityReference{Kind: "Pod", Name: "idp"}
		}, "https://idp.example.com"),
			want: []want{{j0 + ".certificateAuthorityRef.kind", field.ErrorTypeNotSupported, nil}}},
		{name: "oidc flags beside it", tcp: withIssuers(func(tcp *apiary.TenantControlPlane, _ []apiary.JWTAuthenticator) {
			tcp.Spec.APIServer.ExtraArgs = map[string]string{"oidc-issuer-url": "https://idp.example.com"}
		}, "https://idp.example.com"),
			want: []want{{"spec.apiServer.extraArgs[oidc-issuer-url]", field.ErrorTypeForbidden, []string{"--authentication-config"}}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			errs := Validate(c.tcp)
			if len(errs) != len(c.want) {
				t.Fatalf("got %d errors, want %d: %v", len(errs), len(c.want), errs)
			}
			for i, w := range c.want {
				e := errs[i]
				if e.Field != w.field || e.Type != w.typ {
					t.Errorf("error %d: %s %s, want %s %s (%v)", i, e.Field, e.Type, w.field, w.typ, e)
				}
				for _, d := range w.detail {
					if !strings.Contains(e.Detail, d) && !strings.Contains(e.Error(), d) {
						t.Errorf("error %d %q does not say %q", i, e.Error(), d)
					}
				}
			}
		})
	}
}
