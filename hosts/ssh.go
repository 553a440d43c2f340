package hosts

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/crypto/ssh"
)

// Reasons a connection fails; they are the reasons of the Host's Reachable
// condition.
const (
	ReasonUnreachable          = "Unreachable"
	ReasonHostKeyMismatch      = "HostKeyMismatch"
	ReasonAuthenticationFailed = "AuthenticationFailed"
	ReasonInvalidPrivateKey    = "InvalidPrivateKey"
	ReasonInvalidHostKey       = "InvalidHostKey"
	ReasonCommandFailed        = "CommandFailed"
	// ReasonInvalidInput: a value bound for the host's shell is not of the
	// strict form it must have (nothing was run).
	ReasonInvalidInput = "InvalidInput"
	// ReasonHostBusy: another operator holds the host's lock (LockPath).
	ReasonHostBusy = "HostBusy"
)

// Error is a failure with a reason for conditions.
type Error struct {
	Reason string
	Err    error
}

func (e *Error) Error() string { return e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// ReasonOf returns the reason of an *Error in err's chain, or "".
func ReasonOf(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Reason
	}
	return ""
}

// Target is where and how to connect.
type Target struct {
	Address string
	Port    int
	User    string
	// PrivateKey is a PEM (OpenSSH or PKCS#8/PKCS#1) private key.
	PrivateKey []byte
	// HostKey is the pinned public key in authorized_keys format.
	HostKey string
	// InsecureSkipHostKeyCheck accepts any host key.
	InsecureSkipHostKeyCheck bool
	// Timeout bounds the TCP connect and the SSH handshake (10 s if 0).
	Timeout time.Duration
}

func (t Target) addr() string {
	port := t.Port
	if port == 0 {
		port = 22
	}
	return net.JoinHostPort(t.Address, strconv.Itoa(port))
}

// Client is an SSH connection to a host.
type Client struct {
	c    *ssh.Client
	user string
}

// Dial connects and authenticates. The host must present exactly the
// pinned key unless the target skips the check.
func Dial(ctx context.Context, t Target) (*Client, error) {
	signer, err := ssh.ParsePrivateKey(t.PrivateKey)
	if err != nil {
		return nil, &Error{ReasonInvalidPrivateKey, fmt.Errorf("the SSH private key cannot be parsed: %w", err)}
	}
	var mismatch error
	var hostKeyCallback ssh.HostKeyCallback
	var hostKeyAlgorithms []string
	if t.InsecureSkipHostKeyCheck {
		hostKeyCallback = ssh.InsecureIgnoreHostKey() //nolint:gosec // explicit, shown in status
	} else {
		pinned, _, _, _, err := ssh.ParseAuthorizedKey([]byte(t.HostKey))
		if err != nil {
			return nil, &Error{ReasonInvalidHostKey, fmt.Errorf("the pinned host key cannot be parsed (want authorized_keys format, e.g. \"ssh-ed25519 AAAA...\"): %w", err)}
		}
		// Offer only the pinned key's algorithms: a stock host has rsa,
		// ecdsa and ed25519 keys, and x/crypto would otherwise negotiate
		// the one it prefers (ecdsa) and fail against an ed25519 pin.
		hostKeyAlgorithms = algorithmsFor(pinned.Type())
		want := pinned.Marshal()
		hostKeyCallback = func(_ string, _ net.Addr, key ssh.PublicKey) error {
			if !bytes.Equal(key.Marshal(), want) {
				mismatch = fmt.Errorf("host key mismatch: %s presented %s %s, but %s %s is pinned; refusing to connect",
					t.addr(), key.Type(), ssh.FingerprintSHA256(key), pinned.Type(), ssh.FingerprintSHA256(pinned))
				return mismatch
			}
			return nil
		}
	}
	user := t.User
	if user == "" {
		user = "root"
	}
	timeout := t.Timeout
	if timeout == 0 {
		timeout = 10 * time.Second
	}
	cfg := &ssh.ClientConfig{
		User:              user,
		Auth:              []ssh.AuthMethod{ssh.PublicKeys(signer)},
		HostKeyCallback:   hostKeyCallback,
		HostKeyAlgorithms: hostKeyAlgorithms,
		Timeout:           timeout,
	}
	dialCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(dialCtx, "tcp", t.addr())
	if err != nil {
		return nil, &Error{ReasonUnreachable, fmt.Errorf("cannot reach %s: %w", t.addr(), err)}
	}
	// The handshake obeys the context too.
	stop := context.AfterFunc(dialCtx, func() { _ = conn.SetDeadline(time.Now()) })
	sc, chans, reqs, err := ssh.NewClientConn(conn, t.addr(), cfg)
	stop()
	if err != nil {
		conn.Close()
		switch {
		case mismatch != nil:
			return nil, &Error{ReasonHostKeyMismatch, mismatch}
		case strings.Contains(err.Error(), "unable to authenticate"):
			return nil, &Error{ReasonAuthenticationFailed, fmt.Errorf("%s@%s refused the SSH key (%s %s): %w",
				user, t.addr(), signer.PublicKey().Type(), ssh.FingerprintSHA256(signer.PublicKey()), err)}
		default:
			return nil, &Error{ReasonUnreachable, fmt.Errorf("SSH handshake with %s: %w", t.addr(), err)}
		}
	}
	_ = conn.SetDeadline(time.Time{})
	return &Client{c: ssh.NewClient(sc, chans, reqs), user: user}, nil
}

