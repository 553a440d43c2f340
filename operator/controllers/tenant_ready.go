package controllers

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log"

	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/operator/render"
	"github.com/apiaryhq/apiary/pki"
)

// readyPrerequisites are the conditions Ready summarizes besides the probe
// and the bootstrap.
var readyPrerequisites = []string{apiary.ConditionDataStoreReady, apiary.ConditionCertificatesReady, apiary.ConditionEndpointReady, apiary.ConditionControlPlaneAvailable}

// apiState is what the probe of the tenant API found.
type apiState struct {
	// notTrue is the first prerequisite that is not True: the API was not
	// probed.
	notTrue string
	// err is why /readyz did not answer 200 through the endpoint.
	err error
}

func (a apiState) answering() bool { return a.notTrue == "" && a.err == nil }

// probeTenantAPI asks the tenant API for /readyz through its public
// endpoint, verified against the tenant CA, once everything it needs is in
// place.
func (r *TenantControlPlaneReconciler) probeTenantAPI(ctx context.Context, tcp *apiary.TenantControlPlane, ca *pki.KeyPair, ep render.Endpoint) apiState {
	for _, c := range readyPrerequisites {
		if !meta.IsStatusConditionTrue(tcp.Status.Conditions, c) {
			return apiState{notTrue: c}
		}
	}
	return apiState{err: probeAPI(ctx, ca, ep)}
}

// reconcileBootstrap applies what kubeadm join and the nodes need inside the
// tenant, once its API answers. Over quota the tenant refuses the applies
// too: a tenant bootstrapped before keeps what it has until it is back
// under. It returns the bootstrap's error.
func (r *TenantControlPlaneReconciler) reconcileBootstrap(ctx context.Context, tcp *apiary.TenantControlPlane, cr *credentials, ep render.Endpoint, api apiState, overQuota bool) error {
	if !api.answering() {
		// TenantBootstrapped keeps what it last said: what was applied is
		// still there while the API is away.
		return nil
	}
	if overQuota && meta.IsStatusConditionTrue(tcp.Status.Conditions, apiary.ConditionTenantBootstrapped) {
		log.FromContext(ctx).V(1).Info("tenant over its datastore quota: bootstrap not re-applied")
		return nil
	}
	if err := r.bootstrapTenant(ctx, tcp, cr, ep.URL()); err != nil {
		log.FromContext(ctx).Info("tenant bootstrap failed", "error", err.Error())
		return err
	}
	return nil
}

// summarizeReady sets Ready from the other conditions, the probe and the
// bootstrap, and says when to look again.
func (r *TenantControlPlaneReconciler) summarizeReady(tcp *apiary.TenantControlPlane, ep render.Endpoint, api apiState, bootstrapErr error) ctrl.Result {
	switch {
	case api.notTrue != "":
		r.setCondition(tcp, apiary.ConditionReady, metav1.ConditionFalse, ReasonWaitingForPrerequisites, api.notTrue+" is not True")
		return ctrl.Result{}
	case api.err != nil:
		r.setCondition(tcp, apiary.ConditionReady, metav1.ConditionFalse, ReasonAPIUnreachable, api.err.Error())
		// Poll fast while a new control plane comes up (Ready within
		// seconds matters), then back off: an endpoint that stays
		// unreachable emits no event and must not become a hot loop.
		return r.backoff(tcp, apiary.ConditionReady)
	case bootstrapErr != nil:
		r.setCondition(tcp, apiary.ConditionReady, metav1.ConditionFalse, ReasonWaitingForPrerequisites, apiary.ConditionTenantBootstrapped+" is not True")
		// A fresh API server may lack kube-public for a moment: retry
		// fast at first, then back off.
		return r.backoff(tcp, apiary.ConditionTenantBootstrapped)
	}
	r.setCondition(tcp, apiary.ConditionReady, metav1.ConditionTrue, ReasonAPIAnswering, "the tenant API answers at "+ep.URL())
	// Re-check now and then: a broken endpoint emits no event.
	return ctrl.Result{RequeueAfter: 5 * time.Minute}
}

// backoff retries every second for apiUnreachableFastPoll after the
// condition went False, then every 15 s.
func (r *TenantControlPlaneReconciler) backoff(tcp *apiary.TenantControlPlane, condition string) ctrl.Result {
	if c := meta.FindStatusCondition(tcp.Status.Conditions, condition); c != nil && r.Now().Sub(c.LastTransitionTime.Time) > apiUnreachableFastPoll {
		return ctrl.Result{RequeueAfter: 15 * time.Second}
	}
	return ctrl.Result{RequeueAfter: time.Second}
}

func probeAPI(ctx context.Context, ca *pki.KeyPair, ep render.Endpoint) error {
	return getReadyz(ctx, ca, "", ep.URL())
}

// getReadyz asks base+"/readyz" for 200, trusting only the tenant CA;
// serverName, when set, is the name the certificate must carry (a host
// probed at its own address serves the endpoint's certificate).
func getReadyz(ctx context.Context, ca *pki.KeyPair, serverName, base string) error {
	if ca == nil {
		return fmt.Errorf("no tenant CA")
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	hc := &http.Client{
		Timeout:   2 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: serverName, MinVersion: tls.VersionTLS12}},
	}
	defer hc.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/readyz", nil)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("GET %s/readyz: %w", base, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s/readyz: %s", base, resp.Status)
	}
	return nil
}
