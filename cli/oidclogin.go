package cli

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"html"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"github.com/spf13/cobra"
	"golang.org/x/oauth2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientauthv1 "k8s.io/client-go/pkg/apis/clientauthentication/v1"
)

// OIDCLogin is a sign-in to an OpenID provider for a kubeconfig's exec
// credential plugin: the authorization-code flow with PKCE (RFC 7636)
// through the user's browser and a redirect to loopback (RFC 8252), the
// ID token verified and kept in a cache until it expires.
type OIDCLogin struct {
	Issuer   string
	ClientID string
	// ClientSecret, for providers that register the CLI as a confidential
	// client; a public client (PKCE alone) needs none.
	ClientSecret string
	// Listen is the loopback address the redirect comes back to; the
	// provider must allow http://<Listen>/callback.
	Listen string
	// CAFile verifies the provider's TLS (default: the system roots).
	CAFile string
	// Scopes besides openid.
	Scopes []string
	// CacheDir keeps tokens between calls (one file per issuer, client and
	// scopes, mode 0600).
	CacheDir string
	// Timeout bounds the wait for the browser.
	Timeout time.Duration
	// Now is the clock (tests).
	Now func() time.Time
}

// earlyExpiry: a cached token is not handed out within this of its
// expiry, so that it does not expire on its way.
const earlyExpiry = 30 * time.Second

// Credential returns an ID token: the cached one while it lasts, else a
// new one from a sign-in whose URL is written to prompt.
func (l OIDCLogin) Credential(ctx context.Context, prompt io.Writer) (*clientauthv1.ExecCredential, error) {
	now := time.Now
	if l.Now != nil {
		now = l.Now
	}
	hc, err := l.httpClient()
	if err != nil {
		return nil, err
	}
	ctx = oidc.ClientContext(ctx, hc)
	provider, err := oidc.NewProvider(ctx, l.Issuer)
	if err != nil {
		return nil, fmt.Errorf("discovering the OpenID provider %s: %w", l.Issuer, err)
	}
	verifier := provider.Verifier(&oidc.Config{ClientID: l.ClientID, Now: now})
	cache := l.cacheFile()
	if raw, err := os.ReadFile(cache); err == nil {
		if tok, err := verifier.Verify(ctx, strings.TrimSpace(string(raw))); err == nil && tok.Expiry.After(now().Add(earlyExpiry)) {
			return execCredential(strings.TrimSpace(string(raw)), tok.Expiry), nil
		}
	}
	raw, tok, err := l.signIn(ctx, provider, verifier, prompt)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(cache), 0o700); err != nil {
		return nil, fmt.Errorf("creating the token cache: %w", err)
	}
	if err := os.WriteFile(cache, []byte(raw), 0o600); err != nil {
		return nil, fmt.Errorf("caching the token: %w", err)
	}
	return execCredential(raw, tok.Expiry), nil
}

func execCredential(token string, expiry time.Time) *clientauthv1.ExecCredential {
	exp := metav1.NewTime(expiry)
	return &clientauthv1.ExecCredential{
		TypeMeta: metav1.TypeMeta{APIVersion: clientauthv1.SchemeGroupVersion.String(), Kind: "ExecCredential"},
		Status:   &clientauthv1.ExecCredentialStatus{Token: token, ExpirationTimestamp: &exp},
	}
}

func (l OIDCLogin) httpClient() (*http.Client, error) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if l.CAFile != "" {
		pemData, err := os.ReadFile(l.CAFile)
		if err != nil {
			return nil, fmt.Errorf("reading --ca-file: %w", err)
		}
		roots := x509.NewCertPool()
		if !roots.AppendCertsFromPEM(pemData) {
			return nil, fmt.Errorf("--ca-file %s holds no PEM certificate", l.CAFile)
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	}
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}, nil
}

func (l OIDCLogin) cacheFile() string {
	h := sha256.Sum256([]byte(l.Issuer + "\x00" + l.ClientID + "\x00" + strings.Join(l.Scopes, " ")))
	return filepath.Join(l.CacheDir, hex.EncodeToString(h[:8])+".token")
}

type callback struct {
	code string
	err  error
}

