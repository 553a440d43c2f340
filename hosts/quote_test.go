package hosts

import (
	"os/exec"
	"strings"
	"testing"
)

// echoed runs printf '%s' <Quote(s)> in /bin/sh and returns what it printed.
func echoed(t testing.TB, s string) string {
	t.Helper()
	out, err := exec.Command("/bin/sh", "-c", "printf '%s' "+Quote(s)).Output()
	if err != nil {
		t.Fatalf("sh -c printf %s: %v", Quote(s), err)
	}
	return string(out)
}

// FuzzQuote: whatever the string, a real shell sees exactly one word, and
// that word is the string (no expansion, no command, no second word).
func FuzzQuote(f *testing.F) {
	for _, s := range []string{"", "plain", "a b", "it's", "'", `\`, "$(reboot)", "`id`", "a;reboot", "a|reboot", "a&&b", "*", "~", "$HOME", "a\nb", "'\\''", `"'"`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if strings.ContainsRune(s, 0) {
			return // no argument can hold NUL
		}
		if got := echoed(t, s); got != s {
			t.Fatalf("Quote(%q) = %s, the shell read %q", s, Quote(s), got)
		}
	})
}

func TestJoinRequestValidate(t *testing.T) {
	ok := JoinRequest{Endpoint: "192.0.2.10:6443", Token: "abcdef.0123456789abcdef", CACertHash: "sha256:" + strings.Repeat("a", 64), NodeName: "worker-1"}
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid request refused: %v", err)
	}
	for name, mutate := range map[string]func(*JoinRequest){
		"endpoint with a pipe":      func(r *JoinRequest) { r.Endpoint = "a|reboot:6443" },
		"endpoint without port":     func(r *JoinRequest) { r.Endpoint = "192.0.2.10" },
		"endpoint with a bad port":  func(r *JoinRequest) { r.Endpoint = "192.0.2.10:70000" },
		"endpoint with a subshell":  func(r *JoinRequest) { r.Endpoint = "$(reboot):6443" },
		"token with a space":        func(r *JoinRequest) { r.Token = "abcdef.0123456789abcde f" },
		"hash of another algorithm": func(r *JoinRequest) { r.CACertHash = "md5:" + strings.Repeat("a", 32) },
		"node name with a newline":  func(r *JoinRequest) { r.NodeName = "worker\nreboot" },
		"empty node name":           func(r *JoinRequest) { r.NodeName = "" },
	} {
		r := ok
		mutate(&r)
		if err := r.Validate(); err == nil {
			t.Errorf("%s: accepted %+v", name, r)
		}
	}
	// A DNS name and IPv6 endpoints are fine.
	for _, ep := range []string{"api.acme.example:443", "[2001:db8::1]:6443"} {
		r := ok
		r.Endpoint = ep
		if err := r.Validate(); err != nil {
			t.Errorf("%s: %v", ep, err)
		}
	}
}
