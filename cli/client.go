package cli

import (
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/go-logr/logr"
	"github.com/spf13/pflag"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	apiaryv1alpha1 "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

// Scheme knows the types the CLI reads: core Secrets and Apiary's API.
var Scheme = runtime.NewScheme()

func init() {
	utilruntime.Must(corev1.AddToScheme(Scheme))
	utilruntime.Must(autoscalingv1.AddToScheme(Scheme))
	utilruntime.Must(apiaryv1alpha1.AddToScheme(Scheme))
}

// ConfigFlags are the global flags that select the management cluster and the
// namespace, resolved with client-go's standard loading rules (--kubeconfig,
// else $KUBECONFIG, else ~/.kube/config, else in-cluster).
type ConfigFlags struct {
	// Kubeconfig is an explicit kubeconfig file; empty uses the loading rules.
	Kubeconfig string
	// Context is the kubeconfig context; empty uses the current context.
	Context string
	// Namespace overrides the namespace of the context; empty uses the
	// context's namespace, else "default".
	Namespace string
}

// AddFlags registers --kubeconfig, --context and -n/--namespace.
func (f *ConfigFlags) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&f.Kubeconfig, "kubeconfig", "",
		"kubeconfig file of the management cluster (default: $KUBECONFIG, else ~/.kube/config)")
	fs.StringVar(&f.Context, "context", "",
		"kubeconfig context to use (default: the current context)")
	fs.StringVarP(&f.Namespace, "namespace", "n", "",
		`namespace of the tenant control planes (default: the namespace of the context, else "default")`)
}

// ClientConfig returns the client-go loader for the selected kubeconfig and
// context.
func (f *ConfigFlags) ClientConfig() clientcmd.ClientConfig {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = f.Kubeconfig
	overrides := &clientcmd.ConfigOverrides{CurrentContext: f.Context}
	overrides.Context.Namespace = f.Namespace
	return clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, overrides)
}

// ResolveNamespace returns -n when given, else the namespace of the selected
// context, else "default".
func (f *ConfigFlags) ResolveNamespace() (string, error) {
	if f.Namespace != "" {
		return f.Namespace, nil
	}
	ns, _, err := f.ClientConfig().Namespace()
	if err != nil {
		return "", kubeconfigError(err)
	}
	if ns == "" {
		ns = "default"
	}
	return ns, nil
}

// RESTConfig returns the REST config of the selected context.
func (f *ConfigFlags) RESTConfig() (*rest.Config, error) {
	cfg, err := f.ClientConfig().ClientConfig()
	if err != nil {
		return nil, kubeconfigError(err)
	}
	return cfg, nil
}

// NewClient returns a client of the management cluster. API warnings (such as
// deprecations) are written to warnings.
func (f *ConfigFlags) NewClient(warnings io.Writer) (client.Client, error) {
	cfg, err := f.RESTConfig()
	if err != nil {
		return nil, err
	}
	cfg = rest.CopyConfig(cfg)
	cfg.WarningHandler = rest.NewWarningWriter(warnings, rest.WarningWriterOptions{Deduplicate: true})
	cfg.WarningHandlerWithContext = nil
	if cfg.UserAgent == "" {
		cfg.UserAgent = "apiary-cli"
	}
	// The command line reports errors itself; controller-runtime would
	// otherwise complain, after 30 s, that no logger was set.
	quietControllerRuntime.Do(quietLogs)
	c, err := client.New(cfg, client.Options{Scheme: Scheme})
	if err != nil {
		return nil, fmt.Errorf("cannot create a client for %s: %w", cfg.Host, err)
	}
	return c, nil
}

var quietControllerRuntime sync.Once

func quietLogs() { ctrllog.SetLogger(logr.Discard()) }

// NamespacedClient resolves the namespace and makes a client, for commands
// that work in one namespace; API warnings go to warnings.
func (f *ConfigFlags) NamespacedClient(warnings io.Writer) (string, client.Client, error) {
	ns, err := f.ResolveNamespace()
	if err != nil {
		return "", nil, err
	}
	c, err := f.NewClient(warnings)
	return ns, c, err
}

// kubeconfigError explains a failure to load the user's kubeconfig.
func kubeconfigError(err error) error {
	if clientcmd.IsEmptyConfig(err) {
		return errors.New("no kubeconfig found for the management cluster: pass --kubeconfig, set KUBECONFIG, or create ~/.kube/config")
	}
	return fmt.Errorf("cannot load the kubeconfig of the management cluster: %w", err)
}
