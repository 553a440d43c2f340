package datastore

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/authpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"k8s.io/apimachinery/pkg/util/version"

	"github.com/apiaryhq/apiary/pki"
)

const (
	// dialTimeout bounds what clientv3 does on its own (keep-alive, token
	// fetch); each call is bounded by its context.
	dialTimeout = 5 * time.Second
	// defaultCheckTimeout bounds Check when the caller's context has no
	// deadline: with WaitForReady, an unreachable etcd would otherwise make
	// every call wait forever.
	defaultCheckTimeout = 10 * time.Second
	// maxDiagnosisTime is how much of Check's time is kept to find out why
	// etcd did not answer (see diagnose).
	maxDiagnosisTime = time.Second
	// statusTimeout bounds each short maintenance call (a member's Status,
	// AlarmList, AlarmDisarm): a member that is down must not hold a check.
	statusTimeout = 2 * time.Second
)

// Client administers one DataStore. It is authenticated as etcd's root user
// by client certificate.
type Client struct {
	etcd      *clientv3.Client
	endpoints []string
	// user is the etcd user named by the client certificate (normally
	// "root"); Check verifies it holds the root role.
	user string
	// tls is kept for diagnose, which dials the endpoints itself.
	tls       *tls.Config
	closeOnce sync.Once
	closeErr  error
}

// Connect builds a client from the config. It validates the config but does
// not contact etcd (gRPC connects in the background), so it returns at once
// even when etcd is down; Check says whether etcd answers. Calls wait for a
// connection until their context ends, so give them deadlines.
func Connect(ctx context.Context, cfg Config) (*Client, error) {
	if err := ctx.Err(); err != nil {
		return nil, &Error{Reason: ReasonCanceled, Err: fmt.Errorf("connecting to etcd: %w", err)}
	}
	if len(cfg.Endpoints) == 0 {
		return nil, &Error{Reason: ReasonInvalidConfig, Err: errors.New("no etcd endpoint")}
	}
	for _, ep := range cfg.Endpoints {
		// Plain http would send requests without the client certificate, so
		// etcd would see no user at all.
		u, err := url.Parse(ep)
		if err != nil || u.Scheme != "https" || u.Host == "" {
			return nil, &Error{Reason: ReasonInvalidConfig, Err: fmt.Errorf("etcd endpoint %q is not an https://host:port URL", ep)}
		}
	}
	tlsCfg, user, err := clientTLS(cfg)
	if err != nil {
		return nil, err
	}
	etcd, err := clientv3.New(clientv3.Config{
		Endpoints:            slices.Clone(cfg.Endpoints),
		TLS:                  tlsCfg,
		DialTimeout:          dialTimeout,
		DialKeepAliveTime:    30 * time.Second,
		DialKeepAliveTimeout: 10 * time.Second,
		// Errors are returned to the caller, who reports them in conditions;
		// clientv3's own logger would only repeat them on stderr on every
		// retry.
		Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{
			// gRPC's default reconnect backoff grows to two minutes, so a
			// DataStore that was down for a while would stay "Unreachable"
			// long after it is back.
			grpc.WithConnectParams(grpc.ConnectParams{
				Backoff: backoff.Config{
					BaseDelay:  250 * time.Millisecond,
					Multiplier: 1.6,
					Jitter:     0.2,
					MaxDelay:   10 * time.Second,
				},
				MinConnectTimeout: dialTimeout,
			}),
		},
	})
	if err != nil {
		return nil, &Error{Reason: ReasonInvalidConfig, Err: fmt.Errorf("creating etcd client for %v: %w", cfg.Endpoints, err)}
	}
	return &Client{etcd: etcd, endpoints: slices.Clone(cfg.Endpoints), user: user, tls: tlsCfg}, nil
}

