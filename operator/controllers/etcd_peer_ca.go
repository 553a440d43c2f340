package controllers

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/operator/render"
	"github.com/apiaryhq/apiary/operator/render/managedetcd"
	"github.com/apiaryhq/apiary/pki"
)

// Reasons of a managed DataStore's PeerCASeparate condition.
const (
	ReasonPeerCASeparate = "Separate"
	ReasonMovingToPeerCA = "MovingToPeerCA"
)

// peerStage is where a managed etcd is on its way from one CA for
// everything (DataStores made before the peer CA existed) to a peer CA of
// its own. Each step changes what the members mount, and the next one
// waits until every member runs with it (a rolling update, one member at a
// time), so that any two members always trust each other's certificate.
type peerStage int

const (
	// peerTrustBoth: members still present certificates of the client CA
	// and learn to trust the peer CA as well.
	peerTrustBoth peerStage = iota
	// peerReissued: members present peer-CA certificates; both CAs are
	// still trusted, for members not rolled yet.
	peerReissued
	// peerSeparate: only the peer CA is trusted, and only the peer common
	// name accepted.
	peerSeparate
)

// peerPlan says what the members mount next.
type peerPlan struct {
	stage peerStage
	// signWithClientCA keeps the peer certificate of the old layout.
	signWithClientCA bool
	// trust is the peer port's CA bundle.
	trust []byte
}

// planPeerCA is the next step from what exists: the current peer
// certificate (nil for a new DataStore), the current trust bundle, and
// whether every member runs with them.
func planPeerCA(clientCA, peerCA *x509.Certificate, peerCert *x509.Certificate, trust []byte, rolledOut bool) peerPlan {
	both := append(certPEM(peerCA), certPEM(clientCA)...)
	only := certPEM(peerCA)
	trusts := func(c *x509.Certificate) bool { return bytes.Contains(trust, certPEM(c)) }
	switch {
	case peerCert == nil:
		// New: the separate layout from the start.
		return peerPlan{stage: peerSeparate, trust: only}
	case signedBy(peerCert, clientCA):
		if trusts(peerCA) && rolledOut {
			return peerPlan{stage: peerReissued, trust: both}
		}
		return peerPlan{stage: peerTrustBoth, signWithClientCA: true, trust: both}
	case trusts(clientCA):
		if rolledOut {
			return peerPlan{stage: peerSeparate, trust: only}
		}
		return peerPlan{stage: peerReissued, trust: both}
	default:
		return peerPlan{stage: peerSeparate, trust: only}
	}
}

func certPEM(c *x509.Certificate) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
}

func signedBy(c, ca *x509.Certificate) bool {
	return c.CheckSignatureFrom(ca) == nil
}

// rolledOut says whether every member of the StatefulSet runs the pod
// template with the given config hash.
func rolledOut(sts *appsv1.StatefulSet, hash string) bool {
	if sts == nil || sts.Spec.Template.Annotations[render.AnnotationConfigHash] != hash || sts.Spec.Replicas == nil {
		return false
	}
	// Under the OnDelete strategy the StatefulSet controller never moves
	// currentRevision: updatedReplicas counts the pods on the template.
	st, n := sts.Status, *sts.Spec.Replicas
	return st.ObservedGeneration >= sts.Generation && st.UpdatedReplicas == n && st.ReadyReplicas == n && st.Replicas == n
}

// peerCredentials issues the peer CA, the peer certificate and the trust
// bundle for the next step, and returns whether the separate layout is
// reached (PeerCAOnly).
func (r *DataStoreReconciler) peerCredentials(ctx context.Context, ds *apiary.DataStore, cr *credentials, clientCA *pki.KeyPair) (bool, error) {
	peerCA, err := cr.ca(ctx, managedetcd.SecretPeerCA, managedetcd.PeerCACommonName(ds))
	if err != nil {
		return false, err
	}
	var peerCert *x509.Certificate
	if data, _ := cr.existing(managedetcd.SecretPeer); data != nil {
		if kp, err := pki.ParseKeyPair(data[render.KeyTLSCert], data[render.KeyTLSKey]); err == nil {
			peerCert = kp.Cert
		}
	}
	trustData, _ := cr.existing(managedetcd.SecretPeerTrust)
	var sts appsv1.StatefulSet
	var live *appsv1.StatefulSet
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: ds.Spec.Managed.Namespace, Name: managedetcd.Name(ds)}, &sts); err == nil {
		live = &sts
	} else if !apierrors.IsNotFound(err) {
		return false, fmt.Errorf("reading the etcd StatefulSet: %w", err)
	}
	current := map[render.SecretKind]map[string][]byte{}
	for _, kind := range managedetcd.MountedSecrets {
		current[kind], _ = cr.existing(kind)
	}
	plan := planPeerCA(clientCA.Cert, peerCA.Cert, peerCert, trustData[render.KeyCACert], rolledOut(live, etcdConfigHash(current)))

	signer := peerCA
	if plan.signWithClientCA {
		signer = clientCA
	}
	if err := cr.leaf(ctx, managedetcd.SecretPeer, signer, managedetcd.ServingCertRequest(ds, r.ClusterDomain, true), nil); err != nil {
		return false, err
	}
	if !bytes.Equal(trustData[render.KeyCACert], plan.trust) {
		why := "created"
		if trustData != nil {
			why = "peer trust changed"
		}
		if err := cr.write(ctx, managedetcd.SecretPeerTrust, map[string][]byte{render.KeyCACert: plan.trust}, why, false); err != nil {
			return false, err
		}
	} else {
		cr.data[managedetcd.SecretPeerTrust] = trustData
	}
	switch plan.stage {
	case peerSeparate:
		r.set(ds, apiary.ConditionPeerCASeparate, metav1.ConditionTrue, ReasonPeerCASeparate,
			"the peer port trusts only the peer CA and the peer common name "+managedetcd.PeerCN+"; tenant and root client certificates are refused there")
	case peerTrustBoth:
		r.set(ds, apiary.ConditionPeerCASeparate, metav1.ConditionFalse, ReasonMovingToPeerCA,
			"step 1 of 3: members learn to trust the new peer CA, one at a time; the client CA is still trusted on the peer port")
	case peerReissued:
		r.set(ds, apiary.ConditionPeerCASeparate, metav1.ConditionFalse, ReasonMovingToPeerCA,
			"step 2 of 3: members get peer certificates of the peer CA, one at a time; the client CA is still trusted on the peer port")
	}
	return plan.stage == peerSeparate, nil
}

// etcdConfigHash is the StatefulSet's config hash of the mounted Secrets:
// only the certificate of the client CA, whose key stays with the operator.
func etcdConfigHash(data map[render.SecretKind]map[string][]byte) string {
	mounted := map[string]map[string][]byte{}
	for _, kind := range managedetcd.MountedSecrets {
		d := data[kind]
		if kind == managedetcd.SecretCA {
			d = map[string][]byte{render.KeyTLSCert: d[render.KeyTLSCert]}
		}
		mounted[string(kind)] = d
	}
	return render.ConfigHash(mounted)
}
