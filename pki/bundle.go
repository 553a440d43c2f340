package pki

import (
	"bytes"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"fmt"

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

// CertificatesOnly re-encodes the certificates of PEM data that must hold
// nothing else (a trust bundle a user names): a block of another type (a
// private key) or bytes that are not PEM make it an error that says what
// was found without quoting it, so that a key named by mistake is neither
// copied nor echoed into a message.
func CertificatesOnly(data []byte) ([]byte, error) {
	var certs []*x509.Certificate
	rest := bytes.TrimSpace(data)
	for len(rest) > 0 {
		// pem.Decode skips text before a block: a bundle must not hide
		// anything there.
		block, next := pem.Decode(rest)
		if block == nil || !bytes.HasPrefix(rest, []byte("-----BEGIN ")) {
			return nil, fmt.Errorf("holds %d bytes that are not PEM after %d certificates", len(rest), len(certs))
		}
		if block.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("holds a PEM block of type %q: only CERTIFICATE blocks are accepted", block.Type)
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("certificate %d does not parse: %w", len(certs)+1, err)
		}
		certs = append(certs, c)
		rest = bytes.TrimSpace(next)
	}
	if len(certs) == 0 {
		return nil, fmt.Errorf("holds no certificate")
	}
	return Bundle(certs...), nil
}
