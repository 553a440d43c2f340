package cli

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/crypto/ssh"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/duration"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/apiaryhq/apiary/hosts"
	apiaryv1alpha1 "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

const resourceHosts = "hosts.apiary.dev"

// HostAddOptions are the flags of "apiary host add".
type HostAddOptions struct {
	Tenant, Address, User, Role string
	Port                        int
	SSHKeyFile, SSHKeySecret    string
	HostKey                     string
	InsecureSkipHostKeyCheck    bool
	Labels                      []string
	Taints                      []string
	Yes                         bool
}

// NewHostCommand returns "apiary host add|remove|list".
func NewHostCommand(flags *ConfigFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "host",
		Short: "Add, remove and list the SSH hosts that join tenants as Nodes",
		Long: `A Host is a machine the operator reaches over SSH and joins to a tenant as a
Node. The agent connects with the pinned host key, runs preflight (systemd,
containerd with CRI v1, no swap, kernel modules, free ports, no other
kubelet), installs kubelet, kubeadm, kubectl and the CNI plugins of the
tenant's version from the node bundle, and runs kubeadm join with a
short-lived bootstrap token; each step is recorded in status.journal.
Removing a Host drains and deletes its Node and resets the machine.

A Host with --role control-plane runs the tenant's control plane while the
tenant is registered. While it is standalone (no control-plane Nodes) the
Host is installed but not joined (phase Standby); it joins when the tenant
switches to registered and leaves again after the switch back (Node
deleted, kubeadm reset, node software kept).

Hosts live in the tenant's namespace of the management cluster. The operator
only connects to the host key pinned in the Host (spec.hostKey): "host add"
reads it from the host, shows its fingerprint and asks you to confirm it
(compare it with the host's own "ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub"),
unless you pass --host-key or --yes.`,
		Example: `  apiary host add node-1 -n team-a --tenant dev --address 192.0.2.21 --ssh-key-file ~/.ssh/id_ed25519
  apiary host list -n team-a
  apiary host remove node-1 -n team-a --wait 10m`,
	}
	cmd.AddCommand(newHostAddCommand(flags), newHostRemoveCommand(flags), newHostListCommand(flags))
	return cmd
}

