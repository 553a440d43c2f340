package render

import (
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	apiserverv1 "k8s.io/apiserver/pkg/apis/apiserver/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"sigs.k8s.io/yaml"

	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

// A tenant's spec.authentication becomes kube-apiserver's structured
// AuthenticationConfiguration, a file in the API server's projected volume
// (a ConfigMap of the tenant; a file on a registered tenant's control-plane
// hosts) passed with --authentication-config. The file's content is hashed
// into the pods, so a change rolls them; kube-apiserver would also reload
// it, which keeps a pod that has not rolled yet consistent in between.
const (
	// KeyAuthenticationConfig is the key of the file in the tenant's
	// authentication ConfigMap.
	KeyAuthenticationConfig  = "authentication-configuration.yaml"
	pathAuthenticationConfig = kubernetesDir + "/" + KeyAuthenticationConfig
)

// AuthenticationConfigMapName holds the tenant's AuthenticationConfiguration.
func AuthenticationConfigMapName(tcp *apiary.TenantControlPlane) string {
	return tcp.Name + "-authentication"
}

// AuthenticationEnabled says whether the tenant configures token issuers.
func AuthenticationEnabled(tcp *apiary.TenantControlPlane) bool {
	return tcp.Spec.Authentication != nil && len(tcp.Spec.Authentication.JWT) > 0
}

// AuthenticationConfiguration is what kube-apiserver reads from the file.
// referenced holds, by index in spec.authentication.jwt, the certificates
// read from an issuer's certificateAuthorityRef; an issuer with a
// reference but no entry is left out (its certificates were never read:
// trusting the system roots instead would verify the wrong thing). nil
// without issuers.
func AuthenticationConfiguration(tcp *apiary.TenantControlPlane, referenced map[int]string) *apiserverv1.AuthenticationConfiguration {
	if !AuthenticationEnabled(tcp) {
		return nil
	}
	cfg := &apiserverv1.AuthenticationConfiguration{
		TypeMeta: metav1.TypeMeta{APIVersion: apiserverv1.SchemeGroupVersion.String(), Kind: "AuthenticationConfiguration"},
		// kube-apiserver accepts an empty list: an issuer left out
		// does not stop the API server.
		JWT: []apiserverv1.JWTAuthenticator{},
	}
	for i, a := range tcp.Spec.Authentication.JWT {
		j := *a.JWTAuthenticator.DeepCopy()
		if a.CertificateAuthorityRef != nil {
			ca, ok := referenced[i]
			if !ok {
				continue
			}
			j.Issuer.CertificateAuthority = ca
		}
		cfg.JWT = append(cfg.JWT, j)
	}
	return cfg
}

// AuthenticationFile is the configuration as the file holds it; "" for
// nil.
func AuthenticationFile(cfg *apiserverv1.AuthenticationConfiguration) (string, error) {
	if cfg == nil {
		return "", nil
	}
	b, err := yaml.Marshal(cfg)
	if err != nil {
		return "", fmt.Errorf("rendering the AuthenticationConfiguration: %w", err)
	}
	return string(b), nil
}

// AuthenticationConfigMap holds the file the API server mounts.
func AuthenticationConfigMap(tcp *apiary.TenantControlPlane, file string) *corev1ac.ConfigMapApplyConfiguration {
	return corev1ac.ConfigMap(AuthenticationConfigMapName(tcp), tcp.Namespace).
		WithLabels(Labels(tcp)).
		WithOwnerReferences(OwnerReference(tcp)).
		WithData(map[string]string{KeyAuthenticationConfig: file})
}

// ServiceAccountIssuers are the issuers of the tenant's own ServiceAccount
// tokens (Apiary's default and an extraArgs override): no JWT issuer may
// claim them.
func ServiceAccountIssuers(tcp *apiary.TenantControlPlane) []string {
	out := []string{defaultServiceAccountIssuer(tcp)}
	if v, ok := tcp.Spec.APIServer.ExtraArgs["service-account-issuer"]; ok && v != out[0] {
		out = append(out, v)
	}
	return out
}

func defaultServiceAccountIssuer(tcp *apiary.TenantControlPlane) string {
	return "https://kubernetes.default.svc." + tcp.Spec.Network.ClusterDomain
}
