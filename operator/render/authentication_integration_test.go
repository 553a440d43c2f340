//go:build integration

package render

import (
	"context"
	"encoding/pem"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	apiserverv1 "k8s.io/apiserver/pkg/apis/apiserver/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/apiaryhq/apiary/internal/testenv"
	"github.com/apiaryhq/apiary/internal/testoidc"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

// oidcServer is a real OpenID provider over TLS on loopback, with alice
// (group team-a) and the public client "kubernetes".
func oidcServer(t *testing.T, aud ...string) (*httptest.Server, string) {
	t.Helper()
	srv := httptest.NewUnstartedServer(nil)
	srv.StartTLS()
	t.Cleanup(srv.Close)
	var clients []testoidc.Client
	for _, a := range aud {
		clients = append(clients, testoidc.Client{ID: a, RedirectURIs: []string{"http://127.0.0.1:1/callback"}})
	}
	p, err := testoidc.New(testoidc.Config{Issuer: srv.URL, Clients: clients, Users: []testoidc.User{
		{Username: "alice", Password: "alice-pw", Email: "alice@example.test", Groups: []string{"team-a"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	srv.Config.Handler = p
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	return srv, string(ca)
}

func idToken(t *testing.T, srv *httptest.Server, client string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	tok, err := testoidc.SignIn(ctx, srv.Client(), srv.URL, testoidc.Client{ID: client, RedirectURIs: []string{"http://127.0.0.1:1/callback"}},
		"alice", "alice-pw", "email", testoidc.ScopeGroups)
	if err != nil {
		t.Fatalf("signing in to %s as alice: %v", srv.URL, err)
	}
	return testoidc.IDToken(tok)
}

// TestAuthenticationInARealAPIServer runs the rendered
// AuthenticationConfiguration in a real kube-apiserver with ID tokens of a
// real OpenID provider: the mapped user and groups, RBAC deciding what
// they may do, and the refusals (another audience, an issuer not in the
// file, a forged signature); then an issuer added to the file is taken
// without a restart, as a roll in between relies on.
func TestAuthenticationInARealAPIServer(t *testing.T) {
	idp, idpCA := oidcServer(t, "kubernetes", "another-app")
	other, otherCA := oidcServer(t, "kubernetes")

	tcp := fixture()
	mapping := apiserverv1.ClaimMappings{
		Username: apiserverv1.PrefixedClaimOrExpression{Claim: "email", Prefix: new("oidc:")},
		Groups:   apiserverv1.PrefixedClaimOrExpression{Claim: "groups", Prefix: new("oidc:")},
	}
	tcp.Spec.Authentication = &apiary.AuthenticationSpec{JWT: []apiary.JWTAuthenticator{{
		JWTAuthenticator:        apiserverv1.JWTAuthenticator{Issuer: apiserverv1.Issuer{URL: idp.URL, Audiences: []string{"kubernetes"}}, ClaimMappings: mapping},
		CertificateAuthorityRef: &apiary.CertificateAuthorityReference{Kind: "ConfigMap", Name: "idp-ca"},
	}}}
	file := func(referenced map[int]string) string {
		f, err := AuthenticationFile(AuthenticationConfiguration(tcp, referenced))
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	dir := testenv.NewAtomicDir(t, filepath.Join(t.TempDir(), "authn"), map[string]string{KeyAuthenticationConfig: file(map[int]string{0: idpCA})})
	_, cfg := testenv.Start(t, testenv.Options{APIServerArgs: map[string]string{
		"authentication-config": filepath.Join(dir.Dir, KeyAuthenticationConfig),
	}})
	admin, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	as := func(token string) *kubernetes.Clientset {
		c := rest.AnonymousClientConfig(cfg)
		c.BearerToken = token
		cs, err := kubernetes.NewForConfig(c)
		if err != nil {
			t.Fatal(err)
		}
		return cs
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	whoami := func(token string) (*authenticationv1.UserInfo, error) {
		r, err := as(token).AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
		if err != nil {
			return nil, err
		}
		return &r.Status.UserInfo, nil
	}

	alice := idToken(t, idp, "kubernetes")
	// The API server fetches the provider's keys after it starts.
	var who *authenticationv1.UserInfo
	testenv.Eventually(t, "alice's ID token authenticates", 30*time.Second, func() error {
		who, err = whoami(alice)
		return err
	})
	if who.Username != "oidc:alice@example.test" || !slices.Contains(who.Groups, "oidc:team-a") {
		t.Errorf("alice is %q in %v, want oidc:alice@example.test in oidc:team-a", who.Username, who.Groups)
	}

	// RBAC decides: nothing until a binding names her group.
	if _, err := as(alice).CoreV1().Namespaces().List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("alice lists namespaces without a binding: %v, want 403", err)
	}
	if _, err := admin.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "namespace-reader"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"namespaces"}, Verbs: []string{"get", "list"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "team-a-namespace-reader"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "namespace-reader"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: "oidc:team-a"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "alice lists namespaces through her group's binding", 30*time.Second, func() error {
		_, err := as(alice).CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
		return err
	})
	if _, err := as(alice).CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "alices"}}, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("alice (a reader) creates a namespace: %v, want 403", err)
	}

	// Refused: another audience, an issuer not in the file, a forged signature.
	unauthorized := func(what, token string) {
		t.Helper()
		if _, err := whoami(token); !apierrors.IsUnauthorized(err) {
			t.Errorf("%s: %v, want 401", what, err)
		}
	}
	unauthorized("a token for another audience", idToken(t, idp, "another-app"))
	otherToken := idToken(t, other, "kubernetes")
	unauthorized("a token of an issuer not in the file", otherToken)
	parts := strings.Split(alice, ".")
	sig := []byte(parts[2])
	sig[len(sig)/2] ^= 1
	if sig[len(sig)/2] == '.' || sig[len(sig)/2] == '=' {
		sig[len(sig)/2] = 'A'
	}
	unauthorized("a token with a changed signature", parts[0]+"."+parts[1]+"."+string(sig))

	// An issuer added to the file is taken without a restart.
	tcp.Spec.Authentication.JWT = append(tcp.Spec.Authentication.JWT, apiary.JWTAuthenticator{
		JWTAuthenticator: apiserverv1.JWTAuthenticator{Issuer: apiserverv1.Issuer{URL: other.URL, Audiences: []string{"kubernetes"}, CertificateAuthority: otherCA}, ClaimMappings: mapping},
	})
	dir.Write(t, map[string]string{KeyAuthenticationConfig: file(map[int]string{0: idpCA})})
	testenv.Eventually(t, "the added issuer's token authenticates", time.Minute, func() error {
		_, err := whoami(otherToken)
		return err
	})
	if _, err := whoami(alice); err != nil {
		t.Errorf("alice after the reload: %v", err)
	}
}
