// Package operator wires Apiary's controllers and webhooks into a
// controller-runtime manager.
package operator

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/apiaryhq/apiary/datastore"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/operator/controllers"
	"github.com/apiaryhq/apiary/operator/metrics"
	"github.com/apiaryhq/apiary/operator/render"
	"github.com/apiaryhq/apiary/operator/tenantcluster"
	"github.com/apiaryhq/apiary/operator/webhookcerts"
	"github.com/apiaryhq/apiary/operator/webhooks"
)

// Options configure the operator; cmd/apiary maps them to flags.
type Options struct {
	MetricsAddr string
	// MetricsSecure serves metrics over HTTPS to authenticated and
	// authorized clients only (TokenReview, then SubjectAccessReview for
	// get on /metrics), with a self-signed serving certificate.
	MetricsSecure           bool
	ProbeAddr               string
	LeaderElection          bool
	LeaderElectionNamespace string
	LeaderElectionID        string
	Webhooks                bool
	WebhookHost             string
	WebhookPort             int
	WebhookCertDir          string
	// WebhookCertSecret ("namespace/name") makes the operator issue and
	// renew its webhook serving certificate itself, kept in that Secret,
	// for WebhookService ("namespace/name"), and inject its CA into
	// the named webhook configurations. Empty: the files in WebhookCertDir
	// come from elsewhere (cert-manager).
	WebhookCertSecret              string
	WebhookService                 string
	WebhookMutatingConfiguration   string
	WebhookValidatingConfiguration string
	ImageRepository                string
	// NodeBundleRepository holds the node bundles the host agent installs,
	// tagged with the Kubernetes version; NodeBundleInsecure reaches it over
	// plain HTTP.
	NodeBundleRepository    string
	NodeBundleInsecure      bool
	ClusterDomain           string
	MaxConcurrentReconciles int
	// ResyncPeriod re-reconciles every object this often even without
	// changes (0: controller-runtime's default of about 10 hours).
	ResyncPeriod time.Duration
	// DataStoreCheckInterval is how often each DataStore's etcd is checked.
	DataStoreCheckInterval time.Duration
	// UsageInterval is how often each tenant's datastore usage is measured
	// against its quota.
	UsageInterval time.Duration
	// ShutdownDelay is how long Run keeps serving after its context ends,
	// with /readyz failing, so that Services stop routing webhook calls to
	// this replica before its webhook server closes.
	ShutdownDelay time.Duration
	// NetworkPolicies makes the operator apply a NetworkPolicy per tenant
	// and per managed etcd (the tenant boundary on the network; the cluster
	// must enforce NetworkPolicy). Policy holds what they select.
	NetworkPolicies bool
	Policy          render.PolicyInputs
	// TenantPolicy is what the platform admin allows tenants (webhook and
	// controller).
	TenantPolicy webhooks.TenantPolicy
	// TenantNamespaces, when set, are the only namespaces the operator
	// works in (with its own, Policy.OperatorNamespace, for managed etcd):
	// it caches and watches only there, and the chart grants its
	// namespaced rights there only. TenantControlPlanes and Hosts
	// elsewhere are refused at admission.
	TenantNamespaces []string
}

// DefaultOptions are the flag defaults.
func DefaultOptions() Options {
	return Options{
		MetricsAddr:             ":8443",
		MetricsSecure:           true,
		ProbeAddr:               ":8081",
		LeaderElectionID:        "apiary-operator.apiary.dev",
		Webhooks:                true,
		WebhookPort:             9443,
		ClusterDomain:           "cluster.local",
		NodeBundleRepository:    controllers.DefaultNodeBundleRepository,
		MaxConcurrentReconciles: 4,
		DataStoreCheckInterval:  controllers.DefaultDataStoreCheckInterval,
		UsageInterval:           controllers.DefaultUsageInterval,
		ShutdownDelay:           5 * time.Second,
		NetworkPolicies:         true,
		Policy: render.PolicyInputs{
			OperatorNamespace: "apiary-system",
			OperatorPodLabels: map[string]string{"app.kubernetes.io/name": "apiary"},
			DNSNamespace:      "kube-system",
			DNSPodLabels:      map[string]string{"k8s-app": "kube-dns"},
		},
	}
}

// Scheme holds every type the operator reads or writes.
func Scheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		return nil, err
	}
	if err := apiary.AddToScheme(s); err != nil {
		return nil, err
	}
	return s, nil
}

// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create

// metricsOptions: secure metrics need the TokenReview and
// SubjectAccessReview rights above; scrapers need get on the non-resource
// URL /metrics (the chart's <release>-metrics-reader ClusterRole).
func metricsOptions(opts Options) metricsserver.Options {
	m := metricsserver.Options{BindAddress: opts.MetricsAddr}
	if opts.MetricsSecure {
		m.SecureServing = true
		m.FilterProvider = filters.WithAuthenticationAndAuthorization
	}
	return m
}

// managedNamespaces are the namespaces the operator works in (tenants',
// and its own for managed etcd), or nil for every namespace.
func managedNamespaces(opts Options) []string {
	if len(opts.TenantNamespaces) == 0 {
		return nil
	}
	out := slices.Clone(opts.TenantNamespaces)
	if !slices.Contains(out, opts.Policy.OperatorNamespace) {
		out = append(out, opts.Policy.OperatorNamespace)
	}
	return out
}

// policyInputs is nil when the operator applies no NetworkPolicies.
func policyInputs(opts Options) *render.PolicyInputs {
	if !opts.NetworkPolicies {
		return nil
	}
	p := opts.Policy
	return &p
}

// NewManager builds a manager with Apiary's controllers and webhooks. The
// returned cleanup closes datastore connections.
func NewManager(cfg *rest.Config, opts Options) (ctrl.Manager, func(), error) {
	scheme, err := Scheme()
	if err != nil {
		return nil, nil, err
	}
	for _, c := range opts.Policy.ManagementCIDRs {
		if _, err := netip.ParsePrefix(c); err != nil {
			return nil, nil, fmt.Errorf("--management-cidrs: %q is not a CIDR such as 10.244.0.0/16", c)
		}
	}
	// Cache only the Secrets, Services and Deployments Apiary owns: a
	// management cluster may hold many others, and caching every Secret
	// would cost memory and read access the operator does not need.
	owned := cache.ByObject{Label: labels.SelectorFromSet(labels.Set{render.LabelManagedBy: render.ManagedBy})}
	mgrOpts := ctrl.Options{
		Scheme:                  scheme,
		Metrics:                 metricsOptions(opts),
		HealthProbeBindAddress:  opts.ProbeAddr,
		LeaderElection:          opts.LeaderElection,
		LeaderElectionID:        opts.LeaderElectionID,
		LeaderElectionNamespace: opts.LeaderElectionNamespace,
		// Hand over at once on a clean shutdown (rolling update).
		LeaderElectionReleaseOnCancel: true,
		// A standby replica starts and syncs every controller's watches
		// when it starts, not when it wins the lease: its cache is then
		// warm, and a namespace of --tenant-namespaces deleted since
		// (its Roles go with it) cannot keep a new informer from
		// syncing. Without this the new leader's controllers waited
		// the 2-minute cache-sync timeout there, and the operator
		// exited and restarted before it reconciled anything.
		Controller: config.Controller{EnableWarmup: ptr.To(true)},
		Cache: cache.Options{
			SyncPeriod: resync(opts.ResyncPeriod),
			// The operator applies with SSA and never reads managedFields:
			// ~10% of the cached bytes per tenant.
			DefaultTransform: cache.TransformStripManagedFields(),
			ByObject: map[client.Object]cache.ByObject{
				&corev1.Secret{}:                owned,
				&corev1.Service{}:               owned,
				&appsv1.Deployment{}:            owned,
				&corev1.ConfigMap{}:             owned,
				&appsv1.StatefulSet{}:           owned,
				&policyv1.PodDisruptionBudget{}: owned,
				&networkingv1.NetworkPolicy{}:   owned,
			}},
	}
	var watch *namespacesWatch
	if namespaces := managedNamespaces(opts); namespaces != nil {
		direct, err := client.New(cfg, client.Options{Scheme: scheme})
		if err != nil {
			return nil, nil, fmt.Errorf("creating a client: %w", err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		usable, err := usableNamespaces(ctx, direct, namespaces)
		cancel()
		if err != nil {
			return nil, nil, err
		}
		if missing := slices.DeleteFunc(slices.Clone(namespaces), func(ns string) bool { return slices.Contains(usable, ns) }); len(missing) > 0 {
			ctrl.Log.Info("tenant namespaces missing or being deleted: not watched until they exist again (the operator then restarts)", "namespaces", missing)
		}
		watch = &namespacesWatch{reader: direct, names: namespaces, started: usable, interval: 30 * time.Second}
		mgrOpts.Cache.DefaultNamespaces = map[string]cache.Config{}
		for _, ns := range usable {
			mgrOpts.Cache.DefaultNamespaces[ns] = cache.Config{}
		}
		// Apiary's own kinds, on which the operator's rights are
		// cluster-wide, in every namespace: the finalizers of tenants and
		// Hosts in a namespace being deleted must still run.
		all := map[string]cache.Config{}
		for _, ns := range namespaces {
			all[ns] = cache.Config{}
		}
		mgrOpts.Cache.ByObject[&apiary.TenantControlPlane{}] = cache.ByObject{Namespaces: all}
		mgrOpts.Cache.ByObject[&apiary.Host{}] = cache.ByObject{Namespaces: all}
	}
	if opts.Webhooks {
		mgrOpts.WebhookServer = webhook.NewServer(webhook.Options{Host: opts.WebhookHost, Port: opts.WebhookPort, CertDir: opts.WebhookCertDir})
	}
	mgr, err := ctrl.NewManager(cfg, mgrOpts)
	if err != nil {
		return nil, nil, fmt.Errorf("creating manager: %w", err)
	}
	if watch != nil {
		if err := mgr.Add(*watch); err != nil {
			return nil, nil, err
		}
	}
	pool := datastore.NewPool()
	if err := (&controllers.DataStoreReconciler{
		Client:          mgr.GetClient(),
		APIReader:       mgr.GetAPIReader(),
		Recorder:        mgr.GetEventRecorder("apiary-datastore"),
		DataStores:      pool,
		CheckInterval:   opts.DataStoreCheckInterval,
		Namespaces:      managedNamespaces(opts),
		ClusterDomain:   opts.ClusterDomain,
		ImageRepository: opts.ImageRepository,
		NetworkPolicy:   policyInputs(opts),
	}).SetupWithManager(mgr); err != nil {
		pool.Close()
		return nil, nil, fmt.Errorf("setting up DataStore controller: %w", err)
	}
	// One connection per tenant cluster, shared by the controllers.
	tenants := tenantcluster.New()
	if err := mgr.Add(tenants); err != nil {
		pool.Close()
		return nil, nil, fmt.Errorf("adding the tenant cluster cache: %w", err)
	}
	if err := (&controllers.TenantControlPlaneReconciler{
		Client:                  mgr.GetClient(),
		APIReader:               mgr.GetAPIReader(),
		Recorder:                mgr.GetEventRecorder("apiary-tenantcontrolplane"),
		DataStores:              pool,
		ImageRepository:         opts.ImageRepository,
		ClusterDomain:           opts.ClusterDomain,
		UsageInterval:           opts.UsageInterval,
		Policy:                  opts.TenantPolicy,
		MaxConcurrentReconciles: opts.MaxConcurrentReconciles,
		NetworkPolicy:           policyInputs(opts),
		Tenants:                 tenants,
	}).SetupWithManager(mgr); err != nil {
		pool.Close()
		return nil, nil, fmt.Errorf("setting up TenantControlPlane controller: %w", err)
	}
	if err := (&controllers.HostReconciler{
		Client:                  mgr.GetClient(),
		APIReader:               mgr.GetAPIReader(),
		Recorder:                mgr.GetEventRecorder("apiary-host"),
		NodeBundleRepository:    opts.NodeBundleRepository,
		NodeBundleInsecure:      opts.NodeBundleInsecure,
		MaxConcurrentReconciles: opts.MaxConcurrentReconciles,
		Tenants:                 tenants,
	}).SetupWithManager(mgr); err != nil {
		pool.Close()
		return nil, nil, fmt.Errorf("setting up Host controller: %w", err)
	}
	if opts.Webhooks && opts.WebhookCertSecret != "" {
		certs, err := webhookCertManager(cfg, scheme, opts)
		if err != nil {
			pool.Close()
			return nil, nil, err
		}
		// The webhook server must start with files: issue before returning.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		err = retry(ctx, certs.Ensure, func(err error) {
			ctrl.Log.WithName("webhook-certs").Error(err, "preparing the webhook serving certificate; retrying")
		})
		cancel()
		if err != nil {
			pool.Close()
			return nil, nil, fmt.Errorf("preparing the webhook serving certificate: %w", err)
		}
		if err := mgr.Add(certs); err != nil {
			pool.Close()
			return nil, nil, err
		}
	}
	if opts.Webhooks {
		if err := (webhooks.TenantControlPlane{Policy: opts.TenantPolicy, Namespaces: opts.TenantNamespaces}).Setup(mgr); err != nil {
			pool.Close()
			return nil, nil, fmt.Errorf("setting up webhooks: %w", err)
		}
		if err := (webhooks.Host{Namespaces: opts.TenantNamespaces}).Setup(mgr); err != nil {
			pool.Close()
			return nil, nil, fmt.Errorf("setting up webhooks: %w", err)
		}
		if err := mgr.AddReadyzCheck("webhook", mgr.GetWebhookServer().StartedChecker()); err != nil {
			pool.Close()
			return nil, nil, err
		}
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		pool.Close()
		return nil, nil, err
	}
	// The state series come from the leader only (every replica's cache
	// is full: see EnableWarmup above), so that sums count each object
	// once.
	elected := mgr.Elected()
	state := &metrics.Collector{Reader: mgr.GetCache(), Log: ctrl.Log.WithName("metrics"), Leading: func() bool {
		select {
		case <-elected:
			return true
		default:
			return false
		}
	}}
	if err := metrics.Register(crmetrics.Registry, state); err != nil {
		pool.Close()
		return nil, nil, fmt.Errorf("registering Apiary's metrics: %w", err)
	}
	return mgr, pool.Close, nil
}

