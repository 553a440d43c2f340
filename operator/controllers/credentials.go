package controllers

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/operator/render"
	"github.com/apiaryhq/apiary/operator/render/managedetcd"
	"github.com/apiaryhq/apiary/pki"
)

// secretSet says whose Secrets a credentials issuer manages: a tenant's,
// or a managed etcd's.
type secretSet interface {
	namespace() string
	// selector lists the set's Secrets.
	selector() map[string]string
	name(kind render.SecretKind) string
	secret(kind render.SecretKind, data map[string][]byte) *corev1.Secret
	ownerUID() types.UID
	// clusterName names the cluster in kubeconfigs.
	clusterName() string
	// lifetime is the validity of leaf certificates and how long before
	// their expiry they are renewed.
	lifetime() (validity, renewBefore time.Duration)
}

type tenantSecrets struct{ tcp *apiary.TenantControlPlane }

func (t tenantSecrets) namespace() string                  { return t.tcp.Namespace }
func (t tenantSecrets) selector() map[string]string        { return render.Labels(t.tcp) }
func (t tenantSecrets) name(kind render.SecretKind) string { return render.SecretName(t.tcp, kind) }
func (t tenantSecrets) ownerUID() types.UID                { return t.tcp.UID }
func (t tenantSecrets) clusterName() string                { return t.tcp.Name }
func (t tenantSecrets) secret(kind render.SecretKind, data map[string][]byte) *corev1.Secret {
	return render.Secret(t.tcp, kind, data)
}

// lifetime reads the defaulted spec, with the defaults for an object
// written while the defaulting webhook was down.
func (t tenantSecrets) lifetime() (validity, renewBefore time.Duration) {
	c := t.tcp.Spec.Certificates
	validity = apiary.DefaultCertificateValidity
	if c.Validity != nil {
		validity = c.Validity.Duration
	}
	renewBefore = apiary.DefaultRenewBefore(validity)
	if c.RenewBefore != nil {
		renewBefore = c.RenewBefore.Duration
	}
	return validity, renewBefore
}

type etcdSecrets struct{ ds *apiary.DataStore }

func (e etcdSecrets) namespace() string                  { return e.ds.Spec.Managed.Namespace }
func (e etcdSecrets) selector() map[string]string        { return managedetcd.Labels(e.ds) }
func (e etcdSecrets) name(kind render.SecretKind) string { return managedetcd.SecretName(e.ds, kind) }
func (e etcdSecrets) ownerUID() types.UID                { return e.ds.UID }
func (e etcdSecrets) clusterName() string                { return e.ds.Name }
func (e etcdSecrets) secret(kind render.SecretKind, data map[string][]byte) *corev1.Secret {
	return managedetcd.Secret(e.ds, kind, data)
}

// lifetime of etcd's certificates: pki's defaults. The DataStore is
// checked every CheckInterval, which renews them when due.
func (e etcdSecrets) lifetime() (validity, renewBefore time.Duration) {
	return pki.LeafValidity, pki.RenewBefore
}

// credentials issues a set of Secrets: it keeps what is still valid and
// (re)issues only what is missing or has a problem (expiring, wrong SANs,
// signed by a CA that was replaced, owned by a previous object of the same
// name). Writes use Create, or Update with the read resourceVersion, so that
// a stale cache can never overwrite a key pair with a different one.
type credentials struct {
	c client.Client
	// reader reads past the cache, which holds only Apiary's Secrets.
	reader client.Reader
	set    secretSet
	now    time.Time
	byKind map[render.SecretKind]*corev1.Secret

	// data is the content of every Secret after issuing, by kind.
	data map[render.SecretKind]map[string][]byte
	// issued lists what was written and why, by event reason: Issued
	// (created or repaired), Renewed (due) and Rotated (asked for).
	issued map[string][]string
	certs  []apiary.CertificateStatus
	// renewAhead: leaves are judged this far ahead of now, so that those
	// due within the renewal window of one due now are renewed with it.
	renewAhead time.Duration
	// rotation is the token of the last rotation asked for: a leaf whose
	// Secret does not carry it is re-issued, and every leaf written
	// carries it. Clocks play no part: a token is answered once.
	rotation string
	// trust is the CA bundle kubeconfigs carry; empty: the signing CA's
	// certificate alone.
	trust []byte
}

// annotationRotation on a leaf's Secret is the rotation token it was
// issued under.
const annotationRotation = "apiary.dev/rotation"

// rotationWhy is why a leaf is re-issued for a rotation.
func rotationWhy(token string) string { return fmt.Sprintf("rotation %q", token) }

// errCacheBehind means a Secret we wrote is not in the cache yet: reconcile
// again shortly rather than issue it twice.
var errCacheBehind = fmt.Errorf("secret cache is behind the API server")