// clientTLS builds the TLS configuration from the Config's PEMs and returns
// the user name of the client certificate.
func clientTLS(cfg Config) (*tls.Config, string, error) {
	invalid := func(format string, args ...any) error {
		return &Error{Reason: ReasonInvalidCredentials, Err: fmt.Errorf(format, args...)}
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(cfg.CACert) {
		return nil, "", invalid("etcd CA certificate: no PEM certificate found")
	}
	// The CA key is not needed to talk to etcd, but without it no tenant
	// can get a certificate, so the DataStore is unusable: say so early.
	if _, err := pki.ParseKeyPair(cfg.CACert, cfg.CAKey); err != nil {
		return nil, "", invalid("etcd CA key pair: %w", err)
	}
	kp, err := pki.ParseKeyPair(cfg.ClientCert, cfg.ClientKey)
	if err != nil {
		return nil, "", invalid("etcd root client key pair: %w", err)
	}
	if kp.Cert.Subject.CommonName == "" {
		return nil, "", invalid("etcd root client certificate has no common name: etcd could not map it to a user")
	}
	cert, err := tls.X509KeyPair(cfg.ClientCert, cfg.ClientKey)
	if err != nil {
		return nil, "", invalid("etcd root client key pair: %w", err)
	}
	return &tls.Config{
		RootCAs:      roots,
		Certificates: []tls.Certificate{cert},
		MinVersion:   tls.VersionTLS12,
	}, kp.Cert.Subject.CommonName, nil
}

// Close closes the connection. It is idempotent.
func (c *Client) Close() error {
	c.closeOnce.Do(func() {
		if err := c.etcd.Close(); err != nil && !errors.Is(err, context.Canceled) {
			c.closeErr = fmt.Errorf("closing etcd client: %w", err)
		}
	})
	return c.closeErr
}

// Etcd returns the underlying etcd client, authenticated as root. It is
// owned by the Client: do not close it.
func (c *Client) Etcd() *clientv3.Client { return c.etcd }

// Check makes real etcd calls to tell whether the DataStore is usable:
// etcd answers (ReasonUnreachable, ReasonTLSFailed), auth is enabled
// (ReasonAuthDisabled: tenant isolation depends on it) and the client
// certificate is the root user's (ReasonAuthFailed when etcd does not know the
// user, ReasonPermissionDenied when the user is not root). It is bounded by
// ctx, or by 10 seconds when ctx has no deadline.
func (c *Client) Check(ctx context.Context) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, defaultCheckTimeout)
		defer cancel()
	}
	// The etcd calls wait for a connection until their deadline and then
	// only say "deadline exceeded"; keep part of the time to find out why.
	deadline, _ := ctx.Deadline()
	reserve := min(time.Until(deadline)/4, maxDiagnosisTime)
	callCtx, cancel := context.WithDeadline(ctx, deadline.Add(-reserve))
	defer cancel()

	// AuthStatus goes through raft, so it also proves there is a leader.
	// With auth enabled etcd only lets root call it; with auth disabled it
	// answers anyone with Enabled=false.
	st, err := c.etcd.AuthStatus(callCtx)
	if err != nil {
		return c.explain(ctx, err, "reading etcd auth status")
	}
	if !st.Enabled {
		return &Error{Reason: ReasonAuthDisabled, Err: errors.New("etcd auth is disabled: every client may read and write every tenant's keys; " +
			"create the root user and run 'etcdctl auth enable'")}
	}
	// Do not rely on AuthStatus being admin-only: check the root role
	// explicitly. A user may always read itself.
	u, err := c.etcd.UserGet(callCtx, c.user)
	if err != nil {
		return c.explain(ctx, err, "reading etcd user %q", c.user)
	}
	if !slices.Contains(u.Roles, rootRole) {
		return &Error{Reason: ReasonPermissionDenied, Err: fmt.Errorf("etcd user %q of the client certificate does not have the %q role", c.user, rootRole)}
	}
	return c.checkVersion(callCtx)
}

