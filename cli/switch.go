package cli

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	apiaryv1alpha1 "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

// SwitchOptions are the flags of "apiary switch".
type SwitchOptions struct {
	Yes       bool
	Wait      time.Duration
	CheckOnly bool
}

// NewSwitchCommand returns "apiary switch NAME standalone|registered".
func NewSwitchCommand(flags *ConfigFlags) *cobra.Command {
	opts := SwitchOptions{}
	cmd := &cobra.Command{
		Use:   "switch NAME standalone|registered",
		Short: "Switch a tenant's control plane between hosted pods and its own hosts, live",
		Long: `Switch a tenant between its two modes by setting spec.mode; the operator
moves the control plane with no failed request to the tenant's clients (same
address, same CA, same kubeconfig):

  registered  the control plane runs as static Pods on the tenant's Hosts
              with role control-plane, registered as tainted control-plane
              Nodes; the hosted pods scale to zero. The Hosts, installed but
              not joined while the tenant is standalone (phase Standby),
              join first. Host by host: the control plane is written, its
              kube-apiserver must answer /readyz, then it joins the tenant
              Service; when every host serves, the hosted pods leave the
              Service, drain and scale away.
  standalone  the hosted pods come back and rejoin the Service; then host by
              host, each leaves the Service, drains, and its static Pods and
              files are removed. Then each host leaves the tenant: its Node
              is drained and deleted and kubeadm reset runs there (the node
              software stays, for the next switch): a standalone tenant has
              no control-plane Nodes.

Before asking for confirmation it shows what the switch will use: the
control-plane Hosts and the DataStore's address for hosts. --yes skips the
question.

--check-only changes nothing. It asks the API server to accept the change
(server-side dry run) and, for a switch to registered, checks every
control-plane Host from this machine: installed, SSH with its pinned host key,
the control plane's ports free, and, from the host itself (SSH-forwarded
connections, TLS end to end with the tenant's own certificates), the
DataStore's host address and the tenant endpoint answering. It prints each
check with its result and exits 1 when one fails. It needs read access to
the Hosts' SSH key Secrets and the tenant's Secrets, and SSH reach to the
hosts. --wait follows the switch phase by phase until the mode is in
effect, and fails with the operator's reason if it stops (a failed host step
stops the switch with the tenant still serving; fixing the host lets the
operator retry it). Switching back mid-way reverses from where it is.`,
		Example: `  # Can dev move onto its control-plane Hosts? (changes nothing)
  apiary switch dev registered -n team-a --check-only

  # Move tenant dev onto its control-plane Hosts and follow it
  apiary switch dev registered -n team-a --wait 10m

  # And back to hosted pods, without the question
  apiary switch dev standalone -n team-a --yes --wait 10m`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 2 {
				return fmt.Errorf("give the tenant and the mode: apiary switch NAME standalone|registered")
			}
			if m := apiaryv1alpha1.Mode(args[1]); m != apiaryv1alpha1.ModeStandalone && m != apiaryv1alpha1.ModeRegistered {
				return fmt.Errorf("mode %q: use standalone or registered", args[1])
			}
			return nil
		},
		ValidArgsFunction: completeTenantNames(flags),
		RunE: func(cmd *cobra.Command, args []string) error {
			ns, c, err := flags.NamespacedClient(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			return runSwitch(cmd.Context(), c, cmd.InOrStdin(), cmd.OutOrStdout(), ns, args[0], apiaryv1alpha1.Mode(args[1]), opts)
		},
	}
	cmd.Flags().BoolVarP(&opts.Yes, "yes", "y", false, "do not ask for confirmation")
	cmd.Flags().BoolVar(&opts.CheckOnly, "check-only", false, "check whether the switch can go through, change nothing, exit 1 when a check fails")
	cmd.Flags().DurationVar(&opts.Wait, "wait", 0, "follow the switch for up to this long until the mode is in effect (0: do not wait)")
	return cmd
}

