package testenv

import (
	"testing"
	"time"
)

// Eventually polls f every 100 ms until it returns nil, failing the test
// with f's last error after timeout.
func Eventually(t testing.TB, what string, timeout time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not true after %s: %v", what, timeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
