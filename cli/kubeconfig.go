package cli

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	apiaryv1alpha1 "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

// KubeconfigRequest asks for the admin kubeconfig of one tenant.
type KubeconfigRequest struct {
	Namespace string
	Name      string
	// Internal selects the kubeconfig that addresses the tenant through its
	// Service's cluster DNS name (for clients inside the management cluster).
	Internal bool
	// AllowNotReady returns the kubeconfig of a tenant that is not Ready, as
	// long as its Secret exists.
	AllowNotReady bool
}

// KubeconfigResult is a tenant's admin kubeconfig.
type KubeconfigResult struct {
	// Kubeconfig is the content of the Secret key, unchanged.
	Kubeconfig []byte
	// Secret is the name of the Secret it was read from, and Key its key.
	Secret, Key string
	// NotReady is set when the tenant is not Ready and AllowNotReady let the
	// kubeconfig through anyway.
	NotReady *NotReadyError
	// TenantControlPlane is the tenant, as read.
	TenantControlPlane *apiaryv1alpha1.TenantControlPlane
}

// NotFoundError says that a TenantControlPlane does not exist.
type NotFoundError struct {
	Namespace, Name string
}

func (e *NotFoundError) Error() string {
	return fmt.Sprintf("tenantcontrolplane %s/%s not found; list the tenants with: apiary status -n %s (or: apiary status -A)",
		e.Namespace, e.Name, e.Namespace)
}

// NotReadyError says that a TenantControlPlane is not Ready, and why.
type NotReadyError struct {
	TenantControlPlane *apiaryv1alpha1.TenantControlPlane
}

// Reason is the reason of the Ready condition, empty when there is none.
func (e *NotReadyError) Reason() string {
	if c := meta.FindStatusCondition(e.TenantControlPlane.Status.Conditions, apiaryv1alpha1.ConditionReady); c != nil {
		return c.Reason
	}
	return ""
}

// Summary is a one-line explanation: the Ready condition and the first
// failing provisioning step.
func (e *NotReadyError) Summary() string {
	tcp := e.TenantControlPlane
	var b strings.Builder
	fmt.Fprintf(&b, "tenantcontrolplane %s/%s is not ready", tcp.Namespace, tcp.Name)
	if tcp.DeletionTimestamp != nil {
		b.WriteString(" (it is being deleted)")
	}
	ready := meta.FindStatusCondition(tcp.Status.Conditions, apiaryv1alpha1.ConditionReady)
	if ready == nil {
		b.WriteString(": it has no Ready condition yet")
		if phase := PhaseOf(tcp); phase != none {
			fmt.Fprintf(&b, " (phase %s)", phase)
		}
		b.WriteString("; is the Apiary operator running?")
	} else {
		fmt.Fprintf(&b, ": %s", describeCondition(*ready))
	}
	if first := FirstFailingCondition(tcp); first != nil {
		fmt.Fprintf(&b, "; first failing condition: %s", describeCondition(*first))
	}
	return b.String()
}

func (e *NotReadyError) Error() string {
	tcp := e.TenantControlPlane
	return fmt.Sprintf("%s\n  see every condition with: apiary status %s -n %s\n  or pass --allow-not-ready to print the kubeconfig anyway",
		e.Summary(), tcp.Name, tcp.Namespace)
}

func describeCondition(c metav1.Condition) string {
	s := fmt.Sprintf("%s=%s", c.Type, c.Status)
	if c.Reason != "" {
		s += ", reason " + c.Reason
	}
	if msg := strings.Join(strings.Fields(c.Message), " "); msg != "" {
		s += fmt.Sprintf(": %q", msg)
	}
	return s
}

// KubeconfigSecretName is status.kubeconfigSecret when the operator set it,
// else the conventional <name>-admin-kubeconfig.
func KubeconfigSecretName(tcp *apiaryv1alpha1.TenantControlPlane) string {
	if tcp.Status.KubeconfigSecret != "" {
		return tcp.Status.KubeconfigSecret
	}
	return tcp.AdminKubeconfigSecretName()
}

