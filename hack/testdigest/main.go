// Command testdigest prints, from a `go test -json` stream (the file
// gotestsum's --jsonfile writes), the output of every failed test that has
// no failed subtest of its own: the reason a suite is red, put where a
// reader of a long log's tail will see it.
//
// The e2e suite streams thousands of lines and a test's own error sits in
// the middle of them; CI shows the tail. hack/e2e.sh runs this last.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
)

// event is the part of a test2json event this reads (see `go doc
// cmd/test2json`).
type event struct {
	Action  string
	Package string
	Test    string
	Output  string
	Elapsed float64
}

type failure struct {
	pkg, test string
	elapsed   float64
}

func main() {
	lines := flag.Int("lines", 40, "the last this many output lines of each failed test")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: testdigest [-lines N] FILE.json\n\n"+
			"Prints the output of each failed test without a failed subtest, from a go test -json stream.\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 1 {
		flag.Usage()
		os.Exit(2)
	}
	f, err := os.Open(flag.Arg(0))
	if err != nil {
		fmt.Fprintln(os.Stderr, "testdigest:", err)
		os.Exit(1)
	}
	defer f.Close()
	if err := digest(f, os.Stdout, *lines); err != nil {
		fmt.Fprintln(os.Stderr, "testdigest:", err)
		os.Exit(1)
	}
}

// digest writes the failed leaf tests of in to out, each with its last
// max output lines (framing lines such as "=== RUN" left out). A package
// that failed without a failed test (a build error, a panic in TestMain, a
// timeout) is named with its own output.
func digest(in io.Reader, out io.Writer, max int) error {
	output := map[[2]string][]string{}
	var failed []failure
	failedTest := map[string]bool{} // packages with a failed test
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var ev event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			continue // go test prints build errors as plain text
		}
		key := [2]string{ev.Package, ev.Test}
		switch ev.Action {
		case "output":
			if !framing(ev.Output) {
				output[key] = append(output[key], strings.TrimRight(ev.Output, "\n"))
			}
		case "fail":
			failed = append(failed, failure{ev.Package, ev.Test, ev.Elapsed})
			if ev.Test != "" {
				failedTest[ev.Package] = true
			}
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("reading the test events: %w", err)
	}
	var leaves []failure
	for _, f := range failed {
		if f.test == "" && failedTest[f.pkg] {
			continue // its tests are named
		}
		if f.test != "" && hasFailedSubtest(failed, f) {
			continue
		}
		leaves = append(leaves, f)
	}
	if len(leaves) == 0 {
		return nil
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n==== %d failed (each with its last %d lines of output)\n", len(leaves), max)
	for _, f := range leaves {
		name := f.pkg
		if f.test != "" {
			name += " " + f.test
		}
		fmt.Fprintf(&b, "\n--- FAIL: %s (%.2fs)\n", name, f.elapsed)
		ls := output[[2]string{f.pkg, f.test}]
		if len(ls) > max {
			fmt.Fprintf(&b, "    [%d earlier lines]\n", len(ls)-max)
			ls = ls[len(ls)-max:]
		}
		for _, l := range ls {
			b.WriteString(l + "\n")
		}
	}
	_, err := io.WriteString(out, b.String())
	return err
}

func hasFailedSubtest(failed []failure, f failure) bool {
	for _, g := range failed {
		if g.pkg == f.pkg && strings.HasPrefix(g.test, f.test+"/") {
			return true
		}
	}
	return false
}

// framing says whether a line is go test's own bookkeeping rather than
// something the test printed.
func framing(line string) bool {
	for _, p := range []string{"=== RUN", "=== PAUSE", "=== CONT", "=== NAME", "--- PASS", "--- FAIL", "--- SKIP", "PASS\n", "FAIL\n"} {
		if strings.HasPrefix(strings.TrimLeft(line, " "), p) {
			return true
		}
	}
	return false
}
