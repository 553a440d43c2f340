//go:build integration

package tenant

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
)

// The CoreDNS that hack/build-upstream.sh builds carries only some plugins
// (hack/tools/coredns/main.go): each Kubernetes version the tools build
// gets, from the built binary of the CoreDNS paired with it, every plugin
// its tenant Corefile names.
func TestBuiltCoreDNSHasTheCorefilesPlugins(t *testing.T) {
	cache := os.Getenv("APIARY_CACHE")
	if cache == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			t.Fatal(err)
		}
		cache = filepath.Join(home, ".cache", "apiary")
	}
	// The two minors hack/build-upstream.sh builds (hack/tools and
	// hack/tools/kubernetes-previous).
	for _, version := range []string{"v1.37.2", "v1.36.3"} {
		in := fixture()
		in.Version = version
		objs, err := coreDNS(in)
		if err != nil {
			t.Fatal(err)
		}
		var corefile string
		for _, o := range objs {
			if cm, ok := o.(*corev1ac.ConfigMapApplyConfiguration); ok && cm.Data["Corefile"] != "" {
				corefile = cm.Data["Corefile"]
			}
		}
		if corefile == "" {
			t.Fatalf("%s: no Corefile rendered", version)
		}
		bin := filepath.Join(cache, "bin", "coredns-"+CoreDNSVersion(version), "coredns")
		out, err := exec.Command(bin, "-plugins").CombinedOutput()
		if err != nil {
			t.Fatalf("%s -plugins (make tools builds it): %v\n%s", bin, err, out)
		}
		linked := map[string]bool{}
		for _, f := range strings.Fields(string(out)) {
			linked[f] = true
		}
		ds := directives(corefile)
		if len(ds) < 5 {
			t.Fatalf("%s: only %v read as plugins from the Corefile:\n%s", version, ds, corefile)
		}
		for _, d := range ds {
			if !linked[d] {
				t.Errorf("%s: the tenant Corefile of %s names %q, which %s lacks (hack/tools/coredns/main.go)", CoreDNSVersion(version), version, d, bin)
			}
		}
	}
}

// directives are the first words of a Corefile's server block lines (depth
// one), the plugins it names.
func directives(corefile string) []string {
	var ds []string
	depth := 0
	for _, line := range strings.Split(corefile, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if depth == 1 && f[0] != "}" {
			ds = append(ds, f[0])
		}
		depth += strings.Count(line, "{") - strings.Count(line, "}")
	}
	return ds
}
