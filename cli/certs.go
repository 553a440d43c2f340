package cli

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	apiaryv1alpha1 "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

// NewCertsCommand returns "apiary certs", the tenant certificates' commands.
func NewCertsCommand(flags *ConfigFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "certs",
		Short: "Tenant certificates: rotate them now",
		Long: `A tenant's leaf certificates (serving, client and kubeconfig certificates,
and its DataStore client certificate) are renewed on a timer: each is
re-issued spec.certificates.renewBefore ahead of its expiry ("apiary status
NAME" lists when). "apiary certs rotate" re-issues them all now.`,
		Example: `  # When is each certificate of dev renewed?
  apiary status dev -n team-a

  # Re-issue them all now
  apiary certs rotate dev -n team-a --yes --wait 2m`,
	}
	cmd.AddCommand(newCertsRotateCommand(flags))
	return cmd
}

// RotateOptions are the flags of "apiary certs rotate".
type RotateOptions struct {
	Yes  bool
	Wait time.Duration
	// Now stamps the request (tests fix it).
	Now func() time.Time
}

func newCertsRotateCommand(flags *ConfigFlags) *cobra.Command {
	opts := RotateOptions{Now: time.Now}
	cmd := &cobra.Command{
		Use:   "rotate NAME",
		Short: "Re-issue every leaf certificate of a tenant now",
		Long: `Re-issue every leaf certificate of a tenant now. The certificate authorities
stay, so kubeconfigs exported before keep working until their certificates
expire; the control plane rolls once, with no failed request (hosted pods one
at a time; in registered mode host by host).

A rotation does not revoke the old certificates: a leaked one stays valid
until it expires (only rotating the CA, not built yet, would end it). The
exported admin kubeconfig's group, kubeadm:cluster-admins, can be unbound
inside the tenant to cut off every certificate in it.

It sets the annotation apiary.dev/rotate-certificates to a new token (the
time of the request); the operator records the rotation in
status.certificateRotation and re-issues every leaf not yet issued under
that token, with events RotationRequested and Rotated. --wait waits until
every leaf is re-issued.`,
		Example: `  # Rotate tenant dev's certificates and wait for them
  apiary certs rotate dev -n team-a --yes --wait 2m`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return fmt.Errorf("give the tenant: apiary certs rotate NAME")
			}
			return nil
		},
		ValidArgsFunction: completeTenantNames(flags),
		RunE: func(cmd *cobra.Command, args []string) error {
			ns, c, err := flags.NamespacedClient(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			return RunRotate(cmd.Context(), c, cmd.InOrStdin(), cmd.OutOrStdout(), ns, args[0], opts)
		},
	}
	cmd.Flags().BoolVarP(&opts.Yes, "yes", "y", false, "do not ask for confirmation")
	cmd.Flags().DurationVar(&opts.Wait, "wait", 0, "wait up to this long until every leaf certificate is re-issued (0: do not wait)")
	return cmd
}

// RunRotate asks for a rotation of the tenant's leaf certificates.
func RunRotate(ctx context.Context, c client.Client, stdin io.Reader, out io.Writer, ns, name string, opts RotateOptions) error {
	tcp, err := GetTenant(ctx, c, ns, name)
	if err != nil {
		return err
	}
	if !opts.Yes && !confirm(stdin, out, fmt.Sprintf("Re-issue every leaf certificate of tenant %s/%s (the control plane rolls once)? [y/N] ", ns, name)) {
		return fmt.Errorf("not rotated")
	}
	token := opts.Now().UTC().Format(time.RFC3339Nano)
	if err := patchTenant(ctx, c, tcp, func(tcp *apiaryv1alpha1.TenantControlPlane) {
		metav1.SetMetaDataAnnotation(&tcp.ObjectMeta, apiaryv1alpha1.AnnotationRotateCertificates, token)
	}); err != nil {
		return err
	}
	fmt.Fprintf(out, "tenantcontrolplane/%s: certificate rotation %s requested\n", name, token)
	if opts.Wait <= 0 {
		return nil
	}
	return waitRotation(ctx, c, out, ns, name, token, opts.Wait)
}

func waitRotation(ctx context.Context, c client.Reader, out io.Writer, ns, name, token string, wait time.Duration) error {
	return pollTenant(ctx, c, ns, name, wait, func(tcp *apiaryv1alpha1.TenantControlPlane) bool {
		rot := tcp.Status.CertificateRotation
		if rot == nil || rot.Token != token || rot.Completed == nil {
			return false
		}
		fmt.Fprintf(out, "tenantcontrolplane/%s: every leaf certificate re-issued in %s; the control plane rolls to them now\n",
			name, rot.Completed.Sub(rot.Requested.Time).Round(time.Second))
		return true
	}, func(*apiaryv1alpha1.TenantControlPlane) error {
		return fmt.Errorf("tenantcontrolplane/%s: rotation %s not completed after %s; see: apiary status %s -n %s", name, token, wait, name, ns)
	})
}
