//go:build integration

package charts_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/apiaryhq/apiary/internal/testenv"
	"github.com/apiaryhq/apiary/operator/metrics"
)

const dashboardFile = "apiary/files/grafana-dashboard.json"

// dashboard is the part of Grafana's dashboard model the test reads.
type dashboard struct {
	UID        string `json:"uid"`
	Title      string `json:"title"`
	Templating struct {
		List []struct {
			Name       string           `json:"name"`
			Type       string           `json:"type"`
			Datasource *dashboardSource `json:"datasource"`
			Query      json.RawMessage  `json:"query"`
		} `json:"list"`
	} `json:"templating"`
	Panels []dashboardPanel `json:"panels"`
}

type dashboardSource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type dashboardPanel struct {
	ID          int                      `json:"id"`
	Type        string                   `json:"type"`
	Title       string                   `json:"title"`
	Description string                   `json:"description"`
	Datasource  *dashboardSource         `json:"datasource"`
	GridPos     struct{ X, Y, W, H int } `json:"gridPos"`
	Targets     []struct {
		RefID      string           `json:"refId"`
		Expr       string           `json:"expr"`
		Datasource *dashboardSource `json:"datasource"`
	} `json:"targets"`
}

func readDashboard(t *testing.T) dashboard {
	t.Helper()
	raw, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	return d
}

// The values a user picks at the top of the dashboard, and Grafana's
// interval variables, as the test substitutes them.
var dashboardVariables = strings.NewReplacer(
	"$namespace", "t", "$tenant", "alpha", "$__rate_interval", "5m", "$__range", "1h")

var notSlug = regexp.MustCompile(`[^a-z0-9]+`)

// slug makes a panel title part of a recording rule's name.
func slug(title string) string {
	return strings.Trim(notSlug.ReplaceAllString(strings.ToLower(title), "_"), "_")
}