func newHostAddCommand(flags *ConfigFlags) *cobra.Command {
	o := HostAddOptions{}
	cmd := &cobra.Command{
		Use:   "add NAME --tenant TENANT --address ADDRESS (--ssh-key-file FILE | --ssh-key-secret SECRET)",
		Short: "Create a Host: the operator checks it, installs the node software and joins it",
		Long: `Create a Host in the namespace of its tenant.

The SSH private key comes from --ssh-key-file (stored in a new Secret
<NAME>-ssh of type kubernetes.io/ssh-auth) or an existing Secret
(--ssh-key-secret). The host key to pin comes from --host-key, or is read from
the host and confirmed by you (--yes confirms without asking). With
--insecure-skip-host-key-check any host key is accepted (labs only).

Nothing is created when a flag is wrong, the key cannot be read, or you do not
confirm the host key; if creating the Host fails, the Secret made for it is
removed again.`,
		Example: `  # Join 192.0.2.21 to tenant dev as worker node-1, with a key from a file (stored
  # in Secret node-1-ssh); confirm the host key it shows
  apiary host add node-1 -n team-a --tenant dev --address 192.0.2.21 --ssh-key-file ~/.ssh/id_ed25519

  # With the host key known already, and a label and a taint for the Node
  apiary host add node-2 -n team-a --tenant dev --address 192.0.2.22 --ssh-key-secret fleet-key \
    --host-key "$(cat node-2.pub)" --label pool=gpu --taint nvidia.com/gpu=true:NoSchedule`,
		Args: exactlyOneHostName,
		RunE: func(cmd *cobra.Command, args []string) error {
			ns, c, err := flags.NamespacedClient(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			return AddHost(cmd.Context(), c, ns, args[0], o, cmd.InOrStdin(), cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Tenant, "tenant", "", "the TenantControlPlane (in the same namespace) the host joins (required)")
	f.StringVar(&o.Address, "address", "", "the host's IP address or DNS name (required)")
	f.IntVar(&o.Port, "port", 22, "sshd's port")
	f.StringVar(&o.User, "user", "root", "the SSH user (others need passwordless sudo)")
	f.StringVar(&o.SSHKeyFile, "ssh-key-file", "", "private key file; stored in a new Secret <NAME>-ssh of type kubernetes.io/ssh-auth")
	f.StringVar(&o.SSHKeySecret, "ssh-key-secret", "", "an existing Secret with the private key under \"ssh-privatekey\"")
	f.StringVar(&o.HostKey, "host-key", "", "the host's public key to pin (authorized_keys format); read from the host when empty")
	f.BoolVar(&o.InsecureSkipHostKeyCheck, "insecure-skip-host-key-check", false, "accept any host key (labs only; shown in the Host's status)")
	f.StringVar(&o.Role, "role", string(apiaryv1alpha1.HostRoleWorker), "worker, or control-plane: runs the control plane while the tenant is registered, and is installed but not joined (phase Standby) while it is standalone")
	f.StringArrayVar(&o.Labels, "label", nil, "a Node label KEY=VALUE (repeatable)")
	f.StringArrayVar(&o.Taints, "taint", nil, "a Node taint KEY[=VALUE]:EFFECT (repeatable)")
	f.BoolVarP(&o.Yes, "yes", "y", false, "pin the host key read from the host without asking")
	return cmd
}

// AddHost creates the Host (and, from a key file, its Secret).
func AddHost(ctx context.Context, c client.Client, ns, name string, o HostAddOptions, in io.Reader, out io.Writer) error {
	if o.Tenant == "" || o.Address == "" {
		return fmt.Errorf("--tenant and --address are required")
	}
	if (o.SSHKeyFile == "") == (o.SSHKeySecret == "") {
		return fmt.Errorf("give exactly one of --ssh-key-file and --ssh-key-secret")
	}
	if o.InsecureSkipHostKeyCheck && o.HostKey != "" {
		return fmt.Errorf("--host-key and --insecure-skip-host-key-check exclude each other")
	}
	h := &apiaryv1alpha1.Host{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: apiaryv1alpha1.HostSpec{
			TenantControlPlane:       o.Tenant,
			Address:                  o.Address,
			Port:                     int32(o.Port),
			User:                     o.User,
			Role:                     apiaryv1alpha1.HostRole(o.Role),
			InsecureSkipHostKeyCheck: o.InsecureSkipHostKeyCheck,
			HostKey:                  strings.TrimSpace(o.HostKey),
		},
	}
	var err error
	if h.Spec.Labels, err = parseLabels(o.Labels); err != nil {
		return err
	}
	if h.Spec.Taints, err = parseTaints(o.Taints); err != nil {
		return err
	}
	var keyPEM []byte
	if o.SSHKeyFile != "" {
		if keyPEM, err = os.ReadFile(o.SSHKeyFile); err != nil {
			return fmt.Errorf("reading --ssh-key-file: %w", err)
		}
		if _, err := ssh.ParsePrivateKey(keyPEM); err != nil {
			return fmt.Errorf("--ssh-key-file %s is not an unencrypted private key: %w", o.SSHKeyFile, err)
		}
		h.Spec.SSHKeySecretRef.Name = name + "-ssh"
	} else {
		h.Spec.SSHKeySecretRef.Name = o.SSHKeySecret
	}
	if h.Spec.HostKey == "" && !o.InsecureSkipHostKeyCheck {
		key, err := hosts.ScanHostKey(ctx, o.Address, o.Port, 10*time.Second)
		if err != nil {
			return fmt.Errorf("reading the host key (pass --host-key to skip this): %w", err)
		}
		fmt.Fprintf(out, "%s:%d presents host key %s %s\n", o.Address, o.Port, key.Type(), ssh.FingerprintSHA256(key))
		if !o.Yes && !confirm(in, out, "Pin this key? Only say yes if it matches the host's own fingerprint [y/N]: ") {
			return fmt.Errorf("host key not confirmed; nothing created")
		}
		h.Spec.HostKey = strings.TrimSpace(string(ssh.MarshalAuthorizedKey(key)))
	}

	if keyPEM != nil {
		sec := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: h.Spec.SSHKeySecretRef.Name},
			Type:       corev1.SecretTypeSSHAuth,
			Data:       map[string][]byte{corev1.SSHAuthPrivateKey: keyPEM},
		}
		if err := c.Create(ctx, sec); err != nil {
			return request{verb: "create", resource: resourceSecrets, namespace: ns, name: sec.Name}.explain(err)
		}
	}
	if err := c.Create(ctx, h); err != nil {
		if keyPEM != nil {
			// Leave nothing behind on failure.
			_ = c.Delete(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: h.Spec.SSHKeySecretRef.Name}})
		}
		if apierrors.IsAlreadyExists(err) || apierrors.IsInvalid(err) {
			return err
		}
		return request{verb: "create", resource: resourceHosts, namespace: ns, name: name}.explain(err)
	}
	fmt.Fprintf(out, "host/%s created in namespace %s; follow it with: apiary host list -n %s\n", name, ns, ns)
	return nil
}

func confirm(in io.Reader, out io.Writer, prompt string) bool {
	fmt.Fprint(out, prompt)
	line, _ := bufio.NewReader(in).ReadString('\n')
	switch strings.ToLower(strings.TrimSpace(line)) {
	case "y", "yes":
		return true
	}
	return false
}

func parseLabels(kvs []string) (map[string]string, error) {
	if len(kvs) == 0 {
		return nil, nil
	}
	m := map[string]string{}
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--label %q: want KEY=VALUE", kv)
		}
		m[k] = v
	}
	return m, nil
}

