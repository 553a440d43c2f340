package webhooks

import (
	"fmt"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation/field"

	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/operator/render"
)

// Every flag that carries the tenant boundary is refused in every spelling
// the components would read as that flag, with a message naming it.
func TestBoundaryFlagsRefusedInEverySpelling(t *testing.T) {
	flags := map[render.Component][]string{
		render.APIServer: {
			"etcd-servers", "etcd-servers-overrides", "etcd-prefix", "etcd-cafile", "etcd-compaction-interval",
			"egress-selector-config-file", "authorization-mode", "authorization-webhook-config-file",
			"authorization-config", "authentication-config", "anonymous-auth",
			"disable-admission-plugins", "admission-control-config-file", "requestheader-allowed-names",
			"requestheader-client-ca-file", "kubelet-certificate-authority", "kubelet-client-key",
			"bind-address", "secure-port", "advertise-address", "tls-cert-file", "client-ca-file",
			"token-auth-file", "proxy-client-cert-file", "service-account-signing-key-file",
			"service-account-key-file", "service-cluster-ip-range",
		},
		render.ControllerManager: {
			"kubeconfig", "authentication-kubeconfig", "authorization-kubeconfig", "bind-address",
			"secure-port", "cluster-signing-key-file", "service-account-private-key-file", "cluster-cidr",
			"master", "etcd-servers",
		},
		render.Scheduler: {"kubeconfig", "authentication-kubeconfig", "authorization-kubeconfig", "bind-address", "secure-port", "config", "master"},
	}
	for c, names := range flags {
		for _, name := range names {
			for _, spelling := range []string{name, "--" + name, "-" + name, name + "=x", strings.ReplaceAll(name, "-", "_"), strings.ToUpper(name), " " + name} {
				t.Run(fmt.Sprintf("%s/%s", c, spelling), func(t *testing.T) {
					tcp := withArgs(c, map[string]string{spelling: "x"})
					errs := Validate(tcp)
					p := fmt.Sprintf("spec.%s.extraArgs[%s]", c, spelling)
					if len(errs) != 1 || errs[0].Field != p || errs[0].Type != field.ErrorTypeForbidden || !strings.Contains(errs[0].Detail, "--"+name+" cannot be set in extraArgs") {
						t.Fatalf("want one Forbidden on %s naming --%s, got %v", p, name, errs)
					}
				})
			}
		}
	}
}

func withArgs(c render.Component, args map[string]string) *apiary.TenantControlPlane {
	return with(func(t *apiary.TenantControlPlane) {
		switch c {
		case render.APIServer:
			t.Spec.APIServer.ExtraArgs = args
		case render.ControllerManager:
			t.Spec.ControllerManager.ExtraArgs = args
		case render.Scheduler:
			t.Spec.Scheduler.ExtraArgs = args
		}
	})
}

