//go:build integration

package browsertest

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/apiaryhq/apiary/pki"
)

// The browser trusts the servers it was given by their keys, follows a
// redirect from one to the other, and reads the page it lands on; its
// tab outlives a first call that had a timeout of its own.
func TestBrowserFollowsRedirectsBetweenTrustedServers(t *testing.T) {
	to := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `<!doctype html><p id="where">landed on the second server</p>`)
	}))
	defer to.Close()
	from := httptest.NewTLSServer(http.RedirectHandler(to.URL+"/page", http.StatusFound))
	defer from.Close()
	b := Start(t, "", from.Certificate(), to.Certificate())
	for i := range 2 {
		ctx, cancel := context.WithTimeout(b, 20*time.Second)
		err := chromedp.Do(ctx, chromedp.Navigate(from.URL+"/"))
		cancel()
		if err != nil {
			t.Fatal(i, err)
		}
		if _, err := WaitText(b, "#where", "second server", 10*time.Second); err != nil {
			t.Fatal(i, err)
		}
		url, err := chromedp.Run(b, chromedp.Location())
		if err != nil || !strings.HasPrefix(url, to.URL) {
			t.Fatalf("at %q (%v), want %s", url, err, to.URL)
		}
	}
	// A server whose key is not in the list is refused.
	ca, err := pki.NewCA("elsewhere")
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Sign(pki.Request{CommonName: "elsewhere", IPs: []net.IP{net.ParseIP("127.0.0.1")}, Usages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	if err != nil {
		t.Fatal(err)
	}
	key, _ := leaf.KeyPEM()
	pair, err := tls.X509KeyPair(leaf.CertPEM(), key)
	if err != nil {
		t.Fatal(err)
	}
	untrusted := httptest.NewUnstartedServer(http.NotFoundHandler())
	untrusted.TLS = &tls.Config{Certificates: []tls.Certificate{pair}}
	untrusted.StartTLS()
	defer untrusted.Close()
	ctx, cancel := context.WithTimeout(b, 20*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, chromedp.Navigate(untrusted.URL+"/")); err == nil || !strings.Contains(err.Error(), "ERR_CERT") {
		t.Errorf("a server not trusted: %v, want a certificate error", err)
	}
}
