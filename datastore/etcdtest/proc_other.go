//go:build !linux

package etcdtest

import "os/exec"

// killWithParent is a no-op where there is no parent-death signal; the
// test's cleanup still stops etcd.
func killWithParent(*exec.Cmd) {}
