package testoidc

import (
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/coreos/go-oidc/v3/oidc"
	"golang.org/x/oauth2"
)

// TestSignIn: a user signs in through the form with PKCE and gets an ID
// token that go-oidc verifies against the provider's discovery and keys,
// carrying the claims the scopes asked for; a wrong password, a wrong
// client secret and a code exchanged without its verifier are refused.
func TestSignIn(t *testing.T) {
	srv := httptest.NewUnstartedServer(nil)
	srv.StartTLS()
	defer srv.Close()
	web := Client{ID: "dashboard", Secret: "s3cret", RedirectURIs: []string{"http://127.0.0.1:1/callback"}}
	cli := Client{ID: "kubectl", RedirectURIs: []string{"http://127.0.0.1:2/callback"}}
	p, err := New(Config{Issuer: srv.URL, Clients: []Client{web, cli}, Users: []User{
		{Username: "alice", Password: "alice-pw", Email: "alice@example.test", Groups: []string{"team-a", "devs"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	srv.Config.Handler = p
	hc := srv.Client()
	ctx := oidc.ClientContext(t.Context(), hc)

	provider, err := oidc.NewProvider(ctx, srv.URL)
	if err != nil {
		t.Fatalf("discovery through go-oidc: %v", err)
	}
	for _, c := range []Client{web, cli} {
		tok, err := SignIn(t.Context(), hc, srv.URL, c, "alice", "alice-pw", "email", "profile", ScopeGroups)
		if err != nil {
			t.Fatalf("client %s: %v", c.ID, err)
		}
		idt, err := provider.Verifier(&oidc.Config{ClientID: c.ID}).Verify(ctx, IDToken(tok))
		if err != nil {
			t.Fatalf("client %s: the ID token does not verify: %v", c.ID, err)
		}
		var claims struct {
			Email    string   `json:"email"`
			Username string   `json:"preferred_username"`
			Groups   []string `json:"groups"`
		}
		if err := idt.Claims(&claims); err != nil {
			t.Fatal(err)
		}
		if idt.Subject != "alice" || claims.Email != "alice@example.test" || claims.Username != "alice" || !slices.Equal(claims.Groups, []string{"team-a", "devs"}) {
			t.Errorf("client %s: ID token subject %q claims %+v", c.ID, idt.Subject, claims)
		}
		if _, err := provider.Verifier(&oidc.Config{ClientID: "someone-else"}).Verify(ctx, IDToken(tok)); err == nil {
			t.Errorf("client %s: the ID token verified for another audience", c.ID)
		}
	}

	if _, err := SignIn(t.Context(), hc, srv.URL, web, "alice", "wrong", "email"); err == nil || !strings.Contains(err.Error(), "401") {
		t.Errorf("a wrong password: %v, want the login form's 401", err)
	}
	bad := web
	bad.Secret = "guess"
	if _, err := SignIn(t.Context(), hc, srv.URL, bad, "alice", "alice-pw"); err == nil {
		t.Error("a wrong client secret was accepted")
	}

	// The code without its PKCE verifier.
	noPKCE := oauth2.Config{ClientID: web.ID, ClientSecret: web.Secret, RedirectURL: web.RedirectURIs[0], Endpoint: provider.Endpoint(), Scopes: []string{"openid"}}
	stop := &stopAtRedirect{hc: hc, stopAt: web.RedirectURIs[0]}
	resp, err := stop.get(t.Context(), noPKCE.AuthCodeURL("st", oauth2.S256ChallengeOption(oauth2.GenerateVerifier())))
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	id := resp.Request.URL.Query().Get(authRequestParam)
	if err := p.store.complete(id, p.store.users["alice"]); err != nil {
		t.Fatal(err)
	}
	resp, err = stop.get(t.Context(), srv.URL+"/authorize/callback?id="+id)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	code := resp.Request.URL.Query().Get("code")
	if code == "" {
		t.Fatalf("no code at %s", resp.Request.URL)
	}
	if _, err := noPKCE.Exchange(ctx, code, oauth2.VerifierOption(oauth2.GenerateVerifier())); err == nil {
		t.Error("a code was exchanged with another PKCE verifier")
	}
	resp, err = hc.Get(srv.URL + "/login?authRequestID=nope")
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("the login form for an unknown request: %s, want 400", resp.Status)
	}
}