// MinVersion is the oldest etcd a DataStore may run: 3.5 is out of
// upstream support and lacks fixes tenants sharing one etcd rely on.
var MinVersion = version.MustParseSemantic("3.6.0")

// SupportedVersion refuses an etcd version older than MinVersion.
func SupportedVersion(v string) error {
	parsed, err := version.ParseSemantic(v)
	if err != nil {
		return &Error{Reason: ReasonUnsupportedVersion, Err: fmt.Errorf("etcd reports version %q, which is not a version", v)}
	}
	if parsed.LessThan(MinVersion) {
		return &Error{Reason: ReasonUnsupportedVersion, Err: fmt.Errorf("etcd %s is not supported: Apiary needs etcd %s or newer", v, MinVersion)}
	}
	return nil
}

// memberStatus is one member's answer to Status.
type memberStatus struct {
	endpoint string
	status   *clientv3.StatusResponse
}

// statuses asks every member for its Status, in parallel and briefly: a
// member that is down must not hold up a check. Members that do not answer
// are left out; lastErr is the last failure, for when none answered.
func (c *Client) statuses(ctx context.Context) (answered []memberStatus, lastErr error) {
	eps := c.etcd.Endpoints()
	type answer struct {
		memberStatus
		err error
	}
	answers := make(chan answer, len(eps))
	for _, ep := range eps {
		go func() {
			callCtx, cancel := context.WithTimeout(ctx, statusTimeout)
			defer cancel()
			st, err := c.etcd.Status(callCtx, ep)
			answers <- answer{memberStatus{ep, st}, err}
		}()
	}
	for range eps {
		if a := <-answers; a.err != nil {
			lastErr = a.err
		} else {
			answered = append(answered, a.memberStatus)
		}
	}
	slices.SortFunc(answered, func(a, b memberStatus) int { return strings.Compare(a.endpoint, b.endpoint) })
	return answered, lastErr
}

// Versions are the versions of the members that answer, by endpoint; it
// fails only when none answers.
func (c *Client) Versions(ctx context.Context) (map[string]string, error) {
	answered, lastErr := c.statuses(ctx)
	if len(answered) == 0 {
		return nil, c.explain(ctx, lastErr, "reading the etcd version")
	}
	out := map[string]string{}
	for _, m := range answered {
		out[m.endpoint] = m.status.Version
	}
	return out, nil
}

// checkVersion: one old member in a cluster is enough to refuse it.
func (c *Client) checkVersion(ctx context.Context) error {
	versions, err := c.Versions(ctx)
	if err != nil {
		return err
	}
	for _, ep := range slices.Sorted(maps.Keys(versions)) {
		if err := SupportedVersion(versions[ep]); err != nil {
			return fmt.Errorf("%s: %w", ep, err)
		}
	}
	return nil
}

// explain wraps a failed Check call; when etcd did not answer it dials the
// endpoints itself to say why.
func (c *Client) explain(ctx context.Context, err error, format string, args ...any) error {
	switch {
	case errors.Is(err, rpctypes.ErrUserNotFound):
		return &Error{Reason: ReasonAuthFailed, Err: fmt.Errorf("etcd has no user %q, the common name of the client certificate: %w", c.user, err)}
	case errors.Is(err, rpctypes.ErrPermissionDenied):
		return &Error{Reason: ReasonPermissionDenied, Err: fmt.Errorf("etcd user %q of the client certificate is not root: %w", c.user, err)}
	}
	wrapped := wrapf(err, format, args...)
	// Only when there was no answer at all: an etcd that answered (e.g. "no
	// leader") has said why already.
	var answered rpctypes.EtcdError
	if reasonFor(err) != ReasonUnreachable || errors.As(err, &answered) || ctx.Err() != nil {
		return wrapped
	}
	reason, diag := diagnose(ctx, c.endpoints, c.tls)
	if diag == nil {
		return wrapped
	}
	return &Error{Reason: reason, Err: fmt.Errorf("%w (%v)", wrapped, diag)}
}

