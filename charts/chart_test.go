//go:build integration

// Package charts_test lints the Helm chart and pins what it renders with
// golden files, using helm built from source (make tools).
package charts_test

import (
	"bytes"
	"flag"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/yaml"

	"github.com/apiaryhq/apiary/internal/testenv"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

func helm(t *testing.T, args ...string) string {
	t.Helper()
	bin, err := testenv.HelmBinary()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	// No user configuration or cache leaks into the test.
	home := t.TempDir()
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+home, "HELM_CONFIG_HOME="+home, "HELM_DATA_HOME="+home)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		t.Fatalf("helm %s: %v\n%s%s", strings.Join(args, " "), err, out.String(), errOut.String())
	}
	return out.String()
}

func TestHelmLint(t *testing.T) {
	for _, set := range [][]string{nil, {"--set", "webhook.certManager.enabled=true"}, {"--set", "defaultDataStore.create=false,metrics.enabled=false"},
		{"--set", monitoringSet}, {"--set", dashboardSet}} {
		out := helm(t, append([]string{"lint", "--strict", "apiary"}, set...)...)
		if !strings.Contains(out, "0 chart(s) failed") {
			t.Errorf("helm lint %v:\n%s", set, out)
		}
	}
}

func TestHelmTemplateGolden(t *testing.T) {
	for name, set := range map[string][]string{
		"default":      nil,
		"cert-manager": {"--set", "webhook.certManager.enabled=true"},
		"dev":          {"--set", "replicaCount=1,defaultDataStore.managed.storage.emptyDir=true,operator.imageRepository=mirror.example.com/k8s"},
		"namespaced":   {"--set", "operator.tenantNamespaces={team-a,team-b}"},
		"monitoring":   {"--set", monitoringSet},
		"dashboard":    {"--set", dashboardSet},
	} {
		t.Run(name, func(t *testing.T) {
			got := helm(t, append([]string{"template", "apiary", "apiary", "--namespace", "apiary-system"}, set...)...)
			// Every document parses.
			for _, doc := range strings.Split(got, "\n---\n") {
				var v map[string]any
				if err := yaml.Unmarshal([]byte(doc), &v); err != nil {
					t.Fatalf("invalid YAML in rendered chart: %v\n%s", err, doc)
				}
			}
			path := filepath.Join("testdata", "apiary-"+name+".golden.yaml")
			if *update {
				if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("reading %s (run go test -tags integration ./charts -update): %v", path, err)
			}
			if got != string(want) {
				t.Errorf("rendered chart differs from %s; run go test -tags integration ./charts -update if intended", path)
			}
		})
	}
}

// monitoringSet turns on the chart's ServiceMonitor, PrometheusRule and Grafana dashboard.
const monitoringSet = "metrics.serviceMonitor.enabled=true,metrics.prometheusRule.enabled=true,metrics.grafanaDashboard.enabled=true"