// FetchKubeconfig reads the admin kubeconfig of a tenant. It fails with a
// *NotFoundError when the tenant does not exist, a *NotReadyError when it is
// not Ready (unless AllowNotReady), and explains missing Secrets or keys and
// RBAC denials.
func FetchKubeconfig(ctx context.Context, c client.Reader, req KubeconfigRequest) (*KubeconfigResult, error) {
	tcp := &apiaryv1alpha1.TenantControlPlane{}
	get := request{verb: "get", resource: resourceTenantControlPlanes, namespace: req.Namespace, name: req.Name}
	if err := c.Get(ctx, client.ObjectKey{Namespace: req.Namespace, Name: req.Name}, tcp); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, &NotFoundError{Namespace: req.Namespace, Name: req.Name}
		}
		return nil, get.explain(err)
	}

	var notReady *NotReadyError
	if !IsReady(tcp) || tcp.DeletionTimestamp != nil {
		notReady = &NotReadyError{TenantControlPlane: tcp}
		if !req.AllowNotReady {
			return nil, notReady
		}
	}

	key := apiaryv1alpha1.KubeconfigKey
	if req.Internal {
		key = apiaryv1alpha1.InternalKubeconfigKey
	}
	name := KubeconfigSecretName(tcp)
	secret := &corev1.Secret{}
	get = request{verb: "get", resource: resourceSecrets, namespace: req.Namespace, name: name}
	if err := c.Get(ctx, client.ObjectKey{Namespace: req.Namespace, Name: name}, secret); err != nil {
		if apierrors.IsNotFound(err) {
			msg := fmt.Sprintf("secret %s/%s, the admin kubeconfig of tenantcontrolplane %s/%s, not found", req.Namespace, name, req.Namespace, req.Name)
			if notReady != nil {
				return nil, fmt.Errorf("%s; %s", msg, notReady.Summary())
			}
			return nil, fmt.Errorf("%s although the tenant is Ready; the operator writes it once the certificates are issued: check its logs, and: apiary status %s -n %s",
				msg, req.Name, req.Namespace)
		}
		return nil, get.explain(err)
	}
	data, ok := secret.Data[key]
	if !ok || len(data) == 0 {
		keys := slices.Sorted(maps.Keys(secret.Data))
		has := "it has no keys"
		if len(keys) > 0 {
			has = "it has: " + strings.Join(keys, ", ")
		}
		what := "has no key"
		if ok {
			what = "has an empty key"
		}
		return nil, fmt.Errorf("secret %s/%s (admin kubeconfig of tenantcontrolplane %s/%s) %s %q (%s)",
			req.Namespace, name, req.Namespace, req.Name, what, key, has)
	}
	return &KubeconfigResult{Kubeconfig: data, Secret: name, Key: key, NotReady: notReady, TenantControlPlane: tcp}, nil
}

