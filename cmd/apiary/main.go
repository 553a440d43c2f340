// Command apiary is the single binary of Apiary: the operator that hosts
// tenant Kubernetes control planes ("apiary operator") and the command-line
// tool to inspect them and get their kubeconfigs.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/apiaryhq/apiary/cli"
)

// version is the build version, set by -ldflags "-X main.version=vX.Y.Z".
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run executes the apiary command line args, writing to stdout and stderr,
// and returns the exit code: 0 on success, 1 on error (printed to stderr).
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := newRootCommand()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	if err := root.ExecuteContext(ctx); err != nil {
		fmt.Fprintf(stderr, "Error: %v\n", err)
		return 1
	}
	return 0
}

// newRootCommand builds the apiary command tree. Each call returns a fresh
// tree with its own flag values.
func newRootCommand() *cobra.Command {
	flags := &cli.ConfigFlags{}
	root := &cobra.Command{
		Use:   "apiary",
		Short: "Hosted Kubernetes control planes",
		Long: `Apiary hosts Kubernetes control planes for tenants on a management cluster.

Each tenant is a TenantControlPlane object (short name "tcp") in a namespace of
the management cluster. The Apiary operator runs the tenant's kube-apiserver,
kube-controller-manager and scheduler as pods there, exposes the tenant API
through a Service (status.endpoint), issues its certificates, and writes an
admin kubeconfig Secret (<name>-admin-kubeconfig). In "standalone" mode the
control plane only runs as those hosted pods; in "registered" mode it runs on
the tenant's own control-plane Hosts, registered as tainted Nodes.

A tenant's state lives in a DataStore: a cluster-scoped object naming a shared
etcd, on which each tenant gets its own key prefix, user and role.

The status of a tenant is summarised by its conditions (DataStoreReady,
CertificatesReady, EndpointReady, ControlPlaneAvailable, TenantBootstrapped
and Ready) and its phase (Provisioning, Ready, NotReady or Deleting).

Machines join a tenant as Nodes through Host objects ("apiary host add"): the
operator reaches them over SSH with a pinned host key, checks them, installs
the node software and runs kubeadm join.

The commands below talk to the management cluster with your own kubeconfig:
--kubeconfig, else $KUBECONFIG, else ~/.kube/config; --context selects a
context, and -n a namespace (default: the context's namespace, else "default").`,
		Example: `  # The tenants of every namespace, and why those that are not Ready are not
  apiary status -A

  # One tenant in detail
  apiary status dev -n team-a

  # Use a tenant
  apiary kubeconfig dev -n team-a > dev.kubeconfig
  kubectl --kubeconfig dev.kubeconfig get nodes`,
		Version:       cli.BuildVersion(version),
		SilenceUsage:  true, // errors say what to do; the usage would bury them
		SilenceErrors: true, // run prints them
	}
	root.SetVersionTemplate("apiary version {{.Version}}\n")
	flags.AddFlags(root.PersistentFlags())

	root.AddCommand(
		cli.NewStatusCommand(flags),
		cli.NewKubeconfigCommand(flags),
		cli.NewHostCommand(flags),
		cli.NewSwitchCommand(flags),
		cli.NewCertsCommand(flags),
		cli.NewDashboardCommand(flags),
		cli.NewOIDCLoginCommand(),
		cli.NewVersionCommand(version),
		newOperatorCommand(), // cmd/apiary/operator.go
	)
	return root
}
