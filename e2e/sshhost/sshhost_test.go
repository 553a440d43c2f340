//go:build e2e

package sshhost_test

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"golang.org/x/crypto/ssh"

	"github.com/apiaryhq/apiary/e2e/sshhost"
)

const (
	network = "apiary-e2e-hosts"
	subnet  = "172.31.250.0/24"
	// probeRepo is pushed to the test's own registry and pulled by each
	// host's containerd as registry.k8s.io/<probeRepo>, through the mirror.
	probeRepo = "apiary-e2e/probe"
)

// TestSSHHosts starts two test hosts and checks what the SSH host agent will
// rely on: key-only root SSH with a pinned host key (a wrong pin fails),
// SFTP, systemd running, containerd answering with its CRI plugin, runc,
// iptables, the two hosts reaching each other, and the registry mirror
// pointing at an address of this machine (a registry the test serves on the
// machine's node IP, whose image a host's containerd pulls and runs with
// runc under systemd cgroups).
func TestSSHHosts(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("the sshhost e2e test runs dockerd and containers: run it as root")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()

	t0 := time.Now()
	d, err := sshhost.EnsureDocker(ctx)
	if err != nil {
		t.Fatal(err)
	}
	started := d.Started
	t.Logf("dockerd on %s (started here: %v) in %s; log %s", d.Socket, started, time.Since(t0).Round(time.Millisecond), d.LogFile)
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			if err := d.Stop(context.Background()); err != nil {
				t.Errorf("Stop: %v", err)
			}
		}
	})

	t0 = time.Now()
	image, err := d.EnsureImage(ctx, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("TIMING EnsureImage %s: %s", image, time.Since(t0).Round(100*time.Millisecond))

	if err := d.EnsureNetwork(ctx, network, subnet); err != nil {
		t.Fatal(err)
	}
	gw, err := d.Gateway(ctx, network)
	if err != nil {
		t.Fatal(err)
	}
	nodeIP, err := primaryIPv4()
	if err != nil {
		t.Fatal(err)
	}
	mirror := startRegistry(t, nodeIP, gw)
	t.Logf("network %s %s, gateway %s; test registry (mirror) %s", network, subnet, gw, mirror)

	var hosts []*sshhost.Host
	var starts []time.Duration
	for _, n := range []string{"apiary-e2e-host-0", "apiary-e2e-host-1"} {
		h, err := d.StartHost(ctx, sshhost.HostOptions{Name: n, Network: network, Image: image,
			RegistryMirror: "http://" + mirror})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("TIMING StartHost %s (%s, systemd %s %v): %s", h.Name, h.Address, h.SystemState, h.FailedUnits, h.StartupTime.Round(time.Millisecond))
		starts = append(starts, h.StartupTime)
		hosts = append(hosts, h)
	}
	slices.Sort(starts)
	t.Logf("TIMING StartHost p50 %s (of %d)", starts[(len(starts)-1)/2].Round(time.Millisecond), len(starts))
	if hosts[0].HostKeyAuthorized == hosts[1].HostKeyAuthorized {
		t.Errorf("both hosts have the host key %s", hosts[0].HostKeyAuthorized)
	}

	for _, h := range hosts {
		checkHost(ctx, t, d, h)
	}

	// The hosts reach each other: ICMP, and sshd's banner over TCP.
	for i, h := range hosts {
		peer := hosts[1-i]
		out, err := sshRun(h, "ping -c 1 -W 2 "+peer.Address)
		if err != nil {
			t.Errorf("%s: ping %s: %v: %s", h.Name, peer.Address, err, out)
		}
		out, err = sshRun(h, fmt.Sprintf("timeout 5 bash -c 'exec 3<>/dev/tcp/%s/22; head -c 8 <&3'", peer.Address))
		if err != nil || !strings.HasPrefix(out, "SSH-2.0") {
			t.Errorf("%s: dial %s:22: %v: %q", h.Name, peer.Address, err, out)
		}
		// No name resolution through Docker's DNS (127.0.0.11, replaced
		// by the machine's nameservers: CoreDNS would loop on it); a host
		// resolves its own name from /etc/hosts, as kubeadm needs.
		if out, err := sshRun(h, "getent hosts "+h.Name); err != nil || !strings.Contains(out, h.Address) {
			t.Errorf("%s: resolving its own name: %v: %q", h.Name, err, out)
		}
	}

	// The machine's addresses as a host sees them: the network's gateway
	// and the node IP of the local management cluster.
	ln, err := net.Listen("tcp", net.JoinHostPort(nodeIP, "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	for _, addr := range []string{nodeIP, gw} {
		out, err := sshRun(hosts[0], fmt.Sprintf("ping -c 1 -W 2 %s >/dev/null && echo icmp-ok", addr))
		t.Logf("%s -> %s ICMP: %v %s", hosts[0].Name, addr, err, strings.TrimSpace(out))
		if err != nil {
			t.Errorf("%s cannot ping the machine at %s: %v", hosts[0].Name, addr, err)
		}
	}
	if out, err := sshRun(hosts[0], fmt.Sprintf("timeout 5 bash -c 'exec 3<>/dev/tcp/%s/%d' && echo tcp-ok", nodeIP, port)); err != nil {
		t.Errorf("%s cannot dial the machine at %s:%d: %v: %s", hosts[0].Name, nodeIP, port, err, out)
	}

	for _, h := range hosts {
		if err := d.RemoveHost(ctx, h.Name); err != nil {
			t.Errorf("RemoveHost %s: %v", h.Name, err)
		}
		if out, err := exec.CommandContext(ctx, "/usr/bin/docker", "--host", "unix://"+d.Socket, "inspect", h.Name).CombinedOutput(); err == nil {
			t.Errorf("%s still exists after RemoveHost: %s", h.Name, out)
		}
	}
	stopped = true
	if err := d.Stop(ctx); err != nil {
		t.Errorf("Stop: %v", err)
	}
	if started {
		if pid := readPidFile(sshhost.DefaultPidFile); pid > 0 {
			if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
				t.Errorf("dockerd (pid %d) still runs after Stop", pid)
			}
		}
		out, _ := exec.CommandContext(ctx, "iptables-save").Output()
		for _, l := range strings.Split(string(out), "\n") {
			if strings.Contains(l, "DOCKER") {
				t.Errorf("iptables after Stop still has %q", l)
			}
		}
		if _, err := net.InterfaceByName("docker0"); err == nil {
			t.Error("docker0 exists (dockerd should run with --bridge=none)")
		}
	}
}