func parseTaints(specs []string) ([]corev1.Taint, error) {
	var taints []corev1.Taint
	for _, s := range specs {
		kv, effect, ok := strings.Cut(s, ":")
		if !ok || effect == "" {
			return nil, fmt.Errorf("--taint %q: want KEY[=VALUE]:EFFECT (NoSchedule, PreferNoSchedule or NoExecute)", s)
		}
		k, v, _ := strings.Cut(kv, "=")
		taints = append(taints, corev1.Taint{Key: k, Value: v, Effect: corev1.TaintEffect(effect)})
	}
	return taints, nil
}

func newHostRemoveCommand(flags *ConfigFlags) *cobra.Command {
	var wait time.Duration
	cmd := &cobra.Command{
		Use:   "remove NAME",
		Short: "Delete a Host: drain and delete its Node, reset the machine",
		Long: `Delete a Host. The operator cordons and drains its Node (evictions, which
respect PodDisruptionBudgets, for up to 2 minutes), runs kubeadm reset on the
host, removes everything it installed, and deletes the Node (with a UID
precondition); then the Host goes away and the machine can join again.
--wait waits for that. If the host cannot be reached any more, the Host stays
with a condition saying why; remove its finalizer apiary.dev/host-cleanup to
give up on the machine.`,
		Example: `  apiary host remove node-1 -n team-a
  apiary host remove node-1 -n team-a --wait 10m`,
		Args: exactlyOneHostName,
		RunE: func(cmd *cobra.Command, args []string) error {
			ns, c, err := flags.NamespacedClient(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			h := &apiaryv1alpha1.Host{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: args[0]}}
			if err := c.Delete(cmd.Context(), h); err != nil {
				if apierrors.IsNotFound(err) {
					return fmt.Errorf("host %q not found in namespace %q; list them with: apiary host list -n %s", args[0], ns, ns)
				}
				return request{verb: "delete", resource: resourceHosts, namespace: ns, name: args[0]}.explain(err)
			}
			if wait <= 0 {
				fmt.Fprintf(cmd.OutOrStdout(), "host/%s is being removed\n", args[0])
				return nil
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), wait)
			defer cancel()
			for {
				err := c.Get(ctx, client.ObjectKeyFromObject(h), h)
				if apierrors.IsNotFound(err) {
					fmt.Fprintf(cmd.OutOrStdout(), "host/%s removed\n", args[0])
					return nil
				}
				select {
				case <-ctx.Done():
					return fmt.Errorf("host/%s still there after %s (phase %s); see: apiary host list -n %s", args[0], wait, h.Status.Phase, ns)
				case <-time.After(time.Second):
				}
			}
		},
	}
	cmd.Flags().DurationVar(&wait, "wait", 0, "wait up to this long for the removal to finish (0: do not wait)")
	return cmd
}

func newHostListCommand(flags *ConfigFlags) *cobra.Command {
	var all bool
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List Hosts with their tenant, phase, Node and what is wrong",
		Long: `List the Hosts of a namespace (or every namespace with -A): tenant, phase,
Node, address, age and, for a Host that is not fine, the first condition that
is not True with its message.`,
		Example: `  apiary host list -n team-a
  apiary host list -A`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ns := ""
			if !all {
				var err error
				if ns, err = flags.ResolveNamespace(); err != nil {
					return err
				}
			}
			c, err := flags.NewClient(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			var list apiaryv1alpha1.HostList
			if err := c.List(cmd.Context(), &list, client.InNamespace(ns)); err != nil {
				return request{verb: "list", resource: resourceHosts, namespace: ns}.explain(err)
			}
			return PrintHosts(cmd.OutOrStdout(), list.Items, all, time.Now())
		},
	}
	cmd.Flags().BoolVarP(&all, "all-namespaces", "A", false, "list the Hosts of every namespace")
	return cmd
}

// PrintHosts writes a table of Hosts; MESSAGE is the first condition that
// is not True.
func PrintHosts(w io.Writer, items []apiaryv1alpha1.Host, withNamespace bool, now time.Time) error {
	if len(items) == 0 {
		_, err := fmt.Fprintln(w, "No hosts found.")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if withNamespace {
		fmt.Fprint(tw, "NAMESPACE\t")
	}
	fmt.Fprintln(tw, "NAME\tTENANT\tPHASE\tNODE\tADDRESS\tAGE\tMESSAGE")
	for _, h := range items {
		msg := ""
		for _, c := range h.Status.Conditions {
			if c.Status != metav1.ConditionTrue {
				msg = c.Type + ": " + c.Message
				break
			}
		}
		if withNamespace {
			fmt.Fprintf(tw, "%s\t", h.Namespace)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", h.Name, h.Spec.TenantControlPlane, h.Status.Phase, h.Status.NodeName,
			h.Spec.Address, duration.HumanDuration(now.Sub(h.CreationTimestamp.Time)), msg)
	}
	return tw.Flush()
}

func exactlyOneHostName(cmd *cobra.Command, args []string) error {
	if len(args) != 1 {
		return fmt.Errorf("%q needs exactly one argument, the name of the Host (got %d); list them with: apiary host list",
			cmd.CommandPath(), len(args))
	}
	return nil
}
