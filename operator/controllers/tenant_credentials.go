package controllers

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/apiaryhq/apiary/datastore"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/operator/render"
	"github.com/apiaryhq/apiary/pki"
)

// issueBase issues the CAs, the service-account key, the client
// certificates that do not name the endpoint, and the datastore client.
func (r *TenantControlPlaneReconciler) issueBase(ctx context.Context, tcp *apiary.TenantControlPlane, cr *credentials, ds *apiary.DataStore, dsCfg datastore.Config) (*pki.KeyPair, error) {
	ca, err := cr.ca(ctx, render.SecretCA, render.CACommonName(tcp))
	if err != nil {
		return nil, err
	}
	if err := r.caTrust(ctx, tcp, cr, ca); err != nil {
		return nil, err
	}
	frontProxyCA, err := cr.ca(ctx, render.SecretFrontProxyCA, render.FrontProxyCACommonName(tcp))
	if err != nil {
		return nil, err
	}
	if err := cr.serviceAccountKey(ctx); err != nil {
		return nil, err
	}
	dsCA, err := pki.ParseKeyPair(dsCfg.CACert, dsCfg.CAKey)
	if err != nil {
		return nil, fmt.Errorf("DataStore %s CA: %w", ds.Name, err)
	}
	tenant := datastore.Tenant{User: tcp.Status.DataStore.User, Prefix: tcp.Status.DataStore.Prefix}
	if err := cr.leaf(ctx, render.SecretDataStoreClient, dsCA, datastore.ClientCertRequest(tenant), map[string][]byte{render.KeyCACert: dsCfg.CACert}); err != nil {
		return nil, err
	}
	if err := cr.leaf(ctx, render.SecretAPIServerKubeletClient, ca, render.ClientCertRequest(render.KubeletClientCN, render.MastersGroup), nil); err != nil {
		return nil, err
	}
	if err := cr.leaf(ctx, render.SecretFrontProxyClient, frontProxyCA, render.ClientCertRequest(render.FrontProxyClientCN), nil); err != nil {
		return nil, err
	}
	loopback := render.LoopbackURL(tcp)
	if err := cr.kubeconfigs(ctx, render.SecretControllerManagerConfig, ca, render.ClientCertRequest(render.ControllerManagerCN), "controller-manager",
		kubeconfig{key: apiary.KubeconfigKey, server: loopback}); err != nil {
		return nil, err
	}
	if err := cr.kubeconfigs(ctx, render.SecretSchedulerConfig, ca, render.ClientCertRequest(render.SchedulerCN), "scheduler",
		kubeconfig{key: apiary.KubeconfigKey, server: loopback}); err != nil {
		return nil, err
	}
	if err := cr.kubeconfigs(ctx, render.SecretKonnectivityKubeconfig, ca, render.ClientCertRequest(render.KonnectivityCN), "konnectivity-server-client",
		kubeconfig{key: apiary.KubeconfigKey, server: loopback}); err != nil {
		return nil, err
	}
	return ca, nil
}

// issueEndpointBound issues the serving certificate and the admin
// kubeconfigs, which name the endpoint.
func (r *TenantControlPlaneReconciler) issueEndpointBound(ctx context.Context, tcp *apiary.TenantControlPlane, cr *credentials, ca *pki.KeyPair, ep render.Endpoint) error {
	if err := cr.leaf(ctx, render.SecretAPIServer, ca, render.APIServerCertRequest(tcp, ep, r.ClusterDomain), nil); err != nil {
		return err
	}
	if err := cr.leaf(ctx, render.SecretKonnectivityServer, ca, render.KonnectivityServerCertRequest(tcp, ep, r.ClusterDomain), nil); err != nil {
		return err
	}
	if err := cr.kubeconfigs(ctx, render.SecretOperatorKubeconfig, ca, render.ClientCertRequest(render.OperatorCN, render.MastersGroup), "apiary-operator",
		kubeconfig{key: apiary.KubeconfigKey, server: ep.URL()}); err != nil {
		return err
	}
	return cr.kubeconfigs(ctx, render.SecretAdminKubeconfig, ca, render.ClientCertRequest(render.AdminCN, render.ClusterAdminsGroup), "admin",
		kubeconfig{key: apiary.KubeconfigKey, server: ep.URL()},
		kubeconfig{key: apiary.InternalKubeconfigKey, server: render.InternalURL(tcp)})
}

// rotation starts a rotation of the leaf certificates when the
// apiary.dev/rotate-certificates annotation carries a new token, and
// returns the token of the last rotation asked for ("" for none).
func (r *TenantControlPlaneReconciler) rotation(tcp *apiary.TenantControlPlane) string {
	token := tcp.Annotations[apiary.AnnotationRotateCertificates]
	rot := tcp.Status.CertificateRotation
	if token != "" && (rot == nil || rot.Token != token) {
		rot = &apiary.CertificateRotation{Token: token, Requested: metav1.NewTime(r.Now().UTC())}
		tcp.Status.CertificateRotation = rot
		r.Recorder.Eventf(tcp, nil, corev1.EventTypeNormal, ReasonRotationRequested, "RotateCertificates",
			"rotation %q: every leaf certificate is re-issued", token)
	}
	if rot == nil {
		return ""
	}
	return rot.Token
}

// credentialsIssued records every credential as issued and valid.
func (r *TenantControlPlaneReconciler) credentialsIssued(tcp *apiary.TenantControlPlane, cr *credentials) {
	if rot := tcp.Status.CertificateRotation; rot != nil && rot.Completed == nil {
		rot.Completed = ptr.To(metav1.NewTime(r.Now().UTC()))
	}
	tcp.Status.Certificates = cr.sortedCerts()
	tcp.Status.KubeconfigSecret = tcp.AdminKubeconfigSecretName()
	r.setCondition(tcp, apiary.ConditionCertificatesReady, metav1.ConditionTrue, ReasonIssued, fmt.Sprintf("%d Secrets hold valid credentials", len(render.AllSecretKinds)))
	r.recordIssued(tcp, cr)
}

func (r *TenantControlPlaneReconciler) credentialsFailed(tcp *apiary.TenantControlPlane, cr *credentials, err error) error {
	if errors.Is(err, errCacheBehind) {
		return err
	}
	r.setCondition(tcp, apiary.ConditionCertificatesReady, metav1.ConditionFalse, ReasonIssueFailed, err.Error())
	r.recordIssued(tcp, cr)
	r.Recorder.Eventf(tcp, nil, corev1.EventTypeWarning, ReasonIssueFailed, "IssueCredentials", "%s", err.Error())
	return err
}

// recordIssued emits one event per reconcile that wrote credentials (one
// event, not one per Secret: events.k8s.io would merge same-reason events
// of an object into a series and keep only the first message).
func (r *TenantControlPlaneReconciler) recordIssued(tcp *apiary.TenantControlPlane, cr *credentials) {
	if cr == nil {
		return
	}
	for _, ev := range cr.issuedEvents() {
		r.Recorder.Eventf(tcp, nil, corev1.EventTypeNormal, ev[0], "IssueCredentials", "%s", ev[1])
	}
}