// The shipped Grafana dashboard: its layout holds together, every query
// uses series the operator exports, parses as PromQL (promtool) and shows
// the right value for known series (testdata/dashboard_test.yaml, one case
// per query), and the chart's ConfigMap carries the file unchanged.
func TestGrafanaDashboard(t *testing.T) {
	d := readDashboard(t)
	if d.UID == "" || d.Title == "" {
		t.Errorf("dashboard uid %q, title %q: both are needed (Grafana keys dashboards by uid)", d.UID, d.Title)
	}
	vars := map[string]bool{}
	for _, v := range d.Templating.List {
		vars[v.Name] = true
		if v.Type == "query" && (v.Datasource == nil || v.Datasource.UID != "${datasource}") {
			t.Errorf("variable %s does not query the ${datasource} picked at the top", v.Name)
		}
	}
	for _, want := range []string{"datasource", "namespace", "tenant"} {
		if !vars[want] {
			t.Errorf("no variable %s", want)
		}
	}

	// Layout: unique ids, inside the 24-column grid, no two panels on the
	// same cells; every panel says what it shows and asks the picked data
	// source.
	ids := map[int]string{}
	type cell struct{ x, y int }
	cells := map[cell]string{}
	rows := 0
	for _, p := range d.Panels {
		if other, dup := ids[p.ID]; dup {
			t.Errorf("panels %q and %q share id %d", other, p.Title, p.ID)
		}
		ids[p.ID] = p.Title
		g := p.GridPos
		if g.W <= 0 || g.H <= 0 || g.X < 0 || g.X+g.W > 24 {
			t.Errorf("panel %q: gridPos %+v is outside the 24-column grid", p.Title, g)
		}
		for x := g.X; x < g.X+g.W; x++ {
			for y := g.Y; y < g.Y+g.H; y++ {
				if other, taken := cells[cell{x, y}]; taken {
					t.Errorf("panels %q and %q overlap at x=%d y=%d", other, p.Title, x, y)
				}
				cells[cell{x, y}] = p.Title
			}
		}
		if p.Type == "row" {
			rows++
			continue
		}
		if p.Description == "" {
			t.Errorf("panel %q has no description", p.Title)
		}
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" || len(p.Targets) == 0 {
			t.Errorf("panel %q: no query of the ${datasource} picked at the top", p.Title)
		}
	}
	if rows != 2 {
		t.Errorf("%d rows, want an overview row and a tenant row", rows)
	}

	// Every series a query names is one the operator exports (or
	// controller-runtime's reconcile counters).
	known := map[string]bool{"controller_runtime_reconcile_total": true, "controller_runtime_reconcile_errors_total": true}
	for _, f := range metrics.Families() {
		known[f.Name] = true
		if f.Histogram {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				known[f.Name+s] = true
			}
		}
	}
	names := regexp.MustCompile(`\b(apiary|controller_runtime)_[a-z_]+\b`)
	check := func(where, expr string) {
		for _, n := range names.FindAllString(expr, -1) {
			if !known[n] {
				t.Errorf("%s: %s is not a series the operator exports (operator/metrics)", where, n)
			}
		}
	}

	// Every query becomes a recording rule: promtool parses it, and the
	// test file says what it records. A variable's label_values(selector,
	// label) records the values it offers, as count by (label).
	type rule struct {
		Record string `json:"record"`
		Expr   string `json:"expr"`
	}
	var recorded []rule
	labelValues := regexp.MustCompile(`^label_values\((.+), *([a-z_]+)\)$`)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q string
		if err := json.Unmarshal(v.Query, &q); err != nil {
			t.Errorf("variable %s: query %s is not a string", v.Name, v.Query)
			continue
		}
		check("variable "+v.Name, q)
		m := labelValues.FindStringSubmatch(q)
		if m == nil {
			t.Errorf("variable %s: %q is not label_values(selector, label)", v.Name, q)
			continue
		}
		recorded = append(recorded, rule{Record: "apiary_dashboard:variable:" + v.Name,
			Expr: fmt.Sprintf("count by (%s) (%s)", m[2], dashboardVariables.Replace(m[1]))})
	}
	seen := map[string]bool{}
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			where := fmt.Sprintf("panel %q query %s", p.Title, tg.RefID)
			check(where, tg.Expr)
			if tg.Datasource == nil || tg.Datasource.UID != "${datasource}" {
				t.Errorf("%s: not on the ${datasource} picked at the top", where)
			}
			name := "apiary_dashboard:" + slug(p.Title) + ":" + tg.RefID
			if seen[name] {
				t.Errorf("%s: two queries record as %s; give the panels distinct titles", where, name)
			}
			seen[name] = true
			if strings.Contains(dashboardVariables.Replace(tg.Expr), "$") {
				t.Errorf("%s uses a variable the test does not know: %s", where, tg.Expr)
			}
			recorded = append(recorded, rule{Record: name, Expr: dashboardVariables.Replace(tg.Expr)})
		}
	}
	rules, err := yaml.Marshal(map[string]any{"groups": []any{map[string]any{"name": "dashboard", "rules": recorded}}})
	if err != nil {
		t.Fatal(err)
	}
	cases, err := os.ReadFile(filepath.Join("testdata", "dashboard_test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recorded {
		if !strings.Contains(string(cases), "- expr: '"+r.Record+"'\n") {
			t.Errorf("query %s (%s) has no case in testdata/dashboard_test.yaml", r.Record, r.Expr)
		}
	}
	dir := t.TempDir()
	for name, content := range map[string][]byte{"dashboard-rules.yaml": rules, "dashboard_test.yaml": cases} {
		if err := os.WriteFile(filepath.Join(dir, name), content, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	promtool, err := testenv.PromtoolBinary()
	if err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"check", "rules", "dashboard-rules.yaml"}, {"test", "rules", "dashboard_test.yaml"}} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), "SUCCESS") {
			t.Errorf("promtool %s: %v\n%s\nrules:\n%s", strings.Join(args, " "), err, out, rules)
		}
	}

	// The chart's ConfigMap holds the file as it is, under the sidecar's
	// label.
	got := helm(t, "template", "apiary", "apiary", "--namespace", "apiary-system", "--set", "metrics.grafanaDashboard.enabled=true",
		"--show-only", "templates/grafana-dashboard.yaml")
	var cm struct {
		Metadata struct {
			Labels map[string]string `json:"labels"`
		} `json:"metadata"`
		Data map[string]string `json:"data"`
	}
	if err := yaml.Unmarshal([]byte(got), &cm); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	if cm.Data["apiary.json"] != strings.TrimRight(string(raw), "\n") {
		t.Errorf("the ConfigMap's apiary.json is not %s:\n%s", dashboardFile, got)
	}
	if cm.Metadata.Labels["grafana_dashboard"] != "1" {
		t.Errorf("the ConfigMap lacks the sidecar's label grafana_dashboard=1: %v", cm.Metadata.Labels)
	}
}
