//go:build integration

package datastore_test

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/apimachinery/pkg/types"

	"github.com/apiaryhq/apiary/datastore"
	"github.com/apiaryhq/apiary/datastore/etcdtest"
	"github.com/apiaryhq/apiary/pki"
)

const (
	uidA = types.UID("a1b2c3d4-0000-4000-8000-00000000000a")
	uidB = types.UID("a1b2c3d4-0000-4000-8000-00000000000b")
)

func testContext(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func connect(t *testing.T, cfg datastore.Config) *datastore.Client {
	t.Helper()
	c, err := datastore.Connect(context.Background(), cfg)
	if err != nil {
		t.Fatalf("Connect: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func wantReason(t *testing.T, what string, err error, reason string) {
	t.Helper()
	if got := datastore.ReasonOf(err); got != reason {
		t.Fatalf("%s: got %v (reason %q), want reason %q", what, err, got, reason)
	}
}

// wantDenied asserts the exact etcd error a tenant gets outside its range.
func wantDenied(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, rpctypes.ErrPermissionDenied) {
		t.Errorf("%s: got %v, want %v", what, err, rpctypes.ErrPermissionDenied)
	}
}

// clientCert signs a client certificate for an arbitrary etcd user name.
func clientCert(t *testing.T, ca *pki.KeyPair, cn string) (certPEM, keyPEM []byte) {
	t.Helper()
	kp, err := ca.Sign(pki.Request{CommonName: cn, Usages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err = kp.KeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	return kp.CertPEM(), keyPEM
}

// withClient returns cfg with another client certificate in place of root's.
func withClient(cfg datastore.Config, certPEM, keyPEM []byte) datastore.Config {
	cfg.ClientCert, cfg.ClientKey = certPEM, keyPEM
	return cfg
}

// tenantClient ensures the tenant and returns an etcd client authenticated
// with the certificate IssueClientCert gives it.
func tenantClient(t *testing.T, s *etcdtest.Server, admin *datastore.Client, tn datastore.Tenant) *clientv3.Client {
	t.Helper()
	if _, err := admin.EnsureTenant(testContext(t), tn); err != nil {
		t.Fatalf("EnsureTenant(%s): %v", tn.User, err)
	}
	certPEM, keyPEM, err := datastore.IssueClientCert(s.Config(), tn)
	if err != nil {
		t.Fatalf("IssueClientCert(%s): %v", tn.User, err)
	}
	return s.ClientFor(t, certPEM, keyPEM)
}

func TestCheckHealthy(t *testing.T) {
	t.Parallel()
	s := etcdtest.Start(t)
	c := connect(t, s.Config())
	if err := c.Check(testContext(t)); err != nil {
		t.Fatalf("Check on a healthy auth-enabled etcd: %v", err)
	}
	// Check read the version with a real call; so does Versions.
	versions, err := c.Versions(testContext(t))
	want := strings.TrimPrefix(etcdtest.Version, "v")
	if err != nil || len(versions) != 1 || versions[s.Config().Endpoints[0]] != want {
		t.Fatalf("Versions: %v, %v; want %s at %s", versions, err, want, s.Config().Endpoints[0])
	}
}

func TestCheckUnreachableAfterStop(t *testing.T) {
	t.Parallel()
	s := etcdtest.Start(t)
	c := connect(t, s.Config())
	if err := c.Check(testContext(t)); err != nil {
		t.Fatalf("Check before Stop: %v", err)
	}
	s.Stop()

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	start := time.Now()
	err := c.Check(ctx)
	elapsed := time.Since(start)
	wantReason(t, "Check after Stop", err, datastore.ReasonUnreachable)
	if elapsed > 3*time.Second {
		t.Errorf("Check took %s with a 2s context", elapsed)
	}
	if !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("Check error %q does not say why", err)
	}
	t.Logf("after Stop, in %s: %v", elapsed.Round(time.Millisecond), err)

	// Connecting afresh does not block either.
	start = time.Now()
	c2 := connect(t, s.Config())
	if d := time.Since(start); d > time.Second {
		t.Errorf("Connect to a stopped etcd took %s", d)
	}
	short, cancel2 := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel2()
	wantReason(t, "Check of a new client after Stop", c2.Check(short), datastore.ReasonUnreachable)
}

func TestCheckUnknownUser(t *testing.T) {
	t.Parallel()
	s := etcdtest.Start(t)
	certPEM, keyPEM := clientCert(t, s.CA, "nobody")
	c := connect(t, withClient(s.Config(), certPEM, keyPEM))
	err := c.Check(testContext(t))
	wantReason(t, "Check with a certificate for an unknown user", err, datastore.ReasonAuthFailed)
	if !errors.Is(err, rpctypes.ErrUserNotFound) {
		t.Errorf("Check error %v does not wrap %v", err, rpctypes.ErrUserNotFound)
	}
}

func TestCheckNonRootUser(t *testing.T) {
	t.Parallel()
	s := etcdtest.Start(t)
	ctx := testContext(t)
	admin := s.RootClient(t)
	if _, err := admin.UserAddWithOptions(ctx, "alice", "", &clientv3.UserAddOptions{NoPassword: true}); err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM := clientCert(t, s.CA, "alice")
	c := connect(t, withClient(s.Config(), certPEM, keyPEM))
	err := c.Check(ctx)
	wantReason(t, "Check as a user without the root role", err, datastore.ReasonPermissionDenied)
	if !errors.Is(err, rpctypes.ErrPermissionDenied) {
		t.Errorf("Check error %v does not wrap %v", err, rpctypes.ErrPermissionDenied)
	}

	// A tenant's certificate is refused the same way.
	root := connect(t, s.Config())
	tn := datastore.TenantFor(uidA)
	if _, err := root.EnsureTenant(ctx, tn); err != nil {
		t.Fatal(err)
	}
	tcert, tkey, err := datastore.IssueClientCert(s.Config(), tn)
	if err != nil {
		t.Fatal(err)
	}
	wantReason(t, "Check as a tenant", connect(t, withClient(s.Config(), tcert, tkey)).Check(ctx), datastore.ReasonPermissionDenied)
}

func TestCheckAuthDisabled(t *testing.T) {
	t.Parallel()
	s := etcdtest.Start(t, etcdtest.WithoutAuth())
	c := connect(t, s.Config())
	wantReason(t, "Check with auth disabled", c.Check(testContext(t)), datastore.ReasonAuthDisabled)
}

// TestCheckTLSFailures: a wrong CA or a client certificate etcd does not
// trust looks like an unreachable etcd to gRPC; Check says it is TLS.
func TestCheckTLSFailures(t *testing.T) {
	t.Parallel()
	s := etcdtest.Start(t)
	foreign, err := pki.NewCA("foreign-ca")
	if err != nil {
		t.Fatal(err)
	}
	foreignKey, err := foreign.KeyPEM()
	if err != nil {
		t.Fatal(err)
	}

	// The server certificate is not signed by the configured CA.
	wrongCA := s.Config()
	wrongCA.CACert, wrongCA.CAKey = foreign.CertPEM(), foreignKey
	ctx, cancel := context.WithTimeout(context.Background(), 1200*time.Millisecond)
	defer cancel()
	err = connect(t, wrongCA).Check(ctx)
	wantReason(t, "Check with the wrong CA", err, datastore.ReasonTLSFailed)
	t.Logf("wrong CA: %v", err)

	// etcd does not trust the client certificate.
	certPEM, keyPEM := clientCert(t, foreign, "root")
	ctx2, cancel2 := context.WithTimeout(context.Background(), 1200*time.Millisecond)
	defer cancel2()
	err = connect(t, withClient(s.Config(), certPEM, keyPEM)).Check(ctx2)
	wantReason(t, "Check with an untrusted client certificate", err, datastore.ReasonTLSFailed)
	t.Logf("untrusted client certificate: %v", err)
}

func TestEnsureTenantIsIdempotent(t *testing.T) {
	t.Parallel()
	s := etcdtest.Start(t)
	ctx := testContext(t)
	c := connect(t, s.Config())
	root := s.RootClient(t)
	tn := datastore.TenantFor(uidA)

	changed, err := c.EnsureTenant(ctx, tn)
	if err != nil || !changed {
		t.Fatalf("first EnsureTenant = %v, %v; want true, nil", changed, err)
	}
	for what, exists := range map[string]func(context.Context, string) (bool, error){"user": c.UserExists, "role": c.RoleExists} {
		if ok, err := exists(ctx, tn.User); err != nil || !ok {
			t.Fatalf("%s %s exists = %v, %v", what, tn.User, ok, err)
		}
	}
	role, err := root.RoleGet(ctx, tn.User)
	if err != nil {
		t.Fatal(err)
	}
	key, end := tn.KeyRange()
	if len(role.Perm) != 1 || string(role.Perm[0].Key) != key || string(role.Perm[0].RangeEnd) != end ||
		role.Perm[0].PermType != clientv3.PermReadWrite {
		t.Fatalf("role permissions = %v, want readwrite [%q, %q)", role.Perm, key, end)
	}
	user, err := root.UserGet(ctx, tn.User)
	if err != nil || len(user.Roles) != 1 || user.Roles[0] != tn.User {
		t.Fatalf("user roles = %v, %v; want [%s]", user, err, tn.User)
	}

	before, err := root.AuthStatus(ctx)
	if err != nil {
		t.Fatal(err)
	}
	kvBefore, err := root.Get(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	changed, err = c.EnsureTenant(ctx, tn)
	if err != nil || changed {
		t.Fatalf("second EnsureTenant = %v, %v; want false, nil", changed, err)
	}
	after, err := root.AuthStatus(ctx)
	if err != nil {
		t.Fatal(err)
	}
	kvAfter, err := root.Get(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	if after.AuthRevision != before.AuthRevision {
		t.Errorf("second EnsureTenant wrote to the auth store: revision %d -> %d", before.AuthRevision, after.AuthRevision)
	}
	if kvAfter.Header.Revision != kvBefore.Header.Revision {
		t.Errorf("second EnsureTenant wrote keys: revision %d -> %d", kvBefore.Header.Revision, kvAfter.Header.Revision)
	}
}

// TestEnsureTenantRepairs: a half-created tenant is completed, and access
// granted beyond the tenant's range is taken away.
func TestEnsureTenantRepairs(t *testing.T) {
	t.Parallel()
	s := etcdtest.Start(t)
	ctx := testContext(t)
	c := connect(t, s.Config())
	root := s.RootClient(t)
	tn := datastore.TenantFor(uidA)
	key, end := tn.KeyRange()

	// Half-created: the role exists with a read-only permission, no user.
	if _, err := root.RoleAdd(ctx, tn.User); err != nil {
		t.Fatal(err)
	}
	if _, err := root.RoleGrantPermission(ctx, tn.User, key, end, clientv3.PermissionType(clientv3.PermRead)); err != nil {
		t.Fatal(err)
	}
	if _, err := root.RoleGrantPermission(ctx, tn.User, "/", "0", clientv3.PermissionType(clientv3.PermReadWrite)); err != nil {
		t.Fatal(err)
	}
	if changed, err := c.EnsureTenant(ctx, tn); err != nil || !changed {
		t.Fatalf("EnsureTenant of a half-created tenant = %v, %v", changed, err)
	}
	role, err := root.RoleGet(ctx, tn.User)
	if err != nil {
		t.Fatal(err)
	}
	if len(role.Perm) != 1 || string(role.Perm[0].Key) != key || role.Perm[0].PermType != clientv3.PermReadWrite {
		t.Fatalf("role permissions after repair = %v", role.Perm)
	}

	// Someone granted the tenant user another role.
	if _, err := root.RoleAdd(ctx, "wide"); err != nil {
		t.Fatal(err)
	}
	if _, err := root.UserGrantRole(ctx, tn.User, "wide"); err != nil {
		t.Fatal(err)
	}
	if changed, err := c.EnsureTenant(ctx, tn); err != nil || !changed {
		t.Fatalf("EnsureTenant of a user with a stray role = %v, %v", changed, err)
	}
	user, err := root.UserGet(ctx, tn.User)
	if err != nil || len(user.Roles) != 1 || user.Roles[0] != tn.User {
		t.Fatalf("user roles after repair = %v, %v", user, err)
	}
	if changed, err := c.EnsureTenant(ctx, tn); err != nil || changed {
		t.Fatalf("EnsureTenant after repair = %v, %v; want false, nil", changed, err)
	}
}

func TestEnsureTenantRejectsInvalidTenant(t *testing.T) {
	t.Parallel()
	s := etcdtest.Start(t)
	c := connect(t, s.Config())
	_, err := c.EnsureTenant(testContext(t), datastore.TenantFor(""))
	wantReason(t, "EnsureTenant with an empty UID", err, datastore.ReasonInvalidTenant)
}

func TestTenantIsolation(t *testing.T) {
	t.Parallel()
	s := etcdtest.Start(t)
	ctx := testContext(t)
	admin := connect(t, s.Config())
	a, b := datastore.TenantFor(uidA), datastore.TenantFor(uidB)
	cliA := tenantClient(t, s, admin, a)
	cliB := tenantClient(t, s, admin, b)
	keyA := a.Prefix + "/registry/pods/default/a"
	keyB := b.Prefix + "/registry/pods/default/b"

	// Inside its own range a tenant does what kube-apiserver does.
	if _, err := cliB.Put(ctx, keyB, "b"); err != nil {
		t.Fatalf("B put own key: %v", err)
	}
	put, err := cliA.Put(ctx, keyA, "a")
	if err != nil {
		t.Fatalf("A put own key: %v", err)
	}
	if got, err := cliA.Get(ctx, a.Prefix+"/", clientv3.WithPrefix()); err != nil || got.Count != 1 {
		t.Fatalf("A list own prefix = %v, %v", got, err)
	}
	txn, err := cliA.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(keyA), "=", put.Header.Revision)).
		Then(clientv3.OpPut(keyA, "a2")).
		Else(clientv3.OpGet(keyA)).
		Commit()
	if err != nil || !txn.Succeeded {
		t.Fatalf("A txn on own key = %v, %v", txn, err)
	}
	if _, err := cliA.Delete(ctx, keyA); err != nil {
		t.Fatalf("A delete own key: %v", err)
	}

	// Leases, as kube-apiserver uses them for events and endpoint leases.
	lease, err := cliA.Grant(ctx, 60)
	if err != nil {
		t.Fatalf("A lease grant: %v", err)
	}
	if _, err := cliA.Put(ctx, a.Prefix+"/events/e1", "e", clientv3.WithLease(lease.ID)); err != nil {
		t.Fatalf("A put with own lease: %v", err)
	}
	if _, err := cliA.KeepAliveOnce(ctx, lease.ID); err != nil {
		t.Fatalf("A lease keep-alive: %v", err)
	}
	if ttl, err := cliA.TimeToLive(ctx, lease.ID, clientv3.WithAttachedKeys()); err != nil || len(ttl.Keys) != 1 {
		t.Fatalf("A lease time-to-live = %v, %v", ttl, err)
	}

	// Watches: own prefix yes.
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	wA := cliA.Watch(wctx, a.Prefix+"/", clientv3.WithPrefix())
	if _, err := cliA.Put(ctx, a.Prefix+"/watched", "w"); err != nil {
		t.Fatal(err)
	}
	select {
	case wr := <-wA:
		if err := wr.Err(); err != nil || len(wr.Events) != 1 {
			t.Fatalf("A watch own prefix: %v, %d events", err, len(wr.Events))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("A watch on own prefix got no event")
	}

	// Outside its range, everything is denied with ErrPermissionDenied.
	outside := map[string]string{
		"B's key":                       keyB,
		"the prefix itself, no slash":   a.Prefix,
		"next to the prefix":            a.Prefix + "x",
		"the range end":                 a.Prefix + "0",
		"a sibling prefix":              a.Prefix + "-sibling/registry/x",
		"the parent":                    "/apiary/",
		"kube-apiserver's compact key":  "compact_rev_key",
		"the root":                      "/",
		"an unprefixed kube-style path": "/registry/pods/default/a",
	}
	for what, k := range outside {
		_, err := cliA.Get(ctx, k)
		wantDenied(t, "A get "+what, err)
		_, err = cliA.Put(ctx, k, "evil")
		wantDenied(t, "A put "+what, err)
		_, err = cliA.Delete(ctx, k)
		wantDenied(t, "A delete "+what, err)
	}
	_, err = cliA.Get(ctx, b.Prefix+"/", clientv3.WithPrefix())
	wantDenied(t, "A list B's prefix", err)
	_, err = cliA.Get(ctx, "/", clientv3.WithPrefix())
	wantDenied(t, "A list everything under /", err)
	_, err = cliA.Get(ctx, "", clientv3.WithFromKey())
	wantDenied(t, "A list the whole keyspace", err)
	_, err = cliA.Delete(ctx, b.Prefix+"/", clientv3.WithPrefix())
	wantDenied(t, "A delete B's prefix", err)
	_, err = cliA.Get(ctx, a.Prefix+"/", clientv3.WithRange(b.Prefix+"0"))
	wantDenied(t, "A range from own prefix into B's", err)

	// Transactions are checked on every compare and operation.
	_, err = cliA.Txn(ctx).Then(clientv3.OpPut(keyA, "ok"), clientv3.OpPut(keyB, "evil")).Commit()
	wantDenied(t, "A txn writing B's key", err)
	_, err = cliA.Txn(ctx).If(clientv3.Compare(clientv3.Value(keyB), "=", "b")).Then(clientv3.OpPut(keyA, "x")).Commit()
	wantDenied(t, "A txn comparing B's key", err)
	_, err = cliA.Txn(ctx).Then(clientv3.OpGet(keyB)).Commit()
	wantDenied(t, "A txn reading B's key", err)

	// Another tenant's lease can be neither used, renewed nor revoked.
	leaseB, err := cliB.Grant(ctx, 60)
	if err != nil {
		t.Fatalf("B lease grant: %v", err)
	}
	if _, err := cliB.Put(ctx, b.Prefix+"/events/e", "e", clientv3.WithLease(leaseB.ID)); err != nil {
		t.Fatalf("B put with lease: %v", err)
	}
	_, err = cliA.Put(ctx, a.Prefix+"/events/stolen", "e", clientv3.WithLease(leaseB.ID))
	wantDenied(t, "A attach B's lease to own key", err)
	_, err = cliA.Revoke(ctx, leaseB.ID)
	wantDenied(t, "A revoke B's lease", err)
	_, err = cliA.TimeToLive(ctx, leaseB.ID, clientv3.WithAttachedKeys())
	wantDenied(t, "A time-to-live of B's lease", err)
	_, err = cliA.KeepAliveOnce(ctx, leaseB.ID)
	wantDenied(t, "A keep B's lease alive", err)

	// A watch outside the range is canceled with ErrPermissionDenied.
	wB := cliA.Watch(wctx, b.Prefix+"/", clientv3.WithPrefix())
	select {
	case wr := <-wB:
		if !wr.Canceled {
			t.Fatalf("A watch on B's prefix: not canceled: %+v", wr)
		}
		// The server sends the full gRPC status text as the cancel reason,
		// which clientv3 cannot map back: the error is a plain string, not
		// rpctypes.ErrPermissionDenied.
		if err := wr.Err(); err == nil || err.Error() != rpctypes.ErrGRPCPermissionDenied.Error() {
			t.Errorf("A watch B's prefix: got %v, want %q", err, rpctypes.ErrGRPCPermissionDenied.Error())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("A watch on B's prefix was not canceled")
	}

	// B's data is intact; A's own lease is revoked with its key.
	if got, err := cliB.Get(ctx, keyB); err != nil || got.Count != 1 || string(got.Kvs[0].Value) != "b" {
		t.Fatalf("B's key after A's attempts = %v, %v", got, err)
	}
	if _, err := cliA.Revoke(ctx, lease.ID); err != nil {
		t.Fatalf("A revoke own lease: %v", err)
	}
	if got, err := cliA.Get(ctx, a.Prefix+"/events/e1"); err != nil || got.Count != 0 {
		t.Fatalf("A's leased key after revoke = %v, %v", got, err)
	}
}

// TestTenantAuxiliaryCalls records what else a tenant's kube-apiserver can
// call on etcd 3.6 with auth enabled, besides keys in its own range.
func TestTenantAuxiliaryCalls(t *testing.T) {
	t.Parallel()
	s := etcdtest.Start(t)
	ctx := testContext(t)
	admin := connect(t, s.Config())
	a, b := datastore.TenantFor(uidA), datastore.TenantFor(uidB)
	cliA := tenantClient(t, s, admin, a)
	cliB := tenantClient(t, s, admin, b)

	// Maintenance.Status only needs an authenticated user: kube-apiserver
	// calls it for the etcd version (feature support) and the database
	// size metric.
	st, err := cliA.Status(ctx, s.Endpoint)
	if err != nil {
		t.Fatalf("tenant Maintenance.Status: %v", err)
	}
	t.Logf("tenant Maintenance.Status allowed: version %s, db size %d", st.Version, st.DbSize)
	nobodyCert, nobodyKey := clientCert(t, s.CA, "nobody")
	if _, err := s.ClientFor(t, nobodyCert, nobodyKey).Status(ctx, s.Endpoint); err != nil {
		t.Errorf("Maintenance.Status with a certificate for an unknown user: %v", err)
	}
	if _, err := cliA.AlarmList(ctx); err != nil {
		t.Errorf("tenant AlarmList: %v", err)
	}
	if _, err := cliA.MemberList(ctx); err != nil {
		t.Errorf("tenant MemberList: %v", err)
	}

	// Watch progress requests (kube-apiserver's consistent reads from cache).
	wctx, wcancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer wcancel()
	w := cliA.Watch(wctx, a.Prefix+"/", clientv3.WithPrefix(), clientv3.WithCreatedNotify())
	select {
	case wr := <-w:
		if !wr.Created {
			t.Fatalf("tenant watch: first response %+v is not the creation", wr)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("tenant watch was not created")
	}
	if err := cliA.RequestProgress(wctx); err != nil {
		t.Fatalf("tenant RequestProgress: %v", err)
	}
	select {
	case wr := <-w:
		if !wr.IsProgressNotify() {
			t.Fatalf("tenant watch: got %+v, want a progress notification", wr)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("tenant got no progress notification")
	}

	// A user may read itself and its own role, not others.
	if _, err := cliA.UserGet(ctx, a.User); err != nil {
		t.Errorf("tenant UserGet self: %v", err)
	}
	if _, err := cliA.RoleGet(ctx, a.User); err != nil {
		t.Errorf("tenant RoleGet own role: %v", err)
	}
	_, err = cliA.UserGet(ctx, b.User)
	wantDenied(t, "tenant UserGet other tenant", err)
	_, err = cliA.RoleGet(ctx, b.User)
	wantDenied(t, "tenant RoleGet other role", err)

	// Admin-only calls.
	_, err = cliA.AuthStatus(ctx)
	wantDenied(t, "tenant AuthStatus", err)
	_, err = cliA.UserList(ctx)
	wantDenied(t, "tenant UserList", err)
	_, err = cliA.RoleGrantPermission(ctx, a.User, "/", "0", clientv3.PermissionType(clientv3.PermReadWrite))
	wantDenied(t, "tenant widening its own role", err)
	_, err = cliA.HashKV(ctx, s.Endpoint, 0)
	wantDenied(t, "tenant HashKV", err)
	_, err = cliA.Defragment(ctx, s.Endpoint)
	wantDenied(t, "tenant Defragment", err)
	rc, err := cliA.Snapshot(ctx)
	if err == nil {
		_, err = rc.Read(make([]byte, 1))
		_ = rc.Close()
	}
	wantDenied(t, "tenant Snapshot", err)

	// Leases(): allowed only if every lease in etcd has keys the caller
	// may read, so a tenant is denied once another tenant holds a lease.
	if _, err := cliA.Leases(ctx); err != nil {
		t.Errorf("tenant Leases with no foreign lease: %v", err)
	}
	lb, err := cliB.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cliB.Put(ctx, b.Prefix+"/leased", "x", clientv3.WithLease(lb.ID)); err != nil {
		t.Fatal(err)
	}
	_, err = cliA.Leases(ctx)
	wantDenied(t, "tenant Leases with another tenant's lease", err)

	// kube-apiserver's compactor first updates "compact_rev_key", outside
	// the tenant's range: it is denied, so tenant API servers must run with
	// --etcd-compaction-interval=0 and the DataStore compacts itself.
	_, err = cliA.Txn(ctx).
		If(clientv3.Compare(clientv3.Version("compact_rev_key"), "=", 0)).
		Then(clientv3.OpPut("compact_rev_key", "1")).
		Else(clientv3.OpGet("compact_rev_key")).
		Commit()
	wantDenied(t, "tenant compactor's compact_rev_key txn", err)
	// Compaction is admin-only.
	rev, err := cliA.Put(ctx, a.Prefix+"/k", "v")
	if err != nil {
		t.Fatal(err)
	}
	_, err = cliA.Compact(ctx, rev.Header.Revision)
	wantDenied(t, "tenant Compact", err)
}

func TestDeleteTenant(t *testing.T) {
	t.Parallel()
	s := etcdtest.Start(t)
	ctx := testContext(t)
	c := connect(t, s.Config())
	a, b := datastore.TenantFor(uidA), datastore.TenantFor(uidB)
	cliA := tenantClient(t, s, c, a)
	cliB := tenantClient(t, s, c, b)
	for i, k := range []string{"/registry/a", "/registry/b", "/registry/c/d"} {
		if _, err := cliA.Put(ctx, a.Prefix+k, "a"); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			if _, err := cliB.Put(ctx, b.Prefix+k, "b"); err != nil {
				t.Fatal(err)
			}
		}
	}
	// A key next to A's range, written by root, must survive.
	if _, err := s.RootClient(t).Put(ctx, a.Prefix+"x", "neighbour"); err != nil {
		t.Fatal(err)
	}
	if n, err := c.CountKeys(ctx, a.Prefix+"/"); err != nil || n != 3 {
		t.Fatalf("CountKeys(A) = %d, %v; want 3", n, err)
	}

	if err := c.DeleteTenant(ctx, a); err != nil {
		t.Fatalf("DeleteTenant: %v", err)
	}
	if n, err := c.CountKeys(ctx, a.Prefix+"/"); err != nil || n != 0 {
		t.Errorf("keys of A after DeleteTenant = %d, %v", n, err)
	}
	if ok, err := c.UserExists(ctx, a.User); err != nil || ok {
		t.Errorf("user of A after DeleteTenant: exists=%v, %v", ok, err)
	}
	if ok, err := c.RoleExists(ctx, a.User); err != nil || ok {
		t.Errorf("role of A after DeleteTenant: exists=%v, %v", ok, err)
	}
	if ok, err := c.TenantExists(ctx, a); err != nil || ok {
		t.Errorf("TenantExists(A) after DeleteTenant = %v, %v", ok, err)
	}

	// A's existing connection is refused: etcd finds no such user.
	_, err := cliA.Get(ctx, a.Prefix+"/registry/a")
	wantDenied(t, "A get after DeleteTenant", err)
	_, err = cliA.Put(ctx, a.Prefix+"/registry/a", "again")
	wantDenied(t, "A put after DeleteTenant", err)

	// B and the neighbouring key are untouched.
	if ok, err := c.TenantExists(ctx, b); err != nil || !ok {
		t.Errorf("TenantExists(B) = %v, %v", ok, err)
	}
	if got, err := cliB.Get(ctx, b.Prefix+"/registry/a"); err != nil || got.Count != 1 {
		t.Errorf("B's key after deleting A = %v, %v", got, err)
	}
	if n, err := c.CountKeys(ctx, a.Prefix+"x"); err != nil || n != 1 {
		t.Errorf("key next to A's range after DeleteTenant = %d, %v", n, err)
	}

	// Idempotent, also for a tenant that never existed.
	if err := c.DeleteTenant(ctx, a); err != nil {
		t.Errorf("second DeleteTenant: %v", err)
	}
	if err := c.DeleteTenant(ctx, datastore.TenantFor("never-created")); err != nil {
		t.Errorf("DeleteTenant of an unknown tenant: %v", err)
	}
	wantReason(t, "DeleteTenant of a one-segment prefix", c.DeleteTenant(ctx, datastore.Tenant{User: "x", Prefix: "/apiary"}), datastore.ReasonInvalidTenant)
	if n, err := c.CountKeys(ctx, "/apiary/"); err != nil || n != 2 {
		t.Errorf("keys under /apiary/ = %d, %v; want B's and the neighbour", n, err)
	}

	// A re-created tenant starts from nothing and works again.
	cliA2 := tenantClient(t, s, c, a)
	if got, err := cliA2.Get(ctx, a.Prefix+"/", clientv3.WithPrefix()); err != nil || got.Count != 0 {
		t.Errorf("re-created A sees %v, %v", got, err)
	}
}

// TestDeleteTenantLeftovers pins what etcd 3.6 does not revoke when a user
// is deleted, so that the order of deletion in the operator accounts for it.
func TestDeleteTenantLeftovers(t *testing.T) {
	t.Parallel()
	s := etcdtest.Start(t)
	ctx := testContext(t)
	c := connect(t, s.Config())
	a := datastore.TenantFor(uidA)
	cliA := tenantClient(t, s, c, a)
	if _, err := cliA.Put(ctx, a.Prefix+"/k", "v"); err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	w := cliA.Watch(wctx, a.Prefix+"/", clientv3.WithPrefix(), clientv3.WithCreatedNotify())
	if wr := <-w; !wr.Created {
		t.Fatalf("watch not created: %+v", wr)
	}

	if err := c.DeleteTenant(ctx, a); err != nil {
		t.Fatal(err)
	}

	// A watch opened before the user was deleted is not canceled: etcd
	// checks permissions when a watch is created only. It sees the deletion
	// of the tenant's keys, and would see later writes under the prefix
	// (nobody writes there: prefixes are per UID). So the tenant's API
	// server must be stopped before DeleteTenant.
	select {
	case wr := <-w:
		if wr.Canceled || len(wr.Events) != 1 || wr.Events[0].Type != clientv3.EventTypeDelete {
			t.Fatalf("existing watch after DeleteTenant: %+v, want the DELETE of the tenant's key", wr)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("existing watch got nothing after DeleteTenant")
	}
	// A new watch is refused.
	select {
	case wr := <-cliA.Watch(wctx, a.Prefix+"/", clientv3.WithPrefix()):
		if !wr.Canceled {
			t.Fatalf("new watch after DeleteTenant: %+v, want canceled", wr)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("new watch after DeleteTenant was neither refused nor answered")
	}

	// Leases and Maintenance.Status only need a certificate that etcd's CA
	// signed, not an existing user: the deleted tenant can still grant
	// (empty) leases. They cannot hold keys of anyone.
	l, err := cliA.Grant(ctx, 5)
	if err != nil {
		t.Fatalf("lease grant by a deleted tenant: %v (etcd now refuses it: update the docs)", err)
	}
	_, err = cliA.Put(ctx, a.Prefix+"/k", "v", clientv3.WithLease(l.ID))
	wantDenied(t, "deleted tenant put with lease", err)
	if _, err := cliA.Status(ctx, s.Endpoint); err != nil {
		t.Errorf("Maintenance.Status by a deleted tenant: %v", err)
	}
}

// TestEnsureTenantConcurrent creates tenants concurrently (as parallel
// reconciles do) while another tenant keeps writing: auth revision changes
// must neither fail the writes nor the creations.
func TestEnsureTenantConcurrent(t *testing.T) {
	t.Parallel()
	s := etcdtest.Start(t)
	ctx := testContext(t)
	c := connect(t, s.Config())
	a := datastore.TenantFor(uidA)
	cliA := tenantClient(t, s, c, a)

	stop := make(chan struct{})
	writerDone := make(chan error, 1)
	go func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				writerDone <- nil
				return
			default:
			}
			if _, err := cliA.Put(ctx, a.Prefix+"/registry/k", strconv.Itoa(i)); err != nil {
				writerDone <- fmt.Errorf("tenant write %d: %w", i, err)
				return
			}
		}
	}()

	var wg sync.WaitGroup
	errs := make(chan error, 40)
	for i := range 20 {
		tn := datastore.TenantFor(types.UID(fmt.Sprintf("c0ffee00-0000-4000-8000-%012d", i)))
		for range 2 { // the same tenant twice at once
			wg.Go(func() {
				if _, err := c.EnsureTenant(ctx, tn); err != nil {
					errs <- fmt.Errorf("EnsureTenant(%s): %w", tn.User, err)
				}
			})
		}
	}
	wg.Wait()
	close(stop)
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if err := <-writerDone; err != nil {
		t.Error(err)
	}
	for i := range 20 {
		tn := datastore.TenantFor(types.UID(fmt.Sprintf("c0ffee00-0000-4000-8000-%012d", i)))
		if changed, err := c.EnsureTenant(ctx, tn); err != nil || changed {
			t.Errorf("EnsureTenant(%s) after the concurrent ones = %v, %v; want false, nil", tn.User, changed, err)
		}
	}
}

func TestPool(t *testing.T) {
	t.Parallel()
	s := etcdtest.Start(t)
	ctx := testContext(t)
	const grace = 500 * time.Millisecond
	p := datastore.NewPoolWithGrace(grace)
	defer p.Close()

	cfg := s.Config()
	c1, err := p.Get(ctx, "ds", cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c1.Check(ctx); err != nil {
		t.Fatalf("Check: %v", err)
	}
	same, err := p.Get(ctx, "ds", s.Config())
	if err != nil || same != c1 {
		t.Fatalf("Get with the same config = %p, %v; want %p", same, err, c1)
	}

	// A rotated root certificate is a new config.
	certPEM, keyPEM := clientCert(t, s.CA, "root")
	rotated := withClient(cfg, certPEM, keyPEM)
	c2, err := p.Get(ctx, "ds", rotated)
	if err != nil {
		t.Fatal(err)
	}
	if c2 == c1 {
		t.Fatal("Get with a changed config returned the old client")
	}
	if err := c2.Check(ctx); err != nil {
		t.Fatalf("Check with the rotated certificate: %v", err)
	}
	// Until the grace period ends, a reconcile holding the replaced
	// client finishes its calls; after it, the client is closed.
	if err := c1.Check(ctx); err != nil {
		t.Errorf("the replaced client failed within the grace period: %v", err)
	}
	time.Sleep(2 * grace)
	short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	if err := c1.Check(short); err == nil {
		t.Error("the replaced client still works after the grace period: it was not closed")
	}
}

// A full shared etcd raises NOSPACE and refuses writes for everyone;
// ReclaimSpace leaves the alarm while the data still fills the quota, and
// once data is deleted (and compacted, as the members do periodically)
// defragments and disarms it, and writes work again.
func TestNoSpaceReclaimed(t *testing.T) {
	t.Parallel()
	const quota = 16 << 20
	s := etcdtest.Start(t, etcdtest.WithArgs(fmt.Sprintf("--quota-backend-bytes=%d", quota)))
	c := connect(t, s.Config())
	root := s.RootClient(t)
	ctx := testContext(t)
	value := strings.Repeat("x", 256<<10)
	next := 0
	fill := func() {
		t.Helper()
		for ; next < 400; next++ {
			if _, err := root.Put(ctx, fmt.Sprintf("/fill/%04d", next), value); err != nil {
				if !errors.Is(err, rpctypes.ErrNoSpace) {
					t.Fatalf("put %d: %v", next, err)
				}
				return
			}
		}
		t.Fatal("etcd took 100 MiB under a 16 MiB quota without NOSPACE")
	}
	// etcd raises NOSPACE when the backend file crosses the quota, which
	// can leave the data itself under the disarm line (90 %): then the
	// reclaim disarms (correctly) and more writes raise it again, until the
	// data fills the quota and the alarm must stay.
	for round := 1; ; round++ {
		fill()
		sp, err := c.Space(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(sp.NoSpace) == 0 || len(sp.Members) != 1 || sp.Members[0].Quota != quota {
			t.Fatalf("space %+v: want a NOSPACE alarm and the member's quota %d", sp, quota)
		}
		r, err := c.ReclaimSpace(ctx)
		if err != nil || len(r.Defragmented) != 1 {
			t.Fatalf("reclaim while alarmed: %+v, %v", r, err)
		}
		after, err := c.Space(ctx)
		if err != nil {
			t.Fatal(err)
		}
		size := after.Members[0].Size
		t.Logf("round %d: backend %d bytes before, %d after defragmentation (disarm below %d)", round, sp.Members[0].Size, size, quota*9/10)
		if size >= quota*9/10 {
			// Still full: defragmenting does not help, the alarm stays.
			if r.Disarmed || !r.StillFull || len(after.NoSpace) == 0 {
				t.Fatalf("reclaim while full: %+v, alarms %v", r, after.NoSpace)
			}
			break
		}
		if !r.Disarmed || r.StillFull || len(after.NoSpace) != 0 {
			t.Fatalf("reclaim with room below the line: %+v, alarms %v", r, after.NoSpace)
		}
		if round == 5 {
			t.Fatal("the data never filled the quota in 5 rounds")
		}
	}
	// A tenant deletes (allowed under NOSPACE); the history is compacted.
	del, err := root.Delete(ctx, "/fill/", clientv3.WithPrefix())
	if err != nil {
		t.Fatalf("delete under NOSPACE: %v", err)
	}
	if _, err := root.Compact(ctx, del.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	r, err := c.ReclaimSpace(ctx)
	if err != nil || !r.Disarmed || r.StillFull || len(r.Defragmented) != 1 {
		t.Fatalf("reclaim after deletion: %+v, %v", r, err)
	}
	if sp, _ := c.Space(ctx); len(sp.NoSpace) != 0 || sp.Members[0].Size >= quota/2 {
		t.Errorf("after reclaim: %+v", sp)
	}
	if _, err := root.Put(ctx, "/after", "ok"); err != nil {
		t.Errorf("write after disarm: %v", err)
	}
	// Nothing to do on a healthy, compact etcd.
	if r, err := c.ReclaimSpace(ctx); err != nil || len(r.Defragmented) != 0 || r.Disarmed {
		t.Errorf("reclaim on a healthy etcd: %+v, %v", r, err)
	}
}

// TestUsage: a tenant's usage is its own keys and values only, summed over
// several pages at one revision, and follows deletions.
func TestUsage(t *testing.T) {
	t.Parallel()
	s := etcdtest.Start(t)
	c := connect(t, s.Config())
	ctx := testContext(t)
	a, b := datastore.TenantFor(uidA), datastore.TenantFor(uidB)
	ca := tenantClient(t, s, c, a)
	cb := tenantClient(t, s, c, b)

	empty, err := c.Usage(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	if empty.Bytes != 0 || empty.Objects != 0 || empty.Revision == 0 {
		t.Fatalf("empty tenant: %+v", empty)
	}
	// More keys than one page holds, of different sizes.
	const n = 1234
	var want int64
	for i := range n {
		k, v := fmt.Sprintf("%s/registry/configmaps/x/%05d", a.Prefix, i), strings.Repeat("v", i%97)
		if _, err := ca.Put(ctx, k, v); err != nil {
			t.Fatal(err)
		}
		want += int64(len(k) + len(v))
	}
	// Another tenant's keys, and a key that shares the prefix without its
	// slash (another tenant's range), are not counted.
	if _, err := cb.Put(ctx, b.Prefix+"/registry/big", strings.Repeat("b", 1<<20)); err != nil {
		t.Fatal(err)
	}
	root := s.RootClient(t)
	if _, err := root.Put(ctx, a.Prefix+"x/outside", "not a's"); err != nil {
		t.Fatal(err)
	}
	u, err := c.Usage(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	if u.Objects != n || u.Bytes != want {
		t.Fatalf("usage %+v, want %d objects and %d bytes", u, n, want)
	}
	// Overwrites count once, at their latest size.
	k := fmt.Sprintf("%s/registry/configmaps/x/%05d", a.Prefix, 0)
	if _, err := ca.Put(ctx, k, strings.Repeat("w", 1000)); err != nil {
		t.Fatal(err)
	}
	if _, err := ca.Delete(ctx, fmt.Sprintf("%s/registry/configmaps/x/%05d", a.Prefix, 1)); err != nil {
		t.Fatal(err)
	}
	want += 1000 - int64(len(fmt.Sprintf("%s/registry/configmaps/x/%05d", a.Prefix, 1))+1)
	if u, err = c.Usage(ctx, a); err != nil {
		t.Fatal(err)
	}
	if u.Objects != n-1 || u.Bytes != want {
		t.Fatalf("after an overwrite and a delete: %+v, want %d objects and %d bytes", u, n-1, want)
	}
	ub, err := c.Usage(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	if ub.Objects != 1 || ub.Bytes != int64(len(b.Prefix+"/registry/big")+1<<20) {
		t.Fatalf("tenant b: %+v", ub)
	}
	if _, err := c.Usage(ctx, datastore.Tenant{User: "x", Prefix: "/"}); datastore.ReasonOf(err) != datastore.ReasonInvalidTenant {
		t.Fatalf("a prefix covering every tenant: %v", err)
	}
}

// TestWatchUsage: the usage kept by the watch follows creates, updates and
// deletes (one by one and by range) and always equals a fresh scan.
func TestWatchUsage(t *testing.T) {
	t.Parallel()
	s := etcdtest.Start(t)
	c := connect(t, s.Config())
	ctx := testContext(t)
	a := datastore.TenantFor(uidA)
	ca := tenantClient(t, s, c, a)
	var mu sync.Mutex
	var last datastore.Usage
	reports := 0
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- c.WatchUsage(wctx, a, func(u datastore.Usage) {
			mu.Lock()
			defer mu.Unlock()
			last = u
			reports++
		})
	}()
	agrees := func(what string) {
		t.Helper()
		want, err := c.Usage(ctx, a)
		if err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			mu.Lock()
			got := last
			mu.Unlock()
			if got.Bytes == want.Bytes && got.Objects == want.Objects && got.Revision >= want.Revision {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: watched usage %+v, scan %+v", what, got, want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	agrees("empty")
	for i := range 50 {
		if _, err := ca.Put(ctx, fmt.Sprintf("%s/registry/secrets/x/%03d", a.Prefix, i), strings.Repeat("s", 100*i)); err != nil {
			t.Fatal(err)
		}
	}
	agrees("50 creates")
	for i := 0; i < 50; i += 3 {
		if _, err := ca.Put(ctx, fmt.Sprintf("%s/registry/secrets/x/%03d", a.Prefix, i), "short"); err != nil {
			t.Fatal(err)
		}
	}
	agrees("updates")
	if _, err := ca.Delete(ctx, fmt.Sprintf("%s/registry/secrets/x/%03d", a.Prefix, 7)); err != nil {
		t.Fatal(err)
	}
	agrees("one delete")
	// A transaction of several operations arrives as one batch.
	if _, err := ca.Txn(ctx).Then(
		clientv3.OpPut(a.Prefix+"/registry/leases/l1", "renewed"),
		clientv3.OpDelete(fmt.Sprintf("%s/registry/secrets/x/%03d", a.Prefix, 8)),
	).Commit(); err != nil {
		t.Fatal(err)
	}
	agrees("a transaction")
	if _, err := ca.Delete(ctx, a.Prefix+"/registry/secrets/", clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	agrees("a range delete")
	// A recreated key counts as new again.
	if _, err := ca.Put(ctx, fmt.Sprintf("%s/registry/secrets/x/%03d", a.Prefix, 1), "again"); err != nil {
		t.Fatal(err)
	}
	agrees("a recreated key")
	stop()
	if err := <-done; err != nil {
		t.Fatalf("WatchUsage after its context ended: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if reports < 5 {
		t.Fatalf("%d reports", reports)
	}
}

// TestProbePeers offers a certificate of the DataStore's CA, made like a
// tenant's, to a real etcd's peer port in the three layouts an external
// etcd may have: plain HTTP and a peer port that trusts the client CA
// answer the peer API (raft for anyone), a peer port with its own CA
// refuses it in the handshake.
func TestProbePeers(t *testing.T) {
	t.Parallel()
	peerCA, err := pki.NewCA("etcdtest-peer-ca")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name                 string
		opts                 []etcdtest.Option
		open, plain, refused bool
	}{
		{"plain http", nil, true, true, false},
		{"peer port trusts the client CA", []etcdtest.Option{etcdtest.WithPeerTLS(nil)}, true, false, false},
		{"peer port with its own CA", []etcdtest.Option{etcdtest.WithPeerTLS(peerCA)}, false, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := etcdtest.Start(t, tc.opts...)
			c := connect(t, s.Config())
			probes, err := c.ProbePeers(testContext(t), s.Config())
			if err != nil {
				t.Fatal(err)
			}
			if len(probes) != 1 {
				t.Fatalf("probes %+v, want one (one member)", probes)
			}
			p := probes[0]
			if p.Open != tc.open || p.Plain != tc.plain || p.Refused != tc.refused {
				t.Errorf("probe %+v; want open %t, plain %t, refused %t", p, tc.open, tc.plain, tc.refused)
			}
		})
	}
}
