// Package browsertest starts the real browser the dashboard's tests
// drive: headless Chromium from Debian's package (make deps installs it),
// through the DevTools protocol (chromedp).
package browsertest

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/browser"
	"github.com/chromedp/chromedp"
)

// Path is Chromium's binary: $APIARY_CHROMIUM, else chromium on PATH.
func Path() (string, error) {
	if p := os.Getenv("APIARY_CHROMIUM"); p != "" {
		return p, nil
	}
	p, err := exec.LookPath("chromium")
	if err != nil {
		return "", fmt.Errorf("chromium not found (make deps installs Debian's chromium; or set APIARY_CHROMIUM): %w", err)
	}
	return p, nil
}

// Start runs a headless Chromium for one test and returns its context;
// the browser stops with the test. It trusts exactly the certificates
// given, by their public keys, wherever they are in the chain a server
// presents (a leaf, or a CA the server sends along), and saves downloads
// in downloads (empty: refused).
func Start(t testing.TB, downloads string, trust ...*x509.Certificate) context.Context {
	t.Helper()
	path, err := Path()
	if err != nil {
		t.Fatal(err)
	}
	var spki []string
	for _, c := range trust {
		sum := sha256.Sum256(c.RawSubjectPublicKeyInfo)
		spki = append(spki, base64.StdEncoding.EncodeToString(sum[:]))
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.UserDataDir(t.TempDir()),
		// The tests run as root in a VM; Chromium's sandbox needs a user.
		chromedp.NoSandbox,
		chromedp.WindowSize(1280, 900),
		// Nothing but the test's own servers: no updates, no fetches.
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
	)
	if os.Getenv("APIARY_CHROMEDP_DEBUG") != "" {
		opts = append(opts, chromedp.CombinedOutput(os.Stderr), chromedp.Flag("enable-logging", "stderr"), chromedp.Flag("v", "0"))
	}
	if len(spki) > 0 {
		opts = append(opts, chromedp.Flag("ignore-certificate-errors-spki-list", strings.Join(spki, ",")))
	}
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	copts := []chromedp.ContextOption{chromedp.WithErrorf(t.Logf)}
	if os.Getenv("APIARY_CHROMEDP_DEBUG") != "" {
		copts = append(copts, chromedp.WithDebugf(t.Logf))
	}
	ctx, cancel := chromedp.NewContext(alloc, copts...)
	t.Cleanup(func() {
		cancel()
		cancelAlloc()
	})
	// The first calls start the browser and attach its tab; the tab lives
	// as long as the context of the call that attached it (chromedp.Run),
	// so they run without a timeout: later calls may carry their own.
	params := browser.SetDownloadBehaviorParams{Behavior: browser.SetDownloadBehaviorBehaviorDeny}
	if downloads != "" {
		params = browser.SetDownloadBehaviorParams{Behavior: browser.SetDownloadBehaviorBehaviorAllow, DownloadPath: downloads}
	}
	if _, err := chromedp.CallBrowser(ctx, browser.SetDownloadBehavior, params); err != nil {
		t.Fatalf("starting %s: %v", path, err)
	}
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("attaching to %s's tab: %v", path, err)
	}
	return ctx
}

// Text is the text content of the first element matching sel, now.
func Text(ctx context.Context, sel string) (string, error) {
	return chromedp.Run(ctx, chromedp.Evaluate[string](fmt.Sprintf(`(document.querySelector(%q) || {}).textContent || ""`, sel)))
}

// SetValue sets the value of the input matching sel, as typing would
// (an input event follows). chromedp.SetValue cannot set an empty value.
func SetValue(sel, value string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		_, err := chromedp.Evaluate[bool](fmt.Sprintf(`(() => { const e = document.querySelector(%q); e.value = %q; e.dispatchEvent(new Event("input", {bubbles: true})); return true; })()`, sel, value))(ctx, t)
		return err
	})
}

// WaitText waits until the element matching sel contains want, and says
// how long that took. It asks every 10 ms, across navigations (a page
// that is being replaced answers with an error, and is asked again).
func WaitText(ctx context.Context, sel, want string, timeout time.Duration) (time.Duration, error) {
	start := time.Now()
	expr := fmt.Sprintf(`((document.querySelector(%q) || {}).textContent || "").includes(%q)`, sel, want)
	for {
		c, cancel := context.WithTimeout(ctx, time.Second)
		ok, err := chromedp.Run(c, chromedp.Evaluate[bool](expr))
		cancel()
		if err == nil && ok {
			return time.Since(start), nil
		}
		if time.Since(start) > timeout {
			got, _ := Text(ctx, sel)
			return time.Since(start), fmt.Errorf("%s does not contain %q after %s (it says %q; last error: %v)", sel, want, timeout, got, err)
		}
		select {
		case <-ctx.Done():
			return time.Since(start), ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}
