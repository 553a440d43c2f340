package webhooks

import (
	"strings"
	"testing"

	"golang.org/x/crypto/ssh"
	corev1 "k8s.io/api/core/v1"

	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

const testHostKey = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGkFIQgU6NB5yvpTaBS/kPhbB2tkoTCJrpjF3Y8YttXr"

func validHost() *apiary.Host {
	return &apiary.Host{Spec: apiary.HostSpec{
		TenantControlPlane: "acme",
		Address:            "192.0.2.20",
		SSHKeySecretRef:    corev1.LocalObjectReference{Name: "ssh"},
		HostKey:            testHostKey,
	}}
}

func TestValidHost(t *testing.T) {
	if errs := ValidateHost(validHost()); len(errs) != 0 {
		t.Fatal(errs)
	}
	h := validHost()
	h.Spec.Address = "node-1.example.com"
	if errs := ValidateHost(h); len(errs) != 0 {
		t.Fatal(errs)
	}
}

func TestInvalidHosts(t *testing.T) {
	for _, tc := range []struct {
		name, want string
		mutate     func(*apiary.Host)
	}{
		{"host key", "spec.hostKey", func(h *apiary.Host) { h.Spec.HostKey = "ssh-ed25519 not-base64" }},
		{"address", "spec.address", func(h *apiary.Host) { h.Spec.Address = "under_score..bad" }},
		{"secret", "spec.sshKeySecretRef.name", func(h *apiary.Host) { h.Spec.SSHKeySecretRef.Name = "" }},
		{"label", "spec.labels", func(h *apiary.Host) { h.Spec.Labels = map[string]string{"bad key!": "x"} }},
		{"taint effect", "spec.taints[0].effect", func(h *apiary.Host) {
			h.Spec.Taints = []corev1.Taint{{Key: "dedicated", Value: "db", Effect: "Sometimes"}}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := validHost()
			tc.mutate(h)
			errs := ValidateHost(h)
			if len(errs) != 1 || !strings.Contains(errs[0].Error(), tc.want) {
				t.Fatalf("errors %v, want one naming %s", errs, tc.want)
			}
		})
	}
}

func TestInsecureHostKeyCheckWarns(t *testing.T) {
	h := validHost()
	h.Spec.HostKey, h.Spec.InsecureSkipHostKeyCheck = "", true
	if w := hostWarnings(h); len(w) != 1 || !strings.Contains(w[0], "insecureSkipHostKeyCheck") {
		t.Fatalf("warnings %v", w)
	}
}

// FuzzValidateHost: whatever host key and address a Host carries,
// validation answers (no panic), and what it accepts is a key
// golang.org/x/crypto/ssh parses and an address that is an IP or a DNS
// name without shell or line-breaking characters.
func FuzzValidateHost(f *testing.F) {
	f.Add(testHostKey, "192.0.2.20")
	f.Add("ssh-rsa AAAA", "node-1.example.com")
	f.Add("ssh-ed25519 "+strings.Repeat("A", 4000), "a;reboot")
	f.Add("", "::1")
	f.Fuzz(func(t *testing.T, key, address string) {
		h := validHost()
		h.Spec.HostKey, h.Spec.Address = key, address
		if errs := ValidateHost(h); len(errs) > 0 {
			return
		}
		// An empty key is the CRD's rule to refuse (or insecureSkipHostKeyCheck).
		if _, _, _, _, err := ssh.ParseAuthorizedKey([]byte(key)); key != "" && err != nil {
			t.Fatalf("host key %q accepted but does not parse: %v", key, err)
		}
		if strings.ContainsAny(address, " \t\n;|&$`'\"\\<>()") {
			t.Fatalf("address %q accepted", address)
		}
	})
}
