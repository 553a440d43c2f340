package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	apiaryv1alpha1 "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

// StatusOptions are the flags of "apiary status".
type StatusOptions struct {
	// AllNamespaces lists the tenants of every namespace.
	AllNamespaces bool
	// Output is "" (table or detail), "yaml" or "json".
	Output string
}

// ListTenants lists the tenants of a namespace ("" for every namespace),
// sorted by namespace and name.
func ListTenants(ctx context.Context, c client.Reader, namespace string) ([]apiaryv1alpha1.TenantControlPlane, error) {
	list := &apiaryv1alpha1.TenantControlPlaneList{}
	if err := c.List(ctx, list, client.InNamespace(namespace)); err != nil {
		return nil, request{verb: "list", resource: resourceTenantControlPlanes, namespace: namespace}.explain(err)
	}
	SortTenants(list.Items)
	return list.Items, nil
}

// GetTenant reads one tenant; a missing one is a *NotFoundError.
func GetTenant(ctx context.Context, c client.Reader, namespace, name string) (*apiaryv1alpha1.TenantControlPlane, error) {
	tcp := &apiaryv1alpha1.TenantControlPlane{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, tcp); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, &NotFoundError{Namespace: namespace, Name: name}
		}
		return nil, request{verb: "get", resource: resourceTenantControlPlanes, namespace: namespace, name: name}.explain(err)
	}
	return tcp, nil
}

// NoTenantsMessage is printed when a listing is empty.
func NoTenantsMessage(namespace string) string {
	if namespace == "" {
		return "No tenant control planes found in any namespace."
	}
	return fmt.Sprintf("No tenant control planes found in namespace %s.", namespace)
}

// NewStatusCommand returns "apiary status [NAME]".
func NewStatusCommand(flags *ConfigFlags) *cobra.Command {
	opts := StatusOptions{}
	cmd := &cobra.Command{
		Use:   "status [NAME]",
		Short: "Show the state of tenant control planes",
		Long: `Show the state of the tenant control planes (TenantControlPlane objects) of a
namespace, or of every namespace with -A.

The table has one line per tenant, sorted by namespace and name:

  VERSION     the running version (status.version), else the requested one
  MODE        standalone (hosted pods only) or registered (on the tenant's Hosts)
  PHASE       Provisioning, Ready, NotReady or Deleting
  READY       ready control-plane pods / desired pods
  ENDPOINT    the URL of the tenant API
  DATASTORE   the DataStore (shared etcd) holding the tenant's state
  CONDITIONS  the conditions that are not True, as Type=Reason, or "all ready"

With a NAME, it shows that tenant in detail: every condition with its reason,
message and age, the endpoint, the datastore binding (DataStore, key prefix,
etcd user, and what the tenant stores against its quota), the certificates
with their expiry, and the replicas.

-o yaml or -o json prints the objects themselves instead.`,
		Example: `  # The tenants of the current namespace
  apiary status

  # The tenants of every namespace
  apiary status -A

  # One tenant in detail: why is it not Ready?
  apiary status dev -n team-a

  # The raw objects, for scripts
  apiary status -A -o json`,
		Args:              cobra.MaximumNArgs(1),
		ValidArgsFunction: completeTenantNames(flags),
		RunE: func(cmd *cobra.Command, args []string) error {
			switch opts.Output {
			case "", "yaml", "json":
			default:
				return fmt.Errorf("unknown output format %q: use -o yaml or -o json, or no -o for a table", opts.Output)
			}
			if len(args) == 1 && opts.AllNamespaces {
				return fmt.Errorf("a NAME cannot be combined with --all-namespaces: give its namespace with -n")
			}
			namespace := ""
			if !opts.AllNamespaces {
				ns, err := flags.ResolveNamespace()
				if err != nil {
					return err
				}
				namespace = ns
			}
			c, err := flags.NewClient(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			return runStatus(cmd.Context(), c, cmd.OutOrStdout(), cmd.ErrOrStderr(), namespace, args, opts)
		},
	}
	cmd.Flags().BoolVarP(&opts.AllNamespaces, "all-namespaces", "A", false, "list the tenants of every namespace")
	cmd.Flags().StringVarP(&opts.Output, "output", "o", "", "print the objects as yaml or json instead of a table")
	_ = cmd.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]string{"yaml", "json"}, cobra.ShellCompDirectiveNoFileComp))
	return cmd
}

func runStatus(ctx context.Context, c client.Reader, stdout, stderr io.Writer, namespace string, args []string, opts StatusOptions) error {
	if len(args) == 1 {
		tcp, err := GetTenant(ctx, c, namespace, args[0])
		if err != nil {
			return err
		}
		if opts.Output != "" {
			return printObject(stdout, opts.Output, cleanForOutput(tcp))
		}
		_, err = io.WriteString(stdout, FormatDetail(tcp, time.Now()))
		return err
	}

	items, err := ListTenants(ctx, c, namespace)
	if err != nil {
		return err
	}
	if opts.Output != "" {
		list := &apiaryv1alpha1.TenantControlPlaneList{Items: items}
		list.APIVersion = apiaryv1alpha1.GroupVersion.String()
		list.Kind = "TenantControlPlaneList"
		for i := range list.Items {
			cleanForOutput(&list.Items[i])
		}
		return printObject(stdout, opts.Output, list)
	}
	if len(items) == 0 {
		_, err := fmt.Fprintln(stderr, NoTenantsMessage(namespace))
		return err
	}
	_, err = io.WriteString(stdout, FormatTable(items, opts.AllNamespaces))
	return err
}

// cleanForOutput sets the type of tcp (clients drop it when decoding) and
// drops its managed fields, as kubectl does.
func cleanForOutput(tcp *apiaryv1alpha1.TenantControlPlane) *apiaryv1alpha1.TenantControlPlane {
	tcp.APIVersion = apiaryv1alpha1.GroupVersion.String()
	tcp.Kind = "TenantControlPlane"
	tcp.ManagedFields = nil
	return tcp
}

func printObject(w io.Writer, format string, obj any) error {
	var out []byte
	var err error
	if format == "json" {
		out, err = json.MarshalIndent(obj, "", "    ")
		out = append(out, '\n')
	} else {
		out, err = yaml.Marshal(obj)
	}
	if err != nil {
		return fmt.Errorf("cannot encode as %s: %w", format, err)
	}
	_, err = w.Write(out)
	return err
}

// completeTenantNames completes the NAME argument with the tenants of the
// selected namespace.
func completeTenantNames(flags *ConfigFlags) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
		if len(args) > 0 {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		ns, err := flags.ResolveNamespace()
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		c, err := flags.NewClient(io.Discard)
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		ctx, cancel := context.WithTimeout(cmd.Context(), 5*time.Second)
		defer cancel()
		items, err := ListTenants(ctx, c, ns)
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		names := make([]string, 0, len(items))
		for _, tcp := range items {
			names = append(names, tcp.Name)
		}
		return names, cobra.ShellCompDirectiveNoFileComp
	}
}
