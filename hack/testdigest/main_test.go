package main

import (
	"os"
	"strings"
	"testing"
)

// testdata/events.json is what `go test -json` wrote for a test with a
// failed leaf two levels down, a passing sibling, and a failed direct
// subtest (their parents fail with them).
func TestDigestNamesOnlyTheFailedLeaves(t *testing.T) {
	f, err := os.Open("testdata/events.json")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out strings.Builder
	if err := digest(f, &out, 2); err != nil {
		t.Fatal(err)
	}
	want := `
==== 2 failed (each with its last 2 lines of output)

--- FAIL: example.com/gtt TestTop/Group/Leaf (0.00s)
    [1 earlier lines]
    a_test.go:8: leaf broke: reason X
    a_test.go:8: after

--- FAIL: example.com/gtt TestTop/Other (0.00s)
    a_test.go:12: only 45 successful requests
`
	if out.String() != want {
		t.Errorf("digest:\n%s\nwant:\n%s", out.String(), want)
	}
}

func TestDigestOfAPassingRunIsEmpty(t *testing.T) {
	in := `{"Action":"run","Package":"p","Test":"TestA"}
{"Action":"output","Package":"p","Test":"TestA","Output":"    a_test.go:1: fine\n"}
{"Action":"pass","Package":"p","Test":"TestA","Elapsed":0.1}
{"Action":"pass","Package":"p","Elapsed":0.2}
`
	var out strings.Builder
	if err := digest(strings.NewReader(in), &out, 10); err != nil {
		t.Fatal(err)
	}
	if out.Len() != 0 {
		t.Errorf("digest of a passing run: %q", out.String())
	}
}

// A package that fails with no failed test (a timeout's panic, a crash in
// TestMain) is named with its own output; plain-text lines such as build
// errors are skipped, not an error.
func TestDigestNamesAPackageThatFailedOnItsOwn(t *testing.T) {
	in := `# p [p.test]
{"Action":"output","Package":"p","Output":"panic: test timed out after 75m0s\n"}
{"Action":"fail","Package":"p","Elapsed":4500}
`
	var out strings.Builder
	if err := digest(strings.NewReader(in), &out, 10); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "--- FAIL: p (4500.00s)\npanic: test timed out after 75m0s\n") {
		t.Errorf("digest:\n%s", out.String())
	}
}
