package hosts

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
)

func TestParseListening(t *testing.T) {
	const proc = `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:19EB 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0000000000000000 100 0 0 10 0
   1: 0100007F:2829 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2 1 0000000000000000 100 0 0 10 0
   2: 0100007F:1F90 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 3 1 0000000000000000 20 4 30 10 -1
  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000000000000:1FBD 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4 1 0000000000000000 100 0 0 10 0
`
	got := parseListening(proc)
	// 0x19EB 6635 and 0x2829 10281 listen on IPv4, 0x1FBD 8125 on IPv6;
	// 0x1F90 8080 is an established connection, not a listener.
	for _, p := range []int{6635, 10281, 8125} {
		if !got[p] {
			t.Errorf("port %d not seen listening", p)
		}
	}
	if got[8080] || len(got) != 3 {
		t.Errorf("listening %v", got)
	}
}

// What the host reaches, checked from the host (this machine, behind an
// SSH server that forwards as sshd does), with credentials the host only
// relays.
func TestChecksFromTheHost(t *testing.T) {
	c := dialTestServer(t, serverOptions{shell: true})

	// A listener here is a port in use on "the host".
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	used := l.Addr().(*net.TCPAddr).Port
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	freePort := free.Addr().(*net.TCPAddr).Port
	free.Close()
	got, err := PortsInUse(t.Context(), c, []int{used, freePort})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, []int{used}) {
		t.Errorf("ports in use %v, want [%d]", got, used)
	}
	// Before a control plane is written: the same port is taken while no
	// manifest is there, and the manifest's own once one is.
	manifest := filepath.Join(t.TempDir(), "kube-apiserver.yaml")
	absent := filepath.Join(t.TempDir(), "kube-scheduler.yaml")
	got, err = PortsTaken(t.Context(), c, []int{used, freePort}, []string{absent, manifest})
	if err != nil || !slices.Equal(got, []int{used}) {
		t.Errorf("ports taken with no manifest: %v, %v, want [%d]", got, err, used)
	}
	if err := os.WriteFile(manifest, []byte("kind: Pod\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err = PortsTaken(t.Context(), c, []int{used, freePort}, []string{absent, manifest})
	if err != nil || len(got) != 0 {
		t.Errorf("ports taken with a manifest written: %v, %v, want none", got, err)
	}
	l.Close()

	// An HTTPS server that wants a client certificate, reached from the host.
	ts := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if len(r.TLS.PeerCertificates) == 0 {
			http.Error(w, "no client certificate", http.StatusUnauthorized)
		}
	}))
	ts.TLS = &tls.Config{ClientAuth: tls.RequestClientCert}
	ts.StartTLS()
	defer ts.Close()
	roots := x509.NewCertPool()
	roots.AddCert(ts.Certificate())
	code, err := c.GetFromHost(t.Context(), ts.URL+"/health", &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{ts.TLS.Certificates[0]}})
	if err != nil || code != http.StatusOK {
		t.Errorf("GET from the host with a certificate: %d, %v", code, err)
	}
	code, err = c.GetFromHost(t.Context(), ts.URL+"/health", &tls.Config{RootCAs: roots})
	if err != nil || code != http.StatusUnauthorized {
		t.Errorf("GET from the host without a certificate: %d, %v", code, err)
	}
	// Nothing listens: the host cannot connect, and says so.
	if _, err := c.GetFromHost(t.Context(), "https://"+net.JoinHostPort("127.0.0.1", strconv.Itoa(freePort))+"/", &tls.Config{RootCAs: roots}); err == nil || ReasonOf(err) != ReasonUnreachable {
		t.Errorf("GET from the host to a closed port: %v (reason %s)", err, ReasonOf(err))
	}
}
