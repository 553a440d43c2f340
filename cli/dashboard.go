package cli

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/spf13/cobra"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/apiaryhq/apiary/dashboard/server"
)

// DefaultDashboardListen is where "apiary dashboard --local" serves.
const DefaultDashboardListen = "127.0.0.1:8080"

// NewDashboardCommand returns "apiary dashboard".
func NewDashboardCommand(flags *ConfigFlags) *cobra.Command {
	var local bool
	listen := DefaultDashboardListen
	cmd := &cobra.Command{
		Use:   "dashboard --local",
		Short: "Open the dashboard of tenants, with your own kubeconfig",
		Long: `Serve the dashboard on this machine, acting with your own kubeconfig
(--local): you see and do what your RBAC in the management cluster allows,
with no sign-in. It listens on loopback only, since anyone reaching it acts
as you.

The overview lists the tenants of a namespace (or all namespaces) and
updates live from a watch: tenants needing attention come first.

Serving signed-in users from the management cluster (OpenID Connect
sign-in, each user impersonated) is not available from this command yet.`,
		Example: `  apiary dashboard --local
  apiary dashboard --local --listen 127.0.0.1:9000`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !local {
				return errors.New("only --local is available: the dashboard for signed-in users is not built into this command yet")
			}
			host, _, err := net.SplitHostPort(listen)
			if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
				return fmt.Errorf("--listen %s: want a loopback address and port (such as %s): whoever reaches the dashboard acts with your kubeconfig", listen, DefaultDashboardListen)
			}
			cfg, err := flags.RESTConfig()
			if err != nil {
				return err
			}
			quietControllerRuntime.Do(quietLogs)
			c, err := client.NewWithWatch(cfg, client.Options{Scheme: Scheme})
			if err != nil {
				return fmt.Errorf("cannot create a client for %s: %w", cfg.Host, err)
			}
			h, err := server.New(server.Options{Local: c})
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", listen)
			if err != nil {
				return fmt.Errorf("listening on %s (choose another with --listen): %w", listen, err)
			}
			srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
			go func() {
				<-ctx.Done()
				_ = srv.Close()
			}()
			fmt.Fprintf(cmd.OutOrStdout(), "Dashboard of %s at http://%s/ (Ctrl-C to stop)\n", cfg.Host, ln.Addr())
			if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("serving the dashboard: %w", err)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&local, "local", false, "serve on this machine with your own kubeconfig, no sign-in")
	cmd.Flags().StringVar(&listen, "listen", listen, "loopback address and port to serve on")
	return cmd
}
