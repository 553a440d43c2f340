package pki

import (
	"bytes"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"

	certutil "k8s.io/client-go/util/cert"
)

// Bundle is the PEM of certificates in the order given: a trust bundle,
// such as the current CA and the one it replaces during a rotation.
func Bundle(certs ...*x509.Certificate) []byte {
	var out bytes.Buffer
	for _, c := range certs {
		out.Write(pemEncode("CERTIFICATE", c.Raw))
	}
	return out.Bytes()
}

// ParseBundle parses a PEM trust bundle; an empty or unreadable one is an
// error.
func ParseBundle(pemData []byte) ([]*x509.Certificate, error) {
	return certutil.ParseCertsPEM(pemData)
}

// Fingerprint names certificates by content: the first 16 hex digits of
// the sha256 of their DER encodings, in order. Two bundles with the same
// certificates in the same order have the same fingerprint whatever their
// PEM formatting; an unreadable bundle has none ("").
func Fingerprint(pemData []byte) string {
	certs, err := ParseBundle(pemData)
	if err != nil {
		return ""
	}
	h := sha256.New()
	for _, c := range certs {
		h.Write(c.Raw)
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}