// signIn runs the flow: a loopback listener, the URL for the browser,
// the code checked against the state and exchanged with the verifier.
func (l OIDCLogin) signIn(ctx context.Context, provider *oidc.Provider, verifier *oidc.IDTokenVerifier, prompt io.Writer) (string, *oidc.IDToken, error) {
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", l.Listen)
	if err != nil {
		return "", nil, fmt.Errorf("listening on %s for the provider's redirect (choose another with --listen; the provider must allow http://ADDRESS/callback): %w", l.Listen, err)
	}
	redirect := "http://" + ln.Addr().String() + "/callback"
	cfg := oauth2.Config{
		ClientID: l.ClientID, ClientSecret: l.ClientSecret, RedirectURL: redirect,
		Endpoint: provider.Endpoint(), Scopes: append([]string{oidc.ScopeOpenID}, l.Scopes...),
	}
	pkce, state, nonce := oauth2.GenerateVerifier(), oauth2.GenerateVerifier(), oauth2.GenerateVerifier()
	done := make(chan callback, 1)
	mux := http.NewServeMux()
	mux.HandleFunc("/callback", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		var cb callback
		switch {
		case q.Get("state") != state:
			// Not an answer to this sign-in (another tab, or a page
			// trying to log the user in as someone else): ignored.
			http.Error(w, "this sign-in was not started here", http.StatusBadRequest)
			return
		case q.Get("error") != "":
			cb.err = fmt.Errorf("the provider refused the sign-in: %s: %s", q.Get("error"), q.Get("error_description"))
		default:
			cb.code = q.Get("code")
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		msg := "Signed in. You can close this window."
		if cb.err != nil {
			msg = cb.err.Error()
		}
		_, _ = fmt.Fprintf(w, "<!doctype html><title>apiary</title><p>%s</p>", html.EscapeString(msg))
		select {
		case done <- cb:
		default:
		}
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer func() { _ = srv.Close() }()

	authURL := cfg.AuthCodeURL(state, oauth2.S256ChallengeOption(pkce), oidc.Nonce(nonce))
	fmt.Fprintf(prompt, "Open this address in your browser to sign in to %s:\n\n  %s\n\n", l.Issuer, authURL)
	timeout := l.Timeout
	if timeout == 0 {
		timeout = 5 * time.Minute
	}
	var cb callback
	select {
	case cb = <-done:
	case <-time.After(timeout):
		return "", nil, fmt.Errorf("no sign-in came back to %s within %s", redirect, timeout)
	case <-ctx.Done():
		return "", nil, ctx.Err()
	}
	if cb.err != nil {
		return "", nil, cb.err
	}
	tok, err := cfg.Exchange(ctx, cb.code, oauth2.VerifierOption(pkce))
	if err != nil {
		return "", nil, fmt.Errorf("exchanging the code at the provider: %w", err)
	}
	raw, _ := tok.Extra("id_token").(string)
	if raw == "" {
		return "", nil, errors.New("the provider's answer holds no ID token")
	}
	idt, err := verifier.Verify(ctx, raw)
	if err != nil {
		return "", nil, fmt.Errorf("the provider's ID token does not verify: %w", err)
	}
	if idt.Nonce != nonce {
		return "", nil, errors.New("the provider's ID token is not for this sign-in (nonce)")
	}
	return raw, idt, nil
}

// DefaultOIDCListen is the loopback address of the redirect, as
// kubelogin's default port: providers register http://127.0.0.1:8000/callback.
const DefaultOIDCListen = "127.0.0.1:8000"

// NewOIDCLoginCommand returns "apiary oidc-login", the exec credential
// plugin of kubeconfigs written by "apiary kubeconfig --oidc".
func NewOIDCLoginCommand() *cobra.Command {
	l := OIDCLogin{}
	cmd := &cobra.Command{
		Use:   "oidc-login --issuer URL --client-id ID",
		Short: "Sign in to an OpenID provider and print the ID token for kubectl (exec credential plugin)",
		Long: `Sign in to an OpenID provider and print an ExecCredential with the ID token,
for a kubeconfig's exec credential plugin (client.authentication.k8s.io/v1):
"apiary kubeconfig NAME --oidc" writes kubeconfigs that call it.

It runs the authorization-code flow with PKCE: it prints an address to open
in a browser, where you sign in at the provider, which redirects back to
http://--listen/callback (the provider must allow that redirect URI for the
client). The ID token is verified (issuer, audience, signature, expiry) and
cached in --cache-dir until 30 s before it expires; later calls print it
without a sign-in. Delete the cache directory to sign out.

The tenant API accepts the token when its spec.authentication names the
issuer and an audience equal to --client-id; its RBAC decides what the
mapped user and groups may do.`,
		Example: `  # What "apiary kubeconfig dev --oidc" writes into the kubeconfig
  apiary oidc-login --issuer https://login.example.com --client-id kubernetes

  # Check who you are in the tenant
  kubectl --kubeconfig dev-oidc.kubeconfig auth whoami`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if l.Issuer == "" || l.ClientID == "" {
				return errors.New("--issuer and --client-id are required: the provider's issuer URL and the client ID the tenant accepts as audience")
			}
			if l.CacheDir == "" {
				dir, err := os.UserCacheDir()
				if err != nil {
					return fmt.Errorf("no --cache-dir and no user cache directory: %w", err)
				}
				l.CacheDir = filepath.Join(dir, "apiary", "oidc")
			}
			cred, err := l.Credential(cmd.Context(), cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			return json.NewEncoder(cmd.OutOrStdout()).Encode(cred)
		},
	}
	f := cmd.Flags()
	f.StringVar(&l.Issuer, "issuer", "", "issuer URL of the OpenID provider (as in the tenant's spec.authentication.jwt[].issuer.url)")
	f.StringVar(&l.ClientID, "client-id", "", "client ID registered at the provider; the tenant must accept it as an audience")
	f.StringVar(&l.ClientSecret, "client-secret", "", "client secret, for a provider that registers the CLI as a confidential client (PKCE needs none)")
	f.StringVar(&l.Listen, "listen", DefaultOIDCListen, "loopback address the provider redirects to (http://ADDRESS/callback)")
	f.StringVar(&l.CAFile, "ca-file", "", "PEM certificates that verify the provider's TLS (default: the system roots)")
	f.StringSliceVar(&l.Scopes, "scopes", []string{"email", "groups"}, "scopes to ask for besides openid (the claims the tenant maps must be in the ID token)")
	f.StringVar(&l.CacheDir, "cache-dir", "", "where tokens are kept (default: the user cache directory's apiary/oidc)")
	f.DurationVar(&l.Timeout, "timeout", 5*time.Minute, "how long to wait for the browser to come back")
	return cmd
}