// NewKubeconfigCommand returns "apiary kubeconfig NAME".
func NewKubeconfigCommand(flags *ConfigFlags) *cobra.Command {
	req := KubeconfigRequest{}
	var withOIDC bool
	oidcOpts := OIDCKubeconfigOptions{}
	cmd := &cobra.Command{
		Use:   "kubeconfig NAME",
		Short: "Print the admin kubeconfig of a tenant control plane",
		Long: `Print the admin kubeconfig of a tenant control plane to stdout.

The kubeconfig is read from the Secret the operator writes for the tenant
(status.kubeconfigSecret, by default <NAME>-admin-kubeconfig) in the tenant's
namespace of the management cluster, with your own kubeconfig and context:
you need "get" on tenantcontrolplanes.apiary.dev and on secrets there.

By default the kubeconfig addresses the tenant API through its public endpoint
(status.endpoint, key "kubeconfig"). --internal prints the one that addresses
it through its Service's cluster DNS name instead (key "kubeconfig-internal"),
for clients that run inside the management cluster.

The command fails, explaining why, while the tenant is not Ready. Pass
--allow-not-ready to print the kubeconfig anyway when its Secret exists (a
warning goes to stderr).

--oidc prints a kubeconfig for the tenant's users instead: the same
endpoint and CA, no admin credential, and a user that signs in to an
OpenID provider the tenant accepts (spec.authentication) through
"apiary oidc-login", an exec credential plugin (the apiary binary must be on
the user's PATH). It holds no secret: a platform admin may hand it to every
user. The issuer and client ID default to the tenant's only issuer and its
first audience; the provider must allow the redirect URI
http://127.0.0.1:8000/callback (--oidc-listen) for that client.`,
		Example: `  # Write the admin kubeconfig of tenant "dev" in namespace "team-a" to a file and use it
  apiary kubeconfig dev -n team-a > dev.kubeconfig
  kubectl --kubeconfig dev.kubeconfig get nodes

  # The kubeconfig for a client running inside the management cluster
  apiary kubeconfig dev -n team-a --internal

  # Get it while the tenant is still provisioning
  apiary kubeconfig dev -n team-a --allow-not-ready

  # A kubeconfig for the tenant's users, who sign in with its OpenID provider
  apiary kubeconfig dev -n team-a --oidc > dev-users.kubeconfig
  kubectl --kubeconfig dev-users.kubeconfig auth whoami`,
		Args:              exactlyOneName,
		ValidArgsFunction: completeTenantNames(flags),
		RunE: func(cmd *cobra.Command, args []string) error {
			ns, c, err := flags.NamespacedClient(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			req.Namespace, req.Name = ns, args[0]
			res, err := FetchKubeconfig(cmd.Context(), c, req)
			if err != nil {
				return err
			}
			if res.NotReady != nil {
				fmt.Fprintf(cmd.ErrOrStderr(), "Warning: %s; printing its kubeconfig anyway (--allow-not-ready)\n", res.NotReady.Summary())
			}
			out := res.Kubeconfig
			if withOIDC {
				if out, err = OIDCKubeconfig(res.Kubeconfig, res.TenantControlPlane, oidcOpts); err != nil {
					return err
				}
			}
			_, err = cmd.OutOrStdout().Write(out)
			return err
		},
	}
	cmd.Flags().BoolVar(&req.Internal, "internal", false,
		`print the kubeconfig that addresses the tenant through its cluster-internal Service DNS name (key "kubeconfig-internal")`)
	cmd.Flags().BoolVar(&req.AllowNotReady, "allow-not-ready", false,
		"print the kubeconfig even if the tenant is not Ready, as long as its Secret exists")
	cmd.Flags().BoolVar(&withOIDC, "oidc", false,
		"print a kubeconfig for the tenant's users: no admin credential, an OpenID sign-in through \"apiary oidc-login\"")
	cmd.Flags().StringVar(&oidcOpts.Issuer, "oidc-issuer", "", "with --oidc: the issuer URL (default: the tenant's only spec.authentication issuer)")
	cmd.Flags().StringVar(&oidcOpts.ClientID, "oidc-client-id", "", "with --oidc: the client ID (default: the issuer's first audience)")
	cmd.Flags().StringVar(&oidcOpts.Listen, "oidc-listen", DefaultOIDCListen, "with --oidc: the loopback address the provider redirects to")
	cmd.Flags().StringVar(&oidcOpts.CAFile, "oidc-ca-file", "", "with --oidc: a path, on the user's machine, of PEM certificates that verify the provider's TLS")
	cmd.Flags().StringVar(&oidcOpts.Command, "oidc-command", "apiary", "with --oidc: the apiary binary the kubeconfig runs")
	return cmd
}

func exactlyOneName(cmd *cobra.Command, args []string) error {
	if len(args) != 1 {
		return fmt.Errorf("%q needs exactly one argument, the name of the tenant control plane (got %d); list them with: apiary status",
			cmd.CommandPath(), len(args))
	}
	return nil
}
