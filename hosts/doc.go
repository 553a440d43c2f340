// Package hosts is the SSH side of the host agent: it connects to a Host
// with a pinned host key (failing closed on a mismatch), and runs the steps
// that prepare it — starting with preflight, which reads the host and
// changes nothing on it.
package hosts
