package server

import (
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/apiaryhq/apiary/dashboard/session"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

// The local dashboard acts with the user's kubeconfig and has no sign-in:
// only loopback host names reach it (DNS rebinding), and an action needs
// the token its pages carry (CSRF from any other site).
func TestLocalGuard(t *testing.T) {
	scheme, err := apiary.SchemeBuilder.Build()
	if err != nil {
		t.Fatal(err)
	}
	h, err := New(Options{Local: fake.NewClientBuilder().WithScheme(scheme).Build()})
	if err != nil {
		t.Fatal(err)
	}
	do := func(method, host, path, token, body string) (int, string) {
		t.Helper()
		r := httptest.NewRequest(method, path, strings.NewReader(body))
		r.Host = host
		if token != "" {
			r.Header.Set(session.CSRFHeader, token)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code, w.Body.String()
	}
	for _, host := range []string{"127.0.0.1:8080", "localhost:8080", "[::1]:8080", "127.0.0.1"} {
		if code, _ := do(http.MethodGet, host, "/", "", ""); code != http.StatusOK {
			t.Errorf("GET / on %s: %d, want 200", host, code)
		}
	}
	for _, host := range []string{"attacker.example:8080", "10.0.0.1:8080", "localhost.attacker.example", ""} {
		if code, body := do(http.MethodGet, host, "/", "", ""); code != http.StatusMisdirectedRequest || !strings.Contains(body, "loopback") {
			t.Errorf("GET / on %q: %d %q, want 421 naming loopback", host, code, body)
		}
	}
	_, page := do(http.MethodGet, "127.0.0.1:8080", "/", "", "")
	m := regexp.MustCompile(`<meta name="csrf-token" content="([^"]+)">`).FindStringSubmatch(page)
	if m == nil {
		t.Fatalf("the page carries no CSRF token: %s", page)
	}
	token := m[1]
	const mode = "/api/tenants/team-a/a/mode"
	for _, tc := range []struct {
		what, token, path, body string
		want                    int
	}{
		{"no token", "", mode, `{"target":"registered"}`, http.StatusForbidden},
		{"a wrong token", "x" + token, mode, `{"target":"registered"}`, http.StatusForbidden},
		{"a name that is no DNS label", token, "/api/tenants/team-a/A_B/mode", `{"target":"registered"}`, http.StatusBadRequest},
		{"a target that is no mode", token, mode, `{"target":"hosted"}`, http.StatusUnprocessableEntity},
		{"no body", token, "/api/tenants/team-a/a/scale", ``, http.StatusBadRequest},
		{"a tenant that does not exist", token, mode, `{"target":"registered"}`, http.StatusNotFound},
		{"no kubeconfig reader", token, "/api/tenants/team-a/a/kubeconfig", ``, http.StatusNotImplemented},
	} {
		if code, body := do(http.MethodPost, "127.0.0.1:8080", tc.path, tc.token, tc.body); code != tc.want {
			t.Errorf("%s: %d %q, want %d", tc.what, code, body, tc.want)
		}
	}
}
