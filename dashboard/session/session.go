// Package session keeps a dashboard user's sign-in in a cookie that the
// browser's scripts cannot read and nobody without the dashboard's keys
// can forge, alter or read: the user and groups in it are what every API
// call of the dashboard impersonates, so a cookie is as good as a login.
package session

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/gorilla/securecookie"
)

// CookieName is the session cookie's name.
const CookieName = "apiary-session"

// CSRFHeader carries a session's CSRF token on every action; CSRFField is
// the same token in a form.
const (
	CSRFHeader = "X-CSRF-Token"
	CSRFField  = "csrf"
)

// Errors Read returns, for the login page to tell apart.
var (
	ErrNoSession = errors.New("no session: sign in")
	ErrInvalid   = errors.New("session cookie not issued by this dashboard")
	ErrExpired   = errors.New("session expired: sign in again")
	ErrCSRF      = errors.New("missing or wrong CSRF token")
)

// Session is a signed-in user as the dashboard impersonates them.
type Session struct {
	User    string    `json:"u"`
	Groups  []string  `json:"g,omitempty"`
	Expires time.Time `json:"e"`
	// CSRF is a random token per session that every action echoes; a
	// page of another origin can make the browser send the cookie but
	// cannot read the token.
	CSRF string `json:"c"`
}

// Store encodes sessions into cookies and back.
type Store struct {
	codec *securecookie.SecureCookie
	ttl   time.Duration
	now   func() time.Time
}

// NewStore signs cookies with hashKey (HMAC-SHA256, at least 32 bytes)
// and encrypts them with blockKey (AES-256, exactly 32 bytes); sessions
// last ttl. Several dashboard replicas share the keys (a Secret).
func NewStore(hashKey, blockKey []byte, ttl time.Duration) (*Store, error) {
	if len(hashKey) < 32 {
		return nil, fmt.Errorf("session hash key: %d bytes, want at least 32", len(hashKey))
	}
	if len(blockKey) != 32 {
		return nil, fmt.Errorf("session block key: %d bytes, want 32 (AES-256)", len(blockKey))
	}
	if ttl <= 0 {
		return nil, fmt.Errorf("session lifetime %s: want more than 0", ttl)
	}
	codec := securecookie.New(hashKey, blockKey)
	codec.SetSerializer(securecookie.JSONEncoder{})
	// securecookie's own timestamp bounds a cookie too, a second line
	// behind Expires, a minute later so that an honest expired cookie is
	// told apart from a forged one.
	codec.MaxAge(int((ttl + time.Minute) / time.Second))
	return &Store{codec: codec, ttl: ttl, now: time.Now}, nil
}

// New starts a session for a user the identity provider vouched for.
func (s *Store) New(user string, groups []string) (Session, error) {
	token := make([]byte, 32)
	if _, err := rand.Read(token); err != nil {
		return Session{}, fmt.Errorf("session CSRF token: %w", err)
	}
	return Session{
		User:    user,
		Groups:  groups,
		Expires: s.now().Add(s.ttl).Truncate(time.Second),
		CSRF:    base64.RawURLEncoding.EncodeToString(token),
	}, nil
}

// Write sets the session cookie: HttpOnly (no script reads it), Secure
// (never sent in clear), SameSite=Lax (not sent with another site's
// form posts; a top-level navigation back from the identity provider
// still carries it).
func (s *Store) Write(w http.ResponseWriter, sess Session) error {
	value, err := s.codec.Encode(CookieName, sess)
	if err != nil {
		return fmt.Errorf("session cookie: %w", err)
	}
	http.SetCookie(w, s.cookie(value, sess.Expires))
	return nil
}

// Clear ends the session in the browser (logout).
func (s *Store) Clear(w http.ResponseWriter) {
	c := s.cookie("", time.Unix(0, 0))
	c.MaxAge = -1
	http.SetCookie(w, c)
}

func (s *Store) cookie(value string, expires time.Time) *http.Cookie {
	return &http.Cookie{
		Name:     CookieName,
		Value:    value,
		Path:     "/",
		Expires:  expires,
		HttpOnly: true,
		Secure:   true,
		SameSite: http.SameSiteLaxMode,
	}
}

// Read returns the request's session, or why there is none.
func (s *Store) Read(r *http.Request) (Session, error) {
	c, err := r.Cookie(CookieName)
	if err != nil || c.Value == "" {
		return Session{}, ErrNoSession
	}
	var sess Session
	if err := s.codec.Decode(CookieName, c.Value, &sess); err != nil {
		return Session{}, ErrInvalid
	}
	if sess.User == "" || sess.CSRF == "" {
		return Session{}, ErrInvalid
	}
	if !s.now().Before(sess.Expires) {
		return Session{}, ErrExpired
	}
	return sess, nil
}

// CheckCSRF refuses an action whose request does not echo the session's
// token (header or form field), compared in constant time.
func (sess Session) CheckCSRF(r *http.Request) error {
	got := r.Header.Get(CSRFHeader)
	if got == "" {
		got = r.PostFormValue(CSRFField)
	}
	if got == "" || subtle.ConstantTimeCompare([]byte(got), []byte(sess.CSRF)) != 1 {
		return ErrCSRF
	}
	return nil
}

// FlowCookieName holds a sign-in in progress, from the redirect to the
// identity provider to its answer.
const FlowCookieName = "apiary-signin"

// flowLifetime bounds how long a user may take at the provider's form.
const flowLifetime = 10 * time.Minute

// Flow is what the dashboard must recognise in the provider's answer:
// the state (this browser started it), the nonce (the ID token was
// minted for it) and the PKCE verifier (only this browser can exchange
// the code), and where to go afterwards.
type Flow struct {
	State    string    `json:"s"`
	Nonce    string    `json:"n"`
	Verifier string    `json:"v"`
	Return   string    `json:"r,omitempty"`
	Expires  time.Time `json:"e"`
}

// WriteFlow sets the sign-in cookie, sealed like a session. SameSite=Lax
// lets the provider's top-level redirect back carry it.
func (s *Store) WriteFlow(w http.ResponseWriter, f Flow) error {
	f.Expires = s.now().Add(flowLifetime).Truncate(time.Second)
	value, err := s.codec.Encode(FlowCookieName, f)
	if err != nil {
		return fmt.Errorf("sign-in cookie: %w", err)
	}
	c := s.cookie(value, f.Expires)
	c.Name = FlowCookieName
	http.SetCookie(w, c)
	return nil
}

// TakeFlow returns the sign-in in progress and clears its cookie: an
// answer of the provider is used once.
func (s *Store) TakeFlow(w http.ResponseWriter, r *http.Request) (Flow, error) {
	gone := s.cookie("", time.Unix(0, 0))
	gone.Name, gone.MaxAge = FlowCookieName, -1
	http.SetCookie(w, gone)
	c, err := r.Cookie(FlowCookieName)
	if err != nil || c.Value == "" {
		return Flow{}, ErrNoSession
	}
	var f Flow
	if err := s.codec.Decode(FlowCookieName, c.Value, &f); err != nil || f.State == "" {
		return Flow{}, ErrInvalid
	}
	if !s.now().Before(f.Expires) {
		return Flow{}, ErrExpired
	}
	return f, nil
}