// EnsureTenant creates what is missing of the tenant: the role, its single
// read-write permission on the tenant's key range, the user (without
// password: it authenticates by certificate only) and the role grant. It
// reads first and writes only what is missing or wrong, so it is cheap and
// safe to call on every reconcile; changed says whether it wrote anything.
//
// It also removes what would widen the tenant's access: other permissions of
// the role and other roles of the user.
func (c *Client) EnsureTenant(ctx context.Context, t Tenant) (changed bool, err error) {
	if err := t.Validate(); err != nil {
		return false, &Error{Reason: ReasonInvalidTenant, Err: err}
	}
	key, end := t.KeyRange()

	var perms []*authpb.Permission
	role, err := c.etcd.RoleGet(ctx, t.User)
	switch {
	case errors.Is(err, rpctypes.ErrRoleNotFound):
		// Another reconcile may create it concurrently: that is fine.
		if _, err := c.etcd.RoleAdd(ctx, t.User); err != nil && !errors.Is(err, rpctypes.ErrRoleAlreadyExist) {
			return changed, wrapf(err, "creating etcd role %q", t.User)
		}
		changed = true
	case err != nil:
		return changed, wrapf(err, "reading etcd role %q", t.User)
	default:
		perms = role.Perm
	}

	granted := false
	for _, p := range perms {
		sameRange := string(p.Key) == key && string(p.RangeEnd) == end
		if sameRange && p.PermType == clientv3.PermReadWrite {
			granted = true
			continue
		}
		if sameRange {
			// Granting again below replaces the type in place.
			continue
		}
		if _, err := c.etcd.RoleRevokePermission(ctx, t.User, string(p.Key), string(p.RangeEnd)); err != nil &&
			!errors.Is(err, rpctypes.ErrPermissionNotGranted) {
			return changed, wrapf(err, "revoking stray permission [%q, %q) from etcd role %q", p.Key, p.RangeEnd, t.User)
		}
		changed = true
	}
	if !granted {
		if _, err := c.etcd.RoleGrantPermission(ctx, t.User, key, end, clientv3.PermissionType(clientv3.PermReadWrite)); err != nil {
			return changed, wrapf(err, "granting read-write on [%q, %q) to etcd role %q", key, end, t.User)
		}
		changed = true
	}

	var roles []string
	user, err := c.etcd.UserGet(ctx, t.User)
	switch {
	case errors.Is(err, rpctypes.ErrUserNotFound):
		// No password: the tenant authenticates with its certificate only, so
		// there is no secret to leak besides the certificate's key.
		_, err := c.etcd.UserAddWithOptions(ctx, t.User, "", &clientv3.UserAddOptions{NoPassword: true})
		if err != nil && !errors.Is(err, rpctypes.ErrUserAlreadyExist) {
			return changed, wrapf(err, "creating etcd user %q", t.User)
		}
		changed = true
	case err != nil:
		return changed, wrapf(err, "reading etcd user %q", t.User)
	default:
		roles = user.Roles
	}
	for _, r := range roles {
		if r == t.User {
			continue
		}
		if _, err := c.etcd.UserRevokeRole(ctx, t.User, r); err != nil && !errors.Is(err, rpctypes.ErrRoleNotGranted) {
			return changed, wrapf(err, "revoking stray role %q from etcd user %q", r, t.User)
		}
		changed = true
	}
	if !slices.Contains(roles, t.User) {
		if _, err := c.etcd.UserGrantRole(ctx, t.User, t.User); err != nil {
			return changed, wrapf(err, "granting etcd role %q to user %q", t.User, t.User)
		}
		changed = true
	}
	return changed, nil
}

