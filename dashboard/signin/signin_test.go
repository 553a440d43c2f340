package signin

import (
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/apiaryhq/apiary/dashboard/session"
	"github.com/apiaryhq/apiary/internal/testoidc"
)

type rig struct {
	dash, prov *httptest.Server
	browser    *http.Client // the user's browser: cookies, no redirects followed
	t          *testing.T
}

// newRig serves a real OpenID provider and a dashboard whose pages show
// the signed-in user, both over TLS (the cookies are Secure).
func newRig(t *testing.T) *rig {
	prov := httptest.NewUnstartedServer(nil)
	prov.StartTLS()
	t.Cleanup(prov.Close)
	dash := httptest.NewUnstartedServer(nil)
	dash.StartTLS()
	t.Cleanup(dash.Close)
	p, err := testoidc.New(testoidc.Config{
		Issuer:  prov.URL,
		Clients: []testoidc.Client{{ID: "dashboard", Secret: "s3cret", RedirectURIs: []string{dash.URL + CallbackPath}}},
		Users: []testoidc.User{
			{Username: "alice", Password: "alice-pw", Email: "alice@example.test", Groups: []string{"team-a", "devs"}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	prov.Config.Handler = p
	sessions, err := session.NewStore([]byte(strings.Repeat("h", 32)), []byte(strings.Repeat("b", 32)), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	h, err := New(t.Context(), Config{
		Issuer: prov.URL, ClientID: "dashboard", ClientSecret: "s3cret", RedirectURL: dash.URL + CallbackPath,
		Scopes: []string{"email", testoidc.ScopeGroups}, UsernamePrefix: "oidc:", GroupsPrefix: "oidc:",
		HTTPClient: prov.Client(),
	}, sessions)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle(LoginPath, h)
	mux.Handle(CallbackPath, h)
	mux.Handle(LogoutPath, h)
	mux.Handle(LoggedOutPath, h)
	mux.Handle("/", h.Require(func(w http.ResponseWriter, r *http.Request, s session.Session) {
		_, _ = fmt.Fprintf(w, "%s %s %v", r.Method, s.User, s.Groups)
	}))
	dash.Config.Handler = mux
	jar, _ := cookiejar.New(nil)
	browser := &http.Client{Jar: jar, Transport: dash.Client().Transport,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	return &rig{dash: dash, prov: prov, browser: browser, t: t}
}

func (r *rig) do(method, path string, header http.Header) (int, string, string) {
	r.t.Helper()
	u := path
	if strings.HasPrefix(path, "/") {
		u = r.dash.URL + path
	}
	req, _ := http.NewRequestWithContext(r.t.Context(), method, u, nil)
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := r.browser.Do(req)
	if err != nil {
		r.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("Location"), string(b)
}

// signIn goes from the login page through the provider's form and
// returns the provider's answer, not yet taken to the callback.
func (r *rig) signIn(ret string) *url.URL {
	r.t.Helper()
	code, authURL, _ := r.do(http.MethodGet, LoginPath+"?return="+url.QueryEscape(ret), nil)
	if code != http.StatusFound || !strings.HasPrefix(authURL, r.prov.URL) {
		r.t.Fatalf("login: %d to %q, want a redirect to the provider", code, authURL)
	}
	back, err := testoidc.Browse(r.t.Context(), r.prov.Client(), authURL, r.dash.URL+CallbackPath, "alice", "alice-pw")
	if err != nil {
		r.t.Fatal(err)
	}
	return back
}

// A user signs in through the provider's form and is who the ID token
// says, with the configured prefixes; unauthenticated requests see only
// the login page; every action needs the session's CSRF token; logout
// ends the session.
func TestSignIn(t *testing.T) {
	r := newRig(t)
	if code, loc, _ := r.do(http.MethodGet, "/tenants/a", nil); code != http.StatusFound || loc != LoginPath+"?return=%2Ftenants%2Fa" {
		t.Errorf("a page without a session: %d to %q, want the login page", code, loc)
	}
	if code, _, _ := r.do(http.MethodGet, "/api/tenants", nil); code != http.StatusUnauthorized {
		t.Errorf("an API call without a session: %d, want 401", code)
	}

	back := r.signIn("/tenants/a")
	if code, loc, body := r.do(http.MethodGet, back.String(), nil); code != http.StatusFound || loc != "/tenants/a" {
		t.Fatalf("callback: %d to %q: %s", code, loc, body)
	}
	if code, _, body := r.do(http.MethodGet, "/tenants/a", nil); code != http.StatusOK || body != "GET oidc:alice@example.test [oidc:team-a oidc:devs]" {
		t.Errorf("signed in: %d %q", code, body)
	}
	// The provider's answer is used once.
	if code, _, _ := r.do(http.MethodGet, back.String(), nil); code != http.StatusUnauthorized {
		t.Errorf("the same answer again: %d, want 401", code)
	}

	// Actions need the CSRF token the page got; the cookie alone, which
	// another site can make the browser send, is not enough.
	if code, _, _ := r.do(http.MethodPost, "/api/tenants/a/scale", nil); code != http.StatusForbidden {
		t.Errorf("an action without the CSRF token: %d, want 403", code)
	}
	sess := r.session()
	if code, _, body := r.do(http.MethodPost, "/api/tenants/a/scale", http.Header{session.CSRFHeader: {sess.CSRF}}); code != http.StatusOK {
		t.Errorf("an action with the CSRF token: %d %s", code, body)
	}

	// Logout needs the token too, then the session is gone.
	if code, _, _ := r.do(http.MethodPost, LogoutPath, nil); code != http.StatusForbidden {
		t.Errorf("logout without the CSRF token: %d, want 403", code)
	}
	if code, loc, _ := r.do(http.MethodPost, LogoutPath, http.Header{session.CSRFHeader: {sess.CSRF}}); code != http.StatusSeeOther || loc != LoggedOutPath {
		t.Errorf("logout: %d to %q, want %s", code, loc, LoggedOutPath)
	}
	if code, _, body := r.do(http.MethodGet, LoggedOutPath, nil); code != http.StatusOK || !strings.Contains(body, LoginPath) {
		t.Errorf("the signed-out page: %d %q, want a link to %s", code, body, LoginPath)
	}
	if code, _, _ := r.do(http.MethodGet, "/tenants/a", nil); code != http.StatusFound {
		t.Errorf("after logout: %d, want the login page", code)
	}
}

// session decodes the browser's session cookie with a request the
// dashboard would see.
func (r *rig) session() session.Session {
	r.t.Helper()
	u, _ := url.Parse(r.dash.URL)
	req := httptest.NewRequest(http.MethodGet, "/", nil)
	for _, c := range r.browser.Jar.Cookies(u) {
		req.AddCookie(c)
	}
	sessions, _ := session.NewStore([]byte(strings.Repeat("h", 32)), []byte(strings.Repeat("b", 32)), time.Hour)
	s, err := sessions.Read(req)
	if err != nil {
		r.t.Fatal(err)
	}
	return s
}

// An answer of the provider that this browser did not ask for (another
// browser's, or with a changed state) signs nobody in.
func TestSignInRefusesForeignAnswers(t *testing.T) {
	r := newRig(t)
	back := r.signIn("/")

	// Another browser, without this one's sign-in cookie.
	other := newRig(t)
	other.dash, other.prov = r.dash, r.prov
	if code, _, _ := other.do(http.MethodGet, back.String(), nil); code != http.StatusUnauthorized {
		t.Errorf("another browser's answer: %d, want 401", code)
	}
	// This browser, the state changed.
	q := back.Query()
	q.Set("state", "someone-elses")
	changed := *back
	changed.RawQuery = q.Encode()
	if code, _, body := r.do(http.MethodGet, changed.String(), nil); code != http.StatusUnauthorized || !strings.Contains(body, "state") {
		t.Errorf("a changed state: %d %s", code, body)
	}
	if code, _, _ := r.do(http.MethodGet, "/", nil); code != http.StatusFound {
		t.Errorf("after refused answers: %d, want no session", code)
	}
}

// The return address stays on the dashboard.
func TestLocalPath(t *testing.T) {
	for in, want := range map[string]string{
		"/tenants/a?x=1":        "/tenants/a?x=1",
		"":                      "/",
		"https://evil.example/": "/",
		"//evil.example/":       "/",
		"/\\evil.example":       "/",
		"javascript:alert(1)":   "/",
		"tenants":               "/",
	} {
		if got := localPath(in); got != want {
			t.Errorf("localPath(%q) = %q, want %q", in, got, want)
		}
	}
}
