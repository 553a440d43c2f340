// Package tenantcluster is the operator's one way to reach tenant clusters:
// a client per tenant built from the operator's kubeconfig for it, and
// metadata watches inside tenants whose events become reconcile requests.
//
// Every controller that talks to a tenant API (the tenant bootstrap, the
// Host agent's join, token and drain steps) asks the Cache for the tenant's
// Access instead of building its own client, so a tenant costs one HTTP/2
// connection however many controllers reach it, and the watches live and
// die with the manager rather than with context.Background().
//
// The contract, after Cluster API's clustercache:
//   - For(uid, kubeconfig) returns the tenant's Access, rebuilt when the
//     kubeconfig changes (a renewed certificate, a new endpoint). Callers
//     pass the kubeconfig they hold: the one just issued may not be in the
//     operator's informer cache yet.
//   - Watch starts (or keeps) a named metadata-only watch inside a tenant;
//     the same name with the same kubeconfig, resources and selector is a
//     no-op, anything else restarts it. Watches run until Forget, or until
//     the manager stops. Before Start they are refused: nothing would read
//     their events.
//   - Forget drops a tenant's Access and stops its watches (the tenant is
//     gone).
//
// Watches are metadata-only and label-filtered: the informers hold names
// and labels, not objects, which keeps the cost per tenant small (Kamaji
// runs a whole manager per tenant; CAPI a typed cache per cluster).
package tenantcluster

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// UserAgent is what tenant API servers see in their audit logs.
const UserAgent = "apiary-operator"

// requestTimeout bounds each request to a tenant API: a tenant that does
// not answer must not hold a reconcile worker.
const requestTimeout = 15 * time.Second

// Access is what the operator uses to talk to one tenant.
type Access struct {
	// Client is a controller-runtime client (server-side apply of rendered
	// objects).
	Client client.Client
	// Clientset is the typed client (subresources: approval, eviction).
	Clientset kubernetes.Interface
	// Config is the REST configuration both are made of.
	Config *rest.Config
	// KubeconfigHash identifies the kubeconfig Access was made of.
	KubeconfigHash [32]byte
}

// Cache holds every tenant's Access and watches. It is a manager Runnable:
// Start gives the watches their lifetime. The zero value is not usable;
// make one with New.
type Cache struct {
	mu      sync.Mutex
	ctx     context.Context
	tenants map[types.UID]*Access
	watches map[watchKey]running
}

type watchKey struct {
	uid  types.UID
	name string
}

type running struct {
	// key is what the watch was started for: the kubeconfig, resources
	// and selector; a different key restarts it.
	key    string
	cancel context.CancelFunc
}

// New returns an empty Cache.
func New() *Cache {
	return &Cache{tenants: map[types.UID]*Access{}, watches: map[watchKey]running{}}
}

// Start runs until ctx ends, then stops every watch.
func (c *Cache) Start(ctx context.Context) error {
	c.mu.Lock()
	c.ctx = ctx
	c.mu.Unlock()
	<-ctx.Done()
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, w := range c.watches {
		w.cancel()
		delete(c.watches, k)
	}
	c.ctx = nil
	return nil
}

// NeedLeaderElection is false so that the cache starts before the
// controllers (which only run on the leader) and is there when they first
// call Watch; it does nothing until they do.
func (c *Cache) NeedLeaderElection() bool { return false }

