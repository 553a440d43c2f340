package render

import (
	"slices"
	"strings"
	"testing"

	apiserverv1 "k8s.io/apiserver/pkg/apis/apiserver/v1"

	"github.com/apiaryhq/apiary/internal/golden"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

// authenticationFixture has three issuers: certificates inline, from a
// reference that was read, and from one never read (left out).
func authenticationFixture() *apiary.TenantControlPlane {
	tcp := fixture()
	jwt := func(url, aud string) apiserverv1.JWTAuthenticator {
		return apiserverv1.JWTAuthenticator{
			Issuer: apiserverv1.Issuer{URL: url, Audiences: []string{aud}},
			ClaimMappings: apiserverv1.ClaimMappings{
				Username: apiserverv1.PrefixedClaimOrExpression{Claim: "email", Prefix: new("oidc:")},
				Groups:   apiserverv1.PrefixedClaimOrExpression{Claim: "groups", Prefix: new("oidc:")},
			},
		}
	}
	inline := jwt("https://idp.example.com", "kubernetes")
	inline.Issuer.CertificateAuthority = "-----BEGIN CERTIFICATE-----\ninline\n-----END CERTIFICATE-----\n"
	inline.ClaimValidationRules = []apiserverv1.ClaimValidationRule{{Expression: "claims.email_verified == true", Message: "email not verified"}}
	tcp.Spec.Authentication = &apiary.AuthenticationSpec{JWT: []apiary.JWTAuthenticator{
		{JWTAuthenticator: inline},
		{JWTAuthenticator: jwt("https://dex.example.com", "acme"), CertificateAuthorityRef: &apiary.CertificateAuthorityReference{Kind: "ConfigMap", Name: "dex-ca"}},
		{JWTAuthenticator: jwt("https://never-read.example.com", "acme"), CertificateAuthorityRef: &apiary.CertificateAuthorityReference{Kind: "Secret", Name: "missing"}},
	}}
	return tcp
}

func TestAuthenticationConfigMapGolden(t *testing.T) {
	tcp := authenticationFixture()
	file, err := AuthenticationFile(AuthenticationConfiguration(tcp, map[int]string{1: "-----BEGIN CERTIFICATE-----\nreferenced\n-----END CERTIFICATE-----\n"}))
	if err != nil {
		t.Fatal(err)
	}
	golden.YAML(t, "authentication", AuthenticationConfigMap(tcp, file))
}

func TestNoAuthenticationWithoutIssuers(t *testing.T) {
	tcp := fixture()
	if cfg := AuthenticationConfiguration(tcp, nil); cfg != nil {
		t.Errorf("a tenant without spec.authentication renders %+v", cfg)
	}
	tcp.Spec.Authentication = &apiary.AuthenticationSpec{}
	if file, err := AuthenticationFile(AuthenticationConfiguration(tcp, nil)); err != nil || file != "" {
		t.Errorf("an empty spec.authentication renders %q, %v", file, err)
	}
}

// The file reaches the API server at the path of its flag, in the
// Deployment and on a registered host, and its content rolls the pods;
// a tenant without it keeps the hash it had.
func TestAuthenticationReachesTheAPIServer(t *testing.T) {
	tcp := authenticationFixture()
	in := inputs(tcp)
	without := in.ConfigHash()
	in.Authentication = "apiVersion: apiserver.config.k8s.io/v1\nkind: AuthenticationConfiguration\njwt: []\n"

	if !slices.Contains(APIServerArgs(in), "--authentication-config="+pathAuthenticationConfig) {
		t.Errorf("kube-apiserver args %v lack --authentication-config", APIServerArgs(in))
	}
	if slices.ContainsFunc(APIServerArgs(inputs(fixture())), func(a string) bool { return strings.HasPrefix(a, "--authentication-config") }) {
		t.Error("a tenant without spec.authentication gets --authentication-config")
	}
	dep := Deployment(in)
	var projected bool
	for _, v := range dep.Spec.Template.Spec.Volumes {
		if *v.Name != containerAPIServer {
			continue
		}
		for _, s := range v.Projected.Sources {
			if s.ConfigMap != nil && *s.ConfigMap.Name == AuthenticationConfigMapName(tcp) &&
				*s.ConfigMap.Items[0].Key == KeyAuthenticationConfig && "/etc/kubernetes/"+*s.ConfigMap.Items[0].Path == pathAuthenticationConfig {
				projected = true
			}
		}
	}
	if !projected {
		t.Error("the API server's volume does not project the authentication ConfigMap at the flag's path")
	}

	hash := in.ConfigHash()
	if hash == without {
		t.Error("the authentication file does not change the pods' hash")
	}
	changed := in
	changed.Authentication += "# changed\n"
	if changed.ConfigHash() == hash {
		t.Error("a change of the authentication file does not roll the pods")
	}

	host := issuedInputs()
	host.TCP, host.Authentication = tcp, in.Authentication
	files, _, err := StaticPods(host, nil)
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(files, func(f HostFile) bool { return f.Path == pathAuthenticationConfig })
	if i < 0 || string(files[i].Data) != in.Authentication {
		t.Errorf("a control-plane host does not get the authentication file at %s", pathAuthenticationConfig)
	}
}

// No JWT issuer may claim the tenant's own ServiceAccount tokens, whether
// the issuer is Apiary's or an override.
func TestServiceAccountIssuers(t *testing.T) {
	tcp := fixture()
	def := "https://kubernetes.default.svc." + tcp.Spec.Network.ClusterDomain
	if got := ServiceAccountIssuers(tcp); !slices.Equal(got, []string{def}) {
		t.Errorf("ServiceAccountIssuers = %v", got)
	}
	if !slices.Contains(APIServerArgs(inputs(tcp)), "--service-account-issuer="+def) {
		t.Error("the API server's issuer is not the default ServiceAccountIssuers names")
	}
	tcp.Spec.APIServer.ExtraArgs = map[string]string{"service-account-issuer": "https://sa.acme.example"}
	if got := ServiceAccountIssuers(tcp); !slices.Equal(got, []string{def, "https://sa.acme.example"}) {
		t.Errorf("ServiceAccountIssuers with an override = %v", got)
	}
}