// algorithmsFor are the host key algorithms that prove possession of a key
// of the given type (an RSA key signs with SHA-2 or, on old hosts, SHA-1).
func algorithmsFor(keyType string) []string {
	if keyType == ssh.KeyAlgoRSA {
		return []string{ssh.KeyAlgoRSASHA512, ssh.KeyAlgoRSASHA256, ssh.KeyAlgoRSA}
	}
	return []string{keyType}
}

// Close ends the connection.
func (c *Client) Close() error { return c.c.Close() }

// MaxOutput bounds what RunScript keeps of a command's standard output; a
// host that writes more fails the step instead of growing the operator.
const MaxOutput = 4 << 20

// maxStderr bounds the standard error kept for messages (its tail).
const maxStderr = 16 << 10

// RunScript runs a shell script on the host (as root: through sudo -n for
// other users) and returns its standard output.
func (c *Client) RunScript(ctx context.Context, script string) (string, error) {
	s, err := c.c.NewSession()
	if err != nil {
		return "", &Error{ReasonUnreachable, fmt.Errorf("opening an SSH session: %w", err)}
	}
	defer s.Close()
	overflow := make(chan struct{})
	stdout := &boundedBuffer{limit: MaxOutput, full: overflow}
	stderr := &tailBuffer{limit: maxStderr}
	s.Stdout, s.Stderr = stdout, stderr
	s.Stdin = strings.NewReader(lockPrelude() + script)
	cmd := "sh -s"
	if c.user != "root" {
		cmd = "sudo -n sh -s"
	}
	done := make(chan error, 1)
	go func() { done <- s.Run(cmd) }()
	select {
	case <-ctx.Done():
		_ = s.Signal(ssh.SIGKILL)
		return stdout.String(), ctx.Err()
	case <-overflow:
		_ = s.Signal(ssh.SIGKILL)
		return "", &Error{ReasonCommandFailed, fmt.Errorf("%s: stopped after more than %d MiB of output", cmd, MaxOutput>>20)}
	case err := <-done:
		if stdout.exceeded() {
			return "", &Error{ReasonCommandFailed, fmt.Errorf("%s: stopped after more than %d MiB of output", cmd, MaxOutput>>20)}
		}
		var exit *ssh.ExitError
		if errors.As(err, &exit) && exit.ExitStatus() == lockedExit {
			return stdout.String(), &Error{ReasonHostBusy, fmt.Errorf("%s", strings.TrimSpace(stderr.String()))}
		}
		if err != nil {
			return stdout.String(), &Error{ReasonCommandFailed, fmt.Errorf("%s: %w: %s", cmd, err, strings.TrimSpace(stderr.String()))}
		}
		return stdout.String(), nil
	}
}

