package main

import (
	goflag "flag"
	"fmt"

	"github.com/spf13/cobra"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/apiaryhq/apiary/operator"
)

func newOperatorCommand() *cobra.Command {
	opts := operator.DefaultOptions()
	logOpts := zap.Options{}
	var qps float32 = -1
	burst := 100
	cmd := &cobra.Command{
		Use:   "operator",
		Short: "Run the Apiary operator (controllers and webhooks)",
		Long: `Run the Apiary operator in the management cluster.

It reconciles DataStores (checks each etcd with a real call, counts its tenants,
and keeps it while tenants use it) and TenantControlPlanes: it binds each
tenant to a DataStore (its own etcd user, role and key prefix), issues its
certificates and kubeconfigs into Secrets, exposes its API with a Service, runs
kube-apiserver, kube-controller-manager and kube-scheduler as a Deployment, and
reports conditions and events. It also serves the defaulting and validating
admission webhooks for TenantControlPlanes (--webhooks).

In a pod it uses the in-cluster configuration; elsewhere --kubeconfig,
$KUBECONFIG or ~/.kube/config. Run several replicas with --leader-elect.`,
		Example: `  # Outside the cluster, against the current kubeconfig context, without webhooks
  apiary operator --webhooks=false --metrics-bind-address=0 --health-probe-bind-address=:8081

  # In the cluster (what the Helm chart runs)
  apiary operator --leader-elect --leader-election-namespace=apiary-system --webhook-cert-dir=/certs`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctrl.SetLogger(zap.New(zap.UseFlagOptions(&logOpts)))
			cfg, err := restConfig(cmd)
			if err != nil {
				return err
			}
			// client-go's default (5 requests/s per resource type) makes 100
			// tenants take minutes to provision; like controller-runtime, rely
			// on the API server's priority and fairness unless told otherwise.
			cfg.QPS, cfg.Burst = qps, burst
			return operator.Run(cmd.Context(), cfg, opts)
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.MetricsAddr, "metrics-bind-address", opts.MetricsAddr, `address of the Prometheus metrics endpoint ("0" disables it)`)
	f.BoolVar(&opts.NetworkPolicies, "network-policies", opts.NetworkPolicies, "apply a NetworkPolicy per tenant (its control-plane pods accept only the API and konnectivity ports, and reach only DNS, their DataStore and addresses outside the management cluster's ranges) and per managed etcd (client port from control planes and the operator, peer port from members, metrics from --monitoring-namespace-labels); the cluster must enforce NetworkPolicy")
	f.StringVar(&opts.Policy.OperatorNamespace, "operator-namespace", opts.Policy.OperatorNamespace, "namespace of the operator's pods, which the etcd NetworkPolicies let reach the client port")
	f.StringToStringVar(&opts.Policy.OperatorPodLabels, "operator-pod-labels", opts.Policy.OperatorPodLabels, "labels of the operator's pods (key=value,...)")
	f.StringVar(&opts.Policy.DNSNamespace, "dns-namespace", opts.Policy.DNSNamespace, "namespace of the cluster DNS pods control planes may query")
	f.StringToStringVar(&opts.Policy.DNSPodLabels, "dns-pod-labels", opts.Policy.DNSPodLabels, "labels of the cluster DNS pods (key=value,...)")
	f.StringToStringVar(&opts.Policy.MonitoringNamespaceLabels, "monitoring-namespace-labels", opts.Policy.MonitoringNamespaceLabels, "labels of the namespaces whose pods may scrape etcd's metrics port (key=value,...); empty: none")
	f.StringSliceVar(&opts.Policy.ManagementCIDRs, "management-cidrs", opts.Policy.ManagementCIDRs, "the management cluster's pod, Service and node ranges, which control planes may not connect to (but for DNS and their DataStore); empty: found on the Nodes (spec.podCIDRs, addresses) and ServiceCIDRs, and kept current")
	f.StringSliceVar(&opts.TenantNamespaces, "tenant-namespaces", opts.TenantNamespaces, "the only namespaces the operator works in (with --operator-namespace, for managed etcd): it caches and watches only there, and TenantControlPlanes and Hosts elsewhere are refused; empty: every namespace. Give the operator namespaced rights there only (the chart does, from operator.tenantNamespaces)")
	f.StringSliceVar(&opts.TenantPolicy.KonnectivityOptionalNamespaces, "konnectivity-optional-namespaces", opts.TenantPolicy.KonnectivityOptionalNamespaces, `namespaces whose tenants may turn konnectivity off (spec.addons.konnectivity.enabled=false; "*" for all); elsewhere the webhook and the controller refuse it, because without konnectivity a tenant's API server connects to the addresses its Nodes name from the management network`)
	f.BoolVar(&opts.MetricsSecure, "metrics-secure", opts.MetricsSecure, "serve metrics over HTTPS to clients with a bearer token allowed to get the non-resource URL /metrics (checked with TokenReview and SubjectAccessReview); false serves plain HTTP to anyone who reaches the port")
	f.StringVar(&opts.ProbeAddr, "health-probe-bind-address", opts.ProbeAddr, "address of the /healthz and /readyz endpoints")
	f.BoolVar(&opts.LeaderElection, "leader-elect", opts.LeaderElection, "elect a leader so that only one replica reconciles at a time")
	f.StringVar(&opts.LeaderElectionNamespace, "leader-election-namespace", opts.LeaderElectionNamespace, "namespace of the leader-election Lease (default: the pod's namespace)")
	f.BoolVar(&opts.Webhooks, "webhooks", opts.Webhooks, "serve the admission webhooks")
	f.IntVar(&opts.WebhookPort, "webhook-port", opts.WebhookPort, "port of the webhook server")
	f.StringVar(&opts.WebhookCertDir, "webhook-cert-dir", opts.WebhookCertDir, "directory with the webhook serving certificate (tls.crt, tls.key)")
	f.StringVar(&opts.WebhookCertSecret, "webhook-cert-secret", opts.WebhookCertSecret, "namespace/name of a Secret in which the operator issues and renews its own webhook serving certificate (empty: the certificate in --webhook-cert-dir comes from elsewhere, e.g. cert-manager)")
	f.StringVar(&opts.WebhookService, "webhook-service", opts.WebhookService, "namespace/name of the Service the API server calls the webhooks through (names in the self-issued certificate)")
	f.StringVar(&opts.WebhookMutatingConfiguration, "webhook-mutating-configuration", opts.WebhookMutatingConfiguration, "name of the MutatingWebhookConfiguration whose caBundle gets the self-issued CA")
	f.StringVar(&opts.WebhookValidatingConfiguration, "webhook-validating-configuration", opts.WebhookValidatingConfiguration, "name of the ValidatingWebhookConfiguration whose caBundle gets the self-issued CA")
	f.StringVar(&opts.ImageRepository, "image-repository", opts.ImageRepository, "registry and path that replace registry.k8s.io in control-plane images (air-gapped installs)")
	f.StringVar(&opts.ClusterDomain, "cluster-domain", opts.ClusterDomain, "DNS domain of the management cluster (names in the tenant API serving certificate)")
	f.DurationVar(&opts.DataStoreCheckInterval, "datastore-check-interval", opts.DataStoreCheckInterval, "how often each DataStore's etcd is checked for reachability and authentication")
	f.DurationVar(&opts.UsageInterval, "datastore-usage-interval", opts.UsageInterval, "how often each tenant's keys are measured against its DataStore quota (a scan of its keys and values); a tenant can write past its quota for about this long before its API server refuses")
	f.Float32Var(&qps, "kube-api-qps", qps, "client-side limit of requests per second to the management API server (-1: none, rely on API priority and fairness)")
	f.IntVar(&burst, "kube-api-burst", burst, "client-side burst of requests to the management API server (with --kube-api-qps > 0)")
	f.DurationVar(&opts.ShutdownDelay, "shutdown-delay", opts.ShutdownDelay, "on SIGTERM, keep serving this long with /readyz failing, so that webhook calls stop arriving before the server closes")
	f.StringVar(&opts.NodeBundleRepository, "node-bundle-repository", opts.NodeBundleRepository, "repository of the node bundles (kubelet, kubeadm, kubectl, CNI plugins) the host agent installs, tagged by Kubernetes version")
	f.BoolVar(&opts.NodeBundleInsecure, "node-bundle-insecure", opts.NodeBundleInsecure, "pull node bundles over plain HTTP (a local registry)")
	f.IntVar(&opts.MaxConcurrentReconciles, "max-concurrent-reconciles", opts.MaxConcurrentReconciles, "tenants reconciled in parallel")
	gofs := goflag.NewFlagSet("zap", goflag.ContinueOnError)
	logOpts.BindFlags(gofs)
	f.AddGoFlagSet(gofs)
	return cmd
}

// restConfig uses the root's --kubeconfig/--context when given, else the
// in-cluster configuration, else the default loading rules.
func restConfig(cmd *cobra.Command) (*rest.Config, error) {
	kubeconfig, _ := cmd.Flags().GetString("kubeconfig")
	context, _ := cmd.Flags().GetString("context")
	if kubeconfig == "" && context == "" {
		if cfg, err := rest.InClusterConfig(); err == nil {
			return cfg, nil
		}
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: context}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("loading the management cluster's kubeconfig: %w", err)
	}
	return cfg, nil
}
