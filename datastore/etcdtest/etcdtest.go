// Package etcdtest runs a real etcd for tests: one member on 127.0.0.1, TLS
// with client-certificate authentication, and auth enabled with a root user
// that authenticates by certificate, as a production DataStore.
//
// The etcd binary is built from source by `make tools`; tests fail (they do
// not skip) when it is missing, so that a missing binary cannot pass CI
// silently.
package etcdtest

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/apiaryhq/apiary/datastore"
	"github.com/apiaryhq/apiary/internal/testenv"
	"github.com/apiaryhq/apiary/pki"
)

// Version is the etcd version `make tools` builds (ETCD_VERSION in the
// Makefile); it names the default binary directory.
const Version = testenv.EtcdVersion

const (
	// pollInterval is how often Start checks whether etcd is up.
	pollInterval = 50 * time.Millisecond
	// startTimeout bounds Start; etcd is normally up in well under a second
	// but CI machines can be slow.
	startTimeout = 30 * time.Second
	// startAttempts: ports are picked by binding and releasing them, so
	// another process may take one before etcd binds it; Start then tries
	// again with new ports.
	startAttempts = 3
)

// Server is a running etcd.
type Server struct {
	// Endpoint is the client URL, https://127.0.0.1:port.
	Endpoint string
	// CA signed the server certificate and the client certificates etcd
	// trusts.
	CA *pki.KeyPair
	// Root is the client certificate of etcd's root user (CN=root).
	Root *pki.KeyPair
	// Dir holds the certificates, the data directory and etcd.log.
	Dir string
	// LogPath is etcd's output.
	LogPath string

	caKeyPEM   []byte
	rootKeyPEM []byte

	mu   sync.Mutex
	proc *process
}

// process is one run of etcd.
type process struct {
	cmd      *exec.Cmd
	done     chan struct{} // closed when cmd has exited
	stopOnce sync.Once
}

func (p *process) stop() {
	p.stopOnce.Do(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
	})
}

// Option changes how Start runs etcd.
type Option func(*options)

type options struct {
	noAuth  bool
	args    []string
	peerTLS bool
	peerCA  *pki.KeyPair
}

// WithoutAuth leaves auth disabled: the root user is not created and every
// client may do everything.
func WithoutAuth() Option { return func(o *options) { o.noAuth = true } }

// WithPeerTLS serves the peer port over TLS with client-certificate
// authentication: trusting peerCA, which signs the peer certificate, or,
// when peerCA is nil, the CA of the clients (the layout that lets any
// client certificate speak raft). Without it the peer port is plain HTTP.
func WithPeerTLS(peerCA *pki.KeyPair) Option {
	return func(o *options) { o.peerTLS, o.peerCA = true, peerCA }
}

// WithArgs adds etcd command-line flags, e.g. --auto-compaction-retention.
func WithArgs(args ...string) Option {
	return func(o *options) { o.args = append(o.args, args...) }
}

// BinaryPath resolves an etcd binary (etcd, etcdctl): $APIARY_ETCD_BIN/name,
// or $HOME/.cache/apiary/bin/etcd-<Version>/name when the variable is unset.
func BinaryPath(name string) (string, error) {
	return testenv.EtcdBinary(name)
}

// Start runs etcd and returns once it serves requests, with auth enabled
// unless WithoutAuth is given. etcd is stopped when the test ends; if the
// test failed, the tail of etcd's log is logged.
func Start(t testing.TB, opts ...Option) *Server {
	t.Helper()
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	bin, err := BinaryPath("etcd")
	if err != nil {
		t.Fatalf("etcdtest: %v", err)
	}

	s, err := newServer(t.TempDir())
	if err != nil {
		t.Fatalf("etcdtest: %v", err)
	}
	t.Cleanup(func() {
		s.Stop()
		if t.Failed() {
			t.Logf("etcdtest: etcd log %s ends with:\n%s", s.LogPath, tail(s.LogPath, 40))
		}
	})

	for attempt := 1; ; attempt++ {
		err = s.launch(bin, o)
		if err == nil {
			break
		}
		s.Stop()
		if !errors.Is(err, errPortTaken) || attempt == startAttempts {
			t.Fatalf("etcdtest: starting etcd: %v\netcd log %s ends with:\n%s", err, s.LogPath, tail(s.LogPath, 40))
		}
		// Try again with new ports and a fresh process.
	}

	if !o.noAuth {
		if err := s.enableAuth(); err != nil {
			t.Fatalf("etcdtest: enabling auth: %v", err)
		}
	}
	return s
}

