package hosts

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/pkg/sftp"

	"golang.org/x/crypto/ssh"
)

// sshServer is a real SSH server (golang.org/x/crypto/ssh) on loopback that
// accepts one client key and answers "exec" requests by echoing stdin, so
// that the client's key handling is tested against the protocol itself.
type sshServer struct {
	addr    string
	hostKey ssh.PublicKey
}

func newKey(t *testing.T) (ssh.Signer, []byte) {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	block, err := ssh.MarshalPrivateKey(priv, "")
	if err != nil {
		t.Fatal(err)
	}
	return signer, pem.EncodeToMemory(block)
}

func startSSHServer(t *testing.T, authorized ssh.PublicKey) *sshServer {
	t.Helper()
	hostSigner, _ := newKey(t)
	return startSSHServerWith(t, authorized, serverOptions{hostKeys: []ssh.Signer{hostSigner}})
}

// serverOptions: the host keys the server has (all offered) and what an
// exec does (echo stdin unless endless, which writes output forever).
type serverOptions struct {
	hostKeys []ssh.Signer
	endless  bool
	// shell runs exec requests with /bin/sh on this machine.
	shell bool
	// sftp is how the sftp subsystem misbehaves: "stall-handshake" (never
	// answers), "stall-write" (answers, then never acknowledges a write),
	// or "local" (serves this machine's files).
	sftp string
}

// stockHostKeys are the rsa, ecdsa and ed25519 keys a stock Debian or
// Ubuntu sshd has.
func stockHostKeys(t *testing.T) []ssh.Signer {
	t.Helper()
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	ecKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ed, _ := newKey(t)
	var out []ssh.Signer
	for _, k := range []any{rsaKey, ecKey} {
		s, err := ssh.NewSignerFromKey(k)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	return append(out, ed)
}

func startSSHServerWith(t *testing.T, authorized ssh.PublicKey, o serverOptions) *sshServer {
	t.Helper()
	cfg := &ssh.ServerConfig{PublicKeyCallback: func(_ ssh.ConnMetadata, k ssh.PublicKey) (*ssh.Permissions, error) {
		if bytes.Equal(k.Marshal(), authorized.Marshal()) {
			return nil, nil
		}
		return nil, ssh.ErrNoAuth
	}}
	for _, k := range o.hostKeys {
		cfg.AddHostKey(k)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			go serveSSH(conn, cfg, o)
		}
	}()
	return &sshServer{addr: l.Addr().String(), hostKey: o.hostKeys[len(o.hostKeys)-1].PublicKey()}
}

