// Package signin signs dashboard users in through an OpenID provider:
// the authorization-code flow with PKCE, state and nonce, the ID token
// verified by go-oidc, and a session cookie holding the user and groups
// that the dashboard's API calls impersonate.
package signin

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/coreos/go-oidc/v3/oidc"
	"golang.org/x/oauth2"

	"github.com/apiaryhq/apiary/dashboard/session"
)

// Paths the handler serves.
const (
	LoginPath    = "/login"
	CallbackPath = "/callback"
	LogoutPath   = "/logout"
	// LoggedOutPath is where logout lands: a page of the dashboard's own,
	// because browsers hold a form's redirects to the page's
	// form-action CSP, so a redirect on to the provider would be blocked.
	LoggedOutPath = "/logged-out"
)

// Config names the provider and how its claims become a user.
type Config struct {
	Issuer       string
	ClientID     string
	ClientSecret string
	// RedirectURL is the dashboard's own URL + CallbackPath, registered
	// at the provider.
	RedirectURL string
	// Scopes beyond openid; defaults to email and groups.
	Scopes []string
	// UsernameClaim defaults to email; GroupsClaim to groups. The
	// prefixes keep the provider's names apart from the cluster's own
	// (as kube-apiserver's claim mappings do).
	UsernameClaim  string
	UsernamePrefix string
	GroupsClaim    string
	GroupsPrefix   string
	// HTTPClient reaches the provider (its CA); nil is http.DefaultClient.
	HTTPClient *http.Client
}

// Handler serves LoginPath, CallbackPath and LogoutPath.
type Handler struct {
	cfg      Config
	oauth    oauth2.Config
	verifier *oidc.IDTokenVerifier
	sessions *session.Store
}

// New discovers the provider.
func New(ctx context.Context, cfg Config, sessions *session.Store) (*Handler, error) {
	if cfg.Issuer == "" || cfg.ClientID == "" || cfg.RedirectURL == "" {
		return nil, errors.New("sign-in: the issuer, client ID and redirect URL are required")
	}
	if cfg.UsernameClaim == "" {
		cfg.UsernameClaim = "email"
	}
	if cfg.GroupsClaim == "" {
		cfg.GroupsClaim = "groups"
	}
	if cfg.Scopes == nil {
		cfg.Scopes = []string{"email", "groups"}
	}
	provider, err := oidc.NewProvider(cfg.context(ctx), cfg.Issuer)
	if err != nil {
		return nil, fmt.Errorf("sign-in: discovering %s: %w", cfg.Issuer, err)
	}
	return &Handler{
		cfg: cfg,
		oauth: oauth2.Config{
			ClientID: cfg.ClientID, ClientSecret: cfg.ClientSecret, RedirectURL: cfg.RedirectURL,
			Endpoint: provider.Endpoint(), Scopes: append([]string{oidc.ScopeOpenID}, cfg.Scopes...),
		},
		verifier: provider.Verifier(&oidc.Config{ClientID: cfg.ClientID}),
		sessions: sessions,
	}, nil
}

func (c Config) context(ctx context.Context) context.Context {
	if c.HTTPClient == nil {
		return ctx
	}
	return oidc.ClientContext(ctx, c.HTTPClient)
}

// ServeHTTP routes the three paths.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case LoginPath:
		h.login(w, r)
	case CallbackPath:
		h.callback(w, r)
	case LogoutPath:
		h.logout(w, r)
	case LoggedOutPath:
		loggedOut(w)
	default:
		http.NotFound(w, r)
	}
}

// login sends the browser to the provider.
func (h *Handler) login(w http.ResponseWriter, r *http.Request) {
	f := session.Flow{
		State: oauth2.GenerateVerifier(), Nonce: oauth2.GenerateVerifier(), Verifier: oauth2.GenerateVerifier(),
		Return: localPath(r.URL.Query().Get("return")),
	}
	if err := h.sessions.WriteFlow(w, f); err != nil {
		http.Error(w, "cannot start the sign-in", http.StatusInternalServerError)
		return
	}
	http.Redirect(w, r, h.oauth.AuthCodeURL(f.State, oauth2.S256ChallengeOption(f.Verifier), oidc.Nonce(f.Nonce)), http.StatusFound)
}

// localPath keeps a return address on this dashboard: an absolute or
// scheme-relative URL would make the sign-in an open redirect.
func localPath(p string) string {
	if !strings.HasPrefix(p, "/") || strings.HasPrefix(p, "//") || strings.HasPrefix(p, "/\\") {
		return "/"
	}
	if u, err := url.Parse(p); err != nil || u.Host != "" || u.Scheme != "" {
		return "/"
	}
	return p
}