func newCredentials(ctx context.Context, c client.Client, reader client.Reader, set secretSet, now time.Time) (*credentials, error) {
	var list corev1.SecretList
	if err := c.List(ctx, &list, client.InNamespace(set.namespace()), client.MatchingLabels(set.selector())); err != nil {
		return nil, fmt.Errorf("listing Secrets of %s: %w", set.clusterName(), err)
	}
	cr := &credentials{c: c, reader: reader, set: set, now: now,
		byKind: map[render.SecretKind]*corev1.Secret{},
		data:   map[render.SecretKind]map[string][]byte{},
	}
	for i := range list.Items {
		s := &list.Items[i]
		kind := render.SecretKind(s.Labels[render.LabelSecret])
		if s.Name == set.name(kind) {
			cr.byKind[kind] = s
		}
	}
	return cr, nil
}

// existing returns the data of a Secret of this tenant, or nil with the reason
// it cannot be used.
func (cr *credentials) existing(kind render.SecretKind) (map[string][]byte, string) {
	s := cr.byKind[kind]
	if s == nil {
		return nil, "created"
	}
	if owner := metav1.GetControllerOf(s); owner == nil || owner.UID != cr.set.ownerUID() {
		return nil, "left by a previous owner of the same name"
	}
	return s.Data, ""
}

// write creates or updates a Secret with new content.
func (cr *credentials) write(ctx context.Context, kind render.SecretKind, data map[string][]byte, why string, leaf bool) error {
	desired := cr.set.secret(kind, data)
	if leaf && cr.rotation != "" {
		metav1.SetMetaDataAnnotation(&desired.ObjectMeta, annotationRotation, cr.rotation)
	}
	if old := cr.byKind[kind]; old == nil {
		if err := cr.c.Create(ctx, desired); err != nil {
			if apierrors.IsAlreadyExists(err) {
				return cr.alreadyExists(ctx, desired)
			}
			return fmt.Errorf("creating Secret %s: %w", desired.Name, err)
		}
	} else {
		desired.ResourceVersion = old.ResourceVersion
		if err := cr.c.Update(ctx, desired); err != nil {
			if apierrors.IsConflict(err) {
				return errCacheBehind
			}
			return fmt.Errorf("updating Secret %s: %w", desired.Name, err)
		}
	}
	cr.byKind[kind] = desired
	cr.data[kind] = data
	reason := ReasonIssued
	switch {
	case strings.Contains(why, pki.DueForRenewal): // a kubeconfig's says which key
		reason = ReasonRenewed
	case cr.rotation != "" && why == rotationWhy(cr.rotation):
		reason = ReasonRotated
	}
	if cr.issued == nil {
		cr.issued = map[string][]string{}
	}
	entry := desired.Name
	if reason == ReasonIssued {
		entry += " (" + why + ")"
	}
	cr.issued[reason] = append(cr.issued[reason], entry)
	return nil
}

// alreadyExists tells a Secret we wrote and the cache has not seen yet
// (reconcile again shortly) from one someone else made under the same name,
// which Apiary never adopts or overwrites: that is an error, retried with
// the controller's backoff rather than every 200 ms.
func (cr *credentials) alreadyExists(ctx context.Context, desired *corev1.Secret) error {
	var found corev1.Secret
	if err := cr.reader.Get(ctx, client.ObjectKeyFromObject(desired), &found); err != nil {
		if apierrors.IsNotFound(err) {
			return errCacheBehind
		}
		return fmt.Errorf("reading Secret %s/%s: %w", desired.Namespace, desired.Name, err)
	}
	if owner := metav1.GetControllerOf(&found); owner != nil && owner.UID == cr.set.ownerUID() && found.Labels[render.LabelManagedBy] == render.ManagedBy {
		return errCacheBehind
	}
	return fmt.Errorf("Secret %s/%s already exists and was not made by Apiary for %s: Apiary does not adopt or overwrite it; delete or rename it", desired.Namespace, desired.Name, cr.set.clusterName())
}

// record adds a certificate to the status; req is nil for a CA, which is
// not renewed on a timer.
func (cr *credentials) record(kind render.SecretKind, name string, kp *pki.KeyPair, req *pki.Request) {
	st := apiary.CertificateStatus{
		Name:     name,
		Secret:   cr.set.name(kind),
		NotAfter: metav1.NewTime(kp.Cert.NotAfter.UTC()),
	}
	if req != nil {
		st.RenewAt = ptr.To(metav1.NewTime(pki.RenewAt(kp.Cert, *req).UTC()))
	}
	cr.certs = append(cr.certs, st)
}

// judgeAt is the moment leaves are judged at (see renewAhead).
func (cr *credentials) judgeAt() time.Time { return cr.now.Add(cr.renewAhead) }

