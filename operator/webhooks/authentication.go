package webhooks

import (
	"fmt"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/util/validation/field"
	apiserver "k8s.io/apiserver/pkg/apis/apiserver"
	apiserverv1 "k8s.io/apiserver/pkg/apis/apiserver/v1"
	apiservervalidation "k8s.io/apiserver/pkg/apis/apiserver/validation"
	authenticationcel "k8s.io/apiserver/pkg/authentication/cel"

	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/operator/render"
)

// celCompiler compiles the claim mappings and validation rules the way
// kube-apiserver does; built once (its environment is costly).
var celCompiler = sync.OnceValue(authenticationcel.NewDefaultCompiler)

// ValidateAuthentication checks spec.authentication with kube-apiserver's
// own validation of an AuthenticationConfiguration (URLs, audiences, claim
// mappings and rules compiled as CEL, duplicate issuers), with the tenant's
// ServiceAccount issuers disallowed, plus what Apiary adds: one source of
// an issuer's certificates, and no --oidc-* flags beside it (kube-apiserver
// refuses to start with both). Errors name spec.authentication.jwt[i]....
func ValidateAuthentication(tcp *apiary.TenantControlPlane) field.ErrorList {
	if !render.AuthenticationEnabled(tcp) {
		return nil
	}
	root := field.NewPath("spec", "authentication")
	var errs field.ErrorList
	for i, a := range tcp.Spec.Authentication.JWT {
		ref := a.CertificateAuthorityRef
		if ref == nil {
			continue
		}
		p := root.Child("jwt").Index(i).Child("certificateAuthorityRef")
		if a.Issuer.CertificateAuthority != "" {
			errs = append(errs, field.Forbidden(p, "must not be set together with issuer.certificateAuthority: name the certificates once"))
		}
		switch ref.Kind {
		case "ConfigMap", "Secret":
		default:
			errs = append(errs, field.NotSupported(p.Child("kind"), ref.Kind, []string{"ConfigMap", "Secret"}))
		}
		if ref.Name == "" {
			errs = append(errs, field.Required(p.Child("name"), "name the ConfigMap or Secret of the tenant's namespace holding the certificates"))
		}
	}
	for k := range tcp.Spec.APIServer.ExtraArgs {
		if strings.HasPrefix(NormalizeFlagName(k), "oidc-") {
			errs = append(errs, field.Forbidden(field.NewPath("spec", "apiServer", "extraArgs").Key(k),
				"--oidc-* flags cannot be set together with spec.authentication: kube-apiserver refuses them beside --authentication-config; configure the issuer in spec.authentication.jwt"))
		}
	}

	// What the file will say, with every referenced issuer present (its
	// certificates are checked when the operator reads them).
	refs := map[int]string{}
	for i, a := range tcp.Spec.Authentication.JWT {
		if a.CertificateAuthorityRef != nil {
			refs[i] = ""
		}
	}
	var internal apiserver.AuthenticationConfiguration
	if err := apiserverv1.Convert_v1_AuthenticationConfiguration_To_apiserver_AuthenticationConfiguration(render.AuthenticationConfiguration(tcp, refs), &internal, nil); err != nil {
		return append(errs, field.InternalError(root, fmt.Errorf("converting the AuthenticationConfiguration: %w", err)))
	}
	for _, e := range apiservervalidation.ValidateAuthenticationConfiguration(celCompiler(), &internal, render.ServiceAccountIssuers(tcp)) {
		e.Field = root.String() + "." + e.Field
		if e.Type == field.ErrorTypeInvalid && strings.HasSuffix(e.Field, ".issuer.url") && strings.Contains(e.Detail, "disallowed") {
			e.Detail += " (it is the issuer of the tenant's own ServiceAccount tokens)"
		}
		errs = append(errs, e)
	}
	return errs
}
