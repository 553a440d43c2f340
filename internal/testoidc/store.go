package testoidc

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/zitadel/oidc/v3/pkg/oidc"
	"github.com/zitadel/oidc/v3/pkg/op"
)

// store is op.Storage in memory: users, clients, authorization requests
// and access tokens. Refresh tokens, JWT profile grants and token
// exchange are not offered (no client registers their grant types).
type store struct {
	users   map[string]User // by username
	clients map[string]*client
	key     *rsa.PrivateKey
	keyID   string

	mu       sync.Mutex
	requests map[string]*authRequest
	codes    map[string]string // code → request ID
	tokens   map[string]accessToken
}

type accessToken struct {
	subject, clientID string
	scopes            []string
	expires           time.Time
}

var errNotFound = errors.New("not found")

func randomID() string { return rand.Text() }

func (s *store) userBySubject(sub string) (User, bool) {
	for _, u := range s.users {
		if u.Subject == sub {
			return u, true
		}
	}
	return User{}, false
}

func (s *store) CreateAuthRequest(_ context.Context, req *oidc.AuthRequest, _ string) (op.AuthRequest, error) {
	r := &authRequest{
		id: randomID(), clientID: req.ClientID, redirectURI: req.RedirectURI, scopes: req.Scopes,
		state: req.State, nonce: req.Nonce, responseType: req.ResponseType, responseMode: req.ResponseMode,
	}
	if req.CodeChallenge != "" {
		r.challenge = &oidc.CodeChallenge{Challenge: req.CodeChallenge, Method: req.CodeChallengeMethod}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requests[r.id] = r
	return r, nil
}

func (s *store) AuthRequestByID(_ context.Context, id string) (op.AuthRequest, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r, ok := s.requests[id]; ok {
		return r, nil
	}
	return nil, fmt.Errorf("authorization request %q: %w", id, errNotFound)
}

func (s *store) AuthRequestByCode(ctx context.Context, code string) (op.AuthRequest, error) {
	s.mu.Lock()
	id, ok := s.codes[code]
	s.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("authorization code: %w", errNotFound)
	}
	return s.AuthRequestByID(ctx, id)
}

func (s *store) SaveAuthCode(_ context.Context, id, code string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.codes[code] = id
	return nil
}

func (s *store) DeleteAuthRequest(_ context.Context, id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.requests, id)
	for code, rid := range s.codes {
		if rid == id {
			delete(s.codes, code)
		}
	}
	return nil
}

// complete marks a request signed in by the user.
func (s *store) complete(id string, u User) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.requests[id]
	if !ok {
		return fmt.Errorf("authorization request %q: %w", id, errNotFound)
	}
	r.subject, r.authTime, r.done = u.Subject, time.Now(), true
	return nil
}

func (s *store) CreateAccessToken(_ context.Context, req op.TokenRequest) (string, time.Time, error) {
	clientID := ""
	if r, ok := req.(*authRequest); ok {
		clientID = r.clientID
	}
	id, expires := randomID(), time.Now().Add(5*time.Minute)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tokens[id] = accessToken{subject: req.GetSubject(), clientID: clientID, scopes: req.GetScopes(), expires: expires}
	return id, expires, nil
}

func (s *store) CreateAccessAndRefreshTokens(context.Context, op.TokenRequest, string) (string, string, time.Time, error) {
	return "", "", time.Time{}, errors.New("refresh tokens are not offered")
}

func (s *store) TokenRequestByRefreshToken(context.Context, string) (op.RefreshTokenRequest, error) {
	return nil, op.ErrInvalidRefreshToken
}

func (s *store) TerminateSession(context.Context, string, string) error { return nil }

func (s *store) RevokeToken(_ context.Context, tokenOrID, _, _ string) *oidc.Error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.tokens, tokenOrID)
	return nil
}

func (s *store) GetRefreshTokenInfo(context.Context, string, string) (string, string, error) {
	return "", "", op.ErrInvalidRefreshToken
}