// callback takes the provider's answer.
func (h *Handler) callback(w http.ResponseWriter, r *http.Request) {
	f, err := h.sessions.TakeFlow(w, r)
	q := r.URL.Query()
	switch {
	case err != nil:
		h.refuse(w, "this sign-in was not started in this browser, or took over 10 minutes: "+err.Error())
		return
	case q.Get("state") != f.State:
		h.refuse(w, "this answer is not for the sign-in this browser started (state)")
		return
	case q.Get("error") != "":
		h.refuse(w, fmt.Sprintf("the provider refused the sign-in: %s: %s", q.Get("error"), q.Get("error_description")))
		return
	}
	ctx := h.cfg.context(r.Context())
	tok, err := h.oauth.Exchange(ctx, q.Get("code"), oauth2.VerifierOption(f.Verifier))
	if err != nil {
		h.refuse(w, "exchanging the code at the provider failed")
		return
	}
	raw, _ := tok.Extra("id_token").(string)
	idt, err := h.verifier.Verify(ctx, raw)
	if err != nil {
		h.refuse(w, "the provider's ID token does not verify: "+err.Error())
		return
	}
	if idt.Nonce != f.Nonce {
		h.refuse(w, "the ID token is not for this sign-in (nonce)")
		return
	}
	user, groups, err := h.identity(idt)
	if err != nil {
		h.refuse(w, err.Error())
		return
	}
	sess, err := h.sessions.New(user, groups)
	if err == nil {
		err = h.sessions.Write(w, sess)
	}
	if err != nil {
		http.Error(w, "cannot start the session", http.StatusInternalServerError)
		return
	}
	http.Redirect(w, r, f.Return, http.StatusFound)
}

// identity maps the ID token's claims to the user and groups the
// dashboard impersonates.
func (h *Handler) identity(idt *oidc.IDToken) (string, []string, error) {
	var claims map[string]any
	if err := idt.Claims(&claims); err != nil {
		return "", nil, fmt.Errorf("the ID token's claims: %w", err)
	}
	name, _ := claims[h.cfg.UsernameClaim].(string)
	if name == "" {
		return "", nil, fmt.Errorf("the ID token has no %q claim to name the user", h.cfg.UsernameClaim)
	}
	if h.cfg.UsernameClaim == "email" {
		// As kube-apiserver: an unverified address names nobody.
		if v, ok := claims["email_verified"].(bool); ok && !v {
			return "", nil, errors.New("the provider has not verified the user's email address")
		}
	}
	var groups []string
	switch g := claims[h.cfg.GroupsClaim].(type) {
	case string:
		groups = []string{h.cfg.GroupsPrefix + g}
	case []any:
		for _, v := range g {
			if s, ok := v.(string); ok && s != "" {
				groups = append(groups, h.cfg.GroupsPrefix+s)
			}
		}
	}
	return h.cfg.UsernamePrefix + name, groups, nil
}

// refuse answers a failed sign-in without a session; the page offers to
// start again.
func (h *Handler) refuse(w http.ResponseWriter, why string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(http.StatusUnauthorized)
	_, _ = fmt.Fprintf(w, "Sign-in failed: %s\nStart again at %s\n", why, LoginPath)
}

// logout ends the session: a POST with the session's CSRF token, so that
// another site cannot sign the user out.
func (h *Handler) logout(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "log out with POST", http.StatusMethodNotAllowed)
		return
	}
	sess, err := h.sessions.Read(r)
	if err == nil {
		err = sess.CheckCSRF(r)
	}
	if err != nil && !errors.Is(err, session.ErrExpired) && !errors.Is(err, session.ErrNoSession) {
		http.Error(w, err.Error(), http.StatusForbidden)
		return
	}
	h.sessions.Clear(w)
	http.Redirect(w, r, LoggedOutPath, http.StatusSeeOther)
}

// loggedOut says the session ended and links to a new sign-in. It holds
// nothing of any user, so it needs no session.
func loggedOut(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = fmt.Fprintf(w, `<!doctype html><html lang="en"><head><meta charset="utf-8"><title>Signed out · Apiary</title></head>
<body><main><h1 id="signed-out">You are signed out.</h1><p><a id="sign-in" href="%s">Sign in again</a></p></main></body></html>
`, LoginPath)
}

// Require serves next only with a valid session; any other request is
// sent to the login page (a page) or answered 401 (an API call), and sees
// nothing else.
func (h *Handler) Require(next func(http.ResponseWriter, *http.Request, session.Session)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sess, err := h.sessions.Read(r)
		if err != nil {
			if r.Method == http.MethodGet && !strings.HasPrefix(r.URL.Path, "/api/") {
				http.Redirect(w, r, LoginPath+"?return="+url.QueryEscape(r.URL.RequestURI()), http.StatusFound)
				return
			}
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			if err := sess.CheckCSRF(r); err != nil {
				http.Error(w, err.Error(), http.StatusForbidden)
				return
			}
		}
		next(w, r, sess)
	})
}
