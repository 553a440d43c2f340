package controllers

import (
	"bytes"
	"crypto/x509"
	"testing"

	"github.com/apiaryhq/apiary/pki"
)

// The way from one CA for everything to a peer CA of its own: three steps,
// each taken only once every member runs the previous one, so that any two
// members trust each other's certificate throughout the rolling updates.
func TestPlanPeerCA(t *testing.T) {
	clientCA, err := pki.NewCA("client")
	if err != nil {
		t.Fatal(err)
	}
	peerCA, err := pki.NewCA("peer")
	if err != nil {
		t.Fatal(err)
	}
	sign := func(ca *pki.KeyPair) *x509.Certificate {
		kp, err := ca.Sign(pki.Request{CommonName: "etcd-peer", Usages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}})
		if err != nil {
			t.Fatal(err)
		}
		return kp.Cert
	}
	oldCert, newCert := sign(clientCA), sign(peerCA)
	only := certPEM(peerCA.Cert)
	both := append(certPEM(peerCA.Cert), certPEM(clientCA.Cert)...)
	legacyTrust := certPEM(clientCA.Cert) // members mounted ca.crt

	for _, tc := range []struct {
		name       string
		cert       *x509.Certificate
		trust      []byte
		rolledOut  bool
		stage      peerStage
		withClient bool
		wantTrust  []byte
	}{
		{"new DataStore", nil, nil, false, peerSeparate, false, only},
		{"legacy: trust the peer CA too", oldCert, nil, true, peerTrustBoth, true, both},
		{"legacy trust, not rolled", oldCert, legacyTrust, false, peerTrustBoth, true, both},
		{"both trusted, roll running", oldCert, both, false, peerTrustBoth, true, both},
		{"both trusted everywhere: reissue", oldCert, both, true, peerReissued, false, both},
		{"reissued, roll running", newCert, both, false, peerReissued, false, both},
		{"reissued everywhere: drop the client CA", newCert, both, true, peerSeparate, false, only},
		{"separate", newCert, only, true, peerSeparate, false, only},
		{"separate, rolling for another reason", newCert, only, false, peerSeparate, false, only},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := planPeerCA(clientCA.Cert, peerCA.Cert, tc.cert, tc.trust, tc.rolledOut)
			if p.stage != tc.stage || p.signWithClientCA != tc.withClient || !bytes.Equal(p.trust, tc.wantTrust) {
				t.Errorf("plan stage=%d signWithClientCA=%v trust both=%v only=%v; want stage=%d signWithClientCA=%v",
					p.stage, p.signWithClientCA, bytes.Equal(p.trust, both), bytes.Equal(p.trust, only), tc.stage, tc.withClient)
			}
		})
	}
}