type signingKey struct {
	id  string
	key *rsa.PrivateKey
}

func (k signingKey) SignatureAlgorithm() jose.SignatureAlgorithm { return jose.RS256 }
func (k signingKey) Key() any                                    { return k.key }
func (k signingKey) ID() string                                  { return k.id }

type publicKey struct {
	id  string
	key *rsa.PublicKey
}

func (k publicKey) ID() string                         { return k.id }
func (k publicKey) Algorithm() jose.SignatureAlgorithm { return jose.RS256 }
func (k publicKey) Use() string                        { return "sig" }
func (k publicKey) Key() any                           { return k.key }

func (s *store) SigningKey(context.Context) (op.SigningKey, error) {
	return signingKey{s.keyID, s.key}, nil
}

func (s *store) SignatureAlgorithms(context.Context) ([]jose.SignatureAlgorithm, error) {
	return []jose.SignatureAlgorithm{jose.RS256}, nil
}

func (s *store) KeySet(context.Context) ([]op.Key, error) {
	return []op.Key{publicKey{s.keyID, &s.key.PublicKey}}, nil
}

func (s *store) GetClientByClientID(_ context.Context, id string) (op.Client, error) {
	if c, ok := s.clients[id]; ok {
		return c, nil
	}
	return nil, fmt.Errorf("client %q: %w", id, errNotFound)
}

func (s *store) AuthorizeClientIDSecret(_ context.Context, id, secret string) error {
	c, ok := s.clients[id]
	if !ok || c.cfg.Secret == "" || !constantTimeEqual(c.cfg.Secret, secret) {
		return errors.New("invalid client credentials")
	}
	return nil
}

// setUserinfo fills what the scopes ask of the user: openid the
// subject, profile the username, email the address, groups the groups.
func (s *store) setUserinfo(info *oidc.UserInfo, subject string, scopes []string) error {
	u, ok := s.userBySubject(subject)
	if !ok {
		return fmt.Errorf("user %q: %w", subject, errNotFound)
	}
	for _, sc := range scopes {
		switch sc {
		case oidc.ScopeOpenID:
			info.Subject = u.Subject
		case oidc.ScopeProfile:
			info.PreferredUsername, info.Name = u.Username, u.Username
		case oidc.ScopeEmail:
			info.Email, info.EmailVerified = u.Email, oidc.Bool(u.Email != "")
		case ScopeGroups:
			info.AppendClaims("groups", slices.Clone(u.Groups))
		}
	}
	return nil
}

func (s *store) SetUserinfoFromScopes(_ context.Context, info *oidc.UserInfo, subject, _ string, scopes []string) error {
	return s.setUserinfo(info, subject, scopes)
}

func (s *store) SetUserinfoFromToken(_ context.Context, info *oidc.UserInfo, tokenID, _, _ string) error {
	s.mu.Lock()
	t, ok := s.tokens[tokenID]
	s.mu.Unlock()
	if !ok || time.Now().After(t.expires) {
		return errors.New("access token expired or unknown")
	}
	return s.setUserinfo(info, t.subject, t.scopes)
}

func (s *store) SetIntrospectionFromToken(_ context.Context, resp *oidc.IntrospectionResponse, tokenID, _, clientID string) error {
	s.mu.Lock()
	t, ok := s.tokens[tokenID]
	s.mu.Unlock()
	if !ok || time.Now().After(t.expires) || t.clientID != clientID {
		return errors.New("access token expired or unknown")
	}
	var info oidc.UserInfo
	if err := s.setUserinfo(&info, t.subject, t.scopes); err != nil {
		return err
	}
	resp.SetUserInfo(&info)
	resp.Active, resp.ClientID, resp.Scope, resp.Expiration = true, t.clientID, t.scopes, oidc.FromTime(t.expires)
	return nil
}