func runSwitch(ctx context.Context, c client.Client, stdin io.Reader, out io.Writer, ns, name string, target apiaryv1alpha1.Mode, opts SwitchOptions) error {
	tcp, err := GetTenant(ctx, c, ns, name)
	if err != nil {
		return err
	}
	if opts.CheckOnly {
		checks, err := checkSwitch(ctx, c, tcp, target)
		if err != nil {
			return err
		}
		if !printChecks(out, checks) {
			return fmt.Errorf("tenantcontrolplane/%s cannot switch to %s: the checks marked ✗ failed; nothing was changed", name, target)
		}
		fmt.Fprintf(out, "tenantcontrolplane/%s can switch to %s; nothing was changed\n", name, target)
		return nil
	}
	if tcp.Spec.Mode == target || (tcp.Spec.Mode == "" && target == apiaryv1alpha1.ModeStandalone) {
		fmt.Fprintf(out, "tenantcontrolplane/%s: spec.mode is already %s (in effect: %s)\n", name, target, orDash(string(tcp.Status.Mode)))
	} else {
		plan, ok, err := switchPlan(ctx, c, tcp, target)
		if err != nil {
			return err
		}
		fmt.Fprint(out, plan)
		if !ok {
			return fmt.Errorf("the switch cannot go through as things are: see above")
		}
		if !opts.Yes && !confirm(stdin, out, fmt.Sprintf("Switch tenant %s/%s to %s? [y/N] ", ns, name, target)) {
			return fmt.Errorf("not switched")
		}
		if err := patchTenant(ctx, c, tcp, func(tcp *apiaryv1alpha1.TenantControlPlane) { tcp.Spec.Mode = target }); err != nil {
			return err
		}
		fmt.Fprintf(out, "tenantcontrolplane/%s: spec.mode set to %s\n", name, target)
	}
	if opts.Wait <= 0 {
		return nil
	}
	return waitSwitch(ctx, c, out, ns, name, target, opts.Wait)
}

// switchPlan says what a switch to target will use, as the management
// cluster sees it, and whether it can start.
func switchPlan(ctx context.Context, c client.Reader, tcp *apiaryv1alpha1.TenantControlPlane, target apiaryv1alpha1.Mode) (string, bool, error) {
	var b strings.Builder
	ok := true
	fmt.Fprintf(&b, "tenant %s/%s: %s → %s\n", tcp.Namespace, tcp.Name, orDash(string(tcp.Status.Mode)), target)
	var hosts apiaryv1alpha1.HostList
	if err := c.List(ctx, &hosts, client.InNamespace(tcp.Namespace)); err != nil {
		return "", false, request{verb: "list", resource: resourceHosts, namespace: tcp.Namespace}.explain(err)
	}
	var cp []string
	for _, h := range hosts.Items {
		if h.Spec.TenantControlPlane != tcp.Name || h.Spec.Role != apiaryv1alpha1.HostRoleControlPlane {
			continue
		}
		var state string
		switch {
		case h.Status.Phase == apiaryv1alpha1.HostPhaseReady:
			state = "joined"
		case h.Status.Phase == apiaryv1alpha1.HostPhaseStandby:
			state = "installed; joins when the switch starts"
		case !meta.IsStatusConditionTrue(h.Status.Conditions, apiaryv1alpha1.HostConditionInstalled):
			state = fmt.Sprintf("phase %s: not used until it is installed", orDash(string(h.Status.Phase)))
		default:
			state = fmt.Sprintf("phase %s", h.Status.Phase)
		}
		cp = append(cp, fmt.Sprintf("  Host %s (%s): %s", h.Name, h.Spec.Address, state))
	}
	slices.Sort(cp)
	if target == apiaryv1alpha1.ModeRegistered {
		if len(cp) == 0 {
			ok = false
			fmt.Fprintf(&b, "✗ control-plane Hosts: none; add one with: apiary host add NAME --tenant %s --role control-plane ...\n", tcp.Name)
		} else {
			fmt.Fprintf(&b, "control-plane Hosts:\n%s\n", strings.Join(cp, "\n"))
		}
		if ds := tcp.Status.DataStore.Name; ds != "" {
			var store apiaryv1alpha1.DataStore
			if err := c.Get(ctx, client.ObjectKey{Name: ds}, &store); err != nil {
				return "", false, request{verb: "get", resource: "datastores.apiary.dev", name: ds}.explain(err)
			}
			cond := meta.FindStatusCondition(store.Status.Conditions, apiaryv1alpha1.ConditionHostAccessReady)
			if cond == nil || cond.Status != metav1.ConditionTrue || len(store.Status.HostEndpoints) == 0 {
				ok = false
				why := "spec.hostAccess is not set"
				if cond != nil {
					why = cond.Message
				}
				fmt.Fprintf(&b, "✗ DataStore %s is not reachable from hosts: %s\n", ds, why)
			} else {
				fmt.Fprintf(&b, "DataStore %s for hosts: %s\n", ds, strings.Join(store.Status.HostEndpoints, ", "))
			}
		}
	} else if len(cp) > 0 {
		fmt.Fprintf(&b, "the hosted pods come back; then the control plane leaves, one at a time:\n%s\n", strings.Join(cp, "\n"))
	}
	return b.String(), ok, nil
}

