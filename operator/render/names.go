// Package render holds the pure functions that turn a TenantControlPlane and
// the facts observed about it into the objects the operator applies: the
// Service, the control-plane Deployment, its arguments, and the content of
// the tenant's Secrets. Nothing here talks to an API server or reads the
// clock, so the same inputs always give the same objects (golden-file tests).
package render

import (
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/operator/render/conventions"
)

// Labels and annotations on every object Apiary creates for a tenant. All
// but LabelTenant and AnnotationAdmissionHash are shared with the managed
// etcds (package conventions).
const (
	LabelTenant    = "apiary.dev/tenant"
	LabelManagedBy = conventions.LabelManagedBy
	LabelComponent = conventions.LabelComponent
	LabelSecret    = conventions.LabelSecret
	ManagedBy      = conventions.ManagedBy

	// AnnotationConfigHash on the pod template is a hash of every Secret
	// mounted into the control-plane pods: a change to any of them rolls the
	// pods.
	AnnotationConfigHash = conventions.AnnotationConfigHash
	// AnnotationAdmissionHash on a running control-plane pod is the hash of
	// the quota policy its kubelet was last asked to write (the operator
	// sets it on the pods, not the template: no rollout).
	AnnotationAdmissionHash = "apiary.dev/admission-hash"

	componentControlPlane = "control-plane"
)

// SecretKind names one of the Secrets of a tenant (or of a managed etcd,
// see managedetcd); the Secret's name is "<tenant>-<kind>".
type SecretKind = conventions.SecretKind

const (
	SecretCA SecretKind = "ca"
	// SecretCATrust holds the cluster CA bundle everything of the tenant
	// trusts (key ca.crt): the CA, and during a CA rotation the one it
	// replaces or is about to be replaced by.
	SecretCATrust SecretKind = "ca-trust"
	// SecretCANext is the CA a rotation moves to, while the old one still
	// issues (the TrustNew phase); it exists only then.
	SecretCANext                 SecretKind = "ca-next"
	SecretAPIServer              SecretKind = "apiserver"
	SecretAPIServerKubeletClient SecretKind = "apiserver-kubelet-client"
	SecretFrontProxyCA           SecretKind = "front-proxy-ca"
	SecretFrontProxyClient       SecretKind = "front-proxy-client"
	SecretServiceAccount         SecretKind = "sa"
	SecretDataStoreClient        SecretKind = "datastore-client"
	SecretAdminKubeconfig        SecretKind = "admin-kubeconfig"
	// SecretOperatorKubeconfig is the operator's own break-glass
	// credential (system:masters); it is never exported.
	SecretOperatorKubeconfig      SecretKind = "operator-kubeconfig"
	SecretControllerManagerConfig SecretKind = "controller-manager-kubeconfig"
	SecretSchedulerConfig         SecretKind = "scheduler-kubeconfig"
	SecretKonnectivityServer      SecretKind = "konnectivity-server"
	SecretKonnectivityKubeconfig  SecretKind = "konnectivity-server-kubeconfig"
)

// AllSecretKinds lists every Secret of a tenant, in the order they are
// issued (CAs before what they sign).
var AllSecretKinds = []SecretKind{
	SecretCA, SecretCATrust, SecretFrontProxyCA, SecretServiceAccount, SecretDataStoreClient,
	SecretAPIServer, SecretAPIServerKubeletClient, SecretFrontProxyClient,
	SecretAdminKubeconfig, SecretOperatorKubeconfig, SecretControllerManagerConfig, SecretSchedulerConfig,
	SecretKonnectivityServer, SecretKonnectivityKubeconfig,
}

// Keys inside the Secrets.
const (
	KeyTLSCert = conventions.KeyTLSCert
	KeyTLSKey  = conventions.KeyTLSKey
	KeyCACert  = conventions.KeyCACert
	KeySAKey   = "sa.key"
	KeySAPub   = "sa.pub"
)

// SecretName is the name of a tenant's Secret of the given kind.
func SecretName(tcp *apiary.TenantControlPlane, kind SecretKind) string {
	if kind == SecretAdminKubeconfig {
		return tcp.AdminKubeconfigSecretName()
	}
	return tcp.Name + "-" + string(kind)
}

// ServiceName is the tenant API Service; DeploymentName the control plane.
// ObjectNames are the names of the objects of each kind Apiary makes for a
// tenant in its namespace: two tenants of one namespace must not share
// one (tenant "a-front-proxy"'s Secret "a-front-proxy-ca" is tenant "a"'s
// front-proxy CA).
func ObjectNames(tcp *apiary.TenantControlPlane) map[string][]string {
	secrets := make([]string, 0, len(AllSecretKinds))
	for _, k := range AllSecretKinds {
		secrets = append(secrets, SecretName(tcp, k))
	}
	return map[string][]string{
		"Secret":        secrets,
		"ConfigMap":     {KonnectivityConfigMapName(tcp), AdmissionConfigMapName(tcp)},
		"Service":       {ServiceName(tcp)},
		"Deployment":    {DeploymentName(tcp)},
		"NetworkPolicy": {NetworkPolicyName(tcp.Name)},
	}
}

func ServiceName(tcp *apiary.TenantControlPlane) string    { return tcp.Name }
func DeploymentName(tcp *apiary.TenantControlPlane) string { return tcp.Name }

// Labels of every object of the tenant.
func Labels(tcp *apiary.TenantControlPlane) map[string]string {
	return map[string]string{
		LabelTenant:    tcp.Name,
		LabelManagedBy: ManagedBy,
	}
}

// SelectorLabels select the tenant's control-plane pods.
func SelectorLabels(tcp *apiary.TenantControlPlane) map[string]string {
	return map[string]string{
		LabelTenant:    tcp.Name,
		LabelComponent: componentControlPlane,
	}
}
