package cli

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/apiaryhq/apiary/dashboard/asuser"
	"github.com/apiaryhq/apiary/dashboard/server"
	"github.com/apiaryhq/apiary/dashboard/session"
	"github.com/apiaryhq/apiary/dashboard/signin"
	apiaryv1alpha1 "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

// DefaultDashboardListen is where "apiary dashboard --local" serves.
const DefaultDashboardListen = "127.0.0.1:8080"

// DashboardOptions are the flags of the signed-in dashboard.
type DashboardOptions struct {
	Listen, TLSCertFile, TLSKeyFile         string
	SessionHashKeyFile, SessionBlockKeyFile string
	SessionLifetime                         time.Duration
	Issuer, IssuerCAFile, ClientID          string
	ClientSecretFile, RedirectURL           string
	UsernameClaim, UsernamePrefix           string
	GroupsClaim, GroupsPrefix               string
}

// NewDashboardCommand returns "apiary dashboard".
func NewDashboardCommand(flags *ConfigFlags) *cobra.Command {
	var local bool
	o := DashboardOptions{Listen: DefaultDashboardListen, SessionLifetime: 8 * time.Hour, UsernamePrefix: "oidc:", GroupsPrefix: "oidc:"}
	cmd := &cobra.Command{
		Use:   "dashboard (--local | --issuer URL --client-id ID --redirect-url URL ...)",
		Short: "Serve the dashboard of tenants",
		Long: `Serve the dashboard of tenants.

With --local it runs on this machine with your own kubeconfig: you see and
do what your RBAC in the management cluster allows, with no sign-in. It
listens on loopback only, since anyone reaching it acts as you.

Without --local it serves signed-in users (as the chart's Deployment
would): users sign in with an OpenID provider (authorization code with
PKCE); every API request impersonates the signed-in user and groups (with
the prefixes given), so the dashboard's own identity needs only the right to
impersonate users and groups. It serves HTTPS only (the session cookie is
Secure) and needs two session keys (files of 32 random bytes each, shared
by every replica): one signs, one encrypts the cookie.

The overview lists the tenants of a namespace (or all namespaces) and
updates live from a watch: tenants needing attention come first.`,
		Example: `  apiary dashboard --local
  apiary dashboard --local --listen 127.0.0.1:9000

  # Signed-in users
  head -c 32 /dev/urandom > hash.key; head -c 32 /dev/urandom > block.key
  apiary dashboard --listen :8443 --tls-cert-file tls.crt --tls-key-file tls.key \
    --session-hash-key-file hash.key --session-block-key-file block.key \
    --issuer https://idp.example --client-id dashboard --client-secret-file secret \
    --redirect-url https://dashboard.example/callback`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !local && !cmd.Flags().Changed("listen") {
				o.Listen = ":8443"
			}
			cfg, err := flags.RESTConfig()
			if err != nil {
				return err
			}
			quietControllerRuntime.Do(quietLogs)
			var h http.Handler
			if local {
				h, err = localDashboard(cfg, o.Listen)
			} else {
				h, err = signedInDashboard(cmd.Context(), cfg, o)
			}
			if err != nil {
				return err
			}
			return serveDashboard(cmd, h, cfg.Host, o, local)
		},
	}
	f := cmd.Flags()
	f.BoolVar(&local, "local", false, "serve on this machine with your own kubeconfig, no sign-in")
	f.StringVar(&o.Listen, "listen", o.Listen, "address and port to serve on (--local: loopback only; default :8443 without --local)")
	f.StringVar(&o.TLSCertFile, "tls-cert-file", "", "serving certificate (PEM), required without --local")
	f.StringVar(&o.TLSKeyFile, "tls-key-file", "", "its private key (PEM)")
	f.StringVar(&o.SessionHashKeyFile, "session-hash-key-file", "", "32 or more random bytes that sign session cookies")
	f.StringVar(&o.SessionBlockKeyFile, "session-block-key-file", "", "exactly 32 random bytes that encrypt session cookies (AES-256)")
	f.DurationVar(&o.SessionLifetime, "session-lifetime", o.SessionLifetime, "how long a sign-in lasts")
	f.StringVar(&o.Issuer, "issuer", "", "the OpenID provider's issuer URL (https)")
	f.StringVar(&o.IssuerCAFile, "issuer-ca-file", "", "CA bundle the provider's certificate chains to (default: the system's)")
	f.StringVar(&o.ClientID, "client-id", "", "the dashboard's client ID at the provider")
	f.StringVar(&o.ClientSecretFile, "client-secret-file", "", "file holding the client secret (none: a public client with PKCE)")
	f.StringVar(&o.RedirectURL, "redirect-url", "", "the dashboard's external URL + /callback, registered at the provider")
	f.StringVar(&o.UsernameClaim, "username-claim", "email", "ID token claim naming the user")
	f.StringVar(&o.UsernamePrefix, "username-prefix", o.UsernamePrefix, "prefix of impersonated user names")
	f.StringVar(&o.GroupsClaim, "groups-claim", "groups", "ID token claim listing the user's groups")
	f.StringVar(&o.GroupsPrefix, "groups-prefix", o.GroupsPrefix, "prefix of impersonated group names")
	return cmd
}

