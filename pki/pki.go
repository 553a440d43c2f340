// Package pki issues and checks the X.509 material of tenant control planes
// and datastore clients: certificate authorities, serving and client
// certificates, and service-account key pairs.
//
// Keys are ECDSA P-256: every Kubernetes component accepts them, and they are
// generated in well under a millisecond, which keeps tenant provisioning fast
// (an RSA-2048 key costs ~100 ms on these machines, times seven per tenant).
package pki

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"net"
	"slices"
	"time"

	certutil "k8s.io/client-go/util/cert"
	"k8s.io/client-go/util/keyutil"
)

const (
	// CAValidity is how long a certificate authority is valid.
	CAValidity = 10 * 365 * 24 * time.Hour
	// LeafValidity is how long serving and client certificates are valid.
	LeafValidity = 365 * 24 * time.Hour
	// RenewBefore is the default remaining lifetime under which a
	// certificate is due for renewal (Request.RenewBefore overrides it for
	// leaves).
	RenewBefore = 30 * 24 * time.Hour
	// DueForRenewal starts the Problem of a certificate past its RenewAt,
	// which callers report as a renewal rather than a repair.
	DueForRenewal = "due for renewal"
	// maxRenewWindow bounds the renewal window (see RenewWindow).
	maxRenewWindow = time.Hour

	// clockSkew backdates NotBefore so that a certificate issued here is
	// already valid on a peer whose clock is slightly behind.
	clockSkew = 5 * time.Minute
)

// KeyPair is a certificate with its private key.
type KeyPair struct {
	Cert *x509.Certificate
	Key  crypto.Signer
}

// CertPEM returns the PEM encoding of the certificate.
func (kp *KeyPair) CertPEM() []byte {
	return pemEncode("CERTIFICATE", kp.Cert.Raw)
}

// KeyPEM returns the PEM encoding of the private key.
func (kp *KeyPair) KeyPEM() ([]byte, error) {
	return keyutil.MarshalPrivateKeyToPEM(kp.Key)
}

// Request describes the certificate to issue.
type Request struct {
	CommonName   string
	Organization []string
	DNSNames     []string
	IPs          []net.IP
	// Usages are the extended key usages: x509.ExtKeyUsageServerAuth,
	// x509.ExtKeyUsageClientAuth or both.
	Usages []x509.ExtKeyUsage
	// Validity of the certificate when issued; zero: LeafValidity.
	Validity time.Duration
	// RenewBefore: the certificate is due for renewal once less than this
	// remains (see RenewAt); zero: RenewBefore.
	RenewBefore time.Duration
}

func (req Request) validity() time.Duration {
	if req.Validity > 0 {
		return req.Validity
	}
	return LeafValidity
}

func (req Request) renewBefore() time.Duration {
	if req.RenewBefore > 0 {
		return req.RenewBefore
	}
	return RenewBefore
}

// RenewAt is when a certificate issued for req is due for renewal:
// RenewBefore ahead of its expiry.
func RenewAt(cert *x509.Certificate, req Request) time.Time {
	return cert.NotAfter.Add(-req.renewBefore())
}

// RenewWindow is how far ahead of their RenewAt certificates are renewed
// along with one that is due: a twentieth of the validity, an hour at most.
// Certificates issued moments apart (a second boundary between them is
// enough) are then renewed in one pass, and their consumers restart once,
// not once per certificate.
func RenewWindow(validity time.Duration) time.Duration {
	if validity <= 0 {
		validity = LeafValidity
	}
	return min(validity/20, maxRenewWindow)
}

func newKey() (*ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating ECDSA P-256 key: %w", err)
	}
	return key, nil
}

// NewCA creates a self-signed certificate authority.
func NewCA(commonName string) (*KeyPair, error) {
	key, err := newKey()
	if err != nil {
		return nil, err
	}
	// Backdated like the leaves: a CA valid only from now would make a peer
	// whose clock is slightly behind reject every chain.
	cert, err := certutil.NewSelfSignedCACert(certutil.Config{CommonName: commonName, NotBefore: time.Now().Add(-clockSkew)}, key)
	if err != nil {
		return nil, fmt.Errorf("self-signing CA %q: %w", commonName, err)
	}
	return &KeyPair{Cert: cert, Key: key}, nil
}

// Sign issues a new key and a certificate for it, signed by the CA.
func (ca *KeyPair) Sign(req Request) (*KeyPair, error) {
	if req.CommonName == "" {
		return nil, errors.New("certificate request without a common name")
	}
	if len(req.Usages) == 0 {
		return nil, fmt.Errorf("certificate request %q without extended key usages", req.CommonName)
	}
	validity := req.validity()
	key, err := newKey()
	if err != nil {
		return nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("generating serial number: %w", err)
	}
	now := time.Now()
	notAfter := now.Add(validity).UTC()
	// Never outlive the issuer: a chain with an expired CA fails anyway, and
	// the renewal check below would not see it.
	if notAfter.After(ca.Cert.NotAfter) {
		notAfter = ca.Cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: req.CommonName, Organization: req.Organization},
		DNSNames:     req.DNSNames,
		IPAddresses:  req.IPs,
		NotBefore:    now.Add(-clockSkew).UTC(),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  req.Usages,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		return nil, fmt.Errorf("signing certificate %q: %w", req.CommonName, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parsing certificate %q: %w", req.CommonName, err)
	}
	return &KeyPair{Cert: cert, Key: key}, nil
}

