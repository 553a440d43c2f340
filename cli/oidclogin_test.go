package cli

import (
	"bufio"
	"context"
	"encoding/pem"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	apiserverv1 "k8s.io/apiserver/pkg/apis/apiserver/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/apiaryhq/apiary/internal/testoidc"
	apiaryv1alpha1 "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

func freeLoopback(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// A sign-in through the user's browser (the provider's real form,
// followed by a browser-like client up to the loopback redirect), the ID
// token verified and cached; the cache answers until the token nears its
// expiry; a redirect that does not carry this sign-in's state is refused
// and does not end it.
func TestOIDCLogin(t *testing.T) {
	srv := httptest.NewUnstartedServer(nil)
	srv.StartTLS()
	defer srv.Close()
	listen := freeLoopback(t)
	redirect := "http://" + listen + "/callback"
	p, err := testoidc.New(testoidc.Config{Issuer: srv.URL,
		Clients: []testoidc.Client{{ID: "kubernetes", RedirectURIs: []string{redirect}}},
		Users:   []testoidc.User{{Username: "alice", Password: "alice-pw", Email: "alice@example.test", Groups: []string{"team-a"}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	srv.Config.Handler = p
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	login := OIDCLogin{Issuer: srv.URL, ClientID: "kubernetes", Listen: listen, CAFile: caFile,
		Scopes: []string{"email", "groups"}, CacheDir: filepath.Join(t.TempDir(), "cache"), Timeout: time.Minute}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()

	// browser reads the address the command prints and does what the
	// user does with it; forged first sends a redirect of its own.
	browser := func(prompt io.Reader, forged bool) error {
		sc := bufio.NewScanner(prompt)
		for sc.Scan() {
			line := strings.TrimSpace(sc.Text())
			if !strings.HasPrefix(line, "https://") {
				continue
			}
			if forged {
				resp, err := http.Get(redirect + "?code=attacker&state=guessed")
				if err != nil {
					return err
				}
				resp.Body.Close()
				if resp.StatusCode != http.StatusBadRequest {
					t.Errorf("a redirect with another state: %s, want 400", resp.Status)
				}
			}
			back, err := testoidc.Browse(ctx, srv.Client(), line, redirect, "alice", "alice-pw")
			if err != nil {
				return err
			}
			resp, err := http.Get(back.String())
			if err != nil {
				return err
			}
			resp.Body.Close()
			return nil
		}
		return io.ErrUnexpectedEOF
	}
	signIn := func(l OIDCLogin, forged bool) (string, time.Time) {
		t.Helper()
		r, w := io.Pipe()
		errc := make(chan error, 1)
		go func() { errc <- browser(r, forged); _, _ = io.Copy(io.Discard, r) }()
		cred, err := l.Credential(ctx, w)
		w.Close()
		if err != nil {
			t.Fatalf("sign-in: %v", err)
		}
		if err := <-errc; err != nil {
			t.Fatalf("the browser: %v", err)
		}
		return cred.Status.Token, cred.Status.ExpirationTimestamp.Time
	}

	token, expiry := signIn(login, true)
	provider, err := oidc.NewProvider(oidc.ClientContext(ctx, srv.Client()), srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	idt, err := provider.Verifier(&oidc.Config{ClientID: "kubernetes"}).Verify(oidc.ClientContext(ctx, srv.Client()), token)
	if err != nil {
		t.Fatalf("the printed token does not verify: %v", err)
	}
	var claims struct {
		Email  string   `json:"email"`
		Groups []string `json:"groups"`
	}
	if err := idt.Claims(&claims); err != nil || claims.Email != "alice@example.test" || len(claims.Groups) != 1 {
		t.Errorf("the token's claims %+v (%v): the tenant maps email and groups", claims, err)
	}
	if !expiry.Equal(idt.Expiry) {
		t.Errorf("expirationTimestamp %s, the token expires at %s", expiry, idt.Expiry)
	}
	if fi, err := os.Stat(login.cacheFile()); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("the token cache: %v %v, want mode 0600", fi.Mode(), err)
	}

	// Cached: no sign-in, the same token.
	again, err := login.Credential(ctx, failWriter{t})
	if err != nil || again.Status.Token != token {
		t.Errorf("the second call: %v (same token: %t)", err, again != nil && again.Status.Token == token)
	}

	// Near its expiry, a new sign-in.
	later := login
	later.Now = func() time.Time { return expiry.Add(-earlyExpiry / 2) }
	if tok, _ := signIn(later, false); tok == token {
		t.Error("a token about to expire was handed out again")
	}
}

type failWriter struct{ t *testing.T }

func (f failWriter) Write(p []byte) (int, error) {
	f.t.Errorf("asked to sign in although a token is cached: %s", p)
	return len(p), nil
}

// The users' kubeconfig keeps the tenant's clusters, drops the admin
// credential and signs in through "apiary oidc-login"; an issuer or a
// client ID the tenant would refuse is refused here, saying why.
func TestOIDCKubeconfig(t *testing.T) {
	admin := clientcmdapi.NewConfig()
	admin.Clusters["acme"] = &clientcmdapi.Cluster{Server: "https://192.0.2.10:6443", CertificateAuthorityData: []byte("ca")}
	admin.AuthInfos["admin"] = &clientcmdapi.AuthInfo{ClientCertificateData: []byte("cert"), ClientKeyData: []byte("key")}
	admin.Contexts["acme"] = &clientcmdapi.Context{Cluster: "acme", AuthInfo: "admin"}
	admin.CurrentContext = "acme"
	raw, err := clientcmd.Write(*admin)
	if err != nil {
		t.Fatal(err)
	}
	tcp := &apiaryv1alpha1.TenantControlPlane{}
	tcp.Namespace, tcp.Name = "team-a", "acme"
	if _, err := OIDCKubeconfig(raw, tcp, OIDCKubeconfigOptions{}); err == nil || !strings.Contains(err.Error(), "accepts no OpenID tokens") {
		t.Errorf("a tenant without issuers: %v", err)
	}
	issuer := func(url string, aud ...string) apiaryv1alpha1.JWTAuthenticator {
		return apiaryv1alpha1.JWTAuthenticator{JWTAuthenticator: apiserverv1.JWTAuthenticator{Issuer: apiserverv1.Issuer{URL: url, Audiences: aud}}}
	}
	tcp.Spec.Authentication = &apiaryv1alpha1.AuthenticationSpec{JWT: []apiaryv1alpha1.JWTAuthenticator{issuer("https://login.example.com", "kubernetes", "other")}}

	out, err := OIDCKubeconfig(raw, tcp, OIDCKubeconfigOptions{CAFile: "/etc/ssl/idp.pem"})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.Load(out)
	if err != nil {
		t.Fatal(err)
	}
	if c := cfg.Clusters["acme"]; c == nil || c.Server != "https://192.0.2.10:6443" || string(c.CertificateAuthorityData) != "ca" {
		t.Errorf("clusters %+v", cfg.Clusters)
	}
	if len(cfg.AuthInfos) != 1 || cfg.AuthInfos[OIDCUser] == nil || strings.Contains(string(out), "Y2VydA") {
		t.Fatalf("users %+v: the admin credential must be gone", cfg.AuthInfos)
	}
	exec := cfg.AuthInfos[OIDCUser].Exec
	want := "oidc-login --issuer https://login.example.com --client-id kubernetes --listen 127.0.0.1:8000 --ca-file /etc/ssl/idp.pem"
	if exec == nil || exec.Command != "apiary" || strings.Join(exec.Args, " ") != want || exec.APIVersion != "client.authentication.k8s.io/v1" {
		t.Errorf("exec %+v, want apiary %s", exec, want)
	}
	if cfg.Contexts["acme"].AuthInfo != OIDCUser {
		t.Errorf("the context uses %q", cfg.Contexts["acme"].AuthInfo)
	}

	for _, c := range []struct {
		o    OIDCKubeconfigOptions
		want string
	}{
		{OIDCKubeconfigOptions{ClientID: "someone"}, "accepts the audiences kubernetes, other, not client ID \"someone\""},
		{OIDCKubeconfigOptions{Issuer: "https://elsewhere.example.com"}, "does not accept issuer https://elsewhere.example.com"},
	} {
		if _, err := OIDCKubeconfig(raw, tcp, c.o); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.o, err, c.want)
		}
	}
	tcp.Spec.Authentication.JWT = append(tcp.Spec.Authentication.JWT, issuer("https://dex.example.com", "acme"))
	if _, err := OIDCKubeconfig(raw, tcp, OIDCKubeconfigOptions{}); err == nil || !strings.Contains(err.Error(), "choose one with --oidc-issuer") {
		t.Errorf("two issuers, none chosen: %v", err)
	}
	if _, err := OIDCKubeconfig(raw, tcp, OIDCKubeconfigOptions{Issuer: "https://dex.example.com"}); err != nil {
		t.Errorf("the second issuer chosen: %v", err)
	}
}
