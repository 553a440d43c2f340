package webhooks

import (
	"fmt"
	"maps"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"

	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/operator/render"
)

// flagNamePattern is what an extraArgs key must look like: a flag name as
// the components spell it, without dashes in front or a value after it.
var flagNamePattern = regexp.MustCompile(`^[a-z0-9][a-z0-9-]*$`)

// tunable are the flags Apiary sets that a spec may still override: they
// change how the tenant's own cluster behaves, not what it is bound to.
// Every other flag Apiary sets is protected (render.DefaultFlags).
var tunable = map[render.Component][]string{
	render.APIServer: {
		"allow-privileged", "enable-admission-plugins", "endpoint-reconciler-type", "feature-gates",
		"profiling", "service-account-issuer", "shutdown-delay-duration",
	},
	render.ControllerManager: {
		"allocate-node-cidrs", "cluster-name", "controllers", "leader-elect",
		"profiling", "use-service-account-credentials",
	},
	render.Scheduler: {"leader-elect", "profiling"},
}

// boundaryPrefixes and boundaryFlags are protected although Apiary does not
// set them (or not always): each would let the tenant's components reach,
// trust or serve something other than what Apiary gave them.
var (
	boundaryPrefixes = map[render.Component][]string{
		render.APIServer: {
			"authorization-", "authentication-", "requestheader-",
			"kubelet-", "tls-", "proxy-client-", "egress-selector-",
		},
		render.ControllerManager: {"authentication-", "authorization-", "requestheader-", "tls-"},
		render.Scheduler:         {"authentication-", "authorization-", "requestheader-", "tls-"},
	}
	boundaryFlags = map[render.Component][]string{
		render.APIServer: {
			"admission-control", "admission-control-config-file", "advertise-address",
			"anonymous-auth", "bind-address", "cert-dir", "client-ca-file",
			"disable-admission-plugins", "egress-selector-config-file",
			"secure-port", "storage-backend", "token-auth-file",
		},
		render.ControllerManager: {"bind-address", "cert-dir", "kubeconfig", "master", "secure-port"},
		render.Scheduler:         {"bind-address", "cert-dir", "config", "kubeconfig", "master", "secure-port"},
	}
)

// reasons say more for the flags a user is most likely to try.
var reasons = map[string]string{
	"service-cluster-ip-range": "comes from spec.network.serviceCIDR, which is immutable",
	"cluster-cidr":             "comes from spec.network.podCIDR, which is immutable",
	"secure-port":              "comes from spec.network.port (and the component's fixed port)",
	"etcd-compaction-interval": "must stay 0: the datastore is shared and compacts itself",
}

// mustKeep are values a tunable flag must keep: without NodeRestriction a
// tenant's kubelet could label and modify any Node of the tenant.
var mustKeep = map[render.Component]map[string]string{
	render.APIServer: {"enable-admission-plugins": "NodeRestriction"},
}

// pinnedGates are feature gates a tenant may not turn: without
// ListFromCacheSnapshot=false the tenant would not see the datastore's
// compaction (render.APIServerArgs); without
// ManifestBasedAdmissionControlConfig its datastore quota would not be
// enforced (render.QuotaPolicy).
var pinnedGates = map[render.Component]map[string]bool{
	render.APIServer: {"ListFromCacheSnapshot": false, "ManifestBasedAdmissionControlConfig": true},
}

// checkGates reads a feature-gates value as the components do (comma
// separated key=value, spaces trimmed, the last setting of a gate wins)
// and says which pinned gate it would turn, or "".
func checkGates(c render.Component, v string) string {
	set := map[string]string{}
	for _, kv := range strings.Split(v, ",") {
		k, val, _ := strings.Cut(kv, "=")
		set[strings.TrimSpace(k)] = strings.TrimSpace(val)
	}
	for _, gate := range slices.Sorted(maps.Keys(pinnedGates[c])) {
		want := pinnedGates[c][gate]
		if got, ok := set[gate]; ok && got != strconv.FormatBool(want) {
			return fmt.Sprintf("must keep %s=%t (Apiary sets it; the last setting of a gate wins)", gate, want)
		}
	}
	return ""
}

