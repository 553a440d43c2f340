package controllers

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	apiserverv1 "k8s.io/apiserver/pkg/apis/apiserver/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/operator/render"
	"github.com/apiaryhq/apiary/pki"
)

// Reasons of the AuthenticationConfigured condition.
const (
	ReasonIssuersConfigured = "IssuersConfigured"
	// ReasonCertificatesUnreadable: an issuer's certificateAuthorityRef
	// could not be read or held something other than certificates.
	ReasonCertificatesUnreadable = "CertificatesUnreadable"
)

// authenticationRecheck is how often the certificates an issuer names are
// read again: they live in the user's objects, which the operator neither
// owns nor watches (its cache holds only what it owns).
const authenticationRecheck = time.Minute

// reconcileAuthentication renders the tenant's AuthenticationConfiguration
// into its ConfigMap and returns the file, which the API server mounts and
// the pods' hash includes, and when to read the references again. An
// issuer whose certificates cannot be read now keeps those of the file as
// it is (a Secret being rotated does not cut the tenant's users off); one
// never read is left out, and the condition says so.
func (r *TenantControlPlaneReconciler) reconcileAuthentication(ctx context.Context, tcp *apiary.TenantControlPlane) (string, time.Duration, error) {
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: tcp.Namespace, Name: render.AuthenticationConfigMapName(tcp)}}
	if !render.AuthenticationEnabled(tcp) {
		meta.RemoveStatusCondition(&tcp.Status.Conditions, apiary.ConditionAuthenticationConfigured)
		// From the cache first: nearly every tenant has none.
		if err := r.Client.Get(ctx, client.ObjectKeyFromObject(cm), cm); apierrors.IsNotFound(err) {
			return "", 0, nil
		}
		return "", 0, r.deleteOwned(ctx, tcp, cm)
	}

	last := r.lastIssuerCertificates(ctx, cm)
	referenced := map[int]string{}
	var problems []string
	next := time.Duration(0)
	for i, a := range tcp.Spec.Authentication.JWT {
		ref := a.CertificateAuthorityRef
		if ref == nil {
			continue
		}
		next = authenticationRecheck
		pem, err := r.readCertificates(ctx, tcp.Namespace, *ref)
		if err == nil {
			referenced[i] = string(pem)
			continue
		}
		what := fmt.Sprintf("jwt[%d] (%s): %v", i, a.Issuer.URL, err)
		if prev, ok := last[a.Issuer.URL]; ok {
			referenced[i] = prev
			what += "; it keeps the certificates read last"
		} else {
			what += "; it is left out until they can be read"
		}
		problems = append(problems, what)
	}
	file, err := render.AuthenticationFile(render.AuthenticationConfiguration(tcp, referenced))
	if err != nil {
		return "", 0, err
	}
	if err := r.Client.Apply(ctx, render.AuthenticationConfigMap(tcp, file), client.FieldOwner(FieldOwner), client.ForceOwnership); err != nil {
		return "", 0, fmt.Errorf("applying ConfigMap %s: %w", render.AuthenticationConfigMapName(tcp), err)
	}
	if len(problems) > 0 {
		r.setCondition(tcp, apiary.ConditionAuthenticationConfigured, metav1.ConditionFalse, ReasonCertificatesUnreadable,
			"spec.authentication."+strings.Join(problems, "; spec.authentication."))
	} else {
		n := len(tcp.Spec.Authentication.JWT)
		r.setCondition(tcp, apiary.ConditionAuthenticationConfigured, metav1.ConditionTrue, ReasonIssuersConfigured,
			fmt.Sprintf("%d token issuer(s) in the API server's AuthenticationConfiguration", n))
	}
	return file, next, nil
}

// lastIssuerCertificates are the certificates of each issuer (by URL) in
// the tenant's AuthenticationConfiguration as it is now; none when it
// cannot be read.
func (r *TenantControlPlaneReconciler) lastIssuerCertificates(ctx context.Context, cm *corev1.ConfigMap) map[string]string {
	out := map[string]string{}
	if err := r.Client.Get(ctx, client.ObjectKeyFromObject(cm), cm); err != nil {
		return out
	}
	var cfg apiserverv1.AuthenticationConfiguration
	if err := yaml.Unmarshal([]byte(cm.Data[render.KeyAuthenticationConfig]), &cfg); err != nil {
		return out
	}
	for _, j := range cfg.JWT {
		if j.Issuer.CertificateAuthority != "" {
			out[j.Issuer.URL] = j.Issuer.CertificateAuthority
		}
	}
	return out
}

// readCertificates reads the certificates a reference names, from the API
// (the cache holds only the operator's own objects). Only certificates are
// returned; anything else in the key makes it an error that does not
// quote it.
func (r *TenantControlPlaneReconciler) readCertificates(ctx context.Context, namespace string, ref apiary.CertificateAuthorityReference) ([]byte, error) {
	key := client.ObjectKey{Namespace: namespace, Name: ref.Name}
	var data []byte
	var found bool
	switch ref.Kind {
	case "ConfigMap":
		var cm corev1.ConfigMap
		if err := r.APIReader.Get(ctx, key, &cm); err != nil {
			return nil, fmt.Errorf("reading ConfigMap %s: %w", ref.Name, err)
		}
		var s string
		if s, found = cm.Data[ref.KeyOrDefault()]; found {
			data = []byte(s)
		} else {
			data, found = cm.BinaryData[ref.KeyOrDefault()]
		}
	case "Secret":
		var s corev1.Secret
		if err := r.APIReader.Get(ctx, key, &s); err != nil {
			return nil, fmt.Errorf("reading Secret %s: %w", ref.Name, err)
		}
		data, found = s.Data[ref.KeyOrDefault()]
	default:
		return nil, fmt.Errorf("kind %q is neither ConfigMap nor Secret", ref.Kind)
	}
	if !found {
		return nil, fmt.Errorf("%s %s has no key %s", ref.Kind, ref.Name, ref.KeyOrDefault())
	}
	certs, err := pki.CertificatesOnly(data)
	if err != nil {
		return nil, fmt.Errorf("key %s of %s %s %w; nothing of it was copied", ref.KeyOrDefault(), ref.Kind, ref.Name, err)
	}
	return certs, nil
}
