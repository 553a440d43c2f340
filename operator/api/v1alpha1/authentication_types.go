package v1alpha1

import (
	apiserverv1 "k8s.io/apiserver/pkg/apis/apiserver/v1"
)

// AuthenticationSpec lets the tenant's users sign in to its API with
// tokens of their own identity providers, beside the client certificates
// and ServiceAccount tokens Apiary sets up. It is rendered into
// kube-apiserver's structured AuthenticationConfiguration
// (apiserver.config.k8s.io/v1), mounted as a file and passed with
// --authentication-config, and checked at admission with kube-apiserver's
// own validation of that type.
type AuthenticationSpec struct {
	// JWT are the token issuers (OpenID Connect providers) the tenant API
	// accepts, each exactly as kube-apiserver's
	// AuthenticationConfiguration.jwt[] reads it, plus
	// certificateAuthorityRef. At most 64; issuer URLs are unique and none
	// may be the tenant's ServiceAccount issuer.
	// +kubebuilder:validation:MaxItems=64
	// +listType=atomic
	// +optional
	JWT []JWTAuthenticator `json:"jwt,omitempty"`
}

// JWTAuthenticator is one token issuer: kube-apiserver's JWTAuthenticator
// (issuer, claimMappings, claimValidationRules, userValidationRules).
type JWTAuthenticator struct {
	apiserverv1.JWTAuthenticator `json:",inline"`
	// CertificateAuthorityRef names a key of a ConfigMap or Secret in the
	// tenant's namespace holding the PEM certificates that verify the
	// issuer's TLS (its discovery document and keys), instead of
	// issuer.certificateAuthority. Only CERTIFICATE blocks are read; a key
	// with anything else is refused and not copied. Its author must be
	// allowed to get it. The operator reads it again every minute; while
	// it cannot, the issuer keeps the certificates read last.
	// +optional
	CertificateAuthorityRef *CertificateAuthorityReference `json:"certificateAuthorityRef,omitempty"`
}

// CertificateAuthorityReference is a key of a ConfigMap or Secret in the
// tenant's namespace.
type CertificateAuthorityReference struct {
	// Kind of the object: ConfigMap or Secret.
	// +kubebuilder:validation:Enum=ConfigMap;Secret
	Kind string `json:"kind"`
	// Name of the object.
	// +kubebuilder:validation:MinLength=1
	Name string `json:"name"`
	// Key holding the certificates (default ca.crt).
	// +optional
	Key string `json:"key,omitempty"`
}

// DefaultCAKey is the key a CertificateAuthorityReference reads when it
// names none.
const DefaultCAKey = "ca.crt"

// KeyOrDefault is the key the reference reads.
func (r CertificateAuthorityReference) KeyOrDefault() string {
	if r.Key == "" {
		return DefaultCAKey
	}
	return r.Key
}

// ConditionAuthenticationConfigured: a tenant with spec.authentication
// has every issuer in its API server's AuthenticationConfiguration, with
// the certificates its reference holds now.
const ConditionAuthenticationConfigured = "AuthenticationConfigured"
