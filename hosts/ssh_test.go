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
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

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
			go serveSSH(conn, cfg, o.endless)
		}
	}()
	return &sshServer{addr: l.Addr().String(), hostKey: o.hostKeys[len(o.hostKeys)-1].PublicKey()}
}

func serveSSH(conn net.Conn, cfg *ssh.ServerConfig, endless bool) {
	_, chans, reqs, err := ssh.NewServerConn(conn, cfg)
	if err != nil {
		conn.Close()
		return
	}
	go ssh.DiscardRequests(reqs)
	for nc := range chans {
		ch, creqs, err := nc.Accept()
		if err != nil {
			continue
		}
		go func() {
			defer ch.Close()
			for req := range creqs {
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
	if err != nil || out != "ran:echo hello\n" {
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
	client, clientPEM := newKey(t)
	host, _ := newKey(t)
	srv := startSSHServerWith(t, client.PublicKey(), serverOptions{hostKeys: []ssh.Signer{host}, endless: true})
	c, err := Dial(t.Context(), srv.target(t, clientPEM, host.PublicKey()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
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