func TestExtraArgsValues(t *testing.T) {
	tests := []struct {
		name   string
		c      render.Component
		args   map[string]string
		detail string // "" means accepted
	}{
		{"admission plugins added", render.APIServer, map[string]string{"enable-admission-plugins": "NodeRestriction,AlwaysPullImages"}, ""},
		{"admission plugins without NodeRestriction", render.APIServer, map[string]string{"enable-admission-plugins": "AlwaysPullImages"}, "must keep NodeRestriction"},
		{"feature gates added", render.APIServer, map[string]string{"feature-gates": "ListFromCacheSnapshot=false,MutatingAdmissionPolicy=true"}, ""},
		{"feature gates without the snapshot gate (Apiary appends it)", render.APIServer, map[string]string{"feature-gates": "MutatingAdmissionPolicy=true"}, ""},
		{"feature gates turning the snapshot gate on", render.APIServer, map[string]string{"feature-gates": "ListFromCacheSnapshot=true"}, "must keep ListFromCacheSnapshot=false"},
		{"feature gates turning it on after keeping it", render.APIServer, map[string]string{"feature-gates": "ListFromCacheSnapshot=false, ListFromCacheSnapshot = true"}, "must keep ListFromCacheSnapshot=false"},
		{"tunable default", render.APIServer, map[string]string{"profiling": "true", "allow-privileged": "false"}, ""},
		{"OIDC issuer URL", render.APIServer, map[string]string{"oidc-issuer-url": "https://issuer.example/realms/a", "oidc-client-id": "k"}, ""},
		{"path to the CA key", render.APIServer, map[string]string{"audit-policy-file": "/etc/kubernetes/pki/ca.key"}, "must not point into /etc/kubernetes"},
		{"path with dot segments", render.APIServer, map[string]string{"oidc-ca-file": "/etc//kubernetes/../kubernetes/pki/sa.key"}, "must not point into /etc/kubernetes"},
		{"path in a URL", render.APIServer, map[string]string{"audit-webhook-config-file": "file:///etc/kubernetes/controller-manager.conf"}, "must not point into /etc/kubernetes"},
		{"konnectivity socket", render.APIServer, map[string]string{"audit-log-path": "/run/konnectivity/konnectivity-server.socket"}, "must not point into /run/konnectivity"},
		{"path in a list", render.ControllerManager, map[string]string{"tls-sni-cert-key": "a,/etc/kubernetes/pki/ca.crt"}, "cannot be set"},
		{"line break", render.Scheduler, map[string]string{"v": "2\n--kubeconfig=/x"}, "must not contain NUL or line breaks"},
		{"other directory", render.APIServer, map[string]string{"audit-log-path": "/var/log/audit.log"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			errs := Validate(withArgs(tt.c, tt.args))
			switch {
			case tt.detail == "" && len(errs) > 0:
				t.Fatalf("refused: %v", errs)
			case tt.detail != "" && (len(errs) != 1 || !strings.Contains(errs[0].Error(), tt.detail)):
				t.Fatalf("want one error with %q, got %v", tt.detail, errs)
			}
		})
	}
}

// FuzzExtraArgs: whatever extraArgs validation accepts, every flag Apiary
// protects appears exactly once on the rendered command line, with Apiary's
// value.
func FuzzExtraArgs(f *testing.F) {
	for _, seed := range []struct {
		c    uint8
		k, v string
	}{
		{0, "etcd-servers", "https://other:2379"}, {0, "ETCD_PREFIX", "/"}, {0, "--authorization-mode=AlwaysAllow", ""},
		{0, "audit-log-maxage", "30"}, {0, "enable-admission-plugins", "NodeRestriction"}, {0, "oidc-ca-file", "/etc/kubernetes/pki/ca.crt"},
		{1, "kubeconfig", "/x"}, {1, "node-monitor-grace-period", "50s"}, {2, "v", "4"}, {2, "secure_port", "1"},
		{0, "feature-gates", "ListFromCacheSnapshot=true"}, {0, "feature-gates", "A=true,ListFromCacheSnapshot=false,ListFromCacheSnapshot=1"},
		{0, "egress-selector-config-file\x00", "x"}, {0, "tls-cert-file", "/etc/kubernetes/pki/apiserver.crt"},
	} {
		f.Add(seed.c, seed.k, seed.v)
	}
	f.Fuzz(func(t *testing.T, ci uint8, k, v string) {
		c := render.Components[int(ci)%len(render.Components)]
		tcp := withArgs(c, map[string]string{k: v})
		if errs := Validate(tcp); len(errs) > 0 {
			return
		}
		in := render.Inputs{TCP: tcp, Version: tcp.Spec.Version, Endpoint: render.Endpoint{Host: "192.0.2.10"}, EtcdServers: []string{"https://etcd:2379"}, EtcdPrefix: "/tenants/x"}
		args := render.Args(c, in)
		for name, value := range render.DefaultFlags(c, in) {
			if ProtectedFlag(c, name) == "" {
				continue
			}
			seen := 0
			for _, a := range args {
				if n, _, _ := strings.Cut(strings.TrimPrefix(a, "--"), "="); NormalizeFlagName(n) == name {
					seen++
					if a != "--"+name+"="+value {
						t.Fatalf("extraArgs {%q: %q} accepted, and --%s is %q, not Apiary's %q", k, v, name, a, value)
					}
				}
			}
			if seen != 1 {
				t.Fatalf("extraArgs {%q: %q} accepted, and --%s appears %d times", k, v, name, seen)
			}
		}
		// Pinned feature gates end as Apiary sets them, read last-wins.
		for _, a := range args {
			if gates, ok := strings.CutPrefix(a, "--feature-gates="); ok {
				if why := checkGates(c, gates); why != "" {
					t.Fatalf("extraArgs {%q: %q} accepted, and %s %s", k, v, a, why)
				}
			}
		}
	})
}
