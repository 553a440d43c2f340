package datastore

import (
	"crypto/x509"
	"errors"
	"fmt"

	"github.com/apiaryhq/apiary/pki"
)

// IssueClientCert signs a client certificate for the tenant with the CA in
// cfg: CN is t.User, which etcd maps to the user when --client-cert-auth is
// on, and the only extended key usage is client authentication, so the
// certificate cannot serve. It returns the certificate and key as PEM.
func IssueClientCert(cfg Config, t Tenant) (certPEM, keyPEM []byte, err error) {
	if err := t.Validate(); err != nil {
		return nil, nil, &Error{Reason: ReasonInvalidTenant, Err: err}
	}
	ca, err := pki.ParseKeyPair(cfg.CACert, cfg.CAKey)
	if err != nil {
		return nil, nil, &Error{Reason: ReasonInvalidCredentials, Err: fmt.Errorf("etcd CA key pair: %w", err)}
	}
	if !ca.Cert.IsCA {
		return nil, nil, &Error{Reason: ReasonInvalidCredentials, Err: errors.New("etcd CA certificate is not a certificate authority")}
	}
	kp, err := ca.Sign(ClientCertRequest(t))
	if err != nil {
		return nil, nil, fmt.Errorf("issuing etcd client certificate for %q: %w", t.User, err)
	}
	keyPEM, err = kp.KeyPEM()
	if err != nil {
		return nil, nil, fmt.Errorf("encoding etcd client key for %q: %w", t.User, err)
	}
	return kp.CertPEM(), keyPEM, nil
}

// ClientCertRequest is the request IssueClientCert signs, for callers that
// check an existing certificate with pki.Problem before re-issuing it.
func ClientCertRequest(t Tenant) pki.Request {
	return pki.Request{
		CommonName: t.User,
		Usages:     []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
}
