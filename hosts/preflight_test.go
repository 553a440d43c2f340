package hosts

import (
	"strings"
	"testing"
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
