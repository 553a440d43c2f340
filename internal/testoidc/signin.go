package testoidc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"golang.org/x/oauth2"
)

// SignIn is what a user's browser does with a provider, for tests that
// need a user's ID token without one: the authorization-code flow with
// PKCE, the login form filled in, the code exchanged. hc must trust the
// provider's certificate; the redirect URI is never fetched.
func SignIn(ctx context.Context, hc *http.Client, issuer string, c Client, username, password string, scopes ...string) (*oauth2.Token, error) {
	disc, err := discover(ctx, hc, issuer)
	if err != nil {
		return nil, err
	}
	cfg := oauth2.Config{
		ClientID: c.ID, ClientSecret: c.Secret, RedirectURL: c.RedirectURIs[0],
		Endpoint: oauth2.Endpoint{AuthURL: disc.AuthorizationEndpoint, TokenURL: disc.TokenEndpoint},
		Scopes:   append([]string{"openid"}, scopes...),
	}
	verifier, state := oauth2.GenerateVerifier(), oauth2.GenerateVerifier()
	back, err := Browse(ctx, hc, cfg.AuthCodeURL(state, oauth2.S256ChallengeOption(verifier)), c.RedirectURIs[0], username, password)
	if err != nil {
		return nil, err
	}
	if e := back.Query().Get("error"); e != "" {
		return nil, fmt.Errorf("the provider refused: %s: %s", e, back.Query().Get("error_description"))
	}
	if back.Query().Get("state") != state {
		return nil, errors.New("the provider returned another state")
	}
	tok, err := cfg.Exchange(context.WithValue(ctx, oauth2.HTTPClient, hc), back.Query().Get("code"), oauth2.VerifierOption(verifier))
	if err != nil {
		return nil, fmt.Errorf("exchanging the code: %w", err)
	}
	return tok, nil
}

// Browse is what a user does in a browser with an authorization URL of
// the provider: the login form filled in, redirects followed up to the
// redirect URI, which is returned without being fetched (a client on
// loopback expects the caller to GET it, as a browser would).
func Browse(ctx context.Context, hc *http.Client, authURL, redirectURI, username, password string) (*url.URL, error) {
	jar := &stopAtRedirect{hc: hc, stopAt: redirectURI}
	// The authorization request lands on the login form.
	resp, err := jar.get(ctx, authURL)
	if err != nil {
		return nil, err
	}
	id := resp.Request.URL.Query().Get(authRequestParam)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK || id == "" {
		return nil, fmt.Errorf("the authorization request ended at %s (%s), not at the login form", resp.Request.URL.Redacted(), resp.Status)
	}
	form := url.Values{authRequestParam: {id}, "username": {username}, "password": {password}}
	loginURL := *resp.Request.URL
	loginURL.RawQuery = ""
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, loginURL.String(), strings.NewReader(form.Encode()))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if resp, err = jar.do(req); err != nil {
		return nil, err
	}
	_ = resp.Body.Close()
	back := resp.Request.URL
	if !strings.HasPrefix(back.String(), redirectURI) {
		return nil, fmt.Errorf("signing in as %s ended at %s (%s), not at the redirect URI", username, back.Redacted(), resp.Status)
	}
	return back, nil
}

// IDToken is the ID token of a token response.
func IDToken(t *oauth2.Token) string {
	s, _ := t.Extra("id_token").(string)
	return s
}

type discovery struct {
	AuthorizationEndpoint string `json:"authorization_endpoint"`
	TokenEndpoint         string `json:"token_endpoint"`
}

func discover(ctx context.Context, hc *http.Client, issuer string) (*discovery, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(issuer, "/")+"/.well-known/openid-configuration", nil)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("discovery: %w", err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil || resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("discovery: %s %v", resp.Status, err)
	}
	var d discovery
	if err := json.Unmarshal(body, &d); err != nil {
		return nil, fmt.Errorf("discovery: %w", err)
	}
	return &d, nil
}

// stopAtRedirect follows redirects until the redirect URI, which it returns
// without fetching (the response's Request is where it stopped).
type stopAtRedirect struct {
	hc     *http.Client
	stopAt string
}

func (c *stopAtRedirect) get(ctx context.Context, u string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	return c.do(req)
}

func (c *stopAtRedirect) do(req *http.Request) (*http.Response, error) {
	hc := *c.hc
	hc.CheckRedirect = func(next *http.Request, via []*http.Request) error {
		if strings.HasPrefix(next.URL.String(), c.stopAt) || len(via) > 10 {
			return http.ErrUseLastResponse
		}
		return nil
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	if loc, err := resp.Location(); err == nil && strings.HasPrefix(loc.String(), c.stopAt) {
		// Stopped before the redirect URI: report it as where we are.
		resp.Request = &http.Request{Method: http.MethodGet, URL: loc}
	}
	return resp, nil
}
