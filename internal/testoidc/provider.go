// Package testoidc is a real OpenID Provider for tests: zitadel/oidc's op
// package (a certified OpenID Provider library) over an in-memory store,
// with a username and password form, users with groups, and clients.
// Tests sign in through it as a user would (a browser, or SignIn for a
// client without one) and hand its ID tokens to real API servers.
//
// It serves tests only: users and clients are fixed at start, nothing is
// persisted, and plain-HTTP redirect URIs are allowed.
package testoidc

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/subtle"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"strings"
	"time"

	"github.com/zitadel/oidc/v3/pkg/op"
	"golang.org/x/text/language"
)

// ScopeGroups asks for the user's groups in the "groups" claim.
const ScopeGroups = "groups"

const (
	loginPath        = "/login"
	authRequestParam = "authRequestID"
)

// User is someone who can sign in.
type User struct {
	// Subject is the "sub" claim; Username defaults it.
	Subject  string
	Username string
	Password string
	Email    string
	Groups   []string
}

// Client is a relying party.
type Client struct {
	ID string
	// Secret makes a confidential client (client_secret_basic); empty,
	// a public one that must use PKCE.
	Secret                 string
	RedirectURIs           []string
	PostLogoutRedirectURIs []string
}

// Config is what New needs.
type Config struct {
	// Issuer is the URL the provider is served at (its discovery
	// document is Issuer + "/.well-known/openid-configuration").
	Issuer  string
	Users   []User
	Clients []Client
	// IDTokenLifetime defaults to 10 minutes.
	IDTokenLifetime time.Duration
}

// Provider serves the OpenID Provider's endpoints and its login form.
type Provider struct {
	op    *op.Provider
	store *store
	mux   *http.ServeMux
}

// New builds a provider with a fresh RSA signing key.
func New(cfg Config) (*Provider, error) {
	if cfg.Issuer == "" {
		return nil, errors.New("testoidc: an issuer URL is required")
	}
	if cfg.IDTokenLifetime == 0 {
		cfg.IDTokenLifetime = 10 * time.Minute
	}
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, fmt.Errorf("testoidc: signing key: %w", err)
	}
	s := &store{users: map[string]User{}, clients: map[string]*client{}, key: key, keyID: randomID(),
		requests: map[string]*authRequest{}, codes: map[string]string{}, tokens: map[string]accessToken{}}
	for _, u := range cfg.Users {
		if u.Username == "" || u.Password == "" {
			return nil, errors.New("testoidc: a user needs a username and a password")
		}
		if u.Subject == "" {
			u.Subject = u.Username
		}
		s.users[u.Username] = u
	}
	for _, c := range cfg.Clients {
		if c.ID == "" || len(c.RedirectURIs) == 0 {
			return nil, errors.New("testoidc: a client needs an ID and a redirect URI")
		}
		s.clients[c.ID] = &client{cfg: c, idTokenLifetime: cfg.IDTokenLifetime}
	}
	var crypto [32]byte
	if _, err := rand.Read(crypto[:]); err != nil {
		return nil, err
	}
	opts := []op.Option{}
	if strings.HasPrefix(cfg.Issuer, "http://") {
		opts = append(opts, op.WithAllowInsecure())
	}
	provider, err := op.NewProvider(&op.Config{
		CryptoKey:          crypto,
		CodeMethodS256:     true,
		AuthMethodPost:     true,
		SupportedUILocales: []language.Tag{language.English},
		SupportedScopes:    []string{"openid", "profile", "email", ScopeGroups},
		SupportedClaims:    []string{"sub", "aud", "exp", "iat", "iss", "auth_time", "nonce", "email", "email_verified", "preferred_username", "name", "groups"},
	}, s, op.StaticIssuer(cfg.Issuer), opts...)
	if err != nil {
		return nil, fmt.Errorf("testoidc: %w", err)
	}
	p := &Provider{op: provider, store: s, mux: http.NewServeMux()}
	p.mux.HandleFunc(loginPath, p.login)
	p.mux.Handle("/", provider)
	return p, nil
}

// ServeHTTP serves the provider.
func (p *Provider) ServeHTTP(w http.ResponseWriter, r *http.Request) { p.mux.ServeHTTP(w, r) }

var loginPage = template.Must(template.New("login").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Sign in – test OpenID provider</title></head>
<body><main>
<h1>Sign in</h1>
{{if .Error}}<p role="alert" id="error">{{.Error}}</p>{{end}}
<form method="post" action="` + loginPath + `">
<input type="hidden" name="` + authRequestParam + `" value="{{.ID}}">
<label for="username">Username</label> <input id="username" name="username" autocomplete="username" required autofocus>
<label for="password">Password</label> <input id="password" name="password" type="password" autocomplete="current-password" required>
<button type="submit" id="submit">Sign in</button>
</form>
</main></body></html>
`))

// constantTimeEqual compares secrets (passwords, client secrets) without
// telling by its timing how much of them matched.
func constantTimeEqual(a, b string) bool {
	return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1
}

// login shows the form (GET) and checks it (POST); a user who signs in
// goes on to the authorization callback, which issues the code.
func (p *Provider) login(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Frame-Options", "DENY")
	switch r.Method {
	case http.MethodGet:
		id := r.URL.Query().Get(authRequestParam)
		if _, err := p.store.AuthRequestByID(r.Context(), id); err != nil {
			http.Error(w, "unknown or finished sign-in request", http.StatusBadRequest)
			return
		}
		_ = loginPage.Execute(w, map[string]string{"ID": id})
	case http.MethodPost:
		if err := r.ParseForm(); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		id := r.PostForm.Get(authRequestParam)
		u, ok := p.store.users[r.PostForm.Get("username")]
		if !ok || !constantTimeEqual(u.Password, r.PostForm.Get("password")) {
			w.WriteHeader(http.StatusUnauthorized)
			_ = loginPage.Execute(w, map[string]string{"ID": id, "Error": "Invalid username or password."})
			return
		}
		if err := p.store.complete(id, u); err != nil {
			http.Error(w, "unknown or finished sign-in request", http.StatusBadRequest)
			return
		}
		http.Redirect(w, r, op.AuthCallbackURL(p.op)(r.Context(), id), http.StatusFound)
	default:
		w.Header().Set("Allow", "GET, POST")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
	}
}
