package cli

import (
	"bytes"
	"fmt"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/duration"

	"github.com/apiaryhq/apiary/datastore"
	apiaryv1alpha1 "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

// none is printed for a value that is not known (yet).
const none = "-"

// conditionOrder is the order in which a tenant's conditions are shown: the
// provisioning steps in the order they happen, then Ready, their summary.
// Conditions of other types follow, sorted by type.
var conditionOrder = []string{
	apiaryv1alpha1.ConditionDataStoreReady,
	apiaryv1alpha1.ConditionCertificatesReady,
	apiaryv1alpha1.ConditionEndpointReady,
	apiaryv1alpha1.ConditionControlPlaneAvailable,
	apiaryv1alpha1.ConditionReady,
}

// OrderedConditions returns a copy of conds in display order (see
// conditionOrder).
func OrderedConditions(conds []metav1.Condition) []metav1.Condition {
	rank := func(t string) int {
		if i := slices.Index(conditionOrder, t); i >= 0 {
			return i
		}
		return len(conditionOrder)
	}
	out := slices.Clone(conds)
	sort.SliceStable(out, func(i, j int) bool {
		ri, rj := rank(out[i].Type), rank(out[j].Type)
		if ri != rj {
			return ri < rj
		}
		return out[i].Type < out[j].Type
	})
	return out
}

// NotTrueConditions returns the conditions of tcp whose status is not True, in
// display order.
func NotTrueConditions(tcp *apiaryv1alpha1.TenantControlPlane) []metav1.Condition {
	var out []metav1.Condition
	for _, c := range OrderedConditions(tcp.Status.Conditions) {
		if c.Status != metav1.ConditionTrue {
			out = append(out, c)
		}
	}
	return out
}

// FirstFailingCondition returns the first condition, other than Ready, that is
// not True, in provisioning order: the step that holds the tenant back. It
// returns nil when there is none.
func FirstFailingCondition(tcp *apiaryv1alpha1.TenantControlPlane) *metav1.Condition {
	for _, c := range NotTrueConditions(tcp) {
		if c.Type != apiaryv1alpha1.ConditionReady {
			return &c
		}
	}
	return nil
}

// IsReady reports whether tcp's Ready condition is True.
func IsReady(tcp *apiaryv1alpha1.TenantControlPlane) bool {
	return meta.IsStatusConditionTrue(tcp.Status.Conditions, apiaryv1alpha1.ConditionReady)
}

// ConditionsSummary is the CONDITIONS cell of the status table: the conditions
// that are not True as Type=Reason, comma separated; "all ready" when every
// condition is True; "none reported" when there is no condition yet.
func ConditionsSummary(tcp *apiaryv1alpha1.TenantControlPlane) string {
	if len(tcp.Status.Conditions) == 0 {
		return "none reported"
	}
	bad := NotTrueConditions(tcp)
	if len(bad) == 0 {
		return "all ready"
	}
	parts := make([]string, len(bad))
	for i, c := range bad {
		reason := c.Reason
		if reason == "" {
			reason = string(c.Status)
		}
		parts[i] = c.Type + "=" + reason
	}
	return strings.Join(parts, ",")
}

// Version is the version a tenant runs (status.version), else the one it
// asks for (spec.version).
func Version(tcp *apiaryv1alpha1.TenantControlPlane) string {
	return firstNonEmpty(tcp.Status.Version, tcp.Spec.Version)
}

// ModeOf is the mode in effect (status.mode), else the requested one.
func ModeOf(tcp *apiaryv1alpha1.TenantControlPlane) string {
	return firstNonEmpty(string(tcp.Status.Mode), string(tcp.Spec.Mode))
}

// PhaseOf is status.phase; Deleting when the tenant is being deleted before
// the operator said so.
func PhaseOf(tcp *apiaryv1alpha1.TenantControlPlane) string {
	if tcp.Status.Phase == "" && tcp.DeletionTimestamp != nil {
		return string(apiaryv1alpha1.PhaseDeleting)
	}
	return firstNonEmpty(string(tcp.Status.Phase))
}

// ReadyReplicas is "ready/desired": status.readyReplicas over status.replicas,
// or over spec.replicas while the operator has not created any pod yet.
func ReadyReplicas(tcp *apiaryv1alpha1.TenantControlPlane) string {
	desired := tcp.Status.Replicas
	if desired == 0 && tcp.Spec.Replicas != nil {
		desired = *tcp.Spec.Replicas
	}
	return fmt.Sprintf("%d/%d", tcp.Status.ReadyReplicas, desired)
}

// formatUsage: "1.2 MiB of 100.0 MiB, 345 of 10000 objects" (no quota:
// "1.2 MiB, 345 objects, no quota").
func formatUsage(u apiaryv1alpha1.DataStoreUsage) string {
	bytes, objects := datastore.FormatBytes(u.Bytes), fmt.Sprintf("%d", u.Objects)
	if u.Quota.IsZero() {
		return bytes + ", " + objects + " objects, no quota"
	}
	if q := u.Quota.Bytes; q != nil {
		bytes += " of " + datastore.FormatBytes(q.Value())
	}
	if q := u.Quota.Objects; q != nil {
		objects += fmt.Sprintf(" of %d", *q)
	}
	return bytes + ", " + objects + " objects"
}

// DataStoreOf is the DataStore the tenant is bound to, else the one it asks
// for.
func DataStoreOf(tcp *apiaryv1alpha1.TenantControlPlane) string {
	return firstNonEmpty(tcp.Status.DataStore.Name, tcp.Spec.DataStore)
}

// SortTenants sorts tenants by namespace, then name.
func SortTenants(items []apiaryv1alpha1.TenantControlPlane) {
	sort.Slice(items, func(i, j int) bool {
		if items[i].Namespace != items[j].Namespace {
			return items[i].Namespace < items[j].Namespace
		}
		return items[i].Name < items[j].Name
	})
}

// FormatTable renders tenants as the "apiary status" table, sorted by
// namespace and name; withNamespace adds the NAMESPACE column (for
// --all-namespaces).
func FormatTable(items []apiaryv1alpha1.TenantControlPlane, withNamespace bool) string {
	items = slices.Clone(items)
	SortTenants(items)

	var buf bytes.Buffer
	w := newTabWriter(&buf)
	header := []string{"NAME", "VERSION", "MODE", "PHASE", "READY", "ENDPOINT", "DATASTORE", "CONDITIONS"}
	if withNamespace {
		header = append([]string{"NAMESPACE"}, header...)
	}
	fmt.Fprintln(w, strings.Join(header, "\t"))
	for i := range items {
		tcp := &items[i]
		row := []string{
			tcp.Name,
			Version(tcp),
			ModeOf(tcp),
			PhaseOf(tcp),
			ReadyReplicas(tcp),
			firstNonEmpty(tcp.Status.Endpoint),
			DataStoreOf(tcp),
			ConditionsSummary(tcp),
		}
		if withNamespace {
			row = append([]string{tcp.Namespace}, row...)
		}
		for j := range row {
			row[j] = cell(row[j])
		}
		fmt.Fprintln(w, strings.Join(row, "\t"))
	}
	_ = w.Flush()
	return buf.String()
}

// FormatDetail renders one tenant for "apiary status NAME": its summary,
// datastore binding, every condition and every certificate. Ages are
// relative to now.
func FormatDetail(tcp *apiaryv1alpha1.TenantControlPlane, now time.Time) string {
	var buf bytes.Buffer
	w := newTabWriter(&buf)
	kv := func(k, v string) { fmt.Fprintf(w, "%s:\t%s\n", k, v) }

	kv("Name", tcp.Name)
	kv("Namespace", tcp.Namespace)
	if !tcp.CreationTimestamp.IsZero() {
		kv("Created", timestamp(tcp.CreationTimestamp, now))
	}
	phase := PhaseOf(tcp)
	if tcp.DeletionTimestamp != nil {
		phase += fmt.Sprintf(" (deletion requested %s ago)", age(*tcp.DeletionTimestamp, now))
	}
	kv("Phase", phase)

	switch {
	case tcp.Status.Version == "" && tcp.Spec.Version == "":
		kv("Version", none)
	case tcp.Status.Version == "":
		kv("Version", tcp.Spec.Version+" (requested, not running yet)")
	case tcp.Spec.Version != "" && tcp.Spec.Version != tcp.Status.Version:
		kv("Version", fmt.Sprintf("%s (spec asks for %s)", tcp.Status.Version, tcp.Spec.Version))
	default:
		kv("Version", tcp.Status.Version)
	}

	switch {
	case tcp.Status.Mode != "":
		kv("Mode", string(tcp.Status.Mode))
	case tcp.Spec.Mode != "":
		kv("Mode", string(tcp.Spec.Mode)+" (requested)")
	default:
		kv("Mode", none)
	}
	kv("Endpoint", firstNonEmpty(tcp.Status.Endpoint))

	replicas := ReadyReplicas(tcp) + " ready"
	if tcp.Spec.Replicas != nil && tcp.Status.Replicas != 0 && *tcp.Spec.Replicas != tcp.Status.Replicas {
		replicas += fmt.Sprintf(" (spec asks for %d)", *tcp.Spec.Replicas)
	}
	kv("Replicas", replicas)

	secret := tcp.Status.KubeconfigSecret
	if secret == "" {
		kv("Kubeconfig", fmt.Sprintf("Secret %s (not reported in status yet)", tcp.AdminKubeconfigSecretName()))
	} else {
		kv("Kubeconfig", fmt.Sprintf("Secret %s (print it with: apiary kubeconfig %s -n %s)", secret, tcp.Name, tcp.Namespace))
	}
	if tcp.Status.ObservedGeneration != 0 && tcp.Status.ObservedGeneration < tcp.Generation {
		kv("Generation", fmt.Sprintf("%d (status describes generation %d: the operator has not caught up yet)",
			tcp.Generation, tcp.Status.ObservedGeneration))
	}

	fmt.Fprintln(w, "DataStore:")
	ds := tcp.Status.DataStore
	if ds.Name == "" {
		if tcp.Spec.DataStore != "" {
			fmt.Fprintf(w, "  (not bound yet; spec asks for %s)\n", tcp.Spec.DataStore)
		} else {
			fmt.Fprintln(w, "  (not bound yet; placement will choose one)")
		}
	} else {
		fmt.Fprintf(w, "  Name:\t%s\n", ds.Name)
		fmt.Fprintf(w, "  Prefix:\t%s\n", firstNonEmpty(ds.Prefix))
		fmt.Fprintf(w, "  User:\t%s\n", firstNonEmpty(ds.User))
		if u := ds.Usage; u != nil {
			fmt.Fprintf(w, "  Usage:\t%s\n", formatUsage(*u))
		}
	}

	fmt.Fprintln(w, "Conditions:")
	if len(tcp.Status.Conditions) == 0 {
		fmt.Fprintln(w, "  (none reported yet: is the Apiary operator running?)")
	} else {
		fmt.Fprintln(w, "  TYPE\tSTATUS\tREASON\tAGE\tMESSAGE")
		for _, c := range OrderedConditions(tcp.Status.Conditions) {
			fmt.Fprintf(w, "  %s\t%s\t%s\t%s\t%s\n", cell(c.Type), cell(string(c.Status)), cell(c.Reason),
				age(c.LastTransitionTime, now), cell(c.Message))
		}
	}

	fmt.Fprintln(w, "Certificates:")
	if rot := tcp.Status.CertificateRotation; rot != nil {
		done := "in progress"
		if rot.Completed != nil {
			done = "completed " + age(*rot.Completed, now) + " ago"
		}
		fmt.Fprintf(w, "  rotation %s: requested %s ago, %s\n", cell(rot.Token), age(rot.Requested, now), done)
	}
	if rot := tcp.Status.CARotation; rot != nil {
		if rot.Completed != nil {
			fmt.Fprintf(w, "  CA rotation %s: requested %s ago, completed %s ago\n", cell(rot.Token), age(rot.Requested, now), age(*rot.Completed, now))
		} else {
			fmt.Fprintf(w, "  CA rotation %s: requested %s ago, phase %s for %s: %s\n", cell(rot.Token), age(rot.Requested, now), cell(rot.Phase), age(rot.PhaseStarted, now), cell(rot.Message))
		}
	}
	if len(tcp.Status.Certificates) == 0 {
		fmt.Fprintln(w, "  (none issued yet)")
	} else {
		certs := slices.Clone(tcp.Status.Certificates)
		sort.SliceStable(certs, func(i, j int) bool { return certs[i].Name < certs[j].Name })
		fmt.Fprintln(w, "  NAME\tSECRET\tNOT AFTER\tEXPIRES\tRENEWED")
		for _, c := range certs {
			fmt.Fprintf(w, "  %s\t%s\t%s\t%s\t%s\n", cell(c.Name), cell(c.Secret), rfc3339(c.NotAfter), expires(c.NotAfter, now), renews(c.RenewAt, now))
		}
	}
	_ = w.Flush()
	return buf.String()
}

func newTabWriter(buf *bytes.Buffer) *tabwriter.Writer {
	return tabwriter.NewWriter(buf, 0, 8, 3, ' ', 0)
}

// cell makes s fit one table cell: no tabs or line breaks, "-" when empty.
func cell(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if s == "" {
		return none
	}
	return s
}

func firstNonEmpty(ss ...string) string {
	for _, s := range ss {
		if s != "" {
			return s
		}
	}
	return none
}

func age(t metav1.Time, now time.Time) string {
	if t.IsZero() {
		return none
	}
	return duration.HumanDuration(now.Sub(t.Time))
}

func rfc3339(t metav1.Time) string {
	if t.IsZero() {
		return none
	}
	return t.UTC().Format(time.RFC3339)
}

func timestamp(t metav1.Time, now time.Time) string {
	return fmt.Sprintf("%s (%s ago)", rfc3339(t), age(t, now))
}

// renews says when a certificate is renewed: certificate authorities
// (no renewAt) are not renewed on a timer.
func renews(t *metav1.Time, now time.Time) string {
	switch {
	case t == nil || t.IsZero():
		return "not on a timer"
	case t.After(now):
		return "in " + duration.HumanDuration(t.Sub(now))
	default:
		return "due now"
	}
}

func expires(t metav1.Time, now time.Time) string {
	switch {
	case t.IsZero():
		return none
	case t.After(now):
		return "in " + duration.HumanDuration(t.Sub(now))
	default:
		return "EXPIRED " + duration.HumanDuration(now.Sub(t.Time)) + " ago"
	}
}
