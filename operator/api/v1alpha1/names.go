package v1alpha1

// Names of the objects Apiary creates for a tenant, shared by the operator
// and the CLI.

const (
	// KubeconfigKey is the key of the kubeconfig (public endpoint) in the
	// admin kubeconfig Secret.
	KubeconfigKey = "kubeconfig"
	// InternalKubeconfigKey is the key of the kubeconfig that addresses the
	// tenant through its Service's cluster DNS name, for clients inside the
	// management cluster.
	InternalKubeconfigKey = "kubeconfig-internal"
)

// AdminKubeconfigSecretName is the Secret holding the tenant's admin
// kubeconfigs.
func (t *TenantControlPlane) AdminKubeconfigSecretName() string {
	return t.Name + "-admin-kubeconfig"
}
