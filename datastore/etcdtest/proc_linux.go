//go:build linux

package etcdtest

import (
	"os/exec"
	"syscall"
)

// killWithParent makes the kernel kill etcd if the test binary dies without
// running its cleanups (e.g. go test's timeout panic), so that no etcd
// outlives the test and holds its ports.
func killWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