// waitSwitch prints every phase of the switch until target is in effect.
func waitSwitch(ctx context.Context, c client.Reader, out io.Writer, ns, name string, target apiaryv1alpha1.Mode, wait time.Duration) error {
	last := ""
	return pollTenant(ctx, c, ns, name, wait, func(tcp *apiaryv1alpha1.TenantControlPlane) bool {
		cond := meta.FindStatusCondition(tcp.Status.Conditions, apiaryv1alpha1.ConditionModeSwitched)
		if cond == nil {
			return false
		}
		line := cond.Reason + ": " + cond.Message
		if line != last {
			fmt.Fprintf(out, "%s  %s\n", time.Now().Format("15:04:05"), line)
			last = line
		}
		if tcp.Status.Mode == target && cond.Status == metav1.ConditionTrue && cond.ObservedGeneration >= tcp.Generation {
			fmt.Fprintf(out, "tenantcontrolplane/%s: %s\n", name, target)
			return true
		}
		return false
	}, func(tcp *apiaryv1alpha1.TenantControlPlane) error {
		return fmt.Errorf("tenantcontrolplane/%s not in mode %s after %s (in effect: %s); see: apiary status %s -n %s", name, target, wait, orDash(string(tcp.Status.Mode)), name, ns)
	})
}

// pollTenant reads the tenant every second until done says so, for up to
// wait; then it returns timedOut's error for the last tenant read.
func pollTenant(ctx context.Context, c client.Reader, ns, name string, wait time.Duration,
	done func(*apiaryv1alpha1.TenantControlPlane) bool, timedOut func(*apiaryv1alpha1.TenantControlPlane) error) error {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	for {
		tcp, err := GetTenant(ctx, c, ns, name)
		if err != nil {
			return err
		}
		if done(tcp) {
			return nil
		}
		select {
		case <-ctx.Done():
			return timedOut(tcp)
		case <-time.After(time.Second):
		}
	}
}

// patchTenant merge-patches what mutate changes in the tenant.
func patchTenant(ctx context.Context, c client.Client, tcp *apiaryv1alpha1.TenantControlPlane, mutate func(*apiaryv1alpha1.TenantControlPlane)) error {
	patch := client.MergeFrom(tcp.DeepCopy())
	mutate(tcp)
	if err := c.Patch(ctx, tcp, patch); err != nil {
		return request{verb: "patch", resource: resourceTenantControlPlanes, namespace: tcp.Namespace, name: tcp.Name}.explain(err)
	}
	return nil
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
