package render

import (
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"

	"github.com/apiaryhq/apiary/konnectivity"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/operator/render/conventions"
	"github.com/apiaryhq/apiary/pki"
)

// konnectivity-server runs beside kube-apiserver in every control-plane pod
// (package konnectivity says how and why); this file is the tenant's side
// of it: the toggle, the ConfigMap of the egress selector configuration,
// the server's certificate and the volume of the tenant's Secrets.
const (
	// KeyEgressSelectorConfig is the key of the egress selector
	// configuration in the tenant's konnectivity ConfigMap.
	KeyEgressSelectorConfig = "egress-selector-configuration.yaml"

	// KonnectivityCN is the client certificate's user; the tenant binds it to
	// system:auth-delegator (token reviews) and lets it manage its leases.
	KonnectivityCN = konnectivity.ServerUser
)

// KonnectivityEnabled says whether the tenant runs konnectivity (the
// default).
func KonnectivityEnabled(tcp *apiary.TenantControlPlane) bool {
	e := tcp.Spec.Addons.Konnectivity.Enabled
	return e == nil || *e
}

// KonnectivityConfigMapName holds the API server's egress selector
// configuration.
func KonnectivityConfigMapName(tcp *apiary.TenantControlPlane) string {
	return tcp.Name + "-konnectivity"
}

// KonnectivityConfigMap holds files of the control-plane pod that are not
// secret.
func KonnectivityConfigMap(tcp *apiary.TenantControlPlane) *corev1ac.ConfigMapApplyConfiguration {
	return corev1ac.ConfigMap(KonnectivityConfigMapName(tcp), tcp.Namespace).
		WithLabels(Labels(tcp)).
		WithOwnerReferences(OwnerReference(tcp)).
		WithData(map[string]string{KeyEgressSelectorConfig: konnectivity.EgressSelectorConfiguration})
}

// KonnectivityServerCertRequest names every address agents dial: the same
// names as the API server's certificate.
func KonnectivityServerCertRequest(tcp *apiary.TenantControlPlane, ep Endpoint, mgmtClusterDomain string) pki.Request {
	req := APIServerCertRequest(tcp, ep, mgmtClusterDomain)
	req.CommonName = konnectivity.ServerName
	return req
}

func konnectivityContainer(in Inputs) *corev1ac.ContainerApplyConfiguration {
	return conventions.Harden(konnectivity.ServerContainer(
		konnectivity.ServerImage(in.ImageRepository),
		resources(konnectivity.ServerName, apiary.ComponentSpec{})))
}