// For returns the tenant's Access, made from kubeconfig (the operator's
// admin kubeconfig for the tenant) and kept while the kubeconfig is the
// same.
func (c *Cache) For(uid types.UID, kubeconfig []byte) (*Access, error) {
	if len(kubeconfig) == 0 {
		return nil, errors.New("no kubeconfig for the tenant")
	}
	h := sha256.Sum256(kubeconfig)
	c.mu.Lock()
	if a, ok := c.tenants[uid]; ok && a.KubeconfigHash == h {
		c.mu.Unlock()
		return a, nil
	}
	c.mu.Unlock()
	cfg, err := clientcmd.RESTConfigFromKubeConfig(kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("reading the operator's kubeconfig for the tenant: %w", err)
	}
	cfg.UserAgent = UserAgent
	cfg.Timeout = requestTimeout
	// One transport for both clients: one connection to the tenant.
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("an HTTP client for the tenant API at %s: %w", cfg.Host, err)
	}
	cl, err := client.New(cfg, client.Options{HTTPClient: hc})
	if err != nil {
		return nil, fmt.Errorf("a client for the tenant API at %s: %w", cfg.Host, err)
	}
	cs, err := kubernetes.NewForConfigAndClient(cfg, hc)
	if err != nil {
		return nil, fmt.Errorf("a clientset for the tenant API at %s: %w", cfg.Host, err)
	}
	a := &Access{Client: cl, Clientset: cs, Config: cfg, KubeconfigHash: h}
	c.mu.Lock()
	defer c.mu.Unlock()
	if old, ok := c.tenants[uid]; ok && old.KubeconfigHash == h {
		// Another worker made it meanwhile: keep one.
		return old, nil
	}
	c.tenants[uid] = a
	return a, nil
}

// Watch describes a metadata watch inside one tenant.
type Watch struct {
	// Name tells a tenant's watches apart ("bootstrap", ...).
	Name string
	// Resources are watched in every namespace.
	Resources []schema.GroupVersionResource
	// LabelSelector filters the objects watched.
	LabelSelector string
	// OnDelete is called with each deleted object (a
	// *metav1.PartialObjectMetadata or a cache.DeletedFinalStateUnknown)
	// and the watch's context, which ends when the watch is stopped.
	OnDelete func(ctx context.Context, obj any)
}

// ErrNotStarted is returned by Watch before Start: nothing would receive
// the watch's events.
var ErrNotStarted = errors.New("the tenant cluster cache is not started")

// Watch starts w inside the tenant of a (from For), or keeps it when it
// runs already for the same kubeconfig, resources and selector.
func (c *Cache) Watch(uid types.UID, a *Access, w Watch) error {
	gvrs := slices.Clone(w.Resources)
	slices.SortFunc(gvrs, func(x, y schema.GroupVersionResource) int { return strings.Compare(x.String(), y.String()) })
	var key strings.Builder
	fmt.Fprintf(&key, "%x;%s", a.KubeconfigHash, w.LabelSelector)
	for _, r := range gvrs {
		key.WriteString(";" + r.String())
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ctx == nil {
		return ErrNotStarted
	}
	k := watchKey{uid: uid, name: w.Name}
	if old, ok := c.watches[k]; ok {
		if old.key == key.String() {
			return nil
		}
		old.cancel()
		delete(c.watches, k)
	}
	mc, err := metadata.NewForConfig(a.Config)
	if err != nil {
		return fmt.Errorf("a metadata client for the tenant API at %s: %w", a.Config.Host, err)
	}
	ctx, cancel := context.WithCancel(c.ctx)
	factory := metadatainformer.NewFilteredSharedInformerFactory(mc, 0, metav1.NamespaceAll, func(o *metav1.ListOptions) {
		o.LabelSelector = w.LabelSelector
	})
	onDelete := func(obj any) { w.OnDelete(ctx, obj) }
	for _, gvr := range gvrs {
		if _, err := factory.ForResource(gvr).Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{DeleteFunc: onDelete}); err != nil {
			cancel()
			return fmt.Errorf("watching %s inside the tenant: %w", gvr, err)
		}
	}
	factory.Start(ctx.Done())
	c.watches[k] = running{key: key.String(), cancel: cancel}
	return nil
}

// Forget drops the tenant's Access and stops its watches.
func (c *Cache) Forget(uid types.UID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.tenants, uid)
	for k, w := range c.watches {
		if k.uid == uid {
			w.cancel()
			delete(c.watches, k)
		}
	}
}

// Watching says how many watches run inside the tenant (tests, metrics).
func (c *Cache) Watching(uid types.UID) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for k := range c.watches {
		if k.uid == uid {
			n++
		}
	}
	return n
}
