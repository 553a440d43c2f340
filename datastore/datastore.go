// Package datastore administers the shared etcd clusters (DataStores) on
// which tenant control planes store their state.
//
// Many tenants' kube-apiservers share one etcd. They are kept apart by etcd's
// own authorization: each tenant gets a user, a role of the same name that
// may read and write only the tenant's key range, and a client certificate
// whose common name is the user name (with --client-cert-auth, etcd
// authenticates a TLS client as the user named by its certificate's CN).
// The operator itself connects as etcd's root user, also by certificate.
//
// Isolation only holds while auth is enabled on etcd: with auth disabled
// every client may read and write every key. Client.Check reports that as
// ReasonAuthDisabled so that the DataStore is not used in that state.
package datastore

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/apimachinery/pkg/types"
)

// Config is what the operator knows about a DataStore.
type Config struct {
	// Endpoints are the etcd client URLs (https://host:port).
	Endpoints []string
	// CACert (PEM) verifies the etcd servers; with CAKey it signs tenant
	// client certificates, so it must be the CA that etcd's
	// --trusted-ca-file trusts for clients.
	CACert []byte
	// CAKey is the PEM private key of the first certificate in CACert.
	CAKey []byte
	// ClientCert is the PEM client certificate of etcd's root user (CN=root).
	ClientCert []byte
	// ClientKey is the PEM private key of ClientCert.
	ClientKey []byte
}

// Hash returns a stable hash of the config, to know when a cached client is
// stale. Every field is length-prefixed so that moving bytes from one field
// to the next cannot produce the same hash.
func (c Config) Hash() string {
	h := sha256.New()
	writeField(h, []byte("apiary-datastore-config-v1"))
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(c.Endpoints)))
	h.Write(n[:])
	for _, ep := range c.Endpoints {
		writeField(h, []byte(ep))
	}
	writeField(h, c.CACert)
	writeField(h, c.CAKey)
	writeField(h, c.ClientCert)
	writeField(h, c.ClientKey)
	return hex.EncodeToString(h.Sum(nil))
}

func writeField(h hash.Hash, b []byte) {
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(b)))
	h.Write(n[:])
	h.Write(b)
}

// Tenant is one tenant's slice of the datastore. The role has the same name
// as the user.
type Tenant struct {
	// User is the etcd user and role name, and the CN of the tenant's
	// client certificate.
	User string
	// Prefix is the kube-apiserver --etcd-prefix. It has no trailing slash:
	// kube-apiserver writes keys Prefix+"/...".
	Prefix string
}

const (
	// userPrefix and keyPrefix namespace everything Apiary creates in a
	// shared etcd, so that other users of the same etcd are recognisable.
	userPrefix = "apiary-"
	keyPrefix  = "/apiary/"
	// rootUser and rootRole are etcd's built-in administrator names.
	rootUser = "root"
	rootRole = "root"
)

// TenantFor derives the slice from the TenantControlPlane UID rather than its
// name, so that a re-created tenant of the same name never inherits the data
// or the credentials of its predecessor.
func TenantFor(uid types.UID) Tenant {
	return Tenant{
		User:   userPrefix + string(uid),
		Prefix: keyPrefix + string(uid),
	}
}

// KeyRange returns the range [key, rangeEnd) that the tenant's role may read
// and write: every key under Prefix+"/". The trailing slash matters: without
// it a tenant whose UID is a prefix of another's would reach the other's keys,
// and the tenant could write the key Prefix+"x" next to its own prefix.
func (t Tenant) KeyRange() (key, rangeEnd string) {
	key = t.Prefix + "/"
	return key, clientv3.GetPrefixRangeEnd(key)
}

// Validate rejects tenants whose range would cover more than one tenant. It
// guards DeleteTenant in particular: an empty or one-segment prefix would
// delete every tenant's keys.
func (t Tenant) Validate() error {
	switch {
	case t.User == "":
		return errors.New("tenant without a user name")
	case t.User == rootUser:
		return errors.New(`tenant user may not be etcd's "root" user`)
	case strings.ContainsAny(t.User, "\x00/"):
		return fmt.Errorf("tenant user %q contains a slash or NUL", t.User)
	case !strings.HasPrefix(t.Prefix, "/") || strings.HasSuffix(t.Prefix, "/"):
		return fmt.Errorf("tenant prefix %q must start and must not end with a slash", t.Prefix)
	}
	segments := strings.Split(strings.TrimPrefix(t.Prefix, "/"), "/")
	if len(segments) < 2 {
		return fmt.Errorf("tenant prefix %q has a single segment: it would be shared by every tenant", t.Prefix)
	}
	for _, s := range segments {
		if s == "" {
			return fmt.Errorf("tenant prefix %q has an empty segment", t.Prefix)
		}
	}
	return nil
}
