package etcdtest

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

func TestBinaryPathMissingSaysMakeTools(t *testing.T) {
	t.Setenv("APIARY_ETCD_BIN", t.TempDir())
	_, err := BinaryPath("etcd")
	if err == nil || !strings.Contains(err.Error(), "make tools") {
		t.Fatalf("BinaryPath of a missing binary: got %v, want an error telling to run `make tools`", err)
	}
}

func TestBinaryPathNotExecutable(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("APIARY_ETCD_BIN", dir)
	if err := os.WriteFile(filepath.Join(dir, "etcd"), []byte("not a binary"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := BinaryPath("etcd"); err == nil || !strings.Contains(err.Error(), "make tools") {
		t.Fatalf("BinaryPath of a non-executable file: got %v, want an error telling to run `make tools`", err)
	}
}

func TestBinaryPathFromEnv(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("APIARY_ETCD_BIN", dir)
	want := filepath.Join(dir, "etcd")
	if err := os.WriteFile(want, []byte("#!/bin/true\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	got, err := BinaryPath("etcd")
	if err != nil || got != want {
		t.Fatalf("BinaryPath = %q, %v; want %q", got, err, want)
	}
}

func TestBinaryPathDefault(t *testing.T) {
	home := t.TempDir()
	t.Setenv("APIARY_ETCD_BIN", "")
	t.Setenv("APIARY_CACHE", "")
	t.Setenv("HOME", home)
	_, err := BinaryPath("etcdctl")
	want := filepath.Join(home, ".cache", "apiary", "bin", "etcd-"+Version, "etcdctl")
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("BinaryPath with APIARY_ETCD_BIN unset: got %v, want an error naming %s", err, want)
	}
}

// fatalTB records Fatalf and ends the goroutine, as testing.T does.
type fatalTB struct {
	testing.TB
	msg string
}

func (f *fatalTB) Helper() {}

func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// TestStartFailsWithoutBinary: a missing etcd must fail the test, telling
// how to build it, never skip it.
func TestStartFailsWithoutBinary(t *testing.T) {
	t.Setenv("APIARY_ETCD_BIN", t.TempDir())
	f := &fatalTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		Start(f)
		f.msg = "Start returned"
	}()
	<-done
	if !strings.Contains(f.msg, "make tools") {
		t.Fatalf("Start without the etcd binary: %q, want a Fatalf telling to run `make tools`", f.msg)
	}
}
