package datastore

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"time"

	"github.com/apiaryhq/apiary/pki"
)

// peerProbeCN names the throwaway certificate of a peer probe; it is no
// etcd user.
const peerProbeCN = "apiary-peer-probe"

// PeerProbe is what a certificate of the DataStore's CA, made like a
// tenant's, gets at one member's peer URL.
type PeerProbe struct {
	URL string
	// Open: the peer API answered (GET /members) to that certificate, or
	// to no certificate at all on a plain http:// peer URL.
	Open bool
	// Plain: the peer URL is http://, with no authentication.
	Plain bool
	// Refused: the TLS handshake or the request was refused. Neither Open
	// nor Refused: the probe could not tell (Detail says why).
	Refused bool
	Detail  string
}

// ProbePeers checks whether the members' peer ports, which speak raft,
// refuse a tenant's certificate: an etcd whose peer port trusts the CA that
// signs tenant client certificates lets every tenant read, write and stop
// the whole cluster. The peer URLs are the members' own (MemberList); a
// fresh certificate of the CA in cfg, with a tenant's usage and a name
// that is no etcd user, is offered to each.
func (c *Client) ProbePeers(ctx context.Context, cfg Config) ([]PeerProbe, error) {
	callCtx, cancel := context.WithTimeout(ctx, statusTimeout)
	members, err := c.etcd.MemberList(callCtx)
	cancel()
	if err != nil {
		return nil, c.explain(ctx, err, "listing the etcd members' peer URLs")
	}
	ca, err := pki.ParseKeyPair(cfg.CACert, cfg.CAKey)
	if err != nil {
		return nil, &Error{Reason: ReasonInvalidCredentials, Err: fmt.Errorf("etcd CA key pair: %w", err)}
	}
	cert, err := ca.Sign(pki.Request{CommonName: peerProbeCN, Usages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	if err != nil {
		return nil, fmt.Errorf("issuing the peer probe certificate: %w", err)
	}
	pair := tls.Certificate{Certificate: [][]byte{cert.Cert.Raw}, PrivateKey: cert.Key, Leaf: cert.Cert}
	var urls []string
	for _, m := range members.Members {
		urls = append(urls, m.PeerURLs...)
	}
	slices.Sort(urls)
	urls = slices.Compact(urls)
	out := make([]PeerProbe, 0, len(urls))
	for _, u := range urls {
		out = append(out, probePeer(ctx, u, pair))
	}
	return out, nil
}

func probePeer(ctx context.Context, peerURL string, cert tls.Certificate) PeerProbe {
	p := PeerProbe{URL: peerURL}
	u, err := url.Parse(peerURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") {
		p.Detail = fmt.Sprintf("peer URL %q is not http(s)", peerURL)
		return p
	}
	p.Plain = u.Scheme == "http"
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{
			Certificates: []tls.Certificate{cert},
			// What the peer port accepts is under test, not its name: its
			// certificate may come from a CA Apiary does not hold.
			InsecureSkipVerify: true, //nolint:gosec // see above
			MinVersion:         tls.VersionTLS12,
		},
		DisableKeepAlives: true,
	}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.JoinPath("members").String(), nil)
	if err != nil {
		p.Detail = err.Error()
		return p
	}
	resp, err := hc.Do(req)
	if err != nil {
		if !p.Plain && isTLSError(err) {
			p.Refused, p.Detail = true, fmt.Sprintf("refused in the TLS handshake: %v", err)
		} else {
			p.Detail = err.Error()
		}
		return p
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
	_ = resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusOK:
		p.Open = true
		p.Detail = "the peer API answered GET /members"
	case resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden:
		p.Refused = true
		p.Detail = fmt.Sprintf("the peer API answered %s", resp.Status)
	default:
		p.Detail = fmt.Sprintf("the peer API answered %s", resp.Status)
	}
	return p
}
