package hosts

import (
	"strings"
	"testing"
	"unicode"
)

const healthy = `os=Debian GNU/Linux 12 (bookworm)
arch=x86_64
kernel=6.1.0-test
init=systemd
systemctl=yes
containerd_active=active
containerd_version=v2.4.2
containerd_socket=yes
cri=ok
swap=0
overlay=yes
br_netfilter=yes
iptables=yes
port_10250=0
port_10256=0
kubelet_running=no
kubelet_conf=no
`

func TestPreflightHealthyHost(t *testing.T) {
	r := ParsePreflight(healthy)
	if len(r.Problems) != 0 {
		t.Fatalf("problems on a healthy host: %v", r.Problems)
	}
	f := r.Facts
	if f.Arch != "amd64" || f.OS != "Debian GNU/Linux 12 (bookworm)" || f.Kernel != "6.1.0-test" || f.ContainerRuntime != "containerd" || f.ContainerRuntimeVersion != "v2.4.2" {
		t.Fatalf("facts %+v", f)
	}
}

func TestPreflightNamesEachProblem(t *testing.T) {
	for _, tc := range []struct{ from, to, want string }{
		{"init=systemd", "init=bash", `PID 1 is "bash", not systemd`},
		{"arch=x86_64", "arch=riscv64", `architecture "riscv64" is not supported`},
		{"containerd_active=active", "containerd_active=inactive", "containerd is not running"},
		{"cri=ok", "cri=skip", "CRI v1 plugin is not serving"},
		{"swap=0", "swap=1", "swap is on"},
		{"br_netfilter=yes", "br_netfilter=no", "bridge netfilter"},
		{"port_10250=0", "port_10250=1", "port 10250 (kubelet) is in use"},
		{"kubelet_conf=no", "kubelet_conf=yes", "a kubelet already runs"},
		{"iptables=yes", "iptables=no", "iptables is not installed"},
	} {
		t.Run(tc.to, func(t *testing.T) {
			r := ParsePreflight(strings.Replace(healthy, tc.from+"\n", tc.to+"\n", 1))
			if len(r.Problems) != 1 || !strings.Contains(r.Problems[0], tc.want) {
				t.Fatalf("problems %q, want one naming %q", r.Problems, tc.want)
			}
		})
	}
}

func TestPreflightEmptyOutputFails(t *testing.T) {
	if r := ParsePreflight(""); len(r.Problems) == 0 {
		t.Fatal("a host that reported nothing passed")
	}
}

// FuzzParsePreflight: whatever a host prints, the report is bounded and
// printable (it goes into status and onto terminals), and names at most
// one problem per check.
func FuzzParsePreflight(f *testing.F) {
	f.Add(healthy)
	f.Add("os=\x1b]0;pwned\x07Debian\nkernel=" + strings.Repeat("k", 5000) + "\n")
	f.Add("")
	f.Fuzz(func(t *testing.T, out string) {
		r := ParsePreflight(out)
		for name, v := range map[string]string{"os": r.Facts.OS, "arch": r.Facts.Arch, "kernel": r.Facts.Kernel, "runtime version": r.Facts.ContainerRuntimeVersion} {
			if n := len([]rune(v)); n > maxFactLength+3 {
				t.Fatalf("%s is %d runes long", name, n)
			}
			for _, c := range v {
				if !unicode.IsPrint(c) {
					t.Fatalf("%s holds %U", name, c)
				}
			}
		}
		if len(r.Problems) > 12 {
			t.Fatalf("%d problems", len(r.Problems))
		}
		for _, p := range r.Problems {
			if len(p) > 1024 {
				t.Fatalf("problem of %d bytes", len(p))
			}
		}
	})
}
