//go:build integration

package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"regexp"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/apiaryhq/apiary/dashboard/signin"
	"github.com/apiaryhq/apiary/internal/testoidc"
	apiaryv1alpha1 "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

// "apiary dashboard --local" serves the overview and the live stream with
// the user's kubeconfig, on loopback only; without --local, or on another
// address, it refuses with what to do.
func TestDashboardLocal(t *testing.T) {
	e := environment(t)
	e.namespace(t, "dash")
	e.tenant(t, "dash", "shown", apiaryv1alpha1.TenantControlPlaneStatus{Phase: apiaryv1alpha1.PhaseReady, Conditions: readyConditions()})
	kubeconfig := e.writeKubeconfig(t, e.kubeconfig, "")

	for args, want := range map[string]string{
		"dashboard": "serving signed-in users needs --client-id, --issuer, --redirect-url, --session-block-key-file, --session-hash-key-file, --tls-cert-file, --tls-key-file",
		"dashboard --local --listen 0.0.0.0:8080":      "want a loopback address",
		"dashboard --local --listen dashboard.example": "want a loopback address",
	} {
		if code, _, errOut := apiary(t, append(strings.Fields(args), "--kubeconfig", kubeconfig)...); code == 0 || !strings.Contains(errOut, want) {
			t.Errorf("apiary %s: exit %d, %q, want %q", args, code, errOut, want)
		}
	}

	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	out, w := io.Pipe()
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"dashboard", "--local", "--listen", "127.0.0.1:0", "--kubeconfig", kubeconfig}, w, io.Discard)
		_ = w.Close()
	}()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("no address printed: %v", err)
	}
	go func() { _, _ = io.Copy(io.Discard, out) }()
	url := regexp.MustCompile(`http://127\.0\.0\.1:\d+/`).FindString(line)
	if url == "" {
		t.Fatalf("printed %q, want the dashboard's address", line)
	}
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "local, with your kubeconfig") {
		t.Errorf("overview: %s %s", resp.Status, body)
	}
	resp, err = http.Get(url + "api/tenants/stream?namespace=dash")
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(resp.Body)
	var data string
	for sc.Scan() && data == "" {
		if strings.HasPrefix(sc.Text(), "data: ") {
			data = sc.Text()
		}
	}
	_ = resp.Body.Close()
	if !strings.Contains(data, `"name":"shown"`) || !strings.Contains(data, `"phase":"Ready"`) {
		t.Errorf("the stream's first event %q, want tenant shown, Ready", data)
	}
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("stopped with exit %d", code)
		}
	case <-time.After(10 * time.Second):
		t.Error("the dashboard did not stop with its context")
	}
}

// "apiary dashboard" for signed-in users: over HTTPS, alice signs in
// through a real OpenID provider's form and streams the tenants of the
// namespace her group may read, as herself; another namespace is refused.
func TestDashboardSignedIn(t *testing.T) {
	e := environment(t)
	e.namespace(t, "dash-team")
	e.namespace(t, "dash-other")
	e.tenant(t, "dash-team", "ours", apiaryv1alpha1.TenantControlPlaneStatus{Phase: apiaryv1alpha1.PhaseReady, Conditions: readyConditions()})
	e.tenant(t, "dash-other", "theirs", apiaryv1alpha1.TenantControlPlaneStatus{Phase: apiaryv1alpha1.PhaseReady, Conditions: readyConditions()})
	for _, o := range []client.Object{
		&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "read-tenants", Namespace: "dash-team"},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{apiaryv1alpha1.GroupVersion.Group}, Resources: []string{"tenantcontrolplanes"}, Verbs: []string{"list", "watch"}}}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "team", Namespace: "dash-team"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "read-tenants"},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.GroupKind, Name: "oidc:team-a"}}},
	} {
		if err := e.client.Create(t.Context(), o); err != nil {
			t.Fatal(err)
		}
	}
	d := startSignedInDashboard(t, e)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	redirect := d.url + signin.CallbackPath

	pool := x509.NewCertPool()
	pool.AddCert(d.ca.Cert)
	jar, _ := cookiejar.New(nil)
	browser := &http.Client{Jar: jar, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	base := d.url
	resp, err := browser.Get(base + "/")
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusFound {
		t.Fatalf("the overview without a session: %s, want the login page", resp.Status)
	}
	resp, err = browser.Get(base + signin.LoginPath)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	back, err := testoidc.Browse(ctx, d.provider.Client(), resp.Header.Get("Location"), redirect, "alice", "alice-pw")
	if err != nil {
		t.Fatal(err)
	}
	if resp, err = browser.Get(back.String()); err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusFound {
		t.Fatalf("the callback: %s", resp.Status)
	}
	if resp, err = browser.Get(base + "/"); err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if !strings.Contains(string(page), "signed in as oidc:alice@example.test") {
		t.Errorf("the overview after sign-in: %s %s", resp.Status, page)
	}
	browser.Timeout = 10 * time.Second
	if resp, err = browser.Get(base + "/api/tenants/stream?namespace=dash-other"); err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("alice's stream of dash-other: %s, want 403", resp.Status)
	}
	if resp, err = browser.Get(base + "/api/tenants/stream?namespace=dash-team"); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(resp.Body)
	var data string
	for sc.Scan() && data == "" {
		if strings.HasPrefix(sc.Text(), "data: ") {
			data = sc.Text()
		}
	}
	_ = resp.Body.Close()
	if !strings.Contains(data, `"name":"ours"`) {
		t.Errorf("alice's stream of dash-team: %s %q, want tenant ours", resp.Status, data)
	}
}

func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	return port
}
