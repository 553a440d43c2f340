package cli

import (
	"fmt"
	"strings"

	clientauthv1 "k8s.io/client-go/pkg/apis/clientauthentication/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	apiaryv1alpha1 "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

// OIDCKubeconfigOptions say which provider a users' kubeconfig signs in to.
type OIDCKubeconfigOptions struct {
	// Issuer and ClientID default to the tenant's only issuer and its
	// first audience.
	Issuer, ClientID string
	// Listen, CAFile: "apiary oidc-login" flags.
	Listen, CAFile string
	// Command is the apiary binary the kubeconfig runs (default apiary).
	Command string
}

// OIDCUser names the kubeconfig user of a users' kubeconfig.
const OIDCUser = "oidc"

// OIDCKubeconfig turns a tenant's admin kubeconfig into one for its users:
// the same clusters (endpoint and CA), the admin credential gone, one user
// whose exec plugin is "apiary oidc-login". It refuses an issuer the
// tenant does not accept, and a client ID that is none of its audiences,
// since the tenant would refuse every token.
func OIDCKubeconfig(admin []byte, tcp *apiaryv1alpha1.TenantControlPlane, o OIDCKubeconfigOptions) ([]byte, error) {
	var issuers []string
	var jwt *apiaryv1alpha1.JWTAuthenticator
	if a := tcp.Spec.Authentication; a != nil {
		for i := range a.JWT {
			issuers = append(issuers, a.JWT[i].Issuer.URL)
			if a.JWT[i].Issuer.URL == o.Issuer || (o.Issuer == "" && len(a.JWT) == 1) {
				jwt = &a.JWT[i]
			}
		}
	}
	switch {
	case len(issuers) == 0:
		return nil, fmt.Errorf("tenantcontrolplane %s/%s accepts no OpenID tokens: set spec.authentication.jwt (see docs/authentication.md)", tcp.Namespace, tcp.Name)
	case jwt == nil && o.Issuer == "":
		return nil, fmt.Errorf("tenantcontrolplane %s/%s accepts several issuers (%s): choose one with --oidc-issuer", tcp.Namespace, tcp.Name, strings.Join(issuers, ", "))
	case jwt == nil:
		return nil, fmt.Errorf("tenantcontrolplane %s/%s does not accept issuer %s; it accepts: %s", tcp.Namespace, tcp.Name, o.Issuer, strings.Join(issuers, ", "))
	}
	auds := jwt.Issuer.Audiences
	if o.ClientID == "" && len(auds) > 0 {
		o.ClientID = auds[0]
	}
	accepted := false
	for _, a := range auds {
		accepted = accepted || a == o.ClientID
	}
	if !accepted {
		return nil, fmt.Errorf("issuer %s of tenantcontrolplane %s/%s accepts the audiences %s, not client ID %q: choose one with --oidc-client-id",
			jwt.Issuer.URL, tcp.Namespace, tcp.Name, strings.Join(auds, ", "), o.ClientID)
	}
	if o.Command == "" {
		o.Command = "apiary"
	}
	if o.Listen == "" {
		o.Listen = DefaultOIDCListen
	}

	cfg, err := clientcmd.Load(admin)
	if err != nil {
		return nil, fmt.Errorf("reading the tenant's kubeconfig: %w", err)
	}
	args := []string{"oidc-login", "--issuer", jwt.Issuer.URL, "--client-id", o.ClientID, "--listen", o.Listen}
	if o.CAFile != "" {
		args = append(args, "--ca-file", o.CAFile)
	}
	cfg.AuthInfos = map[string]*clientcmdapi.AuthInfo{OIDCUser: {Exec: &clientcmdapi.ExecConfig{
		APIVersion:      clientauthv1.SchemeGroupVersion.String(),
		Command:         o.Command,
		Args:            args,
		InteractiveMode: clientcmdapi.IfAvailableExecInteractiveMode,
		InstallHint:     "apiary oidc-login signs you in: install the apiary CLI (see the Apiary README) and put it on your PATH",
	}}}
	for name, c := range cfg.Contexts {
		c.AuthInfo = OIDCUser
		cfg.Contexts[name] = c
	}
	return clientcmd.Write(*cfg)
}
