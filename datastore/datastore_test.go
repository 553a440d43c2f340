package datastore

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/types"

	"github.com/apiaryhq/apiary/pki"
)

const uid = types.UID("0b6f3c1e-9d2a-4c1b-8e57-3f0a9c2d4e61")

func TestTenantFor(t *testing.T) {
	got := TenantFor(uid)
	want := Tenant{User: "apiary-" + string(uid), Prefix: "/apiary/" + string(uid)}
	if got != want {
		t.Fatalf("TenantFor = %+v, want %+v", got, want)
	}
	if err := got.Validate(); err != nil {
		t.Fatalf("Validate(TenantFor(uid)) = %v", err)
	}
	key, end := got.KeyRange()
	if key != want.Prefix+"/" || end != want.Prefix+"0" {
		t.Fatalf("KeyRange = [%q, %q), want [%q, %q)", key, end, want.Prefix+"/", want.Prefix+"0")
	}
}

// TestKeyRangeBoundaries checks which keys the tenant's role covers: all of
// kube-apiserver's keys (Prefix+"/..."), none of its neighbours'.
func TestKeyRangeBoundaries(t *testing.T) {
	tn := TenantFor(uid)
	key, end := tn.KeyRange()
	in := func(k string) bool { return k >= key && k < end }
	for _, k := range []string{
		tn.Prefix + "/",
		tn.Prefix + "/registry/pods/default/p",
		tn.Prefix + "/health",
		tn.Prefix + "/\xff\xff",
	} {
		if !in(k) {
			t.Errorf("key %q is outside the tenant range [%q, %q)", k, key, end)
		}
	}
	for _, k := range []string{
		tn.Prefix,                           // the prefix itself, without slash
		tn.Prefix + "x",                     // next to the prefix
		tn.Prefix + "0",                     // the range end
		tn.Prefix + "-sibling/registry/x",   // a tenant whose UID extends this one
		"/apiary/" + string(uid)[:8] + "/x", // a tenant whose UID is a prefix of this one
		"/apiary/",
		"/",
		"compact_rev_key",
	} {
		if in(k) {
			t.Errorf("key %q is inside the tenant range [%q, %q)", k, key, end)
		}
	}
}

func TestTenantValidate(t *testing.T) {
	for _, tc := range []struct {
		tenant Tenant
		ok     bool
	}{
		{TenantFor(uid), true},
		{Tenant{User: "u", Prefix: "/a/b/c"}, true},
		{TenantFor(""), false}, // "/apiary/": would cover every tenant
		{Tenant{User: "", Prefix: "/apiary/x"}, false},
		{Tenant{User: "root", Prefix: "/apiary/x"}, false},
		{Tenant{User: "a/b", Prefix: "/apiary/x"}, false},
		{Tenant{User: "u", Prefix: ""}, false},
		{Tenant{User: "u", Prefix: "/"}, false},
		{Tenant{User: "u", Prefix: "/apiary"}, false},
		{Tenant{User: "u", Prefix: "apiary/x"}, false},
		{Tenant{User: "u", Prefix: "/apiary/x/"}, false},
		{Tenant{User: "u", Prefix: "/apiary//x"}, false},
	} {
		err := tc.tenant.Validate()
		if (err == nil) != tc.ok {
			t.Errorf("Validate(%+v) = %v, want ok=%v", tc.tenant, err, tc.ok)
		}
	}
}

func TestConfigHash(t *testing.T) {
	base := Config{
		Endpoints:  []string{"https://a:2379", "https://b:2379"},
		CACert:     []byte("ca"),
		CAKey:      []byte("cakey"),
		ClientCert: []byte("cert"),
		ClientKey:  []byte("key"),
	}
	if base.Hash() != base.Hash() {
		t.Fatal("Hash is not stable")
	}
	clone := base
	clone.Endpoints = append([]string(nil), base.Endpoints...)
	if clone.Hash() != base.Hash() {
		t.Fatal("equal configs hash differently")
	}
	variants := map[string]func(c *Config){
		"endpoint":         func(c *Config) { c.Endpoints = []string{"https://a:2379"} },
		"endpoint order":   func(c *Config) { c.Endpoints = []string{"https://b:2379", "https://a:2379"} },
		"endpoints joined": func(c *Config) { c.Endpoints = []string{"https://a:2379https://b:2379"} },
		"ca":               func(c *Config) { c.CACert = []byte("ca2") },
		"ca key":           func(c *Config) { c.CAKey = []byte("cakey2") },
		"client cert":      func(c *Config) { c.ClientCert = []byte("cert2") },
		"client key":       func(c *Config) { c.ClientKey = []byte("key2") },
		"shifted bytes":    func(c *Config) { c.CACert = []byte("cac"); c.CAKey = []byte("akey") },
	}
	seen := map[string]string{base.Hash(): "base"}
	for name, mutate := range variants {
		c := base
		mutate(&c)
		h := c.Hash()
		if other, dup := seen[h]; dup {
			t.Errorf("%s: same hash as %s", name, other)
		}
		seen[h] = name
	}
}