// renewTogether looks at the leaves as last recorded: when one is due now,
// every leaf due within the renewal window is renewed in this pass too.
// Leaves issued moments apart (across a second boundary is enough) have
// renewal points seconds apart; renewed one by one, each would restart
// the control plane.
func (cr *credentials) renewTogether(recorded []apiary.CertificateStatus) {
	validity, _ := cr.set.lifetime()
	for _, c := range recorded {
		if c.RenewAt != nil && !cr.now.Before(c.RenewAt.Time) {
			cr.renewAhead = pki.RenewWindow(validity)
			return
		}
	}
}

// withLifetime sets the set's validity and renewal point on a request.
func (cr *credentials) withLifetime(req pki.Request) pki.Request {
	req.Validity, req.RenewBefore = cr.set.lifetime()
	return req
}

// rotated says why a kept leaf must go for the rotation asked for; empty
// when it carries the last token.
func (cr *credentials) rotated(kind render.SecretKind) string {
	if s := cr.byKind[kind]; cr.rotation != "" && s != nil && s.Annotations[annotationRotation] != cr.rotation {
		return rotationWhy(cr.rotation)
	}
	return ""
}

// maxEventNote is the API server's limit on an event's note.
const maxEventNote = 1024

// issuedEvents returns the events of what was written, one per reason
// (events.k8s.io merges same-reason events of an object into a series that
// keeps only the first note), and forgets it. Renewals and rotations name
// their Secrets and the cause once: a note longer than the API's limit is
// refused and lost.
func (cr *credentials) issuedEvents() [][2]string {
	var out [][2]string
	for _, reason := range []string{ReasonIssued, ReasonRenewed, ReasonRotated} {
		entries := cr.issued[reason]
		if len(entries) == 0 {
			continue
		}
		note := strings.ToLower(reason) + " " + strings.Join(entries, ", ")
		switch reason {
		case ReasonRenewed:
			note += ": " + pki.DueForRenewal + " (status.certificates lists the new expiry)"
		case ReasonRotated:
			note += ": " + rotationWhy(cr.rotation)
		}
		if len(note) > maxEventNote {
			note = strings.ToValidUTF8(note[:maxEventNote-len(" …")], "") + " …"
		}
		out = append(out, [2]string{reason, note})
	}
	cr.issued = nil
	return out
}

// nextRenewal is when the first recorded certificate is due for renewal;
// zero when none is recorded.
func (cr *credentials) nextRenewal() time.Time {
	var next time.Time
	for _, c := range cr.certs {
		if c.RenewAt != nil && (next.IsZero() || c.RenewAt.Time.Before(next)) {
			next = c.RenewAt.Time
		}
	}
	return next
}

// ca keeps or issues a certificate authority.
func (cr *credentials) ca(ctx context.Context, kind render.SecretKind, commonName string) (*pki.KeyPair, error) {
	data, why := cr.existing(kind)
	if data != nil {
		kp, err := pki.ParseKeyPair(data[render.KeyTLSCert], data[render.KeyTLSKey])
		switch {
		case err != nil:
			why = "unreadable: " + err.Error()
		default:
			if why = pki.CAProblem(kp.Cert, cr.now); why == "" {
				cr.data[kind] = data
				cr.record(kind, string(kind), kp, nil)
				return kp, nil
			}
		}
	}
	kp, err := pki.NewCA(commonName)
	if err != nil {
		return nil, err
	}
	keyPEM, err := kp.KeyPEM()
	if err != nil {
		return nil, err
	}
	if err := cr.write(ctx, kind, map[string][]byte{render.KeyTLSCert: kp.CertPEM(), render.KeyTLSKey: keyPEM}, why, false); err != nil {
		return nil, err
	}
	cr.record(kind, string(kind), kp, nil)
	return kp, nil
}

// leaf keeps or issues a certificate signed by ca. extra is added to the
// Secret (such as the CA certificate under ca.crt), and must match too.
func (cr *credentials) leaf(ctx context.Context, kind render.SecretKind, ca *pki.KeyPair, req pki.Request, extra map[string][]byte) error {
	req = cr.withLifetime(req)
	data, why := cr.existing(kind)
	if data != nil {
		var kept *pki.KeyPair
		if kept, why = cr.leafProblem(data, ca, req, extra); why == "" {
			why = cr.rotated(kind)
		}
		if why == "" {
			cr.data[kind] = data
			cr.record(kind, string(kind), kept, &req)
			return nil
		}
	}
	kp, err := ca.Sign(req)
	if err != nil {
		return err
	}
	keyPEM, err := kp.KeyPEM()
	if err != nil {
		return err
	}
	out := map[string][]byte{render.KeyTLSCert: kp.CertPEM(), render.KeyTLSKey: keyPEM}
	for k, v := range extra {
		out[k] = v
	}
	if err := cr.write(ctx, kind, out, why, true); err != nil {
		return err
	}
	cr.record(kind, string(kind), kp, &req)
	return nil
}

