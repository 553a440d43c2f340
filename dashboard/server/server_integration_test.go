//go:build integration

package server

import (
	"bufio"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/apiaryhq/apiary/dashboard/asuser"
	"github.com/apiaryhq/apiary/dashboard/session"
	"github.com/apiaryhq/apiary/dashboard/signin"
	"github.com/apiaryhq/apiary/internal/dashtest"
	"github.com/apiaryhq/apiary/internal/testoidc"
)

// get fetches path with cookie (if any), without following redirects, and
// returns the status, Location and the first line of data (a stream's
// first event) or the body.
func get(t *testing.T, srv *httptest.Server, path string, cookie *http.Cookie) (int, string, string, http.Header) {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, srv.URL+path, nil)
	if cookie != nil {
		req.AddCookie(cookie)
	}
	hc := srv.Client()
	hc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.Header.Get("Content-Type") == "text/event-stream" {
		line := make(chan string, 1)
		go func() {
			sc := bufio.NewScanner(resp.Body)
			for sc.Scan() {
				if strings.HasPrefix(sc.Text(), "data: ") {
					line <- sc.Text()
					return
				}
			}
			line <- ""
		}()
		select {
		case l := <-line:
			return resp.StatusCode, "", l, resp.Header
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: no event within 10s", path)
		}
	}
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("Location"), string(b), resp.Header
}

// Signed in, the dashboard shows alice team-a's tenant and refuses team-b's
// stream; without a session it shows nothing but the way to the login
// page; run locally it acts with the given client's own rights.
func TestDashboardAsTheUserAndLocal(t *testing.T) {
	k := dashtest.Start(t)
	prov := httptest.NewUnstartedServer(nil)
	prov.StartTLS()
	defer prov.Close()
	p, err := testoidc.New(testoidc.Config{Issuer: prov.URL, Clients: []testoidc.Client{{ID: "dashboard", Secret: "s", RedirectURIs: []string{"https://dashboard.example/callback"}}}})
	if err != nil {
		t.Fatal(err)
	}
	prov.Config.Handler = p
	sessions, err := session.NewStore([]byte(strings.Repeat("h", 32)), []byte(strings.Repeat("b", 32)), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	sign, err := signin.New(t.Context(), signin.Config{Issuer: prov.URL, ClientID: "dashboard", ClientSecret: "s",
		RedirectURL: "https://dashboard.example/callback", HTTPClient: prov.Client()}, sessions)
	if err != nil {
		t.Fatal(err)
	}
	clients, err := asuser.New(k.Dashboard)
	if err != nil {
		t.Fatal(err)
	}
	h, err := New(Options{Clients: clients, SignIn: sign})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewTLSServer(h)
	defer srv.Close()

	for _, path := range []string{"/", "/assets/app.js"} {
		if code, loc, _, _ := get(t, srv, path, nil); code != http.StatusFound || !strings.HasPrefix(loc, signin.LoginPath) {
			t.Errorf("%s without a session: %d to %q, want the login page", path, code, loc)
		}
	}
	if code, _, _, _ := get(t, srv, "/api/tenants/stream?namespace=team-a", nil); code != http.StatusUnauthorized {
		t.Errorf("the stream without a session: %d, want 401", code)
	}

	alice, err := sessions.New(dashtest.Alice.User, dashtest.Alice.Groups)
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	if err := sessions.Write(rec, alice); err != nil {
		t.Fatal(err)
	}
	cookie := rec.Result().Cookies()[0]
	code, _, body, hdr := get(t, srv, "/", cookie)
	if code != http.StatusOK || !strings.Contains(body, "signed in as oidc:alice@example.test") || !strings.Contains(body, alice.CSRF) {
		t.Errorf("the overview for alice: %d %s", code, body)
	}
	if !strings.Contains(hdr.Get("Content-Security-Policy"), "default-src 'self'") || hdr.Get("X-Frame-Options") != "DENY" {
		t.Errorf("headers %v", hdr)
	}
	if code, _, body, _ := get(t, srv, "/assets/app.js", cookie); code != http.StatusOK || !strings.Contains(body, "EventSource") {
		t.Errorf("the script for alice: %d", code)
	}
	if code, _, data, _ := get(t, srv, "/api/tenants/stream?namespace=team-a", cookie); code != http.StatusOK || !strings.Contains(data, `"name":"a"`) {
		t.Errorf("alice's stream of team-a: %d %s", code, data)
	}
	if code, _, _, _ := get(t, srv, "/api/tenants/stream?namespace=team-b", cookie); code != http.StatusForbidden {
		t.Errorf("alice's stream of team-b: %d, want 403", code)
	}

	// Locally, with the user's own (here: admin) client and no sign-in.
	admin, err := client.NewWithWatch(k.AdminConfig, client.Options{Scheme: k.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	lh, err := New(Options{Local: admin})
	if err != nil {
		t.Fatal(err)
	}
	lsrv := httptest.NewServer(lh)
	defer lsrv.Close()
	if code, _, body, _ := get(t, lsrv, "/", nil); code != http.StatusOK || !strings.Contains(body, "local, with your kubeconfig") {
		t.Errorf("local overview: %d %s", code, body)
	}
	if code, _, data, _ := get(t, lsrv, "/api/tenants/stream?namespace=team-b", nil); code != http.StatusOK || !strings.Contains(data, `"name":"b"`) {
		t.Errorf("local stream of team-b: %d %s", code, data)
	}
	if _, err := New(Options{Local: admin, Clients: clients}); err == nil {
		t.Error("New accepted both a local client and per-user clients")
	}
}