// checkHost runs the per-host checks over SSH.
func checkHost(ctx context.Context, t *testing.T, d *sshhost.Docker, h *sshhost.Host) {
	t.Helper()
	if h.Port != 22 || h.User != "root" || h.Address == "" {
		t.Errorf("%s: unexpected Host %+v", h.Name, *h)
	}
	// A wrong pinned host key fails the handshake.
	_, other, _ := ed25519.GenerateKey(rand.Reader)
	wrong, err := ssh.NewSignerFromKey(other)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := h.ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	cfg.HostKeyCallback = ssh.FixedHostKey(wrong.PublicKey())
	if c, err := ssh.Dial("tcp", net.JoinHostPort(h.Address, "22"), cfg); err == nil {
		c.Close()
		t.Errorf("%s: the handshake succeeded with a wrong pinned host key", h.Name)
	} else if !strings.Contains(err.Error(), "mismatch") {
		t.Errorf("%s: wrong pinned key: want a host key mismatch, got %v", h.Name, err)
	}
	// No password login for root; the client key is the only way in.
	pw := &ssh.ClientConfig{User: "root", Auth: []ssh.AuthMethod{ssh.Password("root")},
		HostKeyCallback: ssh.FixedHostKey(h.HostKey), HostKeyAlgorithms: []string{h.HostKey.Type()}, Timeout: 10 * time.Second}
	if c, err := ssh.Dial("tcp", net.JoinHostPort(h.Address, "22"), pw); err == nil {
		c.Close()
		t.Errorf("%s: password login accepted", h.Name)
	} else if !strings.Contains(err.Error(), "unable to authenticate") {
		t.Errorf("%s: password login: want an authentication failure, got %v", h.Name, err)
	}
	// The stock key set: rsa, ecdsa and ed25519, each offered.
	for _, typ := range []string{ssh.KeyAlgoRSASHA512, ssh.KeyAlgoECDSA256, ssh.KeyAlgoED25519} {
		var got ssh.PublicKey
		scan := &ssh.ClientConfig{User: "root", HostKeyAlgorithms: []string{typ}, Timeout: 10 * time.Second,
			HostKeyCallback: func(_ string, _ net.Addr, k ssh.PublicKey) error { got = k; return errors.New("scanned") }}
		_, _ = ssh.Dial("tcp", net.JoinHostPort(h.Address, "22"), scan)
		if got == nil {
			t.Errorf("%s: offers no %s host key", h.Name, typ)
		}
	}

	// The pinned key works, and the agent's SFTP subsystem is there.
	c, err := h.Dial()
	if err != nil {
		t.Fatalf("%s: ssh with the pinned key: %v", h.Name, err)
	}
	s, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.RequestSubsystem("sftp"); err != nil {
		t.Errorf("%s: sftp subsystem: %v", h.Name, err)
	}
	s.Close()
	c.Close()

	state, _ := sshRun(h, "systemctl is-system-running")
	state = strings.TrimSpace(state)
	switch state {
	case "running":
	case "degraded":
		failed, _ := sshRun(h, "systemctl list-units --failed --plain --no-legend --no-pager")
		t.Logf("%s: systemd degraded; failed units:\n%s", h.Name, failed)
		for _, u := range []string{"containerd", "ssh", "dbus", "apiary-ssh-hostkey"} {
			if strings.Contains(failed, u+".") {
				t.Errorf("%s: %s failed", h.Name, u)
			}
		}
	default:
		t.Errorf("%s: systemctl is-system-running: %q", h.Name, state)
	}
	must := func(cmd, want string) string {
		t.Helper()
		out, err := sshRun(h, cmd)
		if err != nil {
			t.Errorf("%s: %s: %v: %s", h.Name, cmd, err, out)
		} else if !strings.Contains(out, want) {
			t.Errorf("%s: %s: want %q in %q", h.Name, cmd, want, out)
		}
		return out
	}
	must("systemctl is-active containerd", "active")
	must("systemctl is-active ssh", "active")
	must("whoami", "root")
	out := must("ctr --address /run/containerd/containerd.sock version", "Version:  "+sshhost.ContainerdVersion)
	if strings.Count(out, sshhost.ContainerdVersion) < 2 {
		t.Errorf("%s: ctr version: want client and server %s: %s", h.Name, sshhost.ContainerdVersion, out)
	}
	// The CRI plugins loaded (the kubelet's runtime and image services).
	plugins := must("ctr plugins ls", "io.containerd.grpc.v1")
	for _, p := range []string{"cri", "images", "runtime"} {
		ok := false
		for _, l := range strings.Split(plugins, "\n") {
			f := strings.Fields(l)
			if len(f) >= 4 && strings.HasPrefix(f[0], "io.containerd.") && f[1] == p && f[len(f)-1] == "ok" {
				ok = true
			}
		}
		if !ok {
			t.Errorf("%s: containerd plugin %q not ok:\n%s", h.Name, p, plugins)
		}
	}
	must("containerd config dump", "restrict_oom_score_adj = true")
	must("runc --version", "runc version")
	must("iptables -L -n", "Chain INPUT")
	must("conntrack --version", "conntrack")
	must("sysctl -n net.ipv4.ip_forward", "1")
	must("sshd -T | grep -i -E '^(permitrootlogin|passwordauthentication)'", "permitrootlogin without-password")
	must("sshd -T | grep -i '^passwordauthentication'", "passwordauthentication no")
	must("cat /proc/1/comm", "systemd")
	// No loopback nameserver (Docker's 127.0.0.11 would make CoreDNS on
	// the host loop): this machine's upstream ones.
	must("grep -c '^nameserver' /etc/resolv.conf; grep -E '^nameserver (127\\.|::1)' /etc/resolv.conf || echo no-loopback", "no-loopback")
	// The mirror: registry.k8s.io images come from the test's registry
	// on the machine's node IP, then run with runc under systemd cgroups.
	ref := "registry.k8s.io/" + probeRepo + ":v1"
	must("ctr -n apiary-e2e images pull --hosts-dir /etc/containerd/certs.d "+ref+" >/dev/null && ctr -n apiary-e2e images ls -q", ref)
	// The image has no binary of its own: it runs the host's static ctr.
	must("ctr -n apiary-e2e run --rm --runc-systemd-cgroup --cgroup system.slice:apiary-e2e:probe"+
		" --mount type=bind,src=/usr/local/bin,dst=/x,options=rbind:ro "+ref+" probe /x/ctr --version",
		"ctr github.com/containerd/containerd/v2 "+sshhost.ContainerdVersion)
	_, _ = d.Exec(ctx, h.Name, "ctr", "-n", "apiary-e2e", "images", "rm", ref)
}