// The shipped alert rules pass promtool's checks and its unit tests
// (testdata/alerts_test.yaml: each alert fires on its fault, only after its
// for:, and not on a healthy object), and the chart's PrometheusRule holds
// exactly them.
func TestAlertRules(t *testing.T) {
	promtool, err := testenv.PromtoolBinary()
	if err != nil {
		t.Fatal(err)
	}
	run := func(dir string, args ...string) string {
		t.Helper()
		cmd := exec.Command(promtool, args...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	const rules = "apiary/files/alerts.yaml"
	if out := run(".", "check", "rules", rules); !strings.Contains(out, "SUCCESS") {
		t.Errorf("promtool check rules:\n%s", out)
	}
	if out := run("testdata", "test", "rules", "alerts_test.yaml"); !strings.Contains(out, "SUCCESS") {
		t.Errorf("promtool test rules:\n%s", out)
	}

	// Every alert has a unit test and a runbook.
	raw, err := os.ReadFile(rules)
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Groups []struct {
			Rules []struct {
				Alert       string            `json:"alert"`
				Annotations map[string]string `json:"annotations"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.Unmarshal(raw, &file); err != nil {
		t.Fatal(err)
	}
	tests, err := os.ReadFile(filepath.Join("testdata", "alerts_test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	runbooks, err := os.ReadFile(filepath.Join("..", "docs", "runbooks.md"))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, g := range file.Groups {
		for _, r := range g.Rules {
			n++
			if !strings.Contains(string(tests), "alertname: "+r.Alert+"\n") {
				t.Errorf("alert %s has no case in testdata/alerts_test.yaml", r.Alert)
			}
			if !strings.Contains(string(runbooks), "\n## "+r.Alert+"\n") {
				t.Errorf("alert %s has no section in docs/runbooks.md", r.Alert)
			}
			if want := "docs/runbooks.md#" + strings.ToLower(r.Alert); !strings.HasSuffix(r.Annotations["runbook_url"], want) {
				t.Errorf("alert %s: runbook_url %q, want it to end in %s", r.Alert, r.Annotations["runbook_url"], want)
			}
		}
	}
	if n == 0 {
		t.Fatal("no alerts in " + rules)
	}

	// The PrometheusRule's spec is the file.
	got := helm(t, "template", "apiary", "apiary", "--namespace", "apiary-system", "--set", monitoringSet, "--show-only", "templates/monitoring.yaml")
	var spec any
	for _, doc := range strings.Split(got, "\n---\n") {
		var v struct {
			Kind string `json:"kind"`
			Spec any    `json:"spec"`
		}
		if err := yaml.Unmarshal([]byte(doc), &v); err != nil {
			t.Fatal(err)
		}
		if v.Kind == "PrometheusRule" {
			spec = v.Spec
		}
	}
	var want any
	if err := yaml.Unmarshal(raw, &want); err != nil {
		t.Fatal(err)
	}
	if spec == nil || !reflect.DeepEqual(spec, want) {
		t.Errorf("the PrometheusRule's spec is not files/alerts.yaml:\n%s", got)
	}
}

// The chart's ClusterRole carries exactly the generated rules.
func TestHelmRBACMatchesGenerated(t *testing.T) {
	got := helm(t, "template", "apiary", "apiary", "--namespace", "apiary-system", "--show-only", "templates/rbac.yaml")
	var rendered struct {
		Rules []map[string]any `json:"rules"`
	}
	first := strings.Split(got, "\n---\n")[0]
	if err := yaml.Unmarshal([]byte(first), &rendered); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join("apiary", "files", "rbac", "role.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var generated struct {
		Rules []map[string]any `json:"rules"`
	}
	if err := yaml.Unmarshal(raw, &generated); err != nil {
		t.Fatal(err)
	}
	a, _ := yaml.Marshal(rendered.Rules)
	b, _ := yaml.Marshal(generated.Rules)
	if len(generated.Rules) == 0 || !bytes.Equal(a, b) {
		t.Errorf("chart ClusterRole rules differ from files/rbac/role.yaml:\n%s\nvs\n%s", a, b)
	}
}

// With operator.tenantNamespaces, the generated rules are split, none lost
// and none widened: the cluster-scoped resources stay in the ClusterRole,
// every other resource is granted by a Role in each of those namespaces and
// the release's, and nothing namespaced is granted cluster-wide.
func TestHelmRBACNarrowedToNamespaces(t *testing.T) {
	got := helm(t, "template", "apiary", "apiary", "--namespace", "apiary-system",
		"--set", "operator.tenantNamespaces={team-a,team-b}", "--show-only", "templates/rbac.yaml")
	type rule struct {
		APIGroups []string `json:"apiGroups"`
		Resources []string `json:"resources"`
		Verbs     []string `json:"verbs"`
	}
	type object struct {
		Kind     string `json:"kind"`
		Metadata struct{ Name, Namespace string }
		Rules    []rule `json:"rules"`
	}
	grants := func(rules []rule) map[string]bool {
		out := map[string]bool{}
		for _, r := range rules {
			for _, g := range r.APIGroups {
				for _, res := range r.Resources {
					for _, v := range r.Verbs {
						out[g+"/"+res+":"+v] = true
					}
				}
			}
		}
		return out
	}
	var clusterRole []rule
	roles := map[string][]rule{}
	for _, doc := range strings.Split(got, "\n---\n") {
		var o object
		if err := yaml.Unmarshal([]byte(doc), &o); err != nil {
			t.Fatal(err)
		}
		switch {
		case o.Kind == "ClusterRole" && o.Metadata.Name == "apiary-operator":
			clusterRole = o.Rules
		case o.Kind == "Role" && o.Metadata.Name == "apiary-operator":
			roles[o.Metadata.Namespace] = o.Rules
		}
	}
	raw, err := os.ReadFile(filepath.Join("apiary", "files", "rbac", "role.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var generated struct {
		Rules []rule `json:"rules"`
	}
	if err := yaml.Unmarshal(raw, &generated); err != nil {
		t.Fatal(err)
	}
	want := grants(generated.Rules)
	for _, ns := range []string{"team-a", "team-b", "apiary-system"} {
		if roles[ns] == nil {
			t.Fatalf("no operator Role in namespace %s (have %v)", ns, slices.Sorted(maps.Keys(roles)))
		}
		union := grants(clusterRole)
		maps.Copy(union, grants(roles[ns]))
		if !maps.Equal(union, want) {
			t.Errorf("namespace %s: ClusterRole + Role grant %v, want the generated %v", ns, slices.Sorted(maps.Keys(union)), slices.Sorted(maps.Keys(want)))
		}
	}
	cluster := grants(clusterRole)
	for g := range cluster {
		for _, namespaced := range []string{"/secrets:", "/configmaps:", "/services:", "/pods:", "/deployments:", "/statefulsets:", "/networkpolicies:", "/endpointslices:"} {
			if strings.Contains(g, namespaced) {
				t.Errorf("granted cluster-wide: %s", g)
			}
		}
	}
	// Deleting a namespace deletes its Roles before the tenants' and
	// Hosts' finalizers run: removing them must not depend on a Role.
	for _, g := range []string{"apiary.dev/tenantcontrolplanes:patch", "apiary.dev/tenantcontrolplanes/finalizers:update", "apiary.dev/hosts:patch", "apiary.dev/hosts/finalizers:update"} {
		if !cluster[g] {
			t.Errorf("%s not granted cluster-wide: a namespace being deleted would keep its tenants and Hosts forever", g)
		}
	}
}

// dashboardSet turns on the dashboard with what it requires.
const dashboardSet = "dashboard.enabled=true,dashboard.tlsSecretName=dashboard-tls,dashboard.sessionSecretName=dashboard-session," +
	"dashboard.oidc.issuer=https://idp.example,dashboard.oidc.clientID=dashboard,dashboard.oidc.clientSecretName=dashboard-oidc," +
	"dashboard.oidc.redirectURL=https://dashboard.example/callback,dashboard.ingress.enabled=true,dashboard.ingress.host=dashboard.example"

// The dashboard refuses to render without what it cannot run without,
// naming the value; and its identity may impersonate and nothing else.
func TestHelmDashboard(t *testing.T) {
	bin, err := testenv.HelmBinary()
	if err != nil {
		t.Fatal(err)
	}
	for _, value := range []string{"dashboard.tlsSecretName", "dashboard.sessionSecretName", "dashboard.oidc.issuer",
		"dashboard.oidc.clientID", "dashboard.oidc.redirectURL", "dashboard.ingress.host"} {
		var set []string
		for _, kv := range strings.Split(dashboardSet, ",") {
			if !strings.HasPrefix(kv, value+"=") {
				set = append(set, kv)
			}
		}
		out, err := exec.Command(bin, "template", "apiary", "apiary", "--set", strings.Join(set, ",")).CombinedOutput()
		if err == nil || !strings.Contains(string(out), value+":") {
			t.Errorf("without %s: %v\n%s", value, err, out)
		}
	}

	got := helm(t, "template", "apiary", "apiary", "--namespace", "apiary-system", "--set", dashboardSet, "--show-only", "templates/dashboard.yaml")
	var roles int
	for _, doc := range strings.Split(got, "\n---\n") {
		var o struct {
			Kind  string
			Rules []struct {
				APIGroups, Resources, Verbs, ResourceNames []string
			}
		}
		if err := yaml.Unmarshal([]byte(doc), &o); err != nil {
			t.Fatal(err)
		}
		if o.Kind == "Deployment" {
			// Every argument a string: a value ending in ":" (the
			// prefixes) would make an unquoted one a YAML map, which
			// the API server refuses.
			var d appsv1.Deployment
			if err := yaml.UnmarshalStrict([]byte(doc), &d); err != nil {
				t.Fatalf("the dashboard's Deployment: %v", err)
			}
			if args := d.Spec.Template.Spec.Containers[0].Args; !slices.Contains(args, "--username-prefix=oidc:") || !slices.Contains(args, "--issuer=https://idp.example") {
				t.Errorf("the dashboard's arguments: %q", args)
			}
		}
		if o.Kind != "ClusterRole" && o.Kind != "Role" {
			continue
		}
		roles++
		for _, r := range o.Rules {
			if !slices.Equal(r.APIGroups, []string{""}) || !slices.Equal(r.Verbs, []string{"impersonate"}) ||
				!slices.Equal(r.Resources, []string{"users", "groups"}) {
				t.Errorf("the dashboard's %s grants %+v: want impersonate on users and groups only", o.Kind, r)
			}
		}
	}
	if roles != 1 {
		t.Errorf("the dashboard has %d roles, want one ClusterRole", roles)
	}
}