func TestReasonOf(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connect: connection refused")}
	for _, tc := range []struct {
		err  error
		want string
	}{
		{nil, ""},
		{errors.New("boom"), ReasonError},
		{&Error{Reason: "Custom", Err: errors.New("x")}, "Custom"},
		{fmt.Errorf("outer: %w", &Error{Reason: ReasonAuthDisabled, Err: errors.New("x")}), ReasonAuthDisabled},
	} {
		if got := ReasonOf(tc.err); got != tc.want {
			t.Errorf("ReasonOf(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}

	for _, tc := range []struct {
		err  error
		want string
	}{
		{rpctypes.ErrPermissionDenied, ReasonPermissionDenied},
		{rpctypes.ErrGRPCPermissionDenied, ReasonPermissionDenied},
		{rpctypes.ErrAuthFailed, ReasonAuthFailed},
		{rpctypes.ErrInvalidAuthToken, ReasonAuthFailed},
		{rpctypes.ErrUserNotFound, ReasonAuthFailed},
		{rpctypes.ErrUserEmpty, ReasonAuthFailed},
		{rpctypes.ErrAuthNotEnabled, ReasonAuthDisabled},
		{rpctypes.ErrNoSpace, ReasonNoSpace},
		{rpctypes.ErrNoLeader, ReasonUnreachable},
		{rpctypes.ErrTimeout, ReasonUnreachable},
		{context.DeadlineExceeded, ReasonUnreachable},
		{context.Canceled, ReasonCanceled},
		{status.Error(codes.Unavailable, "connection error: desc = \"transport: Error while dialing\""), ReasonUnreachable},
		{status.Error(codes.DeadlineExceeded, "deadline"), ReasonUnreachable},
		{refused, ReasonUnreachable},
		{rpctypes.ErrRoleNotFound, ReasonError},
		{errors.New("boom"), ReasonError},
	} {
		err := wrapf(tc.err, "doing %s", "something")
		if got := ReasonOf(err); got != tc.want {
			t.Errorf("ReasonOf(wrapf(%v)) = %q, want %q", tc.err, got, tc.want)
		}
		if !errors.Is(err, tc.err) {
			t.Errorf("wrapf(%v) does not unwrap to it", tc.err)
		}
		if !strings.HasPrefix(err.Error(), "doing something: ") {
			t.Errorf("wrapf(%v) = %q, want the context first", tc.err, err)
		}
	}
	if wrapf(nil, "x") != nil {
		t.Error("wrapf(nil) is not nil")
	}
	// A Reason given deeper in the chain wins over the classification.
	inner := &Error{Reason: ReasonInvalidTenant, Err: rpctypes.ErrPermissionDenied}
	if got := ReasonOf(wrapf(inner, "outer")); got != ReasonInvalidTenant {
		t.Errorf("wrapped *Error: reason %q, want %q", got, ReasonInvalidTenant)
	}
}

func newTestConfig(t *testing.T, endpoints ...string) (Config, *pki.KeyPair) {
	t.Helper()
	ca, err := pki.NewCA("test-etcd-ca")
	if err != nil {
		t.Fatal(err)
	}
	root, err := ca.Sign(pki.Request{CommonName: "root", Usages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	if err != nil {
		t.Fatal(err)
	}
	caKey, err := ca.KeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	rootKey, err := root.KeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	if len(endpoints) == 0 {
		endpoints = []string{"https://127.0.0.1:1"}
	}
	return Config{Endpoints: endpoints, CACert: ca.CertPEM(), CAKey: caKey, ClientCert: root.CertPEM(), ClientKey: rootKey}, ca
}

func TestIssueClientCert(t *testing.T) {
	cfg, ca := newTestConfig(t)
	tn := TenantFor(uid)
	certPEM, keyPEM, err := IssueClientCert(cfg, tn)
	if err != nil {
		t.Fatalf("IssueClientCert: %v", err)
	}
	kp, err := pki.ParseKeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatalf("issued key pair does not parse or match: %v", err)
	}
	if kp.Cert.Subject.CommonName != tn.User {
		t.Errorf("CN = %q, want %q", kp.Cert.Subject.CommonName, tn.User)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	if _, err := kp.Cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("client certificate does not verify as a client of the CA: %v", err)
	}
	if _, err := kp.Cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err == nil {
		t.Error("client certificate also verifies as a server certificate")
	}
	if p := pki.Problem(kp.Cert, ca.Cert, ClientCertRequest(tn), time.Now()); p != "" {
		t.Errorf("pki.Problem of a fresh certificate: %s", p)
	}
}

func TestIssueClientCertErrors(t *testing.T) {
	cfg, _ := newTestConfig(t)
	bad := cfg
	bad.CAKey = []byte("not a key")
	if _, _, err := IssueClientCert(bad, TenantFor(uid)); ReasonOf(err) != ReasonInvalidCredentials {
		t.Errorf("bad CA key: %v (reason %q), want %s", err, ReasonOf(err), ReasonInvalidCredentials)
	}
	// A leaf certificate with its key is not a CA.
	leaf := cfg
	leaf.CACert, leaf.CAKey = cfg.ClientCert, cfg.ClientKey
	if _, _, err := IssueClientCert(leaf, TenantFor(uid)); ReasonOf(err) != ReasonInvalidCredentials {
		t.Errorf("non-CA certificate: %v (reason %q), want %s", err, ReasonOf(err), ReasonInvalidCredentials)
	}
	if _, _, err := IssueClientCert(cfg, TenantFor("")); ReasonOf(err) != ReasonInvalidTenant {
		t.Errorf("invalid tenant: %v (reason %q), want %s", err, ReasonOf(err), ReasonInvalidTenant)
	}
}

func TestConnectRejectsBadConfig(t *testing.T) {
	cfg, _ := newTestConfig(t)
	other, _ := newTestConfig(t)
	for name, tc := range map[string]struct {
		mutate func(c *Config)
		reason string
	}{
		"no endpoint":      {func(c *Config) { c.Endpoints = nil }, ReasonInvalidConfig},
		"http endpoint":    {func(c *Config) { c.Endpoints = []string{"http://127.0.0.1:2379"} }, ReasonInvalidConfig},
		"bare endpoint":    {func(c *Config) { c.Endpoints = []string{"127.0.0.1:2379"} }, ReasonInvalidConfig},
		"ca not pem":       {func(c *Config) { c.CACert = []byte("garbage") }, ReasonInvalidCredentials},
		"ca key mismatch":  {func(c *Config) { c.CAKey = other.CAKey }, ReasonInvalidCredentials},
		"client not pem":   {func(c *Config) { c.ClientCert = []byte("garbage") }, ReasonInvalidCredentials},
		"client key empty": {func(c *Config) { c.ClientKey = nil }, ReasonInvalidCredentials},
		"client mismatch":  {func(c *Config) { c.ClientKey = other.ClientKey }, ReasonInvalidCredentials},
	} {
		c := cfg
		tc.mutate(&c)
		cli, err := Connect(context.Background(), c)
		if err == nil {
			_ = cli.Close()
		}
		if ReasonOf(err) != tc.reason {
			t.Errorf("%s: Connect = %v (reason %q), want reason %s", name, err, ReasonOf(err), tc.reason)
		}
	}
}

// TestCheckNothingListening needs no etcd: Connect does not block, and Check
// gives up by its context and says why.
func TestCheckNothingListening(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close() // nothing listens there any more

	cfg, _ := newTestConfig(t, "https://"+addr)
	start := time.Now()
	cli, err := Connect(context.Background(), cfg)
	if err != nil {
		t.Fatalf("Connect: %v", err)
	}
	defer func() { _ = cli.Close() }()
	if d := time.Since(start); d > time.Second {
		t.Errorf("Connect took %s: it should not wait for etcd", d)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 800*time.Millisecond)
	defer cancel()
	start = time.Now()
	err = cli.Check(ctx)
	elapsed := time.Since(start)
	if ReasonOf(err) != ReasonUnreachable {
		t.Fatalf("Check = %v (reason %q), want %s", err, ReasonOf(err), ReasonUnreachable)
	}
	t.Logf("Check: %v", err)
	if !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("Check error %q does not say the connection was refused", err)
	}
	if elapsed > 1500*time.Millisecond {
		t.Errorf("Check took %s with an 800ms context", elapsed)
	}
	if err := cli.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := cli.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestPoolCachesByConfig(t *testing.T) {
	cfg, _ := newTestConfig(t)
	const grace = 200 * time.Millisecond
	p := NewPoolWithGrace(grace)
	defer p.Close()
	ctx := context.Background()

	a, err := p.Get(ctx, "ds", cfg)
	if err != nil {
		t.Fatal(err)
	}
	b, err := p.Get(ctx, "ds", cfg)
	if err != nil {
		t.Fatal(err)
	}
	if a != b {
		t.Fatal("same config: got a new client")
	}
	other, err := p.Get(ctx, "other", cfg)
	if err != nil {
		t.Fatal(err)
	}
	if other == a {
		t.Fatal("another DataStore name shares the client")
	}

	changed := cfg
	changed.Endpoints = []string{"https://127.0.0.1:2"}
	c, err := p.Get(ctx, "ds", changed)
	if err != nil {
		t.Fatal(err)
	}
	if c == a {
		t.Fatal("changed config: got the old client")
	}
	// Reconciles still holding the replaced client finish their calls.
	if a.etcd.Ctx().Err() != nil {
		t.Error("replaced client was closed at once, not after the grace period")
	}
	time.Sleep(3 * grace)
	if a.etcd.Ctx().Err() == nil {
		t.Error("replaced client was not closed after the grace period")
	}

	bad := cfg
	bad.ClientCert = nil
	if _, err := p.Get(ctx, "ds", bad); ReasonOf(err) != ReasonInvalidCredentials {
		t.Errorf("Get with bad credentials = %v, want %s", err, ReasonInvalidCredentials)
	}

	p.Forget("ds")
	if c.etcd.Ctx().Err() == nil {
		t.Error("forgotten client was not closed")
	}
	d, err := p.Get(ctx, "ds", changed)
	if err != nil || d == c {
		t.Fatalf("Get after Forget = %p, %v; want a new client", d, err)
	}

	p.Close()
	if other.etcd.Ctx().Err() == nil || d.etcd.Ctx().Err() == nil {
		t.Error("Close did not close every client")
	}
	if _, err := p.Get(ctx, "ds", cfg); err == nil {
		t.Error("Get after Close succeeded")
	}
}

func TestPoolConcurrentUse(t *testing.T) {
	cfgA, _ := newTestConfig(t)
	cfgB := cfgA
	cfgB.Endpoints = []string{"https://127.0.0.1:2"}
	p := NewPool()
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for j := range 20 {
				cfg := cfgA
				if (i+j)%3 == 0 {
					cfg = cfgB
				}
				name := []string{"x", "y"}[j%2]
				c, err := p.Get(context.Background(), name, cfg)
				if err != nil || c == nil {
					t.Errorf("Get: %v", err)
					return
				}
				if j%7 == 0 {
					p.Forget(name)
				}
			}
		})
	}
	wg.Wait()
	p.Close()
	p.Close() // idempotent
}

func TestSupportedVersion(t *testing.T) {
	for v, ok := range map[string]bool{
		"3.6.0": true, "3.6.16": true, "3.7.1": true, "4.0.0": true,
		"3.5.21": false, "3.4.9": false, "2.3.8": false, "": false, "3.6": false, "v3.6.0x": false,
	} {
		err := SupportedVersion(v)
		if (err == nil) != ok {
			t.Errorf("SupportedVersion(%q) = %v, want supported=%v", v, err, ok)
		}
		if err != nil && ReasonOf(err) != ReasonUnsupportedVersion {
			t.Errorf("SupportedVersion(%q): reason %q", v, ReasonOf(err))
		}
	}
	if err := SupportedVersion("3.5.21"); err == nil || !strings.Contains(err.Error(), "needs etcd 3.6.0 or newer") {
		t.Errorf("message: %v", err)
	}
}

func TestFormatBytes(t *testing.T) {
	for n, want := range map[int64]string{
		0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 1536: "1.5 KiB",
		5 << 20: "5.0 MiB", 3<<30 + 1<<29: "3.5 GiB", 1 << 50: "1.0 PiB",
	} {
		if got := FormatBytes(n); got != want {
			t.Errorf("FormatBytes(%d) = %q, want %q", n, got, want)
		}
	}
}
