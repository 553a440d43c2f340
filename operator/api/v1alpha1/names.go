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
	// AnnotationRotateCertificates on a TenantControlPlane asks for every
	// leaf certificate to be re-issued now. Its value is a token: each new
	// value is one rotation (status.certificateRotation records the last
	// one handled). "apiary certs rotate" sets it to the time of the
	// request.
	AnnotationRotateCertificates = "apiary.dev/rotate-certificates"
	// AnnotationRotateCA on a TenantControlPlane asks for its cluster CA
	// to be replaced (status.caRotation follows it); each new value is one
	// rotation. "apiary certs rotate --ca" sets it to the time of the
	// request.
	AnnotationRotateCA = "apiary.dev/rotate-ca"
	// AnnotationCordonedForUpgrade on a tenant's Node marks a cordon the
	// operator made for a Host upgrade (its value: the version upgraded
	// to). Only such a cordon is lifted when the upgrade ends: a Node its
	// admin cordoned stays cordoned.
	AnnotationCordonedForUpgrade = "apiary.dev/cordoned-for-upgrade"
)

// AdminKubeconfigSecretName is the Secret holding the tenant's admin
// kubeconfigs.
func (t *TenantControlPlane) AdminKubeconfigSecretName() string {
	return t.Name + "-admin-kubeconfig"
}

// RunningVersion is the Kubernetes version the tenant runs: status.version
// once a control plane has fully rolled out, else spec.version (nothing
// else can be running yet). What Apiary puts inside the tenant and on its
// hosts (kubeadm-config, kube-proxy, node bundles) follows it, never
// spec.version, so that nothing is newer than a running kube-apiserver
// while an upgrade rolls.
func (t *TenantControlPlane) RunningVersion() string {
	if t.Status.Version != "" {
		return t.Status.Version
	}
	return t.Spec.Version
}

// Switching reports whether a mode switch is in progress.
func (s *TenantControlPlaneStatus) Switching() bool {
	return s.ModeSwitch != nil && s.ModeSwitch.Phase != SwitchCompleted
}
