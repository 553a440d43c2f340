package session

import (
	"bytes"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"
)

func key(b byte) []byte { return bytes.Repeat([]byte{b}, 32) }

func store(t *testing.T) *Store {
	t.Helper()
	s, err := NewStore(key(1), key(2), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// written returns the cookie Write sets for sess.
func written(t *testing.T, s *Store, sess Session) *http.Cookie {
	t.Helper()
	rec := httptest.NewRecorder()
	if err := s.Write(rec, sess); err != nil {
		t.Fatal(err)
	}
	cs := rec.Result().Cookies()
	if len(cs) != 1 {
		t.Fatalf("%d cookies set, want 1", len(cs))
	}
	return cs[0]
}

func requestWith(c *http.Cookie) *http.Request {
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	if c != nil {
		r.AddCookie(c)
	}
	return r
}

func TestRoundTripAndAttributes(t *testing.T) {
	s := store(t)
	sess, err := s.New("alice@example.test", []string{"team-a"})
	if err != nil {
		t.Fatal(err)
	}
	c := written(t, s, sess)
	if !c.HttpOnly || !c.Secure || c.SameSite != http.SameSiteLaxMode || c.Path != "/" {
		t.Errorf("cookie attributes HttpOnly %v Secure %v SameSite %v Path %q", c.HttpOnly, c.Secure, c.SameSite, c.Path)
	}
	// Encrypted: the user's name is not readable in the cookie.
	if strings.Contains(c.Value, "alice") {
		t.Error("the cookie shows the user in clear")
	}
	got, err := s.Read(requestWith(c))
	if err != nil {
		t.Fatal(err)
	}
	if got.User != sess.User || len(got.Groups) != 1 || got.Groups[0] != "team-a" || got.CSRF != sess.CSRF || !got.Expires.Equal(sess.Expires) {
		t.Errorf("read %+v, wrote %+v", got, sess)
	}
}

func TestRefused(t *testing.T) {
	s := store(t)
	sess, _ := s.New("alice@example.test", nil)
	good := written(t, s, sess)

	other, _ := NewStore(key(3), key(2), time.Hour)
	otherKeys := written(t, other, sess)

	tampered := *good
	b := []byte(tampered.Value)
	b[len(b)/2] ^= 1
	tampered.Value = string(b)

	expired := sess
	expired.Expires = time.Now().Add(-time.Second)

	for _, tc := range []struct {
		name   string
		cookie *http.Cookie
		want   error
	}{
		{"no cookie", nil, ErrNoSession},
		{"signed with other keys", otherKeys, ErrInvalid},
		{"one bit changed", &tampered, ErrInvalid},
		{"forged in clear", &http.Cookie{Name: CookieName, Value: `{"u":"admin","e":"2099-01-01T00:00:00Z","c":"x"}`}, ErrInvalid},
		{"expired", written(t, s, expired), ErrExpired},
	} {
		if _, err := s.Read(requestWith(tc.cookie)); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}

	// Past its lifetime by the clock, an untouched cookie is expired too.
	s.now = func() time.Time { return time.Now().Add(2 * time.Hour) }
	if _, err := s.Read(requestWith(good)); !errors.Is(err, ErrExpired) {
		t.Errorf("an hour-long session read two hours later: %v, want %v", err, ErrExpired)
	}
}

func TestClear(t *testing.T) {
	rec := httptest.NewRecorder()
	store(t).Clear(rec)
	cs := rec.Result().Cookies()
	if len(cs) != 1 || cs[0].MaxAge >= 0 || cs[0].Value != "" {
		t.Fatalf("logout set %+v, want the cookie deleted", cs)
	}
}

func TestCheckCSRF(t *testing.T) {
	sess, _ := store(t).New("alice@example.test", nil)
	post := func(header, field string) *http.Request {
		r := httptest.NewRequest(http.MethodPost, "/scale", strings.NewReader(url.Values{CSRFField: {field}}.Encode()))
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		if header != "" {
			r.Header.Set(CSRFHeader, header)
		}
		return r
	}
	if err := sess.CheckCSRF(post(sess.CSRF, "")); err != nil {
		t.Errorf("header token: %v", err)
	}
	if err := sess.CheckCSRF(post("", sess.CSRF)); err != nil {
		t.Errorf("form token: %v", err)
	}
	other, _ := store(t).New("alice@example.test", nil)
	for name, r := range map[string]*http.Request{
		"none":                    post("", ""),
		"another session's token": post(other.CSRF, ""),
		"truncated":               post(sess.CSRF[:10], ""),
	} {
		if err := sess.CheckCSRF(r); !errors.Is(err, ErrCSRF) {
			t.Errorf("%s: %v, want %v", name, err, ErrCSRF)
		}
	}
}

func TestNewStoreRefusesWeakKeys(t *testing.T) {
	for _, tc := range []struct {
		hash, block []byte
		ttl         time.Duration
		want        string
	}{
		{key(1)[:16], key(2), time.Hour, "hash key: 16 bytes"},
		{key(1), key(2)[:16], time.Hour, "block key: 16 bytes"},
		{key(1), key(2), 0, "lifetime 0s"},
	} {
		if _, err := NewStore(tc.hash, tc.block, tc.ttl); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("NewStore: %v, want %q", err, tc.want)
		}
	}
}