func (cr *credentials) leafProblem(data map[string][]byte, ca *pki.KeyPair, req pki.Request, extra map[string][]byte) (*pki.KeyPair, string) {
	kp, err := pki.ParseKeyPair(data[render.KeyTLSCert], data[render.KeyTLSKey])
	if err != nil {
		return nil, "unreadable: " + err.Error()
	}
	for k, v := range extra {
		if !bytes.Equal(data[k], v) {
			return nil, k + " changed"
		}
	}
	return kp, pki.Problem(kp.Cert, ca.Cert, req, cr.judgeAt())
}

// serviceAccountKey keeps or issues the service-account signing key pair.
func (cr *credentials) serviceAccountKey(ctx context.Context) error {
	kind := render.SecretServiceAccount
	data, why := cr.existing(kind)
	if data != nil {
		if why = pki.ServiceAccountKeyProblem(data[render.KeySAKey], data[render.KeySAPub]); why == "" {
			cr.data[kind] = data
			return nil
		}
	}
	priv, pub, err := pki.NewServiceAccountKey()
	if err != nil {
		return err
	}
	return cr.write(ctx, kind, map[string][]byte{render.KeySAKey: priv, render.KeySAPub: pub}, why, false)
}

// kubeconfig describes one kubeconfig inside a Secret.
type kubeconfig struct {
	key    string
	server string
}

// kubeconfigs keeps or issues a Secret holding kubeconfigs that share one
// client certificate, each pointing at its own server.
func (cr *credentials) kubeconfigs(ctx context.Context, kind render.SecretKind, ca *pki.KeyPair, req pki.Request, name string, configs ...kubeconfig) error {
	req = cr.withLifetime(req)
	caPEM := cr.trust
	if len(caPEM) == 0 {
		caPEM = ca.CertPEM()
	}
	data, why := cr.existing(kind)
	if data != nil {
		kp, problem := cr.kubeconfigProblem(data, ca, caPEM, req, configs)
		if problem == "" {
			problem = cr.rotated(kind)
		}
		if problem == "" {
			cr.data[kind] = data
			cr.record(kind, name, kp, &req)
			return nil
		}
		why = problem
	}
	kp, err := ca.Sign(req)
	if err != nil {
		return err
	}
	keyPEM, err := kp.KeyPEM()
	if err != nil {
		return err
	}
	out := map[string][]byte{}
	for _, cfg := range configs {
		raw, err := render.Kubeconfig(cr.set.clusterName(), cfg.server, caPEM, req.CommonName, kp.CertPEM(), keyPEM)
		if err != nil {
			return err
		}
		out[cfg.key] = raw
	}
	if err := cr.write(ctx, kind, out, why, true); err != nil {
		return err
	}
	cr.record(kind, name, kp, &req)
	return nil
}

func (cr *credentials) kubeconfigProblem(data map[string][]byte, ca *pki.KeyPair, caPEM []byte, req pki.Request, configs []kubeconfig) (*pki.KeyPair, string) {
	var kp *pki.KeyPair
	for _, want := range configs {
		cfg, err := clientcmd.Load(data[want.key])
		if err != nil || cfg.Contexts[cfg.CurrentContext] == nil {
			return nil, want.key + " is missing or unreadable"
		}
		ctx := cfg.Contexts[cfg.CurrentContext]
		cluster, user := cfg.Clusters[ctx.Cluster], cfg.AuthInfos[ctx.AuthInfo]
		if cluster == nil || user == nil {
			return nil, want.key + " is incomplete"
		}
		if cluster.Server != want.server {
			return nil, fmt.Sprintf("%s points at %s, want %s", want.key, cluster.Server, want.server)
		}
		if !bytes.Equal(cluster.CertificateAuthorityData, caPEM) {
			return nil, want.key + " trusts another CA"
		}
		kp, err = pki.ParseKeyPair(user.ClientCertificateData, user.ClientKeyData)
		if err != nil {
			return nil, want.key + " client credentials unreadable: " + err.Error()
		}
		if problem := pki.Problem(kp.Cert, ca.Cert, req, cr.judgeAt()); problem != "" {
			return nil, want.key + " client certificate " + problem
		}
	}
	return kp, ""
}

// sortedCerts returns the certificate statuses in a stable order.
func (cr *credentials) sortedCerts() []apiary.CertificateStatus {
	certs := slices.Clone(cr.certs)
	slices.SortFunc(certs, func(a, b apiary.CertificateStatus) int {
		switch {
		case a.Name < b.Name:
			return -1
		case a.Name > b.Name:
			return 1
		}
		return 0
	})
	return certs
}
