//go:build e2e

package e2e

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/apiaryhq/apiary/e2e/framework"
	"github.com/apiaryhq/apiary/internal/browsertest"
	"github.com/apiaryhq/apiary/internal/testenv"
	"github.com/apiaryhq/apiary/internal/testoidc"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/pki"
)

// The chart's dashboard, in the management cluster, signing users in with
// a real OpenID provider, driven by headless Chromium: alice (group
// team-a, bound in the tenants' namespace) signs in through the
// provider's form, sees tenant alpha live, scales it from the page and
// watches the real pods come and the page follow, downloads its
// kubeconfig and uses it, and logs out.
func (e *env) testDashboardInTheCluster(t *testing.T) {
	onLoopback(t)
	ca, err := pki.NewCA("e2e-dashboard")
	if err != nil {
		t.Fatal(err)
	}
	_, portText, _ := net.SplitHostPort(freeLoopbackAddress(t))
	local, _ := strconv.Atoi(portText)
	url := "https://127.0.0.1:" + portText
	issuer := oidcProviderFor(t, ca, 8445, testoidc.Client{ID: "dashboard", Secret: "dashboard-s3cret", RedirectURIs: []string{url + "/callback"}})

	// What the chart needs before it runs the dashboard: its serving
	// certificate, the session keys, the client secret, the provider's CA.
	serving, err := ca.Sign(pki.Request{CommonName: "apiary-dashboard", IPs: []net.IP{net.ParseIP("127.0.0.1")}, Usages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	if err != nil {
		t.Fatal(err)
	}
	key, err := serving.KeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	random := func() []byte {
		b := make([]byte, 32)
		_, _ = rand.Read(b)
		return b
	}
	ns := framework.SystemNS
	objs := []client.Object{
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "e2e-dashboard-tls"}, Type: corev1.SecretTypeTLS,
			Data: map[string][]byte{corev1.TLSCertKey: serving.CertPEM(), corev1.TLSPrivateKeyKey: key}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "e2e-dashboard-session"},
			Data: map[string][]byte{"hash.key": random(), "block.key": random()}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "e2e-dashboard-oidc"},
			Data: map[string][]byte{"client-secret": []byte("dashboard-s3cret")}},
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "e2e-dashboard-issuer-ca"},
			Data: map[string]string{"ca.crt": string(ca.CertPEM())}},
	}
	// alice's rights on the tenants' namespace: what docs/dashboard.md
	// lists for the dashboard's actions.
	tcp := e.TCP(t, "alpha")
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: framework.TenantsNS, Name: "e2e-dashboard-team-a"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{apiary.GroupVersion.Group}, Resources: []string{"tenantcontrolplanes"}, Verbs: []string{"get", "list", "watch", "patch"}},
		{APIGroups: []string{apiary.GroupVersion.Group}, Resources: []string{"tenantcontrolplanes/scale"}, Verbs: []string{"patch"}},
		{APIGroups: []string{apiary.GroupVersion.Group}, Resources: []string{"hosts"}, Verbs: []string{"list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"secrets"}, ResourceNames: []string{tcp.Status.KubeconfigSecret}, Verbs: []string{"get"}},
	}}
	objs = append(objs, role, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: framework.TenantsNS, Name: role.Name},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: "oidc:team-a"}}})
	for _, o := range objs {
		if err := e.C.Create(e.Ctx, o); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.C.Delete(context.Background(), o) })
	}

	// The chart, as a user turns the dashboard on.
	chart := filepath.Join(testenv.RepoRoot(), "charts", "apiary")
	dashboard := func(on bool, more ...string) {
		t.Helper()
		args := []string{"upgrade", framework.Release, chart, "--namespace", ns, "--reuse-values", "--set", fmt.Sprintf("dashboard.enabled=%t", on)}
		e.Helm(append(args, more...)...)
	}
	start := time.Now()
	dashboard(true, "--set", "dashboard.tlsSecretName=e2e-dashboard-tls,dashboard.sessionSecretName=e2e-dashboard-session",
		"--set", "dashboard.oidc.issuer="+issuer+",dashboard.oidc.clientID=dashboard,dashboard.oidc.clientSecretName=e2e-dashboard-oidc",
		"--set", "dashboard.oidc.redirectURL="+url+"/callback,dashboard.oidc.issuerCAConfigMap=e2e-dashboard-issuer-ca",
		"--wait", "--timeout", "3m")
	t.Cleanup(func() { dashboard(false) })
	framework.Eventually(t, "the dashboard Deployment available", 2*time.Minute, func() error {
		var d appsv1.Deployment
		if err := e.C.Get(e.Ctx, client.ObjectKey{Namespace: ns, Name: framework.Release + "-dashboard"}, &d); err != nil {
			return err
		}
		if d.Status.AvailableReplicas < 1 {
			return fmt.Errorf("%d of %d replicas available", d.Status.AvailableReplicas, *d.Spec.Replicas)
		}
		return nil
	})
	t.Logf("FIGURE the chart's dashboard available %s after helm upgrade began", time.Since(start).Round(time.Millisecond))
	e.portForwardTo(t, "deployment/"+framework.Release+"-dashboard", local, 8443)

	downloads := t.TempDir()
	b := browsertest.Start(t, downloads, serving.Cert, ca.Cert)
	run := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		c, cancel := context.WithTimeout(b, 30*time.Second)
		defer cancel()
		if err := chromedp.Do(c, steps...); err != nil {
			page, _ := browsertest.Text(b, "body")
			t.Fatalf("%s (showing %q): %v", what, page, err)
		}
	}
	waitText := func(sel, want string, timeout time.Duration) time.Duration {
		t.Helper()
		took, err := browsertest.WaitText(b, sel, want, timeout)
		if err != nil {
			t.Fatal(err)
		}
		return took
	}

	run("open the overview", chromedp.Navigate(url+"/?namespace="+framework.TenantsNS), chromedp.WaitVisible(chromedp.ID("username")))
	run("sign in at the provider", chromedp.SendKeys(chromedp.ID("username"), "alice"), chromedp.SendKeys(chromedp.ID("password"), "alice-pw"),
		chromedp.Submit(chromedp.ID("password")))
	waitText("header .who", "signed in as oidc:alice@example.test", 20*time.Second)
	waitText("#tenants tbody", "alpha", 20*time.Second)
	run("ask for the Apiary namespace", browsertest.SetValue("#namespace", framework.SystemNS), chromedp.Submit(chromedp.ID("namespace")))
	waitText("#status", "forbidden", 20*time.Second)

	// Scale alpha from its page: the real pods come, and the page follows.
	run("open alpha", chromedp.Navigate(url+"/tenants/"+framework.TenantsNS+"/alpha"))
	waitText("#summary", "2 ready of 2", 20*time.Second)
	run("scale to 3", browsertest.SetValue("#replicas", "3"), chromedp.Click(chromedp.ID("scale")),
		chromedp.WaitVisible(chromedp.ID("confirm-ok")), chromedp.Click(chromedp.ID("confirm-ok")))
	scaled := time.Now()
	waitText("#action-result", "to 3 replicas", 20*time.Second)
	waitText("#summary", "desired 3", 20*time.Second)
	waitText("#summary", "3 ready of 3", 3*time.Minute)
	t.Logf("FIGURE scaled 2→3 from the page: 3 ready on screen after %s", time.Since(scaled).Round(time.Millisecond))
	run("scale back to 2", browsertest.SetValue("#replicas", "2"), chromedp.Click(chromedp.ID("scale")),
		chromedp.WaitVisible(chromedp.ID("confirm-ok")), chromedp.Click(chromedp.ID("confirm-ok")))
	waitText("#summary", "2 ready of 2", 3*time.Minute)
	e.waitReplicas(t, "alpha", 2)

	// The downloaded kubeconfig reaches the tenant through its LoadBalancer.
	// Chromium drops requests in flight when the machine's interfaces
	// change (net::ERR_NETWORK_CHANGED), and the scale just added and
	// removed a pod's: a download lost that way is asked for again.
	file := filepath.Join(downloads, framework.TenantsNS+"-alpha.kubeconfig")
	framework.Eventually(t, "the downloaded kubeconfig", time.Minute, func() error {
		if _, err := os.Stat(file); err == nil {
			return nil
		}
		run("download the kubeconfig", chromedp.Click(chromedp.ID("download")), chromedp.WaitVisible(chromedp.ID("confirm-ok")),
			chromedp.Click(chromedp.ID("confirm-ok")))
		time.Sleep(5 * time.Second)
		_, err := os.Stat(file)
		return err
	})
	if got := framework.Kubectl(t, file, "get", "namespace", "kube-system", "-o", "name"); strings.TrimSpace(got) != "namespace/kube-system" {
		t.Errorf("kubectl with the downloaded kubeconfig: %q", got)
	}

	// Logout ends the session.
	run("log out", chromedp.Click(chromedp.CSS("header form button")))
	waitText("#signed-out", "signed out", 20*time.Second)
	run("open the overview again", chromedp.Navigate(url+"/"), chromedp.WaitVisible(chromedp.ID("username")))
}