// ParseKeyPair parses a PEM certificate and key and checks that they belong
// together.
func ParseKeyPair(certPEM, keyPEM []byte) (*KeyPair, error) {
	certs, err := certutil.ParseCertsPEM(certPEM)
	if err != nil {
		return nil, fmt.Errorf("parsing certificate: %w", err)
	}
	key, err := keyutil.ParsePrivateKeyPEM(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("parsing private key: %w", err)
	}
	signer, ok := key.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("private key of type %T cannot sign", key)
	}
	if !publicKeysEqual(certs[0].PublicKey, signer.Public()) {
		return nil, errors.New("private key does not match the certificate")
	}
	return &KeyPair{Cert: certs[0], Key: signer}, nil
}

func publicKeysEqual(a, b crypto.PublicKey) bool {
	ak, err := x509.MarshalPKIXPublicKey(a)
	if err != nil {
		return false
	}
	bk, err := x509.MarshalPKIXPublicKey(b)
	if err != nil {
		return false
	}
	return bytes.Equal(ak, bk)
}

// Problem says why an existing certificate cannot be kept; empty when it can.
// It is used for status messages and events, so it names the cause. now is
// the time the certificate is judged at: a caller renewing certificates
// together passes a moment up to RenewWindow ahead.
func Problem(cert *x509.Certificate, ca *x509.Certificate, req Request, now time.Time) string {
	if err := cert.CheckSignatureFrom(ca); err != nil {
		return "not signed by the current CA"
	}
	if !now.Before(RenewAt(cert, req)) {
		return fmt.Sprintf(DueForRenewal+": expires %s, renewed %s before", cert.NotAfter.UTC().Format(time.RFC3339), req.renewBefore())
	}
	// Issued for longer than asked (the validity was shortened since): a
	// certificate that outlives the setting is what the setting exists to
	// prevent. A longer validity waits for the next renewal.
	if lifetime := cert.NotAfter.Sub(cert.NotBefore) - clockSkew; lifetime > req.validity()+time.Minute {
		return fmt.Sprintf("valid for %s, longer than the %s asked for", lifetime.Round(time.Second), req.validity())
	}
	if cert.Subject.CommonName != req.CommonName {
		return fmt.Sprintf("common name is %q, want %q", cert.Subject.CommonName, req.CommonName)
	}
	if !slices.Equal(sortedCopy(cert.Subject.Organization), sortedCopy(req.Organization)) {
		return fmt.Sprintf("organizations are %v, want %v", cert.Subject.Organization, req.Organization)
	}
	for _, name := range req.DNSNames {
		if !slices.Contains(cert.DNSNames, name) {
			return fmt.Sprintf("missing DNS name %q", name)
		}
	}
	for _, ip := range req.IPs {
		if !slices.ContainsFunc(cert.IPAddresses, ip.Equal) {
			return fmt.Sprintf("missing IP address %s", ip)
		}
	}
	for _, u := range req.Usages {
		if !slices.Contains(cert.ExtKeyUsage, u) {
			return "missing extended key usage " + usageName(u)
		}
	}
	return ""
}

// CAProblem says why an existing CA cannot be kept; empty when it can.
func CAProblem(ca *x509.Certificate, now time.Time) string {
	if !ca.IsCA {
		return "not a certificate authority"
	}
	if remaining := ca.NotAfter.Sub(now); remaining < RenewBefore {
		return fmt.Sprintf("expires %s (less than %s left)", ca.NotAfter.UTC().Format(time.RFC3339), RenewBefore)
	}
	return ""
}

func sortedCopy(s []string) []string {
	c := slices.Clone(s)
	slices.Sort(c)
	return c
}

// NewServiceAccountKey returns a new service-account signing key pair as PEM:
// the private key and the PKIX public key.
func NewServiceAccountKey() (privatePEM, publicPEM []byte, err error) {
	key, err := newKey()
	if err != nil {
		return nil, nil, err
	}
	privatePEM, err = keyutil.MarshalPrivateKeyToPEM(key)
	if err != nil {
		return nil, nil, fmt.Errorf("encoding service-account key: %w", err)
	}
	publicPEM, err = EncodePublicKeyPEM(key.Public())
	if err != nil {
		return nil, nil, err
	}
	return privatePEM, publicPEM, nil
}

// EncodePublicKeyPEM encodes a public key as a PKIX "PUBLIC KEY" PEM block.
func EncodePublicKeyPEM(pub crypto.PublicKey) ([]byte, error) {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return nil, fmt.Errorf("encoding public key: %w", err)
	}
	return pemEncode("PUBLIC KEY", der), nil
}

// ServiceAccountKeyProblem says why a service-account key pair cannot be
// kept; empty when it can.
func ServiceAccountKeyProblem(privatePEM, publicPEM []byte) string {
	key, err := keyutil.ParsePrivateKeyPEM(privatePEM)
	if err != nil {
		return "private key does not parse"
	}
	signer, ok := key.(crypto.Signer)
	if !ok {
		return "private key cannot sign"
	}
	pubs, err := keyutil.ParsePublicKeysPEM(publicPEM)
	if err != nil || len(pubs) != 1 {
		return "public key does not parse"
	}
	if !publicKeysEqual(pubs[0], signer.Public()) {
		return "public key does not match the private key"
	}
	return ""
}

func usageName(u x509.ExtKeyUsage) string {
	switch u {
	case x509.ExtKeyUsageServerAuth:
		return "server auth"
	case x509.ExtKeyUsageClientAuth:
		return "client auth"
	default:
		return fmt.Sprintf("%d", u)
	}
}
