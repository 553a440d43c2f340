package hosts

import (
	"bufio"
	"context"
	"fmt"
	"strconv"
	"strings"
	"unicode"

	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

// PreflightScript reads what a kubelet needs from the host. It only reads:
// preflight must change nothing, so that a failure leaves the host as it
// was. Each line is key=value.
const PreflightScript = `
set -u
v() { printf '%s=%s\n' "$1" "$2"; }
v os "$(. /etc/os-release 2>/dev/null; echo "${PRETTY_NAME:-unknown}")"
v arch "$(uname -m)"
v kernel "$(uname -r)"
v init "$(cat /proc/1/comm 2>/dev/null)"
v systemctl "$(command -v systemctl >/dev/null 2>&1 && echo yes || echo no)"
v containerd_active "$(systemctl is-active containerd 2>/dev/null)"
v containerd_version "$(containerd --version 2>/dev/null | awk '{print $3}')"
v containerd_socket "$(test -S /run/containerd/containerd.sock && echo yes || echo no)"
v cri "$(ctr --address /run/containerd/containerd.sock plugins ls 2>/dev/null | awk '$1 == "io.containerd.grpc.v1" && $2 == "cri" {print $NF}')"
v swap "$(awk 'NR > 1' /proc/swaps 2>/dev/null | wc -l)"
v overlay "$(grep -qw overlay /proc/filesystems && echo yes || echo no)"
v br_netfilter "$(test -e /proc/sys/net/bridge/bridge-nf-call-iptables && echo yes || echo no)"
v iptables "$(command -v iptables >/dev/null 2>&1 && echo yes || echo no)"
for p in 10250 10256; do
  v "port_$p" "$( (ss -Hltn "sport = :$p" 2>/dev/null || netstat -ltn 2>/dev/null | awk -v p=":$p" '$4 ~ p"$"') | wc -l)"
done
v kubelet_running "$(pgrep -x kubelet >/dev/null 2>&1 && echo yes || echo no)"
v kubelet_conf "$(test -e /etc/kubernetes/kubelet.conf && echo yes || echo no)"
`

// PreflightReport is what preflight found.
type PreflightReport struct {
	Facts apiary.HostFacts
	// Problems each name one thing that stops a kubelet from running here
	// and how to fix it; empty means the host passed.
	Problems []string
}

// Preflight runs PreflightScript over the connection.
func Preflight(ctx context.Context, c *Client) (PreflightReport, error) {
	out, err := c.RunScript(ctx, PreflightScript)
	if err != nil {
		return PreflightReport{}, fmt.Errorf("preflight: %w", err)
	}
	return ParsePreflight(out), nil
}

// ParsePreflight turns the script's output into facts and problems.
func ParsePreflight(out string) PreflightReport {
	kv := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			kv[k] = strings.TrimSpace(v)
		}
	}
	// The host's owner writes this output: what goes into status (and onto
	// a terminal by apiary host list) is bounded and printable.
	for k, v := range kv {
		kv[k] = printable(v, maxFactLength)
	}
	r := PreflightReport{Facts: apiary.HostFacts{
		OS:     kv["os"],
		Arch:   normalizeArch(kv["arch"]),
		Kernel: kv["kernel"],
	}}
	if kv["containerd_version"] != "" {
		r.Facts.ContainerRuntime, r.Facts.ContainerRuntimeVersion = "containerd", kv["containerd_version"]
	}
	problem := func(format string, args ...any) { r.Problems = append(r.Problems, fmt.Sprintf(format, args...)) }

	if kv["init"] != "systemd" || kv["systemctl"] != "yes" {
		problem("PID 1 is %q, not systemd: the kubelet runs as a systemd service", kv["init"])
	}
	if r.Facts.Arch != "amd64" && r.Facts.Arch != "arm64" {
		problem("architecture %q is not supported (amd64 or arm64)", kv["arch"])
	}
	switch {
	case kv["containerd_active"] != "active":
		problem("containerd is not running (systemctl is-active containerd: %q): install and start containerd", kv["containerd_active"])
	case kv["containerd_socket"] != "yes":
		problem("containerd runs but /run/containerd/containerd.sock is missing")
	case kv["cri"] != "ok":
		problem("containerd's CRI v1 plugin is not serving (ctr plugins ls: %q): remove \"cri\" from disabled_plugins in /etc/containerd/config.toml and restart containerd", kv["cri"])
	}
	if n, _ := strconv.Atoi(kv["swap"]); n > 0 {
		problem("swap is on (%d device(s) in /proc/swaps): run swapoff -a and remove swap from /etc/fstab", n)
	}
	if kv["overlay"] != "yes" {
		problem("the overlay filesystem is not available: modprobe overlay (and list it in /etc/modules-load.d)")
	}
	if kv["br_netfilter"] != "yes" {
		problem("bridge netfilter is not available (/proc/sys/net/bridge missing): modprobe br_netfilter (and list it in /etc/modules-load.d)")
	}
	if kv["iptables"] != "yes" {
		problem("iptables is not installed: kube-proxy needs it")
	}
	for _, p := range []struct{ port, user string }{{"10250", "kubelet"}, {"10256", "kube-proxy health"}} {
		if n, _ := strconv.Atoi(kv["port_"+p.port]); n > 0 {
			problem("port %s (%s) is in use", p.port, p.user)
		}
	}
	if kv["kubelet_running"] == "yes" || kv["kubelet_conf"] == "yes" {
		problem("a kubelet already runs or is configured here (/etc/kubernetes/kubelet.conf): remove the host from its cluster (kubeadm reset -f) first")
	}
	return r
}

// maxFactLength bounds each value the host reports.
const maxFactLength = 128

// printable keeps the first n printable runes of s (no control characters,
// no terminal escapes) and marks a cut with "...".
func printable(s string, n int) string {
	var b strings.Builder
	count := 0
	for _, r := range s {
		if !unicode.IsPrint(r) {
			continue
		}
		if count == n {
			b.WriteString("...")
			break
		}
		b.WriteRune(r)
		count++
	}
	return b.String()
}

func normalizeArch(a string) string {
	switch a {
	case "x86_64", "amd64":
		return "amd64"
	case "aarch64", "arm64":
		return "arm64"
	}
	return a
}