// pathInValue finds absolute paths in a flag value (also inside URLs and
// lists), to refuse values that point into Apiary's mounts.
var pathInValue = regexp.MustCompile(`/[^\s,;:=]*`)

// protectedDefaults are the flags Apiary sets on each component. The key
// set does not depend on the inputs, except that konnectivity adds
// egress-selector-config-file (protected by name above).
var protectedDefaults = func() map[render.Component]map[string]bool {
	tcp := &apiary.TenantControlPlane{}
	tcp.Default()
	out := map[render.Component]map[string]bool{}
	for _, c := range render.Components {
		out[c] = map[string]bool{}
		for k := range render.DefaultFlags(c, render.Inputs{TCP: tcp, Version: tcp.Spec.Version}) {
			if !slices.Contains(tunable[c], k) {
				out[c][k] = true
			}
		}
	}
	return out
}()

// NormalizeFlagName is how the components read a flag name: leading dashes
// and a "=value" suffix are not part of it, and '_' is read as '-'.
func NormalizeFlagName(k string) string {
	k = strings.TrimLeft(strings.TrimSpace(k), "-")
	k, _, _ = strings.Cut(k, "=")
	return strings.ToLower(strings.ReplaceAll(k, "_", "-"))
}

// ProtectedFlag says why a component's flag cannot be set through
// extraArgs, or "" when it can.
func ProtectedFlag(c render.Component, name string) string {
	name = NormalizeFlagName(name)
	if why, ok := reasons[name]; ok && (protectedDefaults[c][name] || slices.Contains(boundaryFlags[c], name)) {
		return why
	}
	if strings.HasPrefix(name, "etcd-") {
		// In every component: only the API server talks to etcd.
		return "binds the tenant to its own datastore credentials: etcd-* flags are set by Apiary only"
	}
	if protectedDefaults[c][name] {
		return "is set by Apiary and carries the tenant boundary (credentials, ports, trust or the datastore binding)"
	}
	if slices.Contains(boundaryFlags[c], name) {
		return "carries the tenant boundary (authentication, authorization, admission, listeners or egress)"
	}
	for _, p := range boundaryPrefixes[c] {
		if strings.HasPrefix(name, p) {
			return fmt.Sprintf("carries the tenant boundary: %s* flags are set by Apiary only", p)
		}
	}
	return ""
}

func validateExtraArgs(p *field.Path, c render.Component, args map[string]string) field.ErrorList {
	var errs field.ErrorList
	keys := make([]string, 0, len(args))
	for k := range args {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		kp, v := p.Key(k), args[k]
		if why := ProtectedFlag(c, k); why != "" {
			errs = append(errs, field.Forbidden(kp, fmt.Sprintf("--%s cannot be set in extraArgs: it %s", NormalizeFlagName(k), why)))
			continue
		}
		if !flagNamePattern.MatchString(k) {
			errs = append(errs, field.Invalid(kp, k, "must be a flag name matching ^[a-z0-9][a-z0-9-]*$ (no leading dashes, no =value, '-' not '_'), such as audit-log-maxage"))
			continue
		}
		if strings.ContainsAny(v, "\x00\n\r") {
			errs = append(errs, field.Invalid(kp, v, "must not contain NUL or line breaks"))
			continue
		}
		if want, ok := mustKeep[c][k]; ok && !slices.Contains(strings.Split(v, ","), want) {
			errs = append(errs, field.Invalid(kp, v, fmt.Sprintf("must keep %s in the list", want)))
			continue
		}
		if k == "feature-gates" {
			if why := checkGates(c, v); why != "" {
				errs = append(errs, field.Invalid(kp, v, why))
				continue
			}
		}
		for _, m := range pathInValue.FindAllString(v, -1) {
			clean := path.Clean(m)
			for _, dir := range render.MountDirs {
				if clean == dir || strings.HasPrefix(clean, dir+"/") {
					errs = append(errs, field.Forbidden(kp, fmt.Sprintf("must not point into %s: Apiary mounts the tenant's credentials there", dir)))
				}
			}
		}
	}
	return errs
}
