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
		Short: "Tenant certificates: rotate them, or the cluster CA, now",
		Long: `A tenant's leaf certificates (serving, client and kubeconfig certificates,
and its DataStore client certificate) are renewed on a timer: each is
re-issued spec.certificates.renewBefore ahead of its expiry ("apiary status
NAME" lists when). "apiary certs rotate" re-issues them all now;
"apiary certs rotate --ca" replaces the cluster CA itself.`,
		Example: `  # When is each certificate of dev renewed?
  apiary status dev -n team-a

  # Re-issue them all now
  apiary certs rotate dev -n team-a --yes --wait 2m

  # Replace the cluster CA (and so every certificate)
  apiary certs rotate dev -n team-a --ca --yes --wait 15m`,
	}
	cmd.AddCommand(newCertsRotateCommand(flags))
	return cmd
}

// RotateOptions are the flags of "apiary certs rotate".
type RotateOptions struct {
	// CA replaces the cluster CA rather than re-issuing the leaves.
	CA   bool
	Yes  bool
	Wait time.Duration
	// Now stamps the request (tests fix it).
	Now func() time.Time
}

func newCertsRotateCommand(flags *ConfigFlags) *cobra.Command {
	opts := RotateOptions{Now: time.Now}
	cmd := &cobra.Command{
		Use:   "rotate NAME",
		Short: "Re-issue every leaf certificate of a tenant now, or replace its CA (--ca)",
		Long: `Re-issue every leaf certificate of a tenant now. The certificate authorities
stay, so kubeconfigs exported before keep working until their certificates
expire; the control plane rolls once, with no failed request (hosted pods one
at a time; in registered mode host by host).

A rotation does not revoke the old certificates: a leaked one stays valid
until it expires. The exported admin kubeconfig's group,
kubeadm:cluster-admins, can be unbound inside the tenant to cut off every
certificate in it; --ca ends them all.

With --ca the tenant's cluster CA is replaced, without cutting anyone off
while it happens, in three phases (status.caRotation.phase):

  TrustNew  a new CA is trusted alongside the old one: API servers,
            kubeconfigs, cluster-info, every pod's kube-root-ca.crt (the
            addons restart to read it) and each Host's kubelet, one Host at
            a time (its kubelet restarts);
  Reissue   the new CA issues: every leaf certificate is re-issued and
            the control plane rolls; then each Host's kubelet gets new
            client and serving certificates through CSRs;
  DropOld   only the new CA is trusted; once everything runs with it,
            every certificate of the old CA is refused.

Each phase waits until everything has taken the previous one in. After it,
kubeconfigs exported before no longer work: export them again. Your own pods
that talk to the tenant API and read its CA only at start must be restarted
between TrustNew and DropOld, as for any Kubernetes CA rotation. It sets the
annotation apiary.dev/rotate-ca; --wait waits for the whole rotation.

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
	cmd.Flags().BoolVar(&opts.CA, "ca", false, "replace the cluster CA (and so every certificate signed by it), in three phases")
	cmd.Flags().BoolVarP(&opts.Yes, "yes", "y", false, "do not ask for confirmation")
	cmd.Flags().DurationVar(&opts.Wait, "wait", 0, "wait up to this long until every leaf certificate is re-issued, or with --ca until the rotation completes (0: do not wait)")
	return cmd
}

// RunRotate asks for a rotation of the tenant's leaf certificates.
func RunRotate(ctx context.Context, c client.Client, stdin io.Reader, out io.Writer, ns, name string, opts RotateOptions) error {
	tcp, err := GetTenant(ctx, c, ns, name)
	if err != nil {
		return err
	}
	if opts.CA {
		return rotateCA(ctx, c, stdin, out, tcp, opts)
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

// rotateCA asks for the tenant's cluster CA to be replaced.
func rotateCA(ctx context.Context, c client.Client, stdin io.Reader, out io.Writer, tcp *apiaryv1alpha1.TenantControlPlane, opts RotateOptions) error {
	ns, name := tcp.Namespace, tcp.Name
	if rot := tcp.Status.CARotation; rot != nil && rot.Completed == nil {
		return fmt.Errorf("tenantcontrolplane/%s: CA rotation %s is under way (phase %s); wait for it to complete: apiary status %s -n %s", name, rot.Token, rot.Phase, name, ns)
	}
	if !opts.Yes && !confirm(stdin, out, fmt.Sprintf("Replace the cluster CA of tenant %s/%s (the control plane rolls three times, each Host's kubelet restarts three times, kubeconfigs exported before stop working at the end)? [y/N] ", ns, name)) {
		return fmt.Errorf("not rotated")
	}
	token := opts.Now().UTC().Format(time.RFC3339Nano)
	if err := patchTenant(ctx, c, tcp, func(tcp *apiaryv1alpha1.TenantControlPlane) {
		metav1.SetMetaDataAnnotation(&tcp.ObjectMeta, apiaryv1alpha1.AnnotationRotateCA, token)
	}); err != nil {
		return err
	}
	fmt.Fprintf(out, "tenantcontrolplane/%s: CA rotation %s requested\n", name, token)
	if opts.Wait <= 0 {
		return nil
	}
	phase := ""
	return pollTenant(ctx, c, ns, name, opts.Wait, func(tcp *apiaryv1alpha1.TenantControlPlane) bool {
		rot := tcp.Status.CARotation
		if rot == nil || rot.Token != token {
			return false
		}
		if rot.Phase != phase {
			phase = rot.Phase
			fmt.Fprintf(out, "tenantcontrolplane/%s: CA rotation phase %s\n", name, phase)
		}
		if rot.Completed == nil {
			return false
		}
		fmt.Fprintf(out, "tenantcontrolplane/%s: CA rotation completed in %s; export the kubeconfig again (apiary kubeconfig %s -n %s)\n",
			name, rot.Completed.Sub(rot.Requested.Time).Round(time.Second), name, ns)
		return true
	}, func(tcp *apiaryv1alpha1.TenantControlPlane) error {
		msg := ""
		if rot := tcp.Status.CARotation; rot != nil && rot.Token == token {
			msg = fmt.Sprintf(" (phase %s: %s)", rot.Phase, rot.Message)
		}
		return fmt.Errorf("tenantcontrolplane/%s: CA rotation %s not completed after %s%s; see: apiary status %s -n %s", name, token, opts.Wait, msg, name, ns)
	})
}