// DeleteTenant revokes, then removes: it deletes the user first, which cuts
// the tenant's API server off at once (etcd looks the user up on every
// request), then every key in the tenant's range, then the role. Whatever is
// already missing is not an error, so it can be retried until it succeeds.
//
// Leases the tenant granted are left to expire: once their keys are gone
// they hold nothing, and finding them would mean listing every lease.
func (c *Client) DeleteTenant(ctx context.Context, t Tenant) error {
	if err := t.Validate(); err != nil {
		return &Error{Reason: ReasonInvalidTenant, Err: err}
	}
	if _, err := c.etcd.UserDelete(ctx, t.User); err != nil && !errors.Is(err, rpctypes.ErrUserNotFound) {
		return wrapf(err, "deleting etcd user %q", t.User)
	}
	key, end := t.KeyRange()
	if _, err := c.etcd.Delete(ctx, key, clientv3.WithRange(end)); err != nil {
		return wrapf(err, "deleting the keys of tenant %q under %q", t.User, key)
	}
	if _, err := c.etcd.RoleDelete(ctx, t.User); err != nil && !errors.Is(err, rpctypes.ErrRoleNotFound) {
		return wrapf(err, "deleting etcd role %q", t.User)
	}
	return nil
}

// CountKeys returns the number of keys that start with prefix (taken as is:
// pass Prefix+"/" for a tenant's keys).
func (c *Client) CountKeys(ctx context.Context, prefix string) (int64, error) {
	resp, err := c.etcd.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return 0, wrapf(err, "counting etcd keys under %q", prefix)
	}
	return resp.Count, nil
}

// UserExists reports whether the etcd user exists.
func (c *Client) UserExists(ctx context.Context, name string) (bool, error) {
	_, err := c.etcd.UserGet(ctx, name)
	switch {
	case errors.Is(err, rpctypes.ErrUserNotFound):
		return false, nil
	case err != nil:
		return false, wrapf(err, "reading etcd user %q", name)
	}
	return true, nil
}

// RoleExists reports whether the etcd role exists.
func (c *Client) RoleExists(ctx context.Context, name string) (bool, error) {
	_, err := c.etcd.RoleGet(ctx, name)
	switch {
	case errors.Is(err, rpctypes.ErrRoleNotFound):
		return false, nil
	case err != nil:
		return false, wrapf(err, "reading etcd role %q", name)
	}
	return true, nil
}

// TenantExists reports whether the tenant's user or role or any of its keys
// remains, for tests and status.
func (c *Client) TenantExists(ctx context.Context, t Tenant) (bool, error) {
	if ok, err := c.UserExists(ctx, t.User); ok || err != nil {
		return ok, err
	}
	if ok, err := c.RoleExists(ctx, t.User); ok || err != nil {
		return ok, err
	}
	key, _ := t.KeyRange()
	n, err := c.CountKeys(ctx, key)
	return n > 0, err
}

// EnableAuth turns on authentication on a new etcd that the operator runs
// itself: it creates the root user (certificate authentication only, no
// password) with the root role, then enables auth. Before auth is enabled
// etcd lets any client with a trusted certificate do this; afterwards only
// root can, and an etcd with auth already enabled is left as it is. It
// returns whether it changed anything.
func (c *Client) EnableAuth(ctx context.Context) (changed bool, err error) {
	st, err := c.etcd.AuthStatus(ctx)
	if err != nil {
		return false, wrapf(err, "reading etcd auth status")
	}
	if st.Enabled {
		return false, nil
	}
	if _, err := c.etcd.UserAddWithOptions(ctx, rootUser, "", &clientv3.UserAddOptions{NoPassword: true}); err != nil && !errors.Is(err, rpctypes.ErrUserAlreadyExist) {
		return false, wrapf(err, "adding etcd user %q", rootUser)
	}
	if _, err := c.etcd.UserGrantRole(ctx, rootUser, rootRole); err != nil {
		return false, wrapf(err, "granting role %q to etcd user %q", rootRole, rootUser)
	}
	if _, err := c.etcd.AuthEnable(ctx); err != nil {
		return false, wrapf(err, "enabling etcd auth")
	}
	return true, nil
}