// Run starts the operator and blocks until ctx ends and the shutdown delay
// has passed.
func Run(ctx context.Context, cfg *rest.Config, opts Options) error {
	mgr, cleanup, err := NewManager(cfg, opts)
	if err != nil {
		return err
	}
	defer cleanup()
	var draining atomic.Bool
	if err := mgr.AddReadyzCheck("draining", func(*http.Request) error {
		if draining.Load() {
			return errors.New("shutting down")
		}
		return nil
	}); err != nil {
		return err
	}
	mgrCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	defer stop()
	go func() {
		select {
		case <-ctx.Done():
		case <-mgrCtx.Done():
			return
		}
		draining.Store(true)
		ctrl.Log.Info("shutting down: serving until the delay has passed", "delay", opts.ShutdownDelay)
		time.Sleep(opts.ShutdownDelay)
		stop()
	}()
	if err := mgr.Start(mgrCtx); err != nil {
		return fmt.Errorf("running manager: %w", err)
	}
	return nil
}

func resync(d time.Duration) *time.Duration {
	if d == 0 {
		return nil
	}
	return &d
}

func webhookCertManager(cfg *rest.Config, scheme *runtime.Scheme, opts Options) (*webhookcerts.Manager, error) {
	secretNS, secretName, ok := strings.Cut(opts.WebhookCertSecret, "/")
	svcNS, svcName, ok2 := strings.Cut(opts.WebhookService, "/")
	if !ok || !ok2 || secretName == "" || svcName == "" {
		return nil, fmt.Errorf("--webhook-cert-secret and --webhook-service must both be namespace/name (got %q, %q)", opts.WebhookCertSecret, opts.WebhookService)
	}
	if opts.WebhookCertDir == "" {
		return nil, fmt.Errorf("--webhook-cert-dir is required with --webhook-cert-secret")
	}
	// Uncached: it runs before the manager's caches start.
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, err
	}
	return &webhookcerts.Manager{Client: c, Options: webhookcerts.Options{
		SecretNamespace: secretNS, SecretName: secretName,
		ServiceNamespace: svcNS, ServiceName: svcName,
		ClusterDomain:           opts.ClusterDomain,
		CertDir:                 opts.WebhookCertDir,
		MutatingConfiguration:   opts.WebhookMutatingConfiguration,
		ValidatingConfiguration: opts.WebhookValidatingConfiguration,
	}}, nil
}

// retry calls f until it succeeds or ctx ends, backing off up to 5 s: the
// API server may not answer yet when the operator pod starts.
func retry(ctx context.Context, f func(context.Context) error, onError func(error)) error {
	delay := 200 * time.Millisecond
	for {
		err := f(ctx)
		if err == nil {
			return nil
		}
		onError(err)
		select {
		case <-ctx.Done():
			return err
		case <-time.After(delay):
		}
		delay = min(2*delay, 5*time.Second)
	}
}
