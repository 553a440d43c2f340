package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// runApiary runs the apiary command line and returns its exit code, stdout
// and stderr.
func runApiary(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), args, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

func TestHelp(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"--help"}, []string{"TenantControlPlane", "DataStore", "status", "kubeconfig", "version", "operator", "--kubeconfig", "--context", "--namespace"}},
		{[]string{"status", "--help"}, []string{"apiary status -A", "--all-namespaces", "--output", "CONDITIONS"}},
		{[]string{"kubeconfig", "--help"}, []string{"--internal", "--allow-not-ready", "kubeconfig-internal", "apiary kubeconfig dev -n team-a"}},
		{[]string{"version", "--help"}, []string{"-ldflags", "--short"}},
	} {
		code, out, errOut := runApiary(t, tc.args...)
		if code != 0 {
			t.Errorf("apiary %v: exit %d, stderr %q", tc.args, code, errOut)
		}
		for _, s := range tc.want {
			if !strings.Contains(out, s) {
				t.Errorf("apiary %v: help does not mention %q:\n%s", tc.args, s, out)
			}
		}
	}
}

func TestEveryCommandIsDocumented(t *testing.T) {
	root := newRootCommand()
	if root.Long == "" || root.Example == "" {
		t.Error("the root command needs Long and Example")
	}
	for _, cmd := range root.Commands() {
		if cmd.Name() == "operator" || cmd.Name() == "completion" || cmd.Name() == "help" {
			continue // operator.go belongs to the operator; the others are cobra's
		}
		if cmd.Short == "" || cmd.Long == "" || cmd.Example == "" {
			t.Errorf("apiary %s: Short, Long and Example must all be set", cmd.Name())
		}
	}
}

func TestVersion(t *testing.T) {
	old := version
	version = "v1.2.3"
	t.Cleanup(func() { version = old })

	if code, out, _ := runApiary(t, "version"); code != 0 || !strings.HasPrefix(out, "apiary version v1.2.3 (go") {
		t.Errorf("apiary version: exit %d, %q", code, out)
	}
	if code, out, _ := runApiary(t, "version", "--short"); code != 0 || out != "v1.2.3\n" {
		t.Errorf("apiary version --short: exit %d, %q", code, out)
	}
	if code, out, _ := runApiary(t, "--version"); code != 0 || out != "apiary version v1.2.3\n" {
		t.Errorf("apiary --version: exit %d, %q", code, out)
	}
}

func TestErrorsGoToStderr(t *testing.T) {
	code, out, errOut := runApiary(t, "kubeconfig")
	if code != 1 || out != "" || !strings.HasPrefix(errOut, "Error: ") || !strings.Contains(errOut, "exactly one argument") {
		t.Errorf("apiary kubeconfig: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	code, _, errOut = runApiary(t, "status", "-o", "xml")
	if code != 1 || !strings.Contains(errOut, `unknown output format "xml"`) {
		t.Errorf("apiary status -o xml: exit %d, stderr %q", code, errOut)
	}
	code, _, errOut = runApiary(t, "status", "x", "-A")
	if code != 1 || !strings.Contains(errOut, "cannot be combined with --all-namespaces") {
		t.Errorf("apiary status x -A: exit %d, stderr %q", code, errOut)
	}
}

func TestMissingKubeconfigFile(t *testing.T) {
	code, _, errOut := runApiary(t, "status", "--kubeconfig", t.TempDir()+"/missing")
	if code != 1 || !strings.Contains(errOut, "missing") {
		t.Errorf("exit %d, stderr %q", code, errOut)
	}
}
