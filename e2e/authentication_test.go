//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	apiserverv1 "k8s.io/apiserver/pkg/apis/apiserver/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/apiaryhq/apiary/e2e/framework"
	"github.com/apiaryhq/apiary/internal/testenv"
	"github.com/apiaryhq/apiary/internal/testoidc"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/operator/controllers"
	"github.com/apiaryhq/apiary/pki"
)

// oidcAddress is where the e2e suite's OpenID providers listen: an address
// of this machine's loopback interface, outside every range of the
// management cluster, so that the tenant's NetworkPolicy lets its API
// server reach it (as it would reach an identity provider on the
// internet) and nothing leaves the machine.
const oidcAddress = "10.203.0.10"

// oidcProvider serves a real OpenID provider (zitadel/oidc, the users'
// form) over TLS at oidcAddress:port with a certificate of ca; it is gone
// when the test ends.
func oidcProvider(t *testing.T, ca *pki.KeyPair, port int, clients ...string) string {
	t.Helper()
	var cs []testoidc.Client
	for _, c := range clients {
		cs = append(cs, testoidc.Client{ID: c, RedirectURIs: []string{"http://127.0.0.1:8000/callback", "http://" + oidcListen + "/callback"}})
	}
	return oidcProviderFor(t, ca, port, cs...)
}

