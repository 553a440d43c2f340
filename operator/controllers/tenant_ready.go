package controllers

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log"

	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/operator/render"
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
func (r *TenantControlPlaneReconciler) probeTenantAPI(ctx context.Context, tcp *apiary.TenantControlPlane, trust []byte, ep render.Endpoint) apiState {
	for _, c := range readyPrerequisites {
		if !meta.IsStatusConditionTrue(tcp.Status.Conditions, c) {
			return apiState{notTrue: c}
		}
	}
	return apiState{err: probeAPI(ctx, trust, ep)}
}

// reconcileBootstrap applies what kubeadm join and the nodes need inside the
// tenant, once its API answers. Over quota the tenant refuses the applies
// too: a tenant bootstrapped before keeps what it has until it is back
// under. It returns the bootstrap's error.
func (r *TenantControlPlaneReconciler) reconcileBootstrap(ctx context.Context, tcp *apiary.TenantControlPlane, cr *credentials, ep render.Endpoint, api apiState, overQuota bool, rootCA string) error {
	if !api.answering() {
		// TenantBootstrapped keeps what it last said: what was applied is
		// still there while the API is away.
		return nil
	}
	if overQuota && meta.IsStatusConditionTrue(tcp.Status.Conditions, apiary.ConditionTenantBootstrapped) {
		log.FromContext(ctx).V(1).Info("tenant over its datastore quota: bootstrap not re-applied")
		return nil
	}
	if err := r.bootstrapTenant(ctx, tcp, cr, ep.URL(), rootCA); err != nil {
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
	case api.err != nil && r.briefRefusal(tcp, api.err):
		// Ready stays as it is; look again in a moment.
		return ctrl.Result{RequeueAfter: time.Second}
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
	r.refusals.Delete(tcp.UID)
	r.setCondition(tcp, apiary.ConditionReady, metav1.ConditionTrue, ReasonAPIAnswering, "the tenant API answers at "+ep.URL())
	// Re-check now and then: a broken endpoint emits no event.
	return ctrl.Result{RequeueAfter: 5 * time.Minute}
}

// readyRefusalGrace is how long a Ready tenant's API may refuse /readyz
// through its endpoint (while answering) before Ready turns False. During
// a roll, the replica that shuts down refuses on purpose, and the load
// balancer follows the rollout a moment later; the operator's probe runs
// at exactly that moment, on the Deployment's status change.
const readyRefusalGrace = 5 * time.Second

// briefRefusal reports a refusal of a Ready tenant that has lasted less
// than readyRefusalGrace. Anything else ends the grace: no answer at all
// counts at once.
func (r *TenantControlPlaneReconciler) briefRefusal(tcp *apiary.TenantControlPlane, err error) bool {
	var refused *readyzRefused
	if !errors.As(err, &refused) || !meta.IsStatusConditionTrue(tcp.Status.Conditions, apiary.ConditionReady) {
		r.refusals.Delete(tcp.UID)
		return false
	}
	first, _ := r.refusals.LoadOrStore(tcp.UID, r.Now())
	return r.Now().Sub(first.(time.Time)) < readyRefusalGrace
}

// backoff retries every second for apiUnreachableFastPoll after the
// condition went False, then every 15 s.
func (r *TenantControlPlaneReconciler) backoff(tcp *apiary.TenantControlPlane, condition string) ctrl.Result {
	if c := meta.FindStatusCondition(tcp.Status.Conditions, condition); c != nil && r.Now().Sub(c.LastTransitionTime.Time) > apiUnreachableFastPoll {
		return ctrl.Result{RequeueAfter: 15 * time.Second}
	}
	return ctrl.Result{RequeueAfter: time.Second}
}

func probeAPI(ctx context.Context, trust []byte, ep render.Endpoint) error {
	return getReadyz(ctx, trust, "", ep.URL(), readyzAttempts)
}

// getReadyz asks base+"/readyz" for 200, trusting only the tenant CA;
// serverName, when set, is the name the certificate must carry (a host
// probed at its own address serves the endpoint's certificate).
func getReadyz(ctx context.Context, trust []byte, serverName, base string, attempts int) error {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(trust) {
		return fmt.Errorf("no tenant CA")
	}
	// A new connection per attempt: behind a load balancer, a refusal
	// comes from one replica. A replica that is shutting down answers
	// /readyz with 500 on purpose, and the load balancer may still pick it
	// for a moment while another serves: through the endpoint, a refusal
	// is asked again on a new connection before it counts (attempts). No
	// answer at all is final.
	hc := &http.Client{
		Timeout:   2 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: serverName, MinVersion: tls.VersionTLS12}, DisableKeepAlives: true},
	}
	var refused error
	for attempt := range max(attempts, 1) {
		if attempt > 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(readyzRetryAfter):
			}
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/readyz", nil)
		if err != nil {
			return err
		}
		resp, err := hc.Do(req)
		if err != nil {
			return fmt.Errorf("GET %s/readyz: %w", base, err)
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			return nil
		}
		refused = &readyzRefused{url: base + "/readyz", status: resp.Status}
	}
	return refused
}

// readyzRefused: a kube-apiserver answered /readyz, not with 200.
type readyzRefused struct{ url, status string }

func (e *readyzRefused) Error() string { return "GET " + e.url + ": " + e.status }

// A /readyz refusal through the endpoint is asked this many times, this
// far apart.
const (
	readyzAttempts   = 3
	readyzRetryAfter = 300 * time.Millisecond
)