// sshRun runs a command over a fresh SSH connection and returns its
// combined output.
func sshRun(h *sshhost.Host, cmd string) (string, error) {
	c, err := h.Dial()
	if err != nil {
		return "", err
	}
	defer c.Close()
	s, err := c.NewSession()
	if err != nil {
		return "", err
	}
	defer s.Close()
	out, err := s.CombinedOutput(cmd)
	return string(out), err
}

// startRegistry serves an in-memory registry on the node IP and the
// gateway, pushes a one-layer probe image to it and returns the node IP
// listener's host:port.
func startRegistry(t *testing.T, nodeIP, gw string) string {
	t.Helper()
	h := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	var addr string
	for _, ip := range []string{nodeIP, gw} {
		ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
		if err != nil {
			t.Fatal(err)
		}
		srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		t.Cleanup(func() { srv.Close() })
		if addr == "" {
			addr = ln.Addr().String()
		}
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	content := []byte("apiary e2e probe\n")
	_ = tw.WriteHeader(&tar.Header{Name: "etc/", Typeflag: tar.TypeDir, Mode: 0o755})
	_ = tw.WriteHeader(&tar.Header{Name: "etc/probe", Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(content))})
	_, _ = tw.Write(content)
	_ = tw.Close()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf.Bytes())), nil })
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config.Cmd = []string{"/x/ctr", "--version"}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	ref, err := name.ParseReference(addr+"/"+probeRepo+":v1", name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		t.Fatalf("pushing the probe image to %s: %v", addr, err)
	}
	return addr
}

// primaryIPv4 is the address of the interface with the default route: the
// management cluster's node IP.
func primaryIPv4() (string, error) {
	f, err := os.Open("/proc/net/route")
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fl := strings.Fields(sc.Text())
		if len(fl) >= 8 && fl[1] == "00000000" && fl[7] == "00000000" {
			ifi, err := net.InterfaceByName(fl[0])
			if err != nil {
				return "", err
			}
			addrs, err := ifi.Addrs()
			if err != nil {
				return "", err
			}
			for _, a := range addrs {
				if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil {
					return ipn.IP.String(), nil
				}
			}
		}
	}
	return "", errors.New("no IPv4 default route")
}

func readPidFile(p string) int {
	b, err := os.ReadFile(p)
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return n
}
