package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/util/keyutil"
)

func newTestCA(t *testing.T, cn string) *KeyPair {
	t.Helper()
	ca, err := NewCA(cn)
	if err != nil {
		t.Fatalf("NewCA(%q): %v", cn, err)
	}
	return ca
}

func sign(t *testing.T, ca *KeyPair, req Request) *KeyPair {
	t.Helper()
	kp, err := ca.Sign(req)
	if err != nil {
		t.Fatalf("Sign(%+v): %v", req, err)
	}
	return kp
}

func serverRequest() Request {
	return Request{
		CommonName:   "kube-apiserver",
		Organization: []string{"apiary"},
		DNSNames:     []string{"kubernetes", "kubernetes.default.svc", "tenant.example.com"},
		IPs:          []net.IP{net.ParseIP("10.96.0.1"), net.ParseIP("192.0.2.7"), net.ParseIP("2001:db8::1")},
		Usages:       []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
}

func clientRequest() Request {
	return Request{
		CommonName:   "kubernetes-admin",
		Organization: []string{"system:masters", "apiary:admins"},
		Usages:       []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
}

func roots(ca *KeyPair) *x509.CertPool {
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	return pool
}

// within reports whether got is within tolerance of want.
func within(got, want time.Time, tolerance time.Duration) bool {
	d := got.Sub(want)
	return d <= tolerance && d >= -tolerance
}

func TestNewCA(t *testing.T) {
	before := time.Now()
	ca := newTestCA(t, "apiary-tenant-ca")
	c := ca.Cert

	if !c.IsCA || !c.BasicConstraintsValid {
		t.Errorf("IsCA = %v, BasicConstraintsValid = %v; want both true", c.IsCA, c.BasicConstraintsValid)
	}
	if c.KeyUsage&x509.KeyUsageCertSign == 0 {
		t.Errorf("KeyUsage %b lacks KeyUsageCertSign", c.KeyUsage)
	}
	if c.Subject.CommonName != "apiary-tenant-ca" {
		t.Errorf("CommonName = %q, want apiary-tenant-ca", c.Subject.CommonName)
	}
	if err := c.CheckSignatureFrom(c); err != nil {
		t.Errorf("CA is not self-signed: %v", err)
	}
	if !slices.Equal(c.RawIssuer, c.RawSubject) {
		t.Errorf("issuer %q differs from subject %q", c.Issuer, c.Subject)
	}
	// A CA verifies as its own root.
	if _, err := c.Verify(x509.VerifyOptions{Roots: roots(ca), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		t.Errorf("CA does not verify against itself: %v", err)
	}
	if got := c.NotAfter.Sub(c.NotBefore); got < CAValidity-10*time.Minute || got > CAValidity+10*time.Minute {
		t.Errorf("CA validity = %s, want ≈ %s", got, CAValidity)
	}
	if !within(c.NotAfter, before.Add(CAValidity), time.Minute) {
		t.Errorf("CA NotAfter = %s, want ≈ %s", c.NotAfter, before.Add(CAValidity))
	}
	if c.NotBefore.After(time.Now()) {
		t.Errorf("CA NotBefore %s is in the future", c.NotBefore)
	}
	key, ok := ca.Key.(*ecdsa.PrivateKey)
	if !ok {
		t.Fatalf("CA key is %T, want *ecdsa.PrivateKey", ca.Key)
	}
	if key.Curve != elliptic.P256() {
		t.Errorf("CA key curve = %s, want P-256", key.Curve.Params().Name)
	}
	if !publicKeysEqual(c.PublicKey, key.Public()) {
		t.Error("CA certificate public key does not match its private key")
	}
	if p := CAProblem(c, time.Now()); p != "" {
		t.Errorf("CAProblem(fresh CA) = %q, want empty", p)
	}

	other := newTestCA(t, "apiary-tenant-ca")
	if c.SerialNumber.Cmp(other.Cert.SerialNumber) == 0 {
		t.Error("two CAs got the same serial number")
	}
	if publicKeysEqual(c.PublicKey, other.Cert.PublicKey) {
		t.Error("two CAs got the same key")
	}
}

func TestSignServingCertificate(t *testing.T) {
	ca := newTestCA(t, "ca")
	req := serverRequest()
	before := time.Now()
	kp := sign(t, ca, req)
	c := kp.Cert

	opts := func(name string, usage x509.ExtKeyUsage) x509.VerifyOptions {
		return x509.VerifyOptions{DNSName: name, Roots: roots(ca), KeyUsages: []x509.ExtKeyUsage{usage}}
	}
	// Every requested DNS name and IP verifies for server auth.
	for _, name := range []string{"kubernetes", "kubernetes.default.svc", "tenant.example.com", "10.96.0.1", "192.0.2.7", "2001:db8::1"} {
		chains, err := c.Verify(opts(name, x509.ExtKeyUsageServerAuth))
		if err != nil {
			t.Errorf("Verify(server auth, %s): %v", name, err)
			continue
		}
		if len(chains) != 1 || len(chains[0]) != 2 || !chains[0][1].Equal(ca.Cert) {
			t.Errorf("Verify(%s) chain does not end at the CA: %v", name, chains)
		}
	}
	// Names and IPs that were not requested do not.
	for _, name := range []string{"other.example.com", "kubernetes.default", "10.96.0.2", "2001:db8::2"} {
		if _, err := c.Verify(opts(name, x509.ExtKeyUsageServerAuth)); err == nil {
			t.Errorf("Verify(server auth, %s) succeeded for a name that is not in the certificate", name)
		}
	}
	// A serving certificate is not a client certificate.
	if _, err := c.Verify(opts("", x509.ExtKeyUsageClientAuth)); err == nil {
		t.Error("serving certificate verifies for client auth")
	} else {
		var inv x509.CertificateInvalidError
		if !errors.As(err, &inv) || inv.Reason != x509.IncompatibleUsage {
			t.Errorf("client-auth verification error = %v, want IncompatibleUsage", err)
		}
	}
	// Nor does it verify against another CA.
	other := newTestCA(t, "ca")
	if _, err := c.Verify(x509.VerifyOptions{DNSName: "kubernetes", Roots: roots(other), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err == nil {
		t.Error("serving certificate verifies against an unrelated CA of the same name")
	}

	if c.Subject.CommonName != req.CommonName {
		t.Errorf("CommonName = %q, want %q", c.Subject.CommonName, req.CommonName)
	}
	if !slices.Equal(c.Subject.Organization, req.Organization) {
		t.Errorf("Organization = %v, want %v", c.Subject.Organization, req.Organization)
	}
	if !slices.Equal(c.DNSNames, req.DNSNames) {
		t.Errorf("DNSNames = %v, want %v", c.DNSNames, req.DNSNames)
	}
	if len(c.IPAddresses) != len(req.IPs) {
		t.Errorf("IPAddresses = %v, want %v", c.IPAddresses, req.IPs)
	} else {
		for i := range req.IPs {
			if !c.IPAddresses[i].Equal(req.IPs[i]) {
				t.Errorf("IPAddresses[%d] = %s, want %s", i, c.IPAddresses[i], req.IPs[i])
			}
		}
	}
	if !slices.Equal(c.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}) {
		t.Errorf("ExtKeyUsage = %v, want [ServerAuth]", c.ExtKeyUsage)
	}
	if c.KeyUsage != x509.KeyUsageDigitalSignature {
		t.Errorf("KeyUsage = %b, want DigitalSignature (%b) only", c.KeyUsage, x509.KeyUsageDigitalSignature)
	}
	if c.KeyUsage&x509.KeyUsageCertSign != 0 || c.IsCA {
		t.Errorf("leaf can sign certificates: KeyUsage %b, IsCA %v", c.KeyUsage, c.IsCA)
	}
	if !slices.Equal(c.RawIssuer, ca.Cert.RawSubject) {
		t.Errorf("Issuer = %s, want the CA subject %s", c.Issuer, ca.Cert.Subject)
	}

	// Validity: backdated by clockSkew, NotAfter ≈ now + LeafValidity.
	if !within(c.NotBefore, before.Add(-clockSkew), time.Minute) {
		t.Errorf("NotBefore = %s, want ≈ %s (backdated by %s)", c.NotBefore, before.Add(-clockSkew), clockSkew)
	}
	if !c.NotBefore.Before(before) {
		t.Errorf("NotBefore %s is not backdated (issued at %s)", c.NotBefore, before)
	}
	if !within(c.NotAfter, before.Add(LeafValidity), time.Minute) {
		t.Errorf("NotAfter = %s, want ≈ %s", c.NotAfter, before.Add(LeafValidity))
	}
	if c.NotAfter.After(ca.Cert.NotAfter) {
		t.Errorf("leaf NotAfter %s is after the CA's %s", c.NotAfter, ca.Cert.NotAfter)
	}

	key, ok := kp.Key.(*ecdsa.PrivateKey)
	if !ok {
		t.Fatalf("leaf key is %T, want *ecdsa.PrivateKey", kp.Key)
	}
	if key.Curve != elliptic.P256() {
		t.Errorf("leaf key curve = %s, want P-256", key.Curve.Params().Name)
	}
	if pub, ok := c.PublicKey.(*ecdsa.PublicKey); !ok || pub.Curve != elliptic.P256() {
		t.Errorf("certificate public key is %T, want P-256 ECDSA", c.PublicKey)
	}
	if c.PublicKeyAlgorithm != x509.ECDSA {
		t.Errorf("PublicKeyAlgorithm = %s, want ECDSA", c.PublicKeyAlgorithm)
	}
	if !publicKeysEqual(c.PublicKey, kp.Key.Public()) {
		t.Error("leaf certificate public key does not match its private key")
	}
	if publicKeysEqual(c.PublicKey, ca.Key.Public()) {
		t.Error("leaf reuses the CA key")
	}
	if p := Problem(c, ca.Cert, req, time.Now()); p != "" {
		t.Errorf("Problem(fresh serving cert) = %q, want empty", p)
	}
}

func TestSignClientCertificate(t *testing.T) {
	ca := newTestCA(t, "ca")
	req := clientRequest()
	kp := sign(t, ca, req)
	c := kp.Cert

	if _, err := c.Verify(x509.VerifyOptions{Roots: roots(ca), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("Verify(client auth): %v", err)
	}
	// Verify defaults to server auth when KeyUsages is empty.
	for _, o := range []x509.VerifyOptions{
		{Roots: roots(ca), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}},
		{Roots: roots(ca)},
	} {
		if _, err := c.Verify(o); err == nil {
			t.Errorf("client certificate verifies for server auth (KeyUsages %v)", o.KeyUsages)
		}
	}
	if c.Subject.CommonName != req.CommonName {
		t.Errorf("CommonName = %q, want %q", c.Subject.CommonName, req.CommonName)
	}
	// DER sorts the values of a SET OF, so the order is not kept.
	if !slices.Equal(sortedCopy(c.Subject.Organization), sortedCopy(req.Organization)) {
		t.Errorf("Organization = %v, want %v", c.Subject.Organization, req.Organization)
	}
	if len(c.DNSNames) != 0 || len(c.IPAddresses) != 0 {
		t.Errorf("client certificate has SANs %v %v, want none", c.DNSNames, c.IPAddresses)
	}
	if c.KeyUsage != x509.KeyUsageDigitalSignature {
		t.Errorf("KeyUsage = %b, want DigitalSignature only", c.KeyUsage)
	}
	if !slices.Equal(c.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}) {
		t.Errorf("ExtKeyUsage = %v, want [ClientAuth]", c.ExtKeyUsage)
	}
	if p := Problem(c, ca.Cert, req, time.Now()); p != "" {
		t.Errorf("Problem(fresh client cert) = %q, want empty", p)
	}
	reordered := req
	reordered.Organization = []string{req.Organization[1], req.Organization[0]}
	if p := Problem(c, ca.Cert, reordered, time.Now()); p != "" {
		t.Errorf("Problem(organizations in another order) = %q, want empty", p)
	}
	fewer := req
	fewer.Organization = req.Organization[:1]
	if p := Problem(c, ca.Cert, fewer, time.Now()); !strings.Contains(p, "organizations") {
		t.Errorf("Problem(one organization fewer) = %q, want an organizations problem", p)
	}
}

func TestSignBothUsages(t *testing.T) {
	ca := newTestCA(t, "etcd-ca")
	kp := sign(t, ca, Request{
		CommonName: "etcd-peer",
		DNSNames:   []string{"etcd-0.etcd"},
		IPs:        []net.IP{net.ParseIP("127.0.0.1")},
		Usages:     []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	})
	for _, u := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
		if _, err := kp.Cert.Verify(x509.VerifyOptions{DNSName: "etcd-0.etcd", Roots: roots(ca), KeyUsages: []x509.ExtKeyUsage{u}}); err != nil {
			t.Errorf("Verify(usage %d): %v", u, err)
		}
	}
	if _, err := kp.Cert.Verify(x509.VerifyOptions{DNSName: "127.0.0.1", Roots: roots(ca)}); err != nil {
		t.Errorf("Verify(127.0.0.1): %v", err)
	}
}

func TestSignValidity(t *testing.T) {
	ca := newTestCA(t, "ca")
	now := time.Now()

	short := sign(t, ca, Request{CommonName: "short", Usages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, Validity: time.Hour})
	if !within(short.Cert.NotAfter, now.Add(time.Hour), time.Minute) {
		t.Errorf("NotAfter with Validity 1h = %s, want ≈ %s", short.Cert.NotAfter, now.Add(time.Hour))
	}

	// A requested validity beyond the CA is clamped to the CA's NotAfter.
	long := sign(t, ca, Request{CommonName: "long", Usages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, Validity: 2 * CAValidity})
	if !long.Cert.NotAfter.Equal(ca.Cert.NotAfter) {
		t.Errorf("NotAfter with Validity 20y = %s, want the CA's NotAfter %s", long.Cert.NotAfter, ca.Cert.NotAfter)
	}
	if _, err := long.Cert.Verify(x509.VerifyOptions{Roots: roots(ca), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("clamped certificate does not verify: %v", err)
	}

	// A CA close to expiry issues leaves that end with it.
	old := newTestCA(t, "old-ca")
	tmpl := *old.Cert
	tmpl.NotAfter = now.Add(48 * time.Hour).UTC().Truncate(time.Second)
	der, err := x509.CreateCertificate(nil, &tmpl, &tmpl, old.Key.Public(), old.Key)
	if err != nil {
		t.Fatal(err)
	}
	if old.Cert, err = x509.ParseCertificate(der); err != nil {
		t.Fatal(err)
	}
	leaf := sign(t, old, clientRequest())
	if !leaf.Cert.NotAfter.Equal(old.Cert.NotAfter) {
		t.Errorf("leaf of a CA expiring in 48h has NotAfter %s, want the CA's %s", leaf.Cert.NotAfter, old.Cert.NotAfter)
	}
	if p := Problem(leaf.Cert, old.Cert, clientRequest(), now); !strings.Contains(p, "expires") {
		t.Errorf("Problem(leaf clamped to 48h) = %q, want an expiry problem", p)
	}
}

func TestRenewAtAndWindow(t *testing.T) {
	ca := newTestCA(t, "ca")
	req := clientRequest()
	req.Validity, req.RenewBefore = 10*time.Minute, 4*time.Minute
	kp := sign(t, ca, req)
	if got := kp.Cert.NotAfter.Sub(RenewAt(kp.Cert, req)); got != 4*time.Minute {
		t.Errorf("RenewAt %s before NotAfter, want renewBefore 4m", got)
	}
	for _, tt := range []struct{ validity, want time.Duration }{
		{0, time.Hour}, // a year: capped at an hour
		{10 * time.Minute, 30 * time.Second},
		{2 * time.Minute, 6 * time.Second},
		{20 * time.Hour, time.Hour},
	} {
		if got := RenewWindow(tt.validity); got != tt.want {
			t.Errorf("RenewWindow(%s) = %s, want %s", tt.validity, got, tt.want)
		}
	}
}

func TestSignSerialNumbers(t *testing.T) {
	ca := newTestCA(t, "ca")
	seen := map[string]bool{}
	for range 20 {
		kp := sign(t, ca, clientRequest())
		s := kp.Cert.SerialNumber
		if s.Sign() <= 0 {
			t.Errorf("serial number %s is not positive", s)
		}
		if s.BitLen() > 159 {
			t.Errorf("serial number %s has %d bits, more than 20 octets allow", s, s.BitLen())
		}
		if seen[s.String()] {
			t.Fatalf("serial number %s issued twice", s)
		}
		seen[s.String()] = true
	}
}

func TestSignRejectsIncompleteRequests(t *testing.T) {
	ca := newTestCA(t, "ca")
	tests := []struct {
		name string
		req  Request
		want string
	}{
		{"empty common name", Request{Usages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, DNSNames: []string{"a"}}, "common name"},
		{"no usages", Request{CommonName: "kube-apiserver"}, "extended key usages"},
		{"empty usages", Request{CommonName: "kube-apiserver", Usages: []x509.ExtKeyUsage{}}, "extended key usages"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			kp, err := ca.Sign(tt.req)
			if err == nil {
				t.Fatalf("Sign(%+v) = %v, want an error", tt.req, kp.Cert.Subject)
			}
			if kp != nil {
				t.Errorf("Sign returned a key pair with its error")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not mention %q", err, tt.want)
			}
		})
	}
}

func TestParseKeyPair(t *testing.T) {
	ca := newTestCA(t, "ca")
	kp := sign(t, ca, serverRequest())
	keyPEM, err := kp.KeyPEM()
	if err != nil {
		t.Fatalf("KeyPEM: %v", err)
	}
	certPEM := kp.CertPEM()
	if b, _ := pem.Decode(certPEM); b == nil || b.Type != "CERTIFICATE" {
		t.Fatalf("CertPEM is not a CERTIFICATE block: %q", certPEM)
	}

	t.Run("round trip", func(t *testing.T) {
		got, err := ParseKeyPair(certPEM, keyPEM)
		if err != nil {
			t.Fatalf("ParseKeyPair: %v", err)
		}
		if !got.Cert.Equal(kp.Cert) {
			t.Error("parsed certificate differs from the issued one")
		}
		if !publicKeysEqual(got.Key.Public(), kp.Key.Public()) {
			t.Error("parsed key differs from the issued one")
		}
		// The parsed pair is usable as a CA too.
		caParsed, err := ParseKeyPair(ca.CertPEM(), mustKeyPEM(t, ca))
		if err != nil {
			t.Fatalf("ParseKeyPair(CA): %v", err)
		}
		leaf := sign(t, caParsed, clientRequest())
		if _, err := leaf.Cert.Verify(x509.VerifyOptions{Roots: roots(ca), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
			t.Errorf("leaf signed by the re-parsed CA does not verify: %v", err)
		}
	})

	other := sign(t, ca, serverRequest())
	otherKey := mustKeyPEM(t, other)
	tests := []struct {
		name    string
		cert    []byte
		key     []byte
		wantErr string
	}{
		{"mismatched key", certPEM, otherKey, "does not match"},
		{"CA key for leaf cert", certPEM, mustKeyPEM(t, ca), "does not match"},
		{"garbage cert", []byte("not a pem"), keyPEM, "parsing certificate"},
		{"empty cert", nil, keyPEM, "parsing certificate"},
		{"key as cert", keyPEM, keyPEM, "parsing certificate"},
		{"garbage key", certPEM, []byte("-----BEGIN EC PRIVATE KEY-----\nAAAA\n-----END EC PRIVATE KEY-----\n"), "parsing private key"},
		{"empty key", certPEM, nil, "parsing private key"},
		{"cert as key", certPEM, certPEM, "parsing private key"},
		{"corrupt cert body", []byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"), keyPEM, "parsing certificate"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseKeyPair(tt.cert, tt.key)
			if err == nil {
				t.Fatalf("ParseKeyPair succeeded (%v), want an error", got.Cert.Subject)
			}
			if !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("error %q does not contain %q", err, tt.wantErr)
			}
		})
	}
}

func mustKeyPEM(t *testing.T, kp *KeyPair) []byte {
	t.Helper()
	b, err := kp.KeyPEM()
	if err != nil {
		t.Fatalf("KeyPEM: %v", err)
	}
	return b
}

func TestProblem(t *testing.T) {
	ca := newTestCA(t, "ca")
	otherCA := newTestCA(t, "ca")
	req := serverRequest()
	kp := sign(t, ca, req)
	cert := kp.Cert
	now := time.Now()

	with := func(f func(r *Request)) Request {
		r := req
		r.Organization = slices.Clone(req.Organization)
		r.DNSNames = slices.Clone(req.DNSNames)
		r.IPs = slices.Clone(req.IPs)
		r.Usages = slices.Clone(req.Usages)
		f(&r)
		return r
	}

	tests := []struct {
		name string
		cert *x509.Certificate
		ca   *x509.Certificate
		req  Request
		now  time.Time
		want []string // substrings of the problem; nil means no problem
	}{
		{name: "fresh", cert: cert, ca: ca.Cert, req: req, now: now},
		{name: "subset of SANs requested", cert: cert, ca: ca.Cert, req: with(func(r *Request) {
			r.DNSNames = r.DNSNames[:1]
			r.IPs = r.IPs[1:2]
		}), now: now},
		{name: "IPv4 given as 16-byte IP", cert: cert, ca: ca.Cert, req: with(func(r *Request) {
			r.IPs = []net.IP{net.ParseIP("10.96.0.1").To16()}
		}), now: now},
		{name: "renewal threshold not reached", cert: cert, ca: ca.Cert, req: req, now: RenewAt(cert, req).Add(-time.Second)},
		{name: "due at RenewAt", cert: cert, ca: ca.Cert, req: req, now: cert.NotAfter.Add(-RenewBefore),
			want: []string{"due for renewal", "renewed 720h0m0s before"}},
		{name: "renewBefore of the request", cert: cert, ca: ca.Cert, req: with(func(r *Request) { r.RenewBefore = 100 * 24 * time.Hour }),
			now: cert.NotAfter.Add(-99 * 24 * time.Hour), want: []string{"due for renewal", "renewed 2400h0m0s before"}},
		{name: "validity shortened", cert: cert, ca: ca.Cert, req: with(func(r *Request) { r.Validity = 10 * time.Minute }), now: now,
			want: []string{"valid for 8760h0m0s, longer than the 10m0s asked for"}},
		{name: "validity lengthened waits for the renewal", cert: cert, ca: ca.Cert, req: with(func(r *Request) { r.Validity = 2 * LeafValidity }), now: now},
		{name: "other CA", cert: cert, ca: otherCA.Cert, req: req, now: now, want: []string{"not signed by the current CA"}},
		{name: "expiring soon", cert: cert, ca: ca.Cert, req: req, now: cert.NotAfter.Add(-24 * time.Hour),
			want: []string{"due for renewal", "expires " + cert.NotAfter.UTC().Format(time.RFC3339)}},
		{name: "expired", cert: cert, ca: ca.Cert, req: req, now: cert.NotAfter.Add(time.Hour), want: []string{"expires"}},
		{name: "CN mismatch", cert: cert, ca: ca.Cert, req: with(func(r *Request) { r.CommonName = "kube-apiserver-2" }), now: now,
			want: []string{"common name", `"kube-apiserver"`, `"kube-apiserver-2"`}},
		{name: "org mismatch", cert: cert, ca: ca.Cert, req: with(func(r *Request) { r.Organization = []string{"system:masters"} }), now: now,
			want: []string{"organizations", "system:masters"}},
		{name: "org missing", cert: cert, ca: ca.Cert, req: with(func(r *Request) { r.Organization = nil }), now: now,
			want: []string{"organizations"}},
		{name: "missing DNS name", cert: cert, ca: ca.Cert, req: with(func(r *Request) { r.DNSNames = append(r.DNSNames, "new.example.com") }), now: now,
			want: []string{"missing DNS name", `"new.example.com"`}},
		{name: "missing IP", cert: cert, ca: ca.Cert, req: with(func(r *Request) { r.IPs = append(r.IPs, net.ParseIP("198.51.100.9")) }), now: now,
			want: []string{"missing IP address", "198.51.100.9"}},
		{name: "missing IPv6", cert: cert, ca: ca.Cert, req: with(func(r *Request) { r.IPs = append(r.IPs, net.ParseIP("2001:db8::2")) }), now: now,
			want: []string{"missing IP address", "2001:db8::2"}},
		{name: "missing usage", cert: cert, ca: ca.Cert, req: with(func(r *Request) { r.Usages = append(r.Usages, x509.ExtKeyUsageClientAuth) }), now: now,
			want: []string{"missing extended key usage"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Problem(tt.cert, tt.ca, tt.req, tt.now)
			if tt.want == nil {
				if got != "" {
					t.Errorf("Problem = %q, want none", got)
				}
				return
			}
			if got == "" {
				t.Fatalf("Problem = \"\", want one mentioning %q", tt.want)
			}
			for _, w := range tt.want {
				if !strings.Contains(got, w) {
					t.Errorf("Problem = %q, want it to contain %q", got, w)
				}
			}
		})
	}
}

func TestCAProblem(t *testing.T) {
	ca := newTestCA(t, "ca")
	leaf := sign(t, ca, clientRequest())
	now := time.Now()
	tests := []struct {
		name string
		cert *x509.Certificate
		now  time.Time
		want []string
	}{
		{name: "fresh", cert: ca.Cert, now: now},
		{name: "nine years on", cert: ca.Cert, now: now.Add(9 * 365 * 24 * time.Hour)},
		{name: "not a CA", cert: leaf.Cert, now: now, want: []string{"not a certificate authority"}},
		{name: "expiring", cert: ca.Cert, now: ca.Cert.NotAfter.Add(-24 * time.Hour),
			want: []string{"expires", ca.Cert.NotAfter.UTC().Format(time.RFC3339)}},
		{name: "expired", cert: ca.Cert, now: ca.Cert.NotAfter.Add(time.Hour), want: []string{"expires"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := CAProblem(tt.cert, tt.now)
			if tt.want == nil {
				if got != "" {
					t.Errorf("CAProblem = %q, want none", got)
				}
				return
			}
			if got == "" {
				t.Fatalf("CAProblem = \"\", want one mentioning %q", tt.want)
			}
			for _, w := range tt.want {
				if !strings.Contains(got, w) {
					t.Errorf("CAProblem = %q, want it to contain %q", got, w)
				}
			}
		})
	}
}

func TestNewServiceAccountKey(t *testing.T) {
	priv, pub, err := NewServiceAccountKey()
	if err != nil {
		t.Fatalf("NewServiceAccountKey: %v", err)
	}
	key, err := keyutil.ParsePrivateKeyPEM(priv)
	if err != nil {
		t.Fatalf("private key does not parse: %v", err)
	}
	ec, ok := key.(*ecdsa.PrivateKey)
	if !ok || ec.Curve != elliptic.P256() {
		t.Fatalf("private key is %T, want P-256 ECDSA", key)
	}
	pubs, err := keyutil.ParsePublicKeysPEM(pub)
	if err != nil {
		t.Fatalf("public key does not parse: %v", err)
	}
	if len(pubs) != 1 {
		t.Fatalf("got %d public keys, want 1", len(pubs))
	}
	if !publicKeysEqual(pubs[0], ec.Public()) {
		t.Error("public key does not match the private key")
	}
	if b, _ := pem.Decode(pub); b == nil || b.Type != "PUBLIC KEY" {
		t.Errorf("public key PEM block type is not PUBLIC KEY: %q", pub)
	}
	if p := ServiceAccountKeyProblem(priv, pub); p != "" {
		t.Errorf("ServiceAccountKeyProblem(fresh pair) = %q, want empty", p)
	}

	priv2, pub2, err := NewServiceAccountKey()
	if err != nil {
		t.Fatalf("NewServiceAccountKey: %v", err)
	}
	if string(priv2) == string(priv) {
		t.Error("two service-account keys are identical")
	}

	tests := []struct {
		name      string
		priv, pub []byte
		want      string
	}{
		{"mismatched pair", priv, pub2, "public key does not match the private key"},
		{"mismatched pair reversed", priv2, pub, "public key does not match the private key"},
		{"garbage private key", []byte("garbage"), pub, "private key does not parse"},
		{"empty private key", nil, pub, "private key does not parse"},
		{"garbage public key", priv, []byte("garbage"), "public key does not parse"},
		{"empty public key", priv, nil, "public key does not parse"},
		{"two public keys", priv, append(slices.Clone(pub), pub2...), "public key does not parse"},
		// kube-apiserver's --service-account-key-file accepts a private key
		// (keyutil.ParsePublicKeysPEM derives its public half), so this is
		// a usable pair.
		{"private key as public key", priv, priv, ""},
		{"other private key as public key", priv, priv2, "public key does not match the private key"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ServiceAccountKeyProblem(tt.priv, tt.pub); got != tt.want {
				t.Errorf("ServiceAccountKeyProblem = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestEncodePublicKeyPEM(t *testing.T) {
	ca := newTestCA(t, "ca")
	b, err := EncodePublicKeyPEM(ca.Key.Public())
	if err != nil {
		t.Fatalf("EncodePublicKeyPEM: %v", err)
	}
	pubs, err := keyutil.ParsePublicKeysPEM(b)
	if err != nil || len(pubs) != 1 || !publicKeysEqual(pubs[0], ca.Cert.PublicKey) {
		t.Errorf("EncodePublicKeyPEM does not round-trip: %v %v", pubs, err)
	}
	if _, err := EncodePublicKeyPEM(struct{}{}); err == nil {
		t.Error("EncodePublicKeyPEM accepted an unsupported key type")
	}
}

// TestCABackdated: a CA is backdated like its leaves, so a peer whose clock
// is a little behind accepts the whole chain.
func TestCABackdated(t *testing.T) {
	ca := newTestCA(t, "ca")
	leaf := sign(t, ca, serverRequest())
	_, err := leaf.Cert.Verify(x509.VerifyOptions{
		DNSName:     "kubernetes",
		Roots:       roots(ca),
		CurrentTime: time.Now().Add(-2 * time.Minute),
	})
	if err != nil {
		t.Errorf("a peer 2 minutes behind rejects the chain: %v", err)
	}
}
