package datastore

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync"
	"time"
)

// diagnose dials every endpoint itself to say why etcd did not answer. gRPC
// keeps the connection error to itself and, since clientv3 waits for a
// connection, the failed call only says "context deadline exceeded". The
// reason is ReasonTLSFailed when no endpoint could complete a TLS handshake
// and at least one failed in TLS, ReasonUnreachable otherwise. It is bounded
// by ctx.
func diagnose(ctx context.Context, endpoints []string, cfg *tls.Config) (reason string, err error) {
	type result struct {
		endpoint string
		tlsOK    bool
		tlsErr   bool
		msg      string
	}
	results := make([]result, len(endpoints))
	var wg sync.WaitGroup
	for i, ep := range endpoints {
		wg.Go(func() {
			ok, tlsErr, msg := probe(ctx, ep, cfg)
			results[i] = result{endpoint: ep, tlsOK: ok, tlsErr: tlsErr, msg: msg}
		})
	}
	wg.Wait()

	var msgs []string
	anyOK, anyTLSErr := false, false
	for _, r := range results {
		anyOK = anyOK || r.tlsOK
		anyTLSErr = anyTLSErr || r.tlsErr
		msgs = append(msgs, r.endpoint+": "+r.msg)
	}
	reason = ReasonUnreachable
	if anyTLSErr && !anyOK {
		reason = ReasonTLSFailed
	}
	return reason, errors.New(strings.Join(msgs, "; "))
}

// probe dials one endpoint with the client's TLS configuration. ok means
// the TLS session was established and etcd did not reject the client
// certificate.
func probe(ctx context.Context, endpoint string, cfg *tls.Config) (ok, tlsErr bool, msg string) {
	u, err := url.Parse(endpoint)
	if err != nil {
		return false, false, err.Error()
	}
	c := cfg.Clone()
	c.ServerName = u.Hostname()
	c.NextProtos = []string{"h2"}
	d := tls.Dialer{NetDialer: &net.Dialer{}, Config: c}
	conn, err := d.DialContext(ctx, "tcp", u.Host)
	if err != nil {
		if isTLSError(err) {
			return false, true, fmt.Sprintf("TLS handshake failed: %v", err)
		}
		return false, false, err.Error()
	}
	defer func() { _ = conn.Close() }()

	// With TLS 1.3 the server checks the client certificate after the
	// client considers the handshake done: a rejection arrives as an alert
	// on the first read. A healthy etcd sends its HTTP/2 settings right
	// away, so a short read tells the two apart.
	deadline := time.Now().Add(500 * time.Millisecond)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	_ = conn.SetReadDeadline(deadline)
	var b [1]byte
	if _, err := conn.Read(b[:]); err != nil {
		var netErr net.Error
		if errors.As(err, &netErr) && netErr.Timeout() {
			return true, false, "TLS handshake succeeded but etcd did not answer in time"
		}
		if isTLSError(err) {
			return false, true, fmt.Sprintf("etcd rejected the client certificate: %v", err)
		}
		return false, false, fmt.Sprintf("connection closed after the TLS handshake: %v", err)
	}
	return true, false, "TLS handshake succeeded, but etcd did not answer in time (no leader or overloaded?)"
}

func isTLSError(err error) bool {
	var (
		opErr     *net.OpError
		record    tls.RecordHeaderError
		verify    *tls.CertificateVerificationError
		unknownCA x509.UnknownAuthorityError
		invalid   x509.CertificateInvalidError
		hostname  x509.HostnameError
	)
	// crypto/tls reports an alert from the peer as a *net.OpError whose Op
	// is "remote error" (the alert type itself is unexported).
	if errors.As(err, &opErr) && opErr.Op == "remote error" {
		return true
	}
	return errors.As(err, &record) || errors.As(err, &verify) ||
		errors.As(err, &unknownCA) || errors.As(err, &invalid) || errors.As(err, &hostname)
}