func (s *store) GetPrivateClaimsFromScopes(context.Context, string, string, []string) (map[string]any, error) {
	return nil, nil
}

func (s *store) GetKeyByIDAndClientID(context.Context, string, string) (*jose.JSONWebKey, error) {
	return nil, errors.New("JWT profile grants are not offered")
}

func (s *store) ValidateJWTProfileScopes(context.Context, string, []string) ([]string, error) {
	return nil, errors.New("JWT profile grants are not offered")
}

func (s *store) Health(context.Context) error { return nil }

// authRequest is op.AuthRequest.
type authRequest struct {
	id, clientID, redirectURI, state, nonce string
	scopes                                  []string
	responseType                            oidc.ResponseType
	responseMode                            oidc.ResponseMode
	challenge                               *oidc.CodeChallenge
	subject                                 string
	authTime                                time.Time
	done                                    bool
}

func (r *authRequest) GetID() string                         { return r.id }
func (r *authRequest) GetACR() string                        { return "" }
func (r *authRequest) GetAMR() []string                      { return []string{"pwd"} }
func (r *authRequest) GetAudience() []string                 { return []string{r.clientID} }
func (r *authRequest) GetAuthTime() time.Time                { return r.authTime }
func (r *authRequest) GetClientID() string                   { return r.clientID }
func (r *authRequest) GetCodeChallenge() *oidc.CodeChallenge { return r.challenge }
func (r *authRequest) GetNonce() string                      { return r.nonce }
func (r *authRequest) GetRedirectURI() string                { return r.redirectURI }
func (r *authRequest) GetResponseType() oidc.ResponseType    { return r.responseType }
func (r *authRequest) GetResponseMode() oidc.ResponseMode    { return r.responseMode }
func (r *authRequest) GetScopes() []string                   { return r.scopes }
func (r *authRequest) GetState() string                      { return r.state }
func (r *authRequest) GetSubject() string                    { return r.subject }
func (r *authRequest) Done() bool                            { return r.done }

// client is op.Client.
type client struct {
	cfg             Client
	idTokenLifetime time.Duration
}

func (c *client) GetID() string                    { return c.cfg.ID }
func (c *client) RedirectURIs() []string           { return c.cfg.RedirectURIs }
func (c *client) PostLogoutRedirectURIs() []string { return c.cfg.PostLogoutRedirectURIs }
func (c *client) ApplicationType() op.ApplicationType {
	if c.cfg.Secret == "" {
		return op.ApplicationTypeNative
	}
	return op.ApplicationTypeWeb
}

func (c *client) AuthMethod() oidc.AuthMethod {
	if c.cfg.Secret == "" {
		return oidc.AuthMethodNone
	}
	return oidc.AuthMethodBasic
}
func (c *client) ResponseTypes() []oidc.ResponseType {
	return []oidc.ResponseType{oidc.ResponseTypeCode}
}
func (c *client) GrantTypes() []oidc.GrantType {
	return []oidc.GrantType{oidc.GrantTypeCode}
}
func (c *client) LoginURL(id string) string           { return loginPath + "?" + authRequestParam + "=" + id }
func (c *client) AccessTokenType() op.AccessTokenType { return op.AccessTokenTypeBearer }
func (c *client) IDTokenLifetime() time.Duration      { return c.idTokenLifetime }

// DevMode allows plain-HTTP redirect URIs (a dashboard on 127.0.0.1 in a
// test): this provider serves tests only.
func (c *client) DevMode() bool { return true }
func (c *client) RestrictAdditionalIdTokenScopes() func([]string) []string {
	return func(s []string) []string { return s }
}
func (c *client) RestrictAdditionalAccessTokenScopes() func([]string) []string {
	return func(s []string) []string { return s }
}
func (c *client) IsScopeAllowed(scope string) bool     { return scope == ScopeGroups }
func (c *client) IDTokenUserinfoClaimsAssertion() bool { return true }
func (c *client) ClockSkew() time.Duration             { return 0 }