func newServer(dir string) (*Server, error) {
	ca, err := pki.NewCA("etcdtest-ca")
	if err != nil {
		return nil, err
	}
	serving, err := ca.Sign(pki.Request{
		CommonName: "etcdtest-server",
		DNSNames:   []string{"localhost"},
		IPs:        []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		Usages:     []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	})
	if err != nil {
		return nil, err
	}
	root, err := ca.Sign(pki.Request{CommonName: "root", Usages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	if err != nil {
		return nil, err
	}
	s := &Server{CA: ca, Root: root, Dir: dir, LogPath: filepath.Join(dir, "etcd.log")}
	if s.caKeyPEM, err = ca.KeyPEM(); err != nil {
		return nil, err
	}
	if s.rootKeyPEM, err = root.KeyPEM(); err != nil {
		return nil, err
	}
	servingKey, err := serving.KeyPEM()
	if err != nil {
		return nil, err
	}
	for name, data := range map[string][]byte{
		"ca.crt":     ca.CertPEM(),
		"server.crt": serving.CertPEM(),
		"server.key": servingKey,
	} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// peerTLS writes the peer port's certificate and trust and returns the
// flags that use them.
func (s *Server) peerTLS(peerCA *pki.KeyPair) ([]string, error) {
	signer := peerCA
	if signer == nil {
		signer = s.CA
	}
	cert, err := signer.Sign(pki.Request{
		CommonName: "etcdtest-peer",
		DNSNames:   []string{"localhost"},
		IPs:        []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		Usages:     []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	})
	if err != nil {
		return nil, err
	}
	key, err := cert.KeyPEM()
	if err != nil {
		return nil, err
	}
	for name, data := range map[string][]byte{"peer.crt": cert.CertPEM(), "peer.key": key, "peer-ca.crt": signer.CertPEM()} {
		if err := os.WriteFile(filepath.Join(s.Dir, name), data, 0o600); err != nil {
			return nil, err
		}
	}
	return []string{
		"--peer-cert-file", filepath.Join(s.Dir, "peer.crt"),
		"--peer-key-file", filepath.Join(s.Dir, "peer.key"),
		"--peer-trusted-ca-file", filepath.Join(s.Dir, "peer-ca.crt"),
		"--peer-client-cert-auth",
	}, nil
}

var errPortTaken = errors.New("port already in use")

// launch starts etcd on fresh ports and waits until it answers.
func (s *Server) launch(bin string, o options) error {
	ports, err := freePorts(2)
	if err != nil {
		return err
	}
	client := "https://127.0.0.1:" + strconv.Itoa(ports[0])
	peer := "http://127.0.0.1:" + strconv.Itoa(ports[1])
	var peerArgs []string
	if o.peerTLS {
		peer = "https://127.0.0.1:" + strconv.Itoa(ports[1])
		if peerArgs, err = s.peerTLS(o.peerCA); err != nil {
			return err
		}
	}
	args := []string{
		"--name", "etcdtest",
		// A fresh data directory per attempt: a failed attempt may have
		// written one with other peer URLs.
		"--data-dir", filepath.Join(s.Dir, "data-"+strconv.Itoa(ports[0])),
		"--listen-client-urls", client,
		"--advertise-client-urls", client,
		"--listen-peer-urls", peer,
		"--initial-advertise-peer-urls", peer,
		"--initial-cluster", "etcdtest=" + peer,
		"--initial-cluster-state", "new",
		"--cert-file", filepath.Join(s.Dir, "server.crt"),
		"--key-file", filepath.Join(s.Dir, "server.key"),
		"--trusted-ca-file", filepath.Join(s.Dir, "ca.crt"),
		"--client-cert-auth",
		// Test data is thrown away: fsync would only make tests slow on
		// slow disks.
		"--unsafe-no-fsync",
		// A single member elects itself after one election timeout; the
		// default (1s) would be most of the start-up time. Shorter ticks are
		// harmless without peers.
		"--heartbeat-interval", "10",
		"--election-timeout", "100",
		"--log-level", "info",
	}
	args = append(append(args, peerArgs...), o.args...)

	logFile, err := os.OpenFile(s.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	fmt.Fprintf(logFile, "=== %s %s\n", bin, strings.Join(args, " "))
	cmd := exec.Command(bin, args...)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	killWithParent(cmd)
	if err := cmd.Start(); err != nil {
		_ = logFile.Close()
		return fmt.Errorf("running %s: %w", bin, err)
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		_ = logFile.Close()
		close(p.done)
	}()
	s.mu.Lock()
	s.proc = p
	s.mu.Unlock()
	s.Endpoint = client
	return s.waitReady(p)
}

// waitReady polls until etcd serves a linearizable read, which needs a
// leader; it fails early when etcd exits.
func (s *Server) waitReady(p *process) error {
	deadline := time.Now().Add(startTimeout)
	exited := func() error {
		select {
		case <-p.done:
			if strings.Contains(tail(s.LogPath, 200), "address already in use") {
				return fmt.Errorf("etcd exited: %w", errPortTaken)
			}
			return fmt.Errorf("etcd exited early: %v", p.cmd.ProcessState)
		default:
			return nil
		}
	}
	// Wait for the listener first: a gRPC client that is refused backs off
	// for a second before it retries.
	host := strings.TrimPrefix(s.Endpoint, "https://")
	for {
		if err := exited(); err != nil {
			return err
		}
		conn, err := net.DialTimeout("tcp", host, time.Second)
		if err == nil {
			_ = conn.Close()
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("etcd did not listen on %s within %s: %v", host, startTimeout, err)
		}
		time.Sleep(pollInterval)
	}

	cli, err := s.client(s.Root.CertPEM(), s.rootKeyPEM)
	if err != nil {
		return err
	}
	defer func() { _ = cli.Close() }()
	for {
		if err := exited(); err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := cli.Get(ctx, "etcdtest-health")
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("etcd did not serve requests within %s: %v", startTimeout, err)
		}
		time.Sleep(pollInterval)
	}
}

// enableAuth creates the root user without password (it authenticates by
// certificate, CN=root), grants it the root role and enables auth, as an
// operator would with etcdctl.
func (s *Server) enableAuth() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dc, err := datastore.Connect(ctx, s.Config())
	if err != nil {
		return err
	}
	defer func() { _ = dc.Close() }()
	if _, err := dc.EnableAuth(ctx); err != nil {
		return fmt.Errorf("enabling auth: %w", err)
	}
	return nil
}

// Config returns a DataStore configuration for this server: its endpoint,
// the CA that signed its certificate and signs client certificates, and the
// root client certificate.
func (s *Server) Config() datastore.Config {
	return datastore.Config{
		Endpoints:  []string{s.Endpoint},
		CACert:     s.CA.CertPEM(),
		CAKey:      bytes.Clone(s.caKeyPEM),
		ClientCert: s.Root.CertPEM(),
		ClientKey:  bytes.Clone(s.rootKeyPEM),
	}
}

// ClientFor returns a client that authenticates with the given certificate,
// e.g. a tenant's. It is closed when the test ends.
func (s *Server) ClientFor(t testing.TB, certPEM, keyPEM []byte) *clientv3.Client {
	t.Helper()
	cli, err := s.client(certPEM, keyPEM)
	if err != nil {
		t.Fatalf("etcdtest: %v", err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

// RootClient returns a client authenticated as etcd's root user. It is
// closed when the test ends.
func (s *Server) RootClient(t testing.TB) *clientv3.Client {
	t.Helper()
	return s.ClientFor(t, s.Root.CertPEM(), s.rootKeyPEM)
}

func (s *Server) client(certPEM, keyPEM []byte) (*clientv3.Client, error) {
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("client key pair: %w", err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(s.CA.Cert)
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{s.Endpoint},
		TLS:         &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		return nil, fmt.Errorf("etcd client: %w", err)
	}
	return cli, nil
}

// Stop kills etcd and waits for it to exit. It is idempotent; tests use it
// to make the server unreachable.
func (s *Server) Stop() {
	s.mu.Lock()
	p := s.proc
	s.mu.Unlock()
	if p != nil {
		p.stop()
	}
}

// freePorts returns n distinct ports that were free a moment ago. All are
// held open until all are picked so that they differ.
func freePorts(n int) ([]int, error) {
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("picking a free port: %w", err)
		}
		defer func() { _ = l.Close() }()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// tail returns the last n lines of a file, or why it cannot be read.
func tail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", path, err)
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
