package cli

import (
	"flag"
	"os"
	"path/filepath"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	apiaryv1alpha1 "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

// golden compares got with testdata/name, or rewrites it with -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (create it with: go test ./cli -run %s -update)", err, t.Name())
	}
	if got != string(want) {
		t.Errorf("%s differs from %s (rewrite it with -update if the change is intended)\n--- got:\n%s\n--- want:\n%s", t.Name(), path, got, want)
	}
}

func tenants() []apiaryv1alpha1.TenantControlPlane {
	// Deliberately out of order: the table sorts by namespace, then name.
	return []apiaryv1alpha1.TenantControlPlane{*deletingTenant(), *newTenant(), *failingTenant(), *readyTenant()}
}

func TestFormatTable(t *testing.T) {
	golden(t, "table.txt", FormatTable(tenants(), false))
}

func TestFormatTableAllNamespaces(t *testing.T) {
	items := tenants()
	golden(t, "table-all-namespaces.txt", FormatTable(items, true))
	if items[0].Name != "delta" {
		t.Errorf("FormatTable reordered its argument")
	}
}

func TestFormatDetailReady(t *testing.T) {
	golden(t, "detail-ready.txt", FormatDetail(readyTenant(), now))
}

func TestFormatDetailFailing(t *testing.T) {
	golden(t, "detail-failing.txt", FormatDetail(failingTenant(), now))
}

func TestFormatDetailNew(t *testing.T) {
	golden(t, "detail-new.txt", FormatDetail(newTenant(), now))
}

func TestFormatDetailDeleting(t *testing.T) {
	golden(t, "detail-deleting.txt", FormatDetail(deletingTenant(), now))
}

func TestConditionsSummary(t *testing.T) {
	unknownType := readyTenant()
	unknownType.Status.Conditions = append(unknownType.Status.Conditions,
		cond("Zeta", metav1.ConditionFalse, "", "", 0), cond("Extra", metav1.ConditionFalse, "Broken", "", 0))
	for _, tc := range []struct {
		name string
		tcp  *apiaryv1alpha1.TenantControlPlane
		want string
	}{
		{"ready", readyTenant(), "all ready"},
		{"failing, in provisioning order", failingTenant(), "DataStoreReady=Unreachable,ControlPlaneAvailable=Progressing,Ready=DataStoreNotReady"},
		{"no status", newTenant(), "none reported"},
		{"other types after, by type; status without a reason", unknownType, "Extra=Broken,Zeta=False"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := ConditionsSummary(tc.tcp); got != tc.want {
				t.Errorf("ConditionsSummary = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestFirstFailingCondition(t *testing.T) {
	if c := FirstFailingCondition(readyTenant()); c != nil {
		t.Errorf("ready tenant: got %v, want nil", c)
	}
	if c := FirstFailingCondition(failingTenant()); c == nil || c.Type != apiaryv1alpha1.ConditionDataStoreReady {
		t.Errorf("failing tenant: got %v, want DataStoreReady", c)
	}
	onlyReady := newTenant()
	onlyReady.Status.Conditions = []metav1.Condition{cond(apiaryv1alpha1.ConditionReady, metav1.ConditionFalse, "X", "", 0)}
	if c := FirstFailingCondition(onlyReady); c != nil {
		t.Errorf("only Ready is false: got %v, want nil", c)
	}
}