// LockPath is the lock every script takes on the host (on tmpfs: nothing
// persists). Two operators that each think they lead (the old leader has
// not yet noticed it lost its lease) never run steps on one host at once:
// the second finds the lock held and fails with ReasonHostBusy, retried
// with the step's backoff.
var LockPath = "/run/apiary-agent.lock"

// lockedExit is the exit status of a script that found the lock held
// (EX_TEMPFAIL).
const lockedExit = 75

func lockPrelude() string {
	return fmt.Sprintf(`command -v flock >/dev/null 2>&1 || { echo "flock is not installed (util-linux): the agent takes a lock on the host for every step" >&2; exit 127; }
exec 9>>%[1]s || exit %[2]d
flock -n 9 || { echo "another Apiary operator runs a step on this host now (%[1]s is held)" >&2; exit %[2]d; }
`, Quote(LockPath), lockedExit)
}

// boundedBuffer keeps up to limit bytes and closes full once more arrive;
// it then discards the rest, so a session never blocks on it.
type boundedBuffer struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	limit int
	over  bool
	full  chan struct{}
}

func (b *boundedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.over {
		return len(p), nil
	}
	if b.buf.Len()+len(p) > b.limit {
		b.over = true
		close(b.full)
		return len(p), nil
	}
	return b.buf.Write(p)
}

func (b *boundedBuffer) exceeded() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.over
}

func (b *boundedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// tailBuffer keeps the last limit bytes written.
type tailBuffer struct {
	mu    sync.Mutex
	buf   []byte
	limit int
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if len(b.buf) > b.limit {
		b.buf = append(b.buf[:0], b.buf[len(b.buf)-b.limit:]...)
	}
	return len(p), nil
}

func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}

// errScanned stops a handshake once the host key is known.
var errScanned = errors.New("host key scanned")

// ScanHostKey returns the key a host presents, like ssh-keyscan: it
// completes the key exchange and disconnects without authenticating. The
// caller must confirm the key out of band before pinning it.
func ScanHostKey(ctx context.Context, address string, port int, timeout time.Duration) (ssh.PublicKey, error) {
	t := Target{Address: address, Port: port, Timeout: timeout}
	if t.Timeout == 0 {
		t.Timeout = 10 * time.Second
	}
	dialCtx, cancel := context.WithTimeout(ctx, t.Timeout)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(dialCtx, "tcp", t.addr())
	if err != nil {
		return nil, &Error{ReasonUnreachable, fmt.Errorf("cannot reach %s: %w", t.addr(), err)}
	}
	defer conn.Close()
	stop := context.AfterFunc(dialCtx, func() { _ = conn.SetDeadline(time.Now()) })
	defer stop()
	var key ssh.PublicKey
	cfg := &ssh.ClientConfig{
		User: "apiary-keyscan",
		HostKeyCallback: func(_ string, _ net.Addr, k ssh.PublicKey) error {
			key = k
			return errScanned
		},
		// Prefer the key type an OpenSSH server offers first and sshd
		// always has.
		HostKeyAlgorithms: []string{ssh.KeyAlgoED25519, ssh.KeyAlgoECDSA256, ssh.KeyAlgoRSASHA512, ssh.KeyAlgoRSASHA256},
	}
	_, _, _, err = ssh.NewClientConn(conn, t.addr(), cfg)
	if key != nil {
		return key, nil
	}
	return nil, &Error{ReasonUnreachable, fmt.Errorf("SSH key exchange with %s: %w", t.addr(), err)}
}