// oidcProviderFor is oidcProvider with the clients spelled out.
func oidcProviderFor(t *testing.T, ca *pki.KeyPair, port int, cs ...testoidc.Client) string {
	t.Helper()
	issuer := fmt.Sprintf("https://%s:%d", oidcAddress, port)
	p, err := testoidc.New(testoidc.Config{Issuer: issuer, Clients: cs, Users: []testoidc.User{
		{Username: "alice", Password: "alice-pw", Email: "alice@example.test", Groups: []string{"team-a"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	serving, err := ca.Sign(pki.Request{CommonName: oidcAddress, IPs: []net.IP{net.ParseIP(oidcAddress)}, Usages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	if err != nil {
		t.Fatal(err)
	}
	key, err := serving.KeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(serving.CertPEM(), key)
	if err != nil {
		t.Fatal(err)
	}
	// The chain names its CA too, so that a test browser can be told to
	// trust it by the CA's key (browsertest.Start).
	cert.Certificate = append(cert.Certificate, ca.Cert.Raw)
	l, err := tls.Listen("tcp", fmt.Sprintf("%s:%d", oidcAddress, port), &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: p, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return issuer
}

// onLoopback adds oidcAddress to lo for the test.
func onLoopback(t *testing.T) {
	t.Helper()
	if out, err := exec.Command("ip", "addr", "add", oidcAddress+"/32", "dev", "lo").CombinedOutput(); err != nil && !strings.Contains(string(out), "File exists") {
		t.Fatalf("ip addr add %s dev lo: %v: %s", oidcAddress, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "addr", "del", oidcAddress+"/32", "dev", "lo").CombinedOutput(); err != nil {
			t.Errorf("ip addr del %s dev lo: %v: %s", oidcAddress, err, out)
		}
	})
}

// tokenKubeconfig is the tenant's kubeconfig with the user's bearer token
// instead of the admin's client certificate.
func tokenKubeconfig(t *testing.T, admin, token string) string {
	t.Helper()
	cfg, err := clientcmd.LoadFromFile(admin)
	if err != nil {
		t.Fatal(err)
	}
	for name := range cfg.AuthInfos {
		cfg.AuthInfos[name] = &clientcmdapi.AuthInfo{Token: token}
	}
	path := filepath.Join(t.TempDir(), "token.kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// testTenantOIDC (issue 11, OIDC for tenant APIs): alpha accepts ID tokens
// of an OpenID provider its spec names, the provider's CA read from a
// ConfigMap: the change rolls the control plane without a failed request
// of a poller; a user signed in through the provider's form is the mapped
// user in the mapped group (kubectl auth whoami) and RBAC inside the
// tenant decides what she may do; a token for another audience, of
// another issuer or with a changed signature is refused; a Secret's key
// named as the CA is refused and never copied; removing the issuer rolls
// back and her token is refused again.
func (e *env) testTenantOIDC(t *testing.T) {
	// The redirect of the users' kubeconfig.
	oidcListen = freeLoopbackAddress(t)
	const name = "alpha"
	onLoopback(t)
	ca, err := pki.NewCA("e2e-oidc")
	if err != nil {
		t.Fatal(err)
	}
	oidcCA = string(ca.CertPEM())
	issuer := oidcProvider(t, ca, 8443, "kubernetes", "another-app")
	other := oidcProvider(t, ca, 8444, "kubernetes")
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}}}
	signIn := func(issuer, client string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(e.Ctx, 30*time.Second)
		defer cancel()
		tok, err := testoidc.SignIn(ctx, hc, issuer, testoidc.Client{ID: client, RedirectURIs: []string{"http://127.0.0.1:8000/callback"}}, "alice", "alice-pw", "email", testoidc.ScopeGroups)
		if err != nil {
			t.Fatalf("alice signs in to %s for %s: %v", issuer, client, err)
		}
		return testoidc.IDToken(tok)
	}

	ns := framework.TenantsNS
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "alpha-oidc-ca", Namespace: ns}, Data: map[string]string{"ca.crt": string(ca.CertPEM())}}
	if err := e.C.Create(e.Ctx, cm); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.C.Delete(context.Background(), cm) })

	rolled := func(what string, after int64) {
		t.Helper()
		start := time.Now()
		framework.Eventually(t, what+": rolled out", 3*time.Minute, func() error {
			var dep appsv1.Deployment
			if err := e.C.Get(e.Ctx, client.ObjectKey{Namespace: ns, Name: name}, &dep); err != nil {
				return err
			}
			st, want := dep.Status, *dep.Spec.Replicas
			if dep.Generation <= after || st.ObservedGeneration != dep.Generation || st.UpdatedReplicas != want || st.ReadyReplicas != want || st.Replicas != want {
				return fmt.Errorf("generation %d (after %d) observed %d, replicas %d updated %d ready %d", dep.Generation, after, st.ObservedGeneration, st.Replicas, st.UpdatedReplicas, st.ReadyReplicas)
			}
			return nil
		})
		t.Logf("FIGURE %s: control plane rolled in %s", what, time.Since(start).Round(100*time.Millisecond))
	}
	generation := func() int64 {
		var dep appsv1.Deployment
		if err := e.C.Get(e.Ctx, client.ObjectKey{Namespace: ns, Name: name}, &dep); err != nil {
			t.Fatal(err)
		}
		return dep.Generation
	}
	setAuthentication := func(a *apiary.AuthenticationSpec) {
		t.Helper()
		framework.Eventually(t, "spec.authentication", 30*time.Second, func() error {
			tcp := e.TCP(t, name)
			tcp.Spec.Authentication = a
			return e.C.Update(e.Ctx, tcp)
		})
	}
	spec := func(ref apiary.CertificateAuthorityReference) *apiary.AuthenticationSpec {
		return &apiary.AuthenticationSpec{JWT: []apiary.JWTAuthenticator{{
			JWTAuthenticator: apiserverv1.JWTAuthenticator{
				Issuer: apiserverv1.Issuer{URL: issuer, Audiences: []string{"kubernetes"}},
				ClaimMappings: apiserverv1.ClaimMappings{
					Username: apiserverv1.PrefixedClaimOrExpression{Claim: "email", Prefix: new("oidc:")},
					Groups:   apiserverv1.PrefixedClaimOrExpression{Claim: "groups", Prefix: new("oidc:")},
				},
			},
			CertificateAuthorityRef: &ref,
		}}}
	}

	// Whatever happens, alpha leaves without the issuer (its provider
	// is gone with the test).
	t.Cleanup(func() {
		if tcp := e.TCP(t, name); tcp.Spec.Authentication != nil {
			tcp.Spec.Authentication = nil
			if err := e.C.Update(context.Background(), tcp); err != nil {
				t.Errorf("removing alpha's spec.authentication: %v", err)
			}
		}
	})
	admin := e.ExportKubeconfig(t, name)
	p := e.newPoller(t, name)
	ctx, cancel := context.WithCancel(e.Ctx)
	done := make(chan struct{})
	go func() { p.run(ctx); close(done) }()
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			cancel()
			<-done
		}
	}
	defer stop()

	before := generation()
	setAuthentication(spec(apiary.CertificateAuthorityReference{Kind: "ConfigMap", Name: cm.Name}))
	framework.Eventually(t, "AuthenticationConfigured", time.Minute, func() error {
		return framework.ConditionIs(e.TCP(t, name).Status.Conditions, apiary.ConditionAuthenticationConfigured, metav1.ConditionTrue, controllers.ReasonIssuersConfigured)
	})
	rolled("an OpenID issuer added", before)
	stop()
	p.verdict(t, "OIDC issuer added to alpha", "while the control plane rolled for an OpenID issuer")

	// What a user does: the kubeconfig "apiary kubeconfig --oidc" writes,
	// kubectl running "apiary oidc-login", the browser signing in.
	users := e.oidcKubeconfig(t, name, hc)
	whoami := e.signInThroughKubectl(t, users, hc)
	alice := tokenKubeconfig(t, admin, signIn(issuer, "kubernetes"))
	var who struct {
		Status struct {
			UserInfo struct {
				Username string   `json:"username"`
				Groups   []string `json:"groups"`
			} `json:"userInfo"`
		} `json:"status"`
	}
	// Every replica fetched the provider's keys when it started; a
	// replica still fetching answers 401 for a moment.
	framework.Eventually(t, "kubectl auth whoami with alice's ID token", time.Minute, func() error {
		out, err := framework.KubectlErr(alice, "auth", "whoami", "-o", "json")
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return json.Unmarshal([]byte(out), &who)
	})
	t.Logf("alice is %q in %v", who.Status.UserInfo.Username, who.Status.UserInfo.Groups)
	if !strings.Contains(whoami, "oidc:alice@example.test") || !strings.Contains(whoami, "oidc:team-a") {
		t.Errorf("kubectl auth whoami through apiary oidc-login:\n%s", whoami)
	}
	if who.Status.UserInfo.Username != "oidc:alice@example.test" || !slices.Contains(who.Status.UserInfo.Groups, "oidc:team-a") {
		t.Errorf("kubectl auth whoami: %q in %v, want oidc:alice@example.test in oidc:team-a", who.Status.UserInfo.Username, who.Status.UserInfo.Groups)
	}
	// RBAC inside the tenant decides.
	if out, err := framework.KubectlErr(alice, "get", "namespaces"); err == nil || !strings.Contains(out, "forbidden") {
		t.Errorf("alice lists namespaces without a binding: %v: %s", err, out)
	}
	framework.Kubectl(t, admin, "create", "clusterrolebinding", "team-a-view", "--clusterrole=view", "--group=oidc:team-a")
	framework.Kubectl(t, admin, "create", "clusterrole", "namespace-reader", "--verb=get,list", "--resource=namespaces")
	framework.Kubectl(t, admin, "create", "clusterrolebinding", "team-a-namespaces", "--clusterrole=namespace-reader", "--group=oidc:team-a")
	framework.Eventually(t, "alice lists namespaces through her group's binding", 30*time.Second, func() error {
		out, err := framework.KubectlErr(alice, "get", "namespaces", "-o", "name")
		if err != nil || !strings.Contains(out, "namespace/kube-system") {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	})
	if out, err := framework.KubectlErr(alice, "create", "namespace", "alices"); err == nil || !strings.Contains(out, "forbidden") {
		t.Errorf("alice (view) creates a namespace: %v: %s", err, out)
	}

	// Refused: another audience, an issuer the tenant does not name, a
	// changed signature.
	unauthorized := func(what, token string) {
		t.Helper()
		out, err := framework.KubectlErr(tokenKubeconfig(t, admin, token), "auth", "whoami")
		if err == nil || !strings.Contains(out, "Unauthorized") {
			t.Errorf("%s: %v: %s, want Unauthorized", what, err, out)
		}
	}
	unauthorized("a token for another audience", signIn(issuer, "another-app"))
	unauthorized("a token of another issuer", signIn(other, "kubernetes"))
	tok := signIn(issuer, "kubernetes")
	dot := strings.LastIndex(tok, ".")
	sig := []byte(tok[dot+1:])
	if sig[5] == 'A' {
		sig[5] = 'B'
	} else {
		sig[5] = 'A'
	}
	unauthorized("a token with a changed signature", tok[:dot+1]+string(sig))

	// The tenant's own CA key, named as the issuer's CA: refused and
	// never copied; alice keeps working with what was read last.
	caSecret := e.TCP(t, name).Name + "-ca"
	setAuthentication(spec(apiary.CertificateAuthorityReference{Kind: "Secret", Name: caSecret, Key: corev1.TLSPrivateKeyKey}))
	framework.Eventually(t, "a key as the CA refused", time.Minute, func() error {
		c := framework.FindCondition(e.TCP(t, name).Status.Conditions, apiary.ConditionAuthenticationConfigured)
		if c.Status != metav1.ConditionFalse || !strings.Contains(c.Message, "key tls.key of Secret "+caSecret) {
			return fmt.Errorf("condition %+v", c)
		}
		return nil
	})
	var authn corev1.ConfigMap
	if err := e.C.Get(e.Ctx, client.ObjectKey{Namespace: ns, Name: name + "-authentication"}, &authn); err != nil {
		t.Fatal(err)
	}
	f := authn.Data["authentication-configuration.yaml"]
	var file apiserverv1.AuthenticationConfiguration
	if err := yaml.UnmarshalStrict([]byte(f), &file); err != nil || strings.Contains(f, "PRIVATE KEY") ||
		len(file.JWT) != 1 || file.JWT[0].Issuer.CertificateAuthority != string(ca.CertPEM()) {
		t.Errorf("the authentication file after a key was named (%v): it must keep the CA read last and nothing else:\n%s", err, f)
	}
	if _, err := framework.KubectlErr(alice, "auth", "whoami"); err != nil {
		t.Errorf("alice after the refused reference: %v", err)
	}

	// Removed: rolled back, and her token is refused.
	before = generation()
	setAuthentication(nil)
	rolled("the OpenID issuer removed", before)
	framework.Eventually(t, "alice refused once the issuer is gone", 30*time.Second, func() error {
		out, err := framework.KubectlErr(alice, "auth", "whoami")
		if err == nil || !strings.Contains(out, "Unauthorized") {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	})
	if err := e.C.Get(e.Ctx, client.ObjectKey{Namespace: ns, Name: name + "-authentication"}, &authn); !apierrors.IsNotFound(err) {
		t.Errorf("the authentication ConfigMap after the removal: %v", err)
	}
	for _, crb := range []string{"team-a-view", "team-a-namespaces"} {
		framework.Kubectl(t, admin, "delete", "clusterrolebinding", crb)
	}
	framework.Kubectl(t, admin, "delete", "clusterrole", "namespace-reader")
}

// oidcListen is the loopback address "apiary oidc-login" listens on in
// testTenantOIDC.
var oidcListen, oidcCA string

func freeLoopbackAddress(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// oidcKubeconfig is "apiary kubeconfig NAME --oidc" of a freshly built
// apiary binary, the one its exec plugin runs, with the e2e CA for the
// provider's TLS.
func (e *env) oidcKubeconfig(t *testing.T, name string, _ *http.Client) string {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "apiary")
	if out, err := exec.CommandContext(e.Ctx, "go", "build", "-o", bin, "../cmd/apiary").CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/apiary: %v\n%s", err, out)
	}
	caFile := filepath.Join(dir, "idp-ca.crt")
	if err := os.WriteFile(caFile, []byte(oidcCA), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(e.Ctx, bin, "--kubeconfig", e.Kubeconfig, "-n", framework.TenantsNS, "kubeconfig", name, "--oidc",
		"--oidc-listen", oidcListen, "--oidc-ca-file", caFile, "--oidc-command", bin).Output()
	if err != nil {
		t.Fatalf("apiary kubeconfig %s --oidc: %v", name, err)
	}
	if strings.Contains(string(out), "client-certificate-data") || strings.Contains(string(out), "client-key-data") {
		t.Fatalf("the users' kubeconfig holds a client credential:\n%s", out)
	}
	path := filepath.Join(dir, name+"-users.kubeconfig")
	if err := os.WriteFile(path, out, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// signInThroughKubectl runs "kubectl auth whoami" with the users'
// kubeconfig: kubectl runs "apiary oidc-login", which prints the address
// to sign in at; the browser (testoidc.Browse) signs alice in at the
// provider's form and follows its redirect to oidc-login's listener.
// It returns what kubectl printed; a second call uses the cached token.
func (e *env) signInThroughKubectl(t *testing.T, kubeconfig string, hc *http.Client) string {
	t.Helper()
	bin, err := testenv.KubeBinary("kubectl")
	if err != nil {
		t.Fatal(err)
	}
	var out string
	// oidc-login's token cache, the user's own.
	cache := t.TempDir()
	framework.Eventually(t, "kubectl auth whoami through apiary oidc-login", time.Minute, func() error {
		ctx, cancel := context.WithTimeout(e.Ctx, 40*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin, "--kubeconfig", kubeconfig, "auth", "whoami")
		cmd.Env = append(os.Environ(), "XDG_CACHE_HOME="+cache)
		stderr, err := cmd.StderrPipe()
		if err != nil {
			return err
		}
		var stdout strings.Builder
		cmd.Stdout = &stdout
		if err := cmd.Start(); err != nil {
			return err
		}
		var log strings.Builder
		browsed := make(chan error, 1)
		go func() {
			sc := bufio.NewScanner(stderr)
			var once bool
			for sc.Scan() {
				line := strings.TrimSpace(sc.Text())
				log.WriteString(line + "\n")
				if once || !strings.HasPrefix(line, "https://") {
					continue
				}
				once = true
				back, err := testoidc.Browse(ctx, hc, line, "http://"+oidcListen+"/callback", "alice", "alice-pw")
				if err == nil {
					var resp *http.Response
					if resp, err = http.Get(back.String()); err == nil {
						resp.Body.Close()
					}
				}
				browsed <- err
			}
			close(browsed)
		}()
		err = cmd.Wait()
		if berr := <-browsed; berr != nil {
			return fmt.Errorf("the browser: %v", berr)
		}
		if err != nil {
			return fmt.Errorf("%v: %s%s", err, stdout.String(), log.String())
		}
		out = stdout.String()
		return nil
	})
	return out
}
