package pki

import (
	"bytes"
	"strings"
	"testing"
)

// Only certificates pass; a key named by mistake is refused without
// being echoed, and so is anything hidden around the blocks.
func TestCertificatesOnly(t *testing.T) {
	a, b := newTestCA(t, "a"), newTestCA(t, "b")
	key, err := a.KeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	both := append(append([]byte("\n"), a.CertPEM()...), b.CertPEM()...)
	got, err := CertificatesOnly(both)
	if err != nil {
		t.Fatalf("two certificates: %v", err)
	}
	if !bytes.Equal(got, Bundle(a.Cert, b.Cert)) {
		t.Errorf("two certificates re-encode as\n%s", got)
	}
	for name, in := range map[string][]byte{
		"a certificate and its key":   append(a.CertPEM(), key...),
		"a key alone":                 key,
		"text before a block":         append([]byte("# comment\n"), a.CertPEM()...),
		"text after a block":          append(a.CertPEM(), []byte("trailing")...),
		"nothing":                     []byte(" \n"),
		"a block that does not parse": []byte("-----BEGIN CERTIFICATE-----\naGVsbG8=\n-----END CERTIFICATE-----\n"),
	} {
		_, err := CertificatesOnly(in)
		if err == nil {
			t.Errorf("%s: accepted", name)
			continue
		}
		if bytes.Contains(in, key) && strings.Contains(err.Error(), string(key[40:60])) {
			t.Errorf("%s: the error quotes the key: %v", name, err)
		}
		t.Logf("%s: %v", name, err)
	}
}
