package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"regexp"

	autoscalingv1 "k8s.io/api/autoscaling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

// Check is one check of a mode switch, run without changing anything, as
// `apiary switch --check-only` runs it.
type Check struct {
	Subject string `json:"subject"`
	What    string `json:"what"`
	OK      bool   `json:"ok"`
	Detail  string `json:"detail"`
}

// KubeconfigFunc reads a tenant's admin kubeconfig with the user's client,
// explaining what is missing or refused.
type KubeconfigFunc func(ctx context.Context, c client.Reader, namespace, name string) ([]byte, error)

// CheckSwitchFunc checks, changing nothing, whether the tenant can switch
// to target, with the user's client.
type CheckSwitchFunc func(ctx context.Context, c client.Client, tcp *apiary.TenantControlPlane, target apiary.Mode) ([]Check, error)

// dnsLabel is what a namespace and a tenant name are; anything else is
// refused before it reaches the API server.
var dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

// dnsSubdomain is what a DataStore's and a Host's name are.
var dnsSubdomain = regexp.MustCompile(`^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$`)

// tenantKey is the tenant a request's path names, or an error to answer.
func tenantKey(r *http.Request) (client.ObjectKey, error) {
	key := client.ObjectKey{Namespace: r.PathValue("namespace"), Name: r.PathValue("name")}
	if !dnsLabel.MatchString(key.Namespace) || !dnsLabel.MatchString(key.Name) {
		return key, fmt.Errorf("namespace %q and name %q must be DNS labels", key.Namespace, key.Name)
	}
	return key, nil
}

// apiError answers err as the API server meant it: refused by RBAC (403),
// not found (404), invalid (422), else the API server could not be asked
// (502). The message is the API server's, so the user sees which right or
// rule said no.
func apiError(w http.ResponseWriter, what string, err error) {
	code := http.StatusBadGateway
	switch {
	case apierrors.IsForbidden(err):
		code = http.StatusForbidden
	case apierrors.IsNotFound(err):
		code = http.StatusNotFound
	case apierrors.IsInvalid(err), apierrors.IsBadRequest(err):
		code = http.StatusUnprocessableEntity
	case apierrors.IsConflict(err):
		code = http.StatusConflict
	}
	http.Error(w, fmt.Sprintf("%s: %v", what, err), code)
}

// kubeconfig answers the tenant's admin kubeconfig as a download, read
// as the user (who needs get on the tenant and its Secret).
func kubeconfig(w http.ResponseWriter, r *http.Request, c client.Reader, fetch KubeconfigFunc) {
	if fetch == nil {
		http.Error(w, "this dashboard cannot read kubeconfigs", http.StatusNotImplemented)
		return
	}
	key, err := tenantKey(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	b, err := fetch(r.Context(), c, key.Namespace, key.Name)
	if err != nil {
		var status apierrors.APIStatus
		if errors.As(err, &status) {
			apiError(w, "kubeconfig of "+key.String(), err)
			return
		}
		http.Error(w, err.Error(), http.StatusConflict)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/yaml")
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Disposition", fmt.Sprintf("attachment; filename=%q", key.Namespace+"-"+key.Name+".kubeconfig"))
	_, _ = w.Write(b)
}

// scale sets the tenant's replicas through its scale subresource, so the
// right needed is the one kubectl scale needs
// (tenantcontrolplanes/scale).
func scale(w http.ResponseWriter, r *http.Request, c client.Client) {
	key, err := tenantKey(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var body struct {
		Replicas *int32 `json:"replicas"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<10)).Decode(&body); err != nil || body.Replicas == nil {
		http.Error(w, `want a JSON body {"replicas": N}`, http.StatusBadRequest)
		return
	}
	// The range is the API's (spec.replicas' validation) and its answer
	// names the rule.
	tcp := &apiary.TenantControlPlane{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}
	patch, _ := json.Marshal(map[string]any{"spec": map[string]any{"replicas": *body.Replicas}})
	if err := c.SubResource("scale").Patch(r.Context(), tcp, client.RawPatch(types.MergePatchType, patch),
		client.WithSubResourceBody(&autoscalingv1.Scale{})); err != nil {
		apiError(w, "scaling "+key.String(), err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// modeTarget reads {"target": "standalone"|"registered"}.
func modeTarget(w http.ResponseWriter, r *http.Request) (apiary.Mode, bool) {
	var body struct {
		Target apiary.Mode `json:"target"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<10)).Decode(&body); err != nil {
		http.Error(w, `want a JSON body {"target": "standalone" or "registered"}`, http.StatusBadRequest)
		return "", false
	}
	if body.Target != apiary.ModeStandalone && body.Target != apiary.ModeRegistered {
		http.Error(w, fmt.Sprintf("target: %q is not a mode: want standalone or registered", body.Target), http.StatusUnprocessableEntity)
		return "", false
	}
	return body.Target, true
}

// checkSwitch answers the check-only report of a switch: the page shows
// it before it offers to switch.
func checkSwitch(w http.ResponseWriter, r *http.Request, c client.Client, check CheckSwitchFunc) {
	if check == nil {
		http.Error(w, "this dashboard cannot check switches", http.StatusNotImplemented)
		return
	}
	key, err := tenantKey(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	target, ok := modeTarget(w, r)
	if !ok {
		return
	}
	var tcp apiary.TenantControlPlane
	if err := c.Get(r.Context(), key, &tcp); err != nil {
		apiError(w, "reading "+key.String(), err)
		return
	}
	checks, err := check(r.Context(), c, &tcp, target)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(checks)
}

// switchMode sets spec.mode; the operator runs the switch and the page
// follows it on the tenant's stream. The API server's admission has the
// last word on whether the switch may start.
func switchMode(w http.ResponseWriter, r *http.Request, c client.Client) {
	key, err := tenantKey(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	target, ok := modeTarget(w, r)
	if !ok {
		return
	}
	tcp := &apiary.TenantControlPlane{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}
	patch, _ := json.Marshal(map[string]any{"spec": map[string]any{"mode": target}})
	if err := c.Patch(r.Context(), tcp, client.RawPatch(types.MergePatchType, patch)); err != nil {
		apiError(w, "switching "+key.String(), err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
