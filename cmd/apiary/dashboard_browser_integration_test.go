//go:build integration

package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/apiaryhq/apiary/dashboard/session"
	"github.com/apiaryhq/apiary/dashboard/signin"
	"github.com/apiaryhq/apiary/internal/browsertest"
	"github.com/apiaryhq/apiary/internal/testenv"
	"github.com/apiaryhq/apiary/internal/testoidc"
	apiaryv1alpha1 "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/pki"
)

// The dashboard in a real browser (headless Chromium), signed in through
// a real OpenID provider's form: alice (group team-a) sees her team's
// tenant and is refused the other namespace; a condition written to the
// API shows on the tenant page within a second; scaling and the
// kubeconfig download go through a confirmation and act as alice (the
// kubeconfig works with kubectl); the mode switch shows its check-only
// report first; logout ends the session; forged and expired cookies get
// the login page.
//
// APIARY_DASHBOARD_SCREENSHOTS=DIR saves the pages as PNGs in DIR
// (docs/images holds the ones the docs show).
func TestDashboardInABrowser(t *testing.T) {
	e := environment(t)
	const team, other = "browser-team", "browser-other"
	e.namespace(t, team)
	e.namespace(t, other)
	web := e.tenant(t, team, "web", apiaryv1alpha1.TenantControlPlaneStatus{Phase: apiaryv1alpha1.PhaseReady, Conditions: readyConditions(),
		Version: "v1.37.2", Mode: apiaryv1alpha1.ModeStandalone, Endpoint: "https://192.0.2.10:6443", Replicas: 2, ReadyReplicas: 2,
		Certificates: []apiaryv1alpha1.CertificateStatus{
			{Name: "ca", Secret: "web-ca", NotAfter: metav1.NewTime(time.Now().Add(10 * 365 * 24 * time.Hour))},
			{Name: "apiserver", Secret: "web-apiserver", NotAfter: metav1.NewTime(time.Now().Add(365 * 24 * time.Hour)), RenewAt: ptrTime(time.Now().Add(335 * 24 * time.Hour))},
		}})
	for _, n := range []string{"db", "cache"} {
		e.tenant(t, team, n, apiaryv1alpha1.TenantControlPlaneStatus{Phase: apiaryv1alpha1.PhaseReady, Conditions: readyConditions(), Version: "v1.37.2", Replicas: 2, ReadyReplicas: 2})
	}
	e.tenant(t, other, "secret-project", apiaryv1alpha1.TenantControlPlaneStatus{Phase: apiaryv1alpha1.PhaseReady, Conditions: readyConditions()})
	ctx := t.Context()
	// The kubeconfig the operator would have written: here it reaches the
	// test's own kube-apiserver, so kubectl can prove the download works.
	kubeSecret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: team, Name: web.AdminKubeconfigSecretName()},
		Data: map[string][]byte{apiaryv1alpha1.KubeconfigKey: e.kubeconfig}}
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "tenant-operators", Namespace: team}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{apiaryv1alpha1.GroupVersion.Group}, Resources: []string{"tenantcontrolplanes"}, Verbs: []string{"get", "list", "watch", "patch"}},
		{APIGroups: []string{apiaryv1alpha1.GroupVersion.Group}, Resources: []string{"tenantcontrolplanes/scale"}, Verbs: []string{"patch"}},
		{APIGroups: []string{apiaryv1alpha1.GroupVersion.Group}, Resources: []string{"hosts"}, Verbs: []string{"list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"secrets"}, ResourceNames: []string{kubeSecret.Name}, Verbs: []string{"get"}},
	}}
	for _, o := range []client.Object{kubeSecret, role,
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "team", Namespace: team},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.GroupKind, Name: "oidc:team-a"}}},
		&corev1.Event{ObjectMeta: metav1.ObjectMeta{Namespace: team, Name: "web.1"},
			InvolvedObject: corev1.ObjectReference{Kind: "TenantControlPlane", Namespace: team, Name: "web", APIVersion: apiaryv1alpha1.GroupVersion.String()},
			Type:           corev1.EventTypeNormal, Reason: "CertificatesIssued", Message: "issued 9 certificates", Count: 1,
			LastTimestamp: metav1.Now(), Source: corev1.EventSource{Component: "apiary-operator"}},
	} {
		if err := e.client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}

	// A Host of web's, whose journal carries what its owner wrote (a
	// step's output is the host's): markup, which must stay text.
	host := &apiaryv1alpha1.Host{ObjectMeta: metav1.ObjectMeta{Namespace: team, Name: "web-worker-1"},
		Spec: apiaryv1alpha1.HostSpec{TenantControlPlane: "web", Address: "192.0.2.21", SSHKeySecretRef: corev1.LocalObjectReference{Name: "ssh"}, InsecureSkipHostKeyCheck: true}}
	if err := e.client.Create(ctx, host); err != nil {
		t.Fatal(err)
	}
	host.Status = apiaryv1alpha1.HostStatus{Phase: apiaryv1alpha1.HostPhaseFailed, Journal: []apiaryv1alpha1.HostStep{
		{Name: "preflight", Started: metav1.Now(), Result: apiaryv1alpha1.HostStepFailed, Message: hostileMarkup}}}
	if err := e.client.Status().Update(ctx, host); err != nil {
		t.Fatal(err)
	}

	// A DataStore short of members, which alice's team may see (a
	// ClusterRole: DataStores are cluster-scoped).
	ds := &apiaryv1alpha1.DataStore{ObjectMeta: metav1.ObjectMeta{Name: "browser-shared"},
		Spec: apiaryv1alpha1.DataStoreSpec{Managed: &apiaryv1alpha1.ManagedEtcd{Replicas: 3, Namespace: team}}}
	if err := e.client.Create(ctx, ds); err != nil {
		t.Fatal(err)
	}
	ds.Status = apiaryv1alpha1.DataStoreStatus{ReadyMembers: 1, Tenants: 4, Conditions: []metav1.Condition{{Type: apiaryv1alpha1.ConditionReady,
		Status: metav1.ConditionFalse, Reason: "MembersNotReady", Message: "1 of 3 members ready", LastTransitionTime: metav1.Now()}}}
	if err := e.client.Status().Update(ctx, ds); err != nil {
		t.Fatal(err)
	}
	for _, o := range []client.Object{
		&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "browser-read-datastores"},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{apiaryv1alpha1.GroupVersion.Group}, Resources: []string{"datastores"}, Verbs: []string{"list", "watch"}}}},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "browser-read-datastores"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "browser-read-datastores"},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.GroupKind, Name: "oidc:team-a"}}},
	} {
		if err := e.client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}

	d := startSignedInDashboard(t, e)
	downloads := t.TempDir()
	b := browsertest.Start(t, downloads, d.serving.Cert, d.provider.Certificate())
	shots := os.Getenv("APIARY_DASHBOARD_SCREENSHOTS")
	shot := func(name string) {
		t.Helper()
		if shots == "" {
			return
		}
		png, err := chromedp.Run(b, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(shots, name), png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	run := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		c, cancel := context.WithTimeout(b, 20*time.Second)
		defer cancel()
		if err := chromedp.Do(c, steps...); err != nil {
			c, cancel := context.WithTimeout(b, 5*time.Second)
			defer cancel()
			url, _ := chromedp.Run(c, chromedp.Location())
			page, _ := chromedp.Run(c, chromedp.Evaluate[string](`document.body ? document.body.innerText : ""`))
			t.Fatalf("%s (at %s, showing %q): %v", what, url, page, err)
		}
	}
	waitText := func(sel, want string) time.Duration {
		t.Helper()
		took, err := browsertest.WaitText(b, sel, want, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return took
	}
	location := func() string {
		c, cancel := context.WithTimeout(b, 5*time.Second)
		defer cancel()
		url, err := chromedp.Run(c, chromedp.Location())
		if err != nil {
			t.Fatal(err)
		}
		return url
	}
	providerLogin := func(what string) {
		t.Helper()
		run(what+": the provider's login form", chromedp.WaitVisible(chromedp.ID("username")))
		if at := location(); !strings.HasPrefix(at, d.provider.URL) {
			t.Fatalf("%s: at %s, want the provider's login page", what, at)
		}
	}

	// Unauthenticated: the provider's login page, then back where alice
	// was going once she signed in.
	run("open the overview", chromedp.Navigate(d.url+"/?namespace="+team))
	providerLogin("before sign-in")
	run("sign in", chromedp.SendKeys(chromedp.ID("username"), "alice"), chromedp.SendKeys(chromedp.ID("password"), "alice-pw"),
		chromedp.Submit(chromedp.ID("password")))
	waitText("header .who", "signed in as oidc:alice@example.test")
	waitText("#counts", "3 tenants: 3 Ready")
	waitText("#tenants tbody", "web")
	if body, _ := browsertest.Text(b, "#tenants tbody"); strings.Contains(body, "secret-project") {
		t.Errorf("alice's overview shows the other team's tenant: %q", body)
	}
	// Beside the tenants: the DataStore short of members first, and the
	// namespace's failing Host with a link to its tenant.
	waitText("#datastores tbody tr.attention", "browser-shared")
	waitText("#datastores tbody", "1/3")
	waitText("#datastores tbody", "1 of 3 members ready")
	waitText("#host-counts", "1 hosts: 1 Failed")
	waitText("#hosts tbody tr.attention", "web-worker-1")
	shot("dashboard-overview.png")

	// The DataStore's page, live: its members coming back show at once.
	run("open the DataStore", chromedp.Click(chromedp.CSS(`#datastores a[href="/datastores/browser-shared"]`)))
	waitText("#summary", "1 ready of 3")
	waitText("#conditions tr.attention", "MembersNotReady")
	ds.Status.ReadyMembers = 3
	meta.SetStatusCondition(&ds.Status.Conditions, metav1.Condition{Type: apiaryv1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: "MembersReady", Message: "3 of 3 members ready"})
	if err := e.client.Status().Update(ctx, ds); err != nil {
		t.Fatal(err)
	}
	waitText("#summary", "3 ready of 3")
	waitText("#conditions", "MembersReady")
	// The Host's page: its journal, the owner's markup as text.
	run("back to the overview", chromedp.Navigate(d.url+"/?namespace="+team))
	run("open the Host", chromedp.WaitVisible(chromedp.CSS(`#hosts a[href="/hosts/`+team+`/web-worker-1"]`)),
		chromedp.Click(chromedp.CSS(`#hosts a[href="/hosts/`+team+`/web-worker-1"]`)))
	waitText("#summary", "192.0.2.21")
	waitText("#journal", hostileMarkup)
	if n, err := chromedp.Run(b, chromedp.Evaluate[int](`document.querySelectorAll("main img, main b").length`)); err != nil || n != 0 {
		t.Errorf("the Host page made %d elements of its journal (%v), want its text", n, err)
	}
	run("back to the overview", chromedp.Navigate(d.url+"/?namespace="+team))
	waitText("#counts", "3 tenants: 3 Ready")

	// The other namespace: refused by the API server, and the page says so.
	run("ask for the other namespace", chromedp.SetValue(chromedp.ID("namespace"), other), chromedp.Submit(chromedp.ID("namespace")))
	waitText("#status", "forbidden")
	waitText("#hosts-unavailable", "Not shown")
	if body, _ := browsertest.Text(b, "#tenants tbody"); body != "" {
		t.Errorf("the overview of %s shows %q, want nothing", other, body)
	}
	// Without a namespace: alice may not list every namespace's tenants.
	run("ask for all namespaces", browsertest.SetValue("#namespace", ""), chromedp.Submit(chromedp.ID("namespace")))
	waitText("#status", "choose a namespace you may read")
	// Nor can she read the other team's tenant page by its address.
	run("open the other team's tenant", chromedp.Navigate(d.url+"/tenants/"+other+"/secret-project"))
	waitText("#status", "reconnecting")
	if s, _ := browsertest.Text(b, "#summary"); s != "" {
		t.Errorf("the other team's tenant page shows %q", s)
	}

	// The tenant page, live.
	run("open the overview", chromedp.Navigate(d.url+"/?namespace="+team))
	run("open tenant web", chromedp.WaitVisible(chromedp.CSS(`a[href="/tenants/`+team+`/web"]`)), chromedp.Click(chromedp.CSS(`a[href="/tenants/`+team+`/web"]`)))
	waitText("#summary", "https://192.0.2.10:6443")
	waitText("#conditions", "the tenant API answers")
	waitText("#certificates", "web-apiserver")
	waitText("#events", "issued 9 certificates")
	waitText("#hosts", "web-worker-1")
	run("open the host's journal", chromedp.Click(chromedp.CSS("#hosts summary")))
	waitText("#hosts", hostileMarkup)
	if n, err := chromedp.Run(b, chromedp.Evaluate[int](`document.querySelectorAll("main img, main b").length`)); err != nil || n != 0 {
		t.Errorf("a Host's journal became %d elements of the page (%v), want its text", n, err)
	}
	if title, _ := chromedp.Run(b, chromedp.Evaluate[string](`document.title`)); title == "pwned" {
		t.Error("a Host's journal ran script in the page")
	}
	shot("dashboard-tenant.png")

	var tcp apiaryv1alpha1.TenantControlPlane
	if err := e.client.Get(ctx, client.ObjectKeyFromObject(web), &tcp); err != nil {
		t.Fatal(err)
	}
	meta.SetStatusCondition(&tcp.Status.Conditions, metav1.Condition{Type: apiaryv1alpha1.ConditionDataStoreReady, Status: metav1.ConditionFalse, Reason: "Unreachable", Message: "dial tcp 10.0.0.5:2379: connection refused"})
	written := time.Now()
	if err := e.client.Status().Update(ctx, &tcp); err != nil {
		t.Fatal(err)
	}
	waitText("#conditions tr.attention", "connection refused")
	shown := time.Since(written)
	if shown > time.Second {
		t.Errorf("the condition showed %s after its write, want within 1s", shown)
	}
	t.Logf("FIGURE a condition written to the API showed on the tenant page after %s", shown.Round(time.Millisecond))

	spec := func() (replicas int32, mode apiaryv1alpha1.Mode) {
		t.Helper()
		var got apiaryv1alpha1.TenantControlPlane
		if err := e.client.Get(ctx, client.ObjectKeyFromObject(web), &got); err != nil {
			t.Fatal(err)
		}
		return *got.Spec.Replicas, got.Spec.Mode
	}
	// Scale: cancelled changes nothing; confirmed scales as alice; a
	// count the API refuses shows the API's rule.
	run("scale, then cancel", browsertest.SetValue("#replicas", "3"), chromedp.Click(chromedp.ID("scale")),
		chromedp.WaitVisible(chromedp.ID("confirm")))
	waitText("#confirm-title", "from 2 to 3 replicas")
	run("cancel", chromedp.Click(chromedp.ID("confirm-cancel")), chromedp.WaitNotVisible(chromedp.ID("confirm")))
	time.Sleep(300 * time.Millisecond)
	if n, _ := spec(); n != 2 {
		t.Fatalf("after a cancelled scale: spec.replicas %d, want 2", n)
	}
	run("scale, then confirm", browsertest.SetValue("#replicas", "3"), chromedp.Click(chromedp.ID("scale")),
		chromedp.WaitVisible(chromedp.ID("confirm-ok")), chromedp.Click(chromedp.ID("confirm-ok")))
	waitText("#action-result", "scaled "+team+"/web to 3 replicas")
	if n, _ := spec(); n != 3 {
		t.Fatalf("after the confirmed scale: spec.replicas %d, want 3", n)
	}
	waitText("#summary", "desired 3")
	run("scale beyond the API's maximum", browsertest.SetValue("#replicas", "8"), chromedp.Click(chromedp.ID("scale")),
		chromedp.WaitVisible(chromedp.ID("confirm-ok")), chromedp.Click(chromedp.ID("confirm-ok")))
	waitText("#action-result", "not scaled")
	waitText("#action-result", "spec.replicas")
	if n, _ := spec(); n != 3 {
		t.Fatalf("after a refused scale: spec.replicas %d, want 3", n)
	}

	// The kubeconfig: downloaded after a confirmation, and kubectl uses it.
	run("download the kubeconfig", chromedp.Click(chromedp.ID("download")), chromedp.WaitVisible(chromedp.ID("confirm-ok")),
		chromedp.Click(chromedp.ID("confirm-ok")))
	file := filepath.Join(downloads, team+"-web.kubeconfig")
	testenv.Eventually(t, "the downloaded kubeconfig", 10*time.Second, func() error {
		_, err := os.Stat(file)
		return err
	})
	kubectl, err := testenv.KubeBinary("kubectl")
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(ctx, kubectl, "--kubeconfig", file, "get", "namespace", team, "-o", "name").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "namespace/"+team {
		t.Fatalf("kubectl with the downloaded kubeconfig: %v: %s", err, out)
	}

	// The mode switch: the check-only report comes first; with a check
	// failed (no DataStore bound) there is nothing to confirm.
	run("check a switch", chromedp.Click(chromedp.ID("switch")), chromedp.WaitVisible(chromedp.ID("confirm")))
	waitText("#confirm-title", "to registered")
	waitText("#confirm-body", "✗")
	waitText("#confirm-body", "not bound to a DataStore")
	shot("dashboard-switch-check.png")
	if okHidden, err := chromedp.Run(b, chromedp.Evaluate[bool](`document.getElementById("confirm-ok").hidden`)); err != nil || !okHidden {
		t.Error("a switch whose checks failed offers to switch")
	}
	run("close the report", chromedp.Click(chromedp.ID("confirm-cancel")), chromedp.WaitNotVisible(chromedp.ID("confirm")))
	if _, mode := spec(); mode != apiaryv1alpha1.ModeStandalone {
		t.Fatalf("after the check: spec.mode %s, want standalone", mode)
	}

	// Logout ends the session: the pages need a sign-in again.
	run("log out", chromedp.Click(chromedp.CSS("header form button")))
	waitText("#signed-out", "signed out")
	run("open the overview again", chromedp.Navigate(d.url+"/"))
	providerLogin("the overview after logout")
	run("back from the provider", chromedp.Navigate(d.url+"/api/tenants/stream?namespace="+team))
	if body, _ := browsertest.Text(b, "body"); !strings.Contains(body, "no session") {
		t.Errorf("the stream after logout: %q, want a refusal", body)
	}

	// A forged cookie and an expired one: the login page again.
	expired := d.cookie(t, time.Second)
	time.Sleep(1500 * time.Millisecond)
	for what, value := range map[string]string{"forged": "MTczMzU1fGZvcmdlZHxub3QtYS1tYWM=", "expired": expired} {
		if _, err := chromedp.Call(b, network.SetCookie, network.SetCookieParams{Name: session.CookieName, Value: value, URL: d.url + "/",
			Secure: ptr.To(true), HTTPOnly: ptr.To(true)}); err != nil {
			t.Fatal(err)
		}
		run("open the overview with a "+what+" cookie", chromedp.Navigate(d.url+"/?namespace="+team))
		providerLogin("with a " + what + " cookie")
	}
}

// signedInDashboard is `apiary dashboard` serving signed-in users, with a
// real OpenID provider (alice, password alice-pw, group team-a).
type signedInDashboard struct {
	url      string
	ca       *pki.KeyPair // the CA of its serving certificate
	serving  *pki.KeyPair // its serving certificate
	provider *httptest.Server
	hashKey  []byte
	blockKey []byte
}

func startSignedInDashboard(t *testing.T, e *testEnv) *signedInDashboard {
	t.Helper()
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	ca, err := pki.NewCA("dashboard-ca")
	if err != nil {
		t.Fatal(err)
	}
	serving, err := ca.Sign(pki.Request{CommonName: "dashboard", IPs: []net.IP{net.ParseIP("127.0.0.1")}, Usages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	if err != nil {
		t.Fatal(err)
	}
	key, _ := serving.KeyPEM()
	port := freePort(t)
	d := &signedInDashboard{url: "https://127.0.0.1:" + port, ca: ca, serving: serving, hashKey: bytes.Repeat([]byte{3}, 32), blockKey: bytes.Repeat([]byte{5}, 32)}
	redirect := d.url + signin.CallbackPath
	d.provider = httptest.NewUnstartedServer(nil)
	d.provider.StartTLS()
	t.Cleanup(d.provider.Close)
	p, err := testoidc.New(testoidc.Config{Issuer: d.provider.URL,
		Clients: []testoidc.Client{{ID: "dashboard", Secret: "s3cret", RedirectURIs: []string{redirect}}},
		Users:   []testoidc.User{{Username: "alice", Password: "alice-pw", Email: "alice@example.test", Groups: []string{"team-a"}}}})
	if err != nil {
		t.Fatal(err)
	}
	d.provider.Config.Handler = p
	ctx, cancel := context.WithCancel(context.Background())
	out, w := io.Pipe()
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"dashboard", "--listen", "127.0.0.1:" + port, "--kubeconfig", e.writeKubeconfig(t, e.kubeconfig, ""),
			"--tls-cert-file", write("tls.crt", serving.CertPEM()), "--tls-key-file", write("tls.key", key),
			"--session-hash-key-file", write("hash.key", d.hashKey), "--session-block-key-file", write("block.key", d.blockKey),
			"--issuer", d.provider.URL, "--issuer-ca-file", write("idp-ca.crt", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: d.provider.Certificate().Raw})),
			"--client-id", "dashboard", "--client-secret-file", write("secret", []byte("s3cret\n")), "--redirect-url", redirect}, w, io.Discard)
		_ = w.Close()
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case code := <-done:
			if code != 0 {
				t.Errorf("the dashboard stopped with exit %d", code)
			}
		case <-time.After(10 * time.Second):
			t.Error("the dashboard did not stop with its context")
		}
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.Contains(line, d.url+"/") {
		t.Fatalf("printed %q (%v), want the dashboard's address", line, err)
	}
	go func() { _, _ = io.Copy(io.Discard, out) }()
	return d
}

// cookie is a genuine session cookie of alice's, made with the
// dashboard's own keys, lasting ttl.
func (d *signedInDashboard) cookie(t *testing.T, ttl time.Duration) string {
	t.Helper()
	store, err := session.NewStore(d.hashKey, d.blockKey, ttl)
	if err != nil {
		t.Fatal(err)
	}
	s, err := store.New("oidc:alice@example.test", []string{"oidc:team-a"})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	if err := store.Write(rec, s); err != nil {
		t.Fatal(err)
	}
	for _, c := range (&http.Response{Header: rec.Header()}).Cookies() {
		if c.Name == session.CookieName {
			return c.Value
		}
	}
	t.Fatal("no session cookie written")
	return ""
}

func ptrTime(t time.Time) *metav1.Time { m := metav1.NewTime(t); return &m }

// hostileMarkup is what a tenant admin might write where the dashboard
// shows it: the page must show it as text, not run it.
const hostileMarkup = `<img src=x onerror="document.title='pwned'"><b>bold</b>`