// dialTestServer starts an SSH server with o (its host key made here) and
// returns a client connected to it with a fresh key, closed when the test
// ends.
func dialTestServer(t *testing.T, o serverOptions) *Client {
	t.Helper()
	client, clientPEM := newKey(t)
	host, _ := newKey(t)
	o.hostKeys = []ssh.Signer{host}
	srv := startSSHServerWith(t, client.PublicKey(), o)
	c, err := Dial(t.Context(), srv.target(t, clientPEM, host.PublicKey()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func serveSSH(conn net.Conn, cfg *ssh.ServerConfig, o serverOptions) {
	endless := o.endless
	_, chans, reqs, err := ssh.NewServerConn(conn, cfg)
	if err != nil {
		conn.Close()
		return
	}
	go ssh.DiscardRequests(reqs)
	for nc := range chans {
		if nc.ChannelType() == "direct-tcpip" && o.shell {
			// Port forwarding from "the host" (this machine), as sshd does.
			go forwardTCP(nc)
			continue
		}
		ch, creqs, err := nc.Accept()
		if err != nil {
			continue
		}
		go func() {
			defer ch.Close()
			for req := range creqs {
				if req.Type == "subsystem" && o.sftp != "" {
					_ = req.Reply(true, nil)
					serveStallingSFTP(ch, o.sftp)
					return
				}
				if req.Type != "exec" {
					_ = req.Reply(false, nil)
					continue
				}
				_ = req.Reply(true, nil)
				if endless {
					line := bytes.Repeat([]byte("y"), 64<<10)
					for {
						if _, err := ch.Write(line); err != nil {
							return
						}
					}
				}
				if o.shell {
					// Run the command here, as sshd would on a host.
					var payload struct{ Command string }
					_ = ssh.Unmarshal(req.Payload, &payload)
					cmd := exec.Command("/bin/sh", "-c", payload.Command)
					cmd.Stdin, cmd.Stdout, cmd.Stderr = ch, ch, ch.Stderr()
					status := uint32(0)
					if err := cmd.Run(); err != nil {
						status = 1
						var exit *exec.ExitError
						if errors.As(err, &exit) {
							status = uint32(exit.ExitCode())
						}
					}
					_, _ = ch.SendRequest("exit-status", false, ssh.Marshal(struct{ Status uint32 }{status}))
					return
				}
				var in bytes.Buffer
				_, _ = in.ReadFrom(ch)
				_, _ = ch.Write([]byte("ran:" + in.String()))
				_, _ = ch.SendRequest("exit-status", false, ssh.Marshal(struct{ Status uint32 }{0}))
				return
			}
		}()
	}
}

func (s *sshServer) target(t *testing.T, key []byte, hostKey ssh.PublicKey) Target {
	host, port, _ := net.SplitHostPort(s.addr)
	p, _ := strconv.Atoi(port)
	return Target{Address: host, Port: p, User: "root", PrivateKey: key,
		HostKey: string(ssh.MarshalAuthorizedKey(hostKey)), Timeout: 5 * time.Second}
}

func TestDialPinnedHostKey(t *testing.T) {
	client, clientPEM := newKey(t)
	srv := startSSHServer(t, client.PublicKey())
	ctx := context.Background()

	c, err := Dial(ctx, srv.target(t, clientPEM, srv.hostKey))
	if err != nil {
		t.Fatalf("pinned key: %v", err)
	}
	out, err := c.RunScript(ctx, "echo hello\n")
	c.Close()
	if err != nil || !strings.HasPrefix(out, "ran:") || !strings.HasSuffix(out, "echo hello\n") || !strings.Contains(out, "flock -n 9") {
		t.Fatalf("RunScript: %q, %v", out, err)
	}

	other, _ := newKey(t)
	_, err = Dial(ctx, srv.target(t, clientPEM, other.PublicKey()))
	if ReasonOf(err) != ReasonHostKeyMismatch || !strings.Contains(err.Error(), ssh.FingerprintSHA256(srv.hostKey)) {
		t.Fatalf("wrong pinned key: %v (reason %q)", err, ReasonOf(err))
	}

	_, wrongPEM := newKey(t)
	_, err = Dial(ctx, srv.target(t, wrongPEM, srv.hostKey))
	if ReasonOf(err) != ReasonAuthenticationFailed {
		t.Fatalf("wrong client key: %v (reason %q)", err, ReasonOf(err))
	}

	tgt := srv.target(t, clientPEM, srv.hostKey)
	tgt.HostKey = "ssh-ed25519 garbage"
	if _, err := Dial(ctx, tgt); ReasonOf(err) != ReasonInvalidHostKey {
		t.Fatalf("unparsable pinned key: %v", err)
	}
	tgt = srv.target(t, []byte("not a key"), srv.hostKey)
	if _, err := Dial(ctx, tgt); ReasonOf(err) != ReasonInvalidPrivateKey {
		t.Fatalf("unparsable private key: %v", err)
	}
}

func TestDialUnreachable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().(*net.TCPAddr)
	l.Close() // nothing listens there now
	_, clientPEM := newKey(t)
	hostKey, _ := newKey(t)
	_, err = Dial(context.Background(), Target{Address: "127.0.0.1", Port: addr.Port, PrivateKey: clientPEM,
		HostKey: string(ssh.MarshalAuthorizedKey(hostKey.PublicKey())), Timeout: 2 * time.Second})
	if ReasonOf(err) != ReasonUnreachable {
		t.Fatalf("closed port: %v", err)
	}
}

func TestScanHostKey(t *testing.T) {
	client, _ := newKey(t)
	srv := startSSHServer(t, client.PublicKey())
	host, port, _ := net.SplitHostPort(srv.addr)
	p, _ := strconv.Atoi(port)
	key, err := ScanHostKey(context.Background(), host, p, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(key.Marshal(), srv.hostKey.Marshal()) {
		t.Fatalf("scanned %s, server has %s", ssh.FingerprintSHA256(key), ssh.FingerprintSHA256(srv.hostKey))
	}
}

// A stock host offers rsa, ecdsa and ed25519 keys; whichever one is pinned,
// Dial negotiates that one (x/crypto alone would prefer ecdsa).
func TestDialStockHostKeys(t *testing.T) {
	client, clientPEM := newKey(t)
	keys := stockHostKeys(t)
	srv := startSSHServerWith(t, client.PublicKey(), serverOptions{hostKeys: keys})
	for _, k := range keys {
		t.Run(k.PublicKey().Type(), func(t *testing.T) {
			c, err := Dial(t.Context(), srv.target(t, clientPEM, k.PublicKey()))
			if err != nil {
				t.Fatalf("pinned %s: %v", k.PublicKey().Type(), err)
			}
			c.Close()
		})
	}
	// A key the host does not have is still a mismatch, not a negotiation
	// failure with another reason.
	other, _ := newKey(t)
	_, err := Dial(t.Context(), srv.target(t, clientPEM, other.PublicKey()))
	if ReasonOf(err) != ReasonHostKeyMismatch {
		t.Fatalf("unknown pinned key: reason %q, %v", ReasonOf(err), err)
	}
}

// A host that streams output forever fails the command with a bounded
// message; what the client kept is bounded too.
func TestRunScriptBoundsOutput(t *testing.T) {
	c := dialTestServer(t, serverOptions{endless: true})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	out, err := c.RunScript(ctx, "yes\n")
	if ReasonOf(err) != ReasonCommandFailed || !strings.Contains(err.Error(), "stopped after more than 4 MiB of output") {
		t.Fatalf("endless output: reason %q, %v", ReasonOf(err), err)
	}
	if len(out) != 0 || len(err.Error()) > 200 {
		t.Errorf("kept %d bytes of output and a %d byte message", len(out), len(err.Error()))
	}
	if ctx.Err() != nil {
		t.Errorf("stopped by the deadline, not by the bound")
	}
}

// TestRunScriptTakesTheHostLock: a script runs only while it holds the
// host's lock; one that finds it held (another operator's step) fails with
// HostBusy and runs nothing, and runs once the lock is free.
func TestRunScriptTakesTheHostLock(t *testing.T) {
	old := LockPath
	LockPath = filepath.Join(t.TempDir(), "agent.lock")
	t.Cleanup(func() { LockPath = old })
	c := dialTestServer(t, serverOptions{shell: true})
	marker := filepath.Join(t.TempDir(), "ran")
	script := "touch " + Quote(marker) + "\necho ran\n"

	// The other operator: holds the lock as flock(1) would.
	f, err := os.OpenFile(LockPath, os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	_, err = c.RunScript(t.Context(), script)
	if ReasonOf(err) != ReasonHostBusy || !strings.Contains(err.Error(), "another Apiary operator runs a step on this host now") {
		t.Fatalf("lock held: reason %q, %v", ReasonOf(err), err)
	}
	if _, err := os.Stat(marker); !os.IsNotExist(err) {
		t.Fatalf("the script ran while the lock was held: %v", err)
	}
	f.Close() // releases the lock
	out, err := c.RunScript(t.Context(), script)
	if err != nil || strings.TrimSpace(out) != "ran" {
		t.Fatalf("lock free: %q, %v", out, err)
	}
	if _, err := os.Stat(marker); err != nil {
		t.Fatalf("the script did not run: %v", err)
	}
}

// serveStallingSFTP plays a host whose SFTP server stops answering.
func serveStallingSFTP(ch ssh.Channel, how string) {
	if how == "local" {
		// This machine's files, as OpenSSH's sftp-server serves a host's.
		if srv, err := sftp.NewServer(ch); err == nil {
			_ = srv.Serve()
		}
		return
	}
	if how == "stall-handshake" {
		_, _ = io.Copy(io.Discard, ch)
		return
	}
	stalled := make(chan struct{})
	handlers := sftp.InMemHandler()
	handlers.FilePut = stallingWriter{stalled}
	srv := sftp.NewRequestServer(ch, handlers)
	_ = srv.Serve()
	close(stalled)
}

type stallingWriter struct{ until chan struct{} }

func (w stallingWriter) Filewrite(*sftp.Request) (io.WriterAt, error) { return w, nil }
func (w stallingWriter) WriteAt([]byte, int64) (int, error) {
	<-w.until
	return 0, io.ErrClosedPipe
}

// TestInstallObeysItsContext: a host whose SFTP server stalls, in the
// handshake or in the middle of a copy, fails the install when its
// context ends instead of holding the operator's worker.
func TestInstallObeysItsContext(t *testing.T) {
	layer, err := random.Layer(1<<20, types.DockerLayer)
	if err != nil {
		t.Fatal(err)
	}
	bundle := &Bundle{Ref: "example/bundle@sha256:0", layers: []v1.Layer{layer}}
	for _, how := range []string{"stall-handshake", "stall-write"} {
		t.Run(how, func(t *testing.T) {
			client, clientPEM := newKey(t)
			host, _ := newKey(t)
			srv := startSSHServerWith(t, client.PublicKey(), serverOptions{hostKeys: []ssh.Signer{host}, sftp: how})
			c, err := Dial(t.Context(), srv.target(t, clientPEM, host.PublicKey()))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
			defer cancel()
			start := time.Now()
			err = Install(ctx, c, bundle)
			took := time.Since(start)
			if err == nil || !strings.Contains(err.Error(), "context deadline exceeded") {
				t.Fatalf("install on a stalled host: %v", err)
			}
			if took > 10*time.Second {
				t.Fatalf("install returned %s after its 2 s deadline", took)
			}
			t.Logf("stalled install ended after %s: %v", took.Round(time.Millisecond), err)
		})
	}
}

// forwardTCP serves a direct-tcpip channel: a connection from this machine
// to the address the client asked for.
func forwardTCP(nc ssh.NewChannel) {
	var p struct {
		Host     string
		Port     uint32
		OrigHost string
		OrigPort uint32
	}
	if err := ssh.Unmarshal(nc.ExtraData(), &p); err != nil {
		_ = nc.Reject(ssh.ConnectionFailed, err.Error())
		return
	}
	conn, err := net.Dial("tcp", net.JoinHostPort(p.Host, fmt.Sprint(p.Port)))
	if err != nil {
		_ = nc.Reject(ssh.ConnectionFailed, err.Error())
		return
	}
	ch, reqs, err := nc.Accept()
	if err != nil {
		conn.Close()
		return
	}
	go ssh.DiscardRequests(reqs)
	go func() { _, _ = io.Copy(ch, conn); _ = ch.CloseWrite() }()
	_, _ = io.Copy(conn, ch)
	conn.Close()
	ch.Close()
}