func localDashboard(cfg *rest.Config, listen string) (http.Handler, error) {
	host, _, err := net.SplitHostPort(listen)
	if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
		return nil, fmt.Errorf("--listen %s: want a loopback address and port (such as %s): whoever reaches the dashboard acts with your kubeconfig", listen, DefaultDashboardListen)
	}
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: Scheme})
	if err != nil {
		return nil, fmt.Errorf("cannot create a client for %s: %w", cfg.Host, err)
	}
	return server.New(dashboardActions(server.Options{Local: c}))
}

func signedInDashboard(ctx context.Context, cfg *rest.Config, o DashboardOptions) (http.Handler, error) {
	var missing []string
	for flag, v := range map[string]string{
		"--tls-cert-file": o.TLSCertFile, "--tls-key-file": o.TLSKeyFile, "--issuer": o.Issuer, "--client-id": o.ClientID,
		"--redirect-url": o.RedirectURL, "--session-hash-key-file": o.SessionHashKeyFile, "--session-block-key-file": o.SessionBlockKeyFile,
	} {
		if v == "" {
			missing = append(missing, flag)
		}
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		return nil, fmt.Errorf("serving signed-in users needs %s (or --local on this machine)", strings.Join(missing, ", "))
	}
	hashKey, err := os.ReadFile(o.SessionHashKeyFile)
	if err != nil {
		return nil, fmt.Errorf("--session-hash-key-file: %w", err)
	}
	blockKey, err := os.ReadFile(o.SessionBlockKeyFile)
	if err != nil {
		return nil, fmt.Errorf("--session-block-key-file: %w", err)
	}
	sessions, err := session.NewStore(hashKey, blockKey, o.SessionLifetime)
	if err != nil {
		return nil, err
	}
	hc := http.DefaultClient
	if o.IssuerCAFile != "" {
		pool, err := certPool(o.IssuerCAFile)
		if err != nil {
			return nil, fmt.Errorf("--issuer-ca-file: %w", err)
		}
		hc = &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	}
	var secret string
	if o.ClientSecretFile != "" {
		b, err := os.ReadFile(o.ClientSecretFile)
		if err != nil {
			return nil, fmt.Errorf("--client-secret-file: %w", err)
		}
		secret = strings.TrimSpace(string(b))
	}
	sign, err := signin.New(ctx, signin.Config{
		Issuer: o.Issuer, ClientID: o.ClientID, ClientSecret: secret, RedirectURL: o.RedirectURL,
		UsernameClaim: o.UsernameClaim, UsernamePrefix: o.UsernamePrefix, GroupsClaim: o.GroupsClaim, GroupsPrefix: o.GroupsPrefix,
		HTTPClient: hc,
	}, sessions)
	if err != nil {
		return nil, err
	}
	clients, err := asuser.New(cfg)
	if err != nil {
		return nil, err
	}
	return server.New(dashboardActions(server.Options{Clients: clients, SignIn: sign}))
}

// dashboardActions gives the dashboard what `apiary kubeconfig` and
// `apiary switch --check-only` do, so that the page and the commands
// explain the same things the same way.
func dashboardActions(o server.Options) server.Options {
	o.Kubeconfig = func(ctx context.Context, c client.Reader, namespace, name string) ([]byte, error) {
		res, err := FetchKubeconfig(ctx, c, KubeconfigRequest{Namespace: namespace, Name: name})
		if err != nil {
			return nil, err
		}
		return res.Kubeconfig, nil
	}
	o.CheckSwitch = func(ctx context.Context, c client.Client, tcp *apiaryv1alpha1.TenantControlPlane, target apiaryv1alpha1.Mode) ([]server.Check, error) {
		checks, err := checkSwitch(ctx, c, tcp, target)
		if err != nil {
			return nil, err
		}
		out := make([]server.Check, 0, len(checks))
		for _, chk := range checks {
			out = append(out, server.Check{Subject: chk.Subject, What: chk.What, OK: chk.OK, Detail: chk.Detail})
		}
		return out, nil
	}
	return o
}

func certPool(file string) (*x509.CertPool, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%s holds no PEM certificate", file)
	}
	return pool, nil
}

func serveDashboard(cmd *cobra.Command, h http.Handler, apiHost string, o DashboardOptions, local bool) error {
	ctx := cmd.Context()
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", o.Listen)
	if err != nil {
		return fmt.Errorf("listening on %s (choose another with --listen): %w", o.Listen, err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	if local {
		fmt.Fprintf(cmd.OutOrStdout(), "Dashboard of %s at http://%s/ (Ctrl-C to stop)\n", apiHost, ln.Addr())
		err = srv.Serve(ln)
	} else {
		fmt.Fprintf(cmd.OutOrStdout(), "Dashboard of %s at https://%s/, signing in with %s\n", apiHost, ln.Addr(), o.Issuer)
		err = srv.ServeTLS(ln, o.TLSCertFile, o.TLSKeyFile)
	}
	if !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serving the dashboard: %w", err)
	}
	return nil
}
