package hosts

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Checks of a host before its tenant's control plane moves onto it: the
// ports the control plane listens on are free, and the host reaches the
// datastore and the tenant endpoint. Reachability is tested from the host
// itself, through an SSH-forwarded connection, with the tenant's
// credentials: TLS runs end to end between the operator and the far side,
// so the host relays bytes it cannot read, and needs no tool installed.

// DialFromHost opens a TCP connection from the host to addr, through the
// SSH connection (OpenSSH's direct-tcpip forwarding, on by default).
func (c *Client) DialFromHost(ctx context.Context, addr string) (net.Conn, error) {
	conn, err := c.c.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, &Error{ReasonUnreachable, fmt.Errorf("from the host, connecting to %s: %w", addr, err)}
	}
	return conn, nil
}

// GetFromHost does an HTTPS GET of url from the host (cfg carries the CA
// and the client certificate) and returns the status code.
func (c *Client) GetFromHost(ctx context.Context, url string, cfg *tls.Config) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	tr := &http.Transport{
		DialContext:     func(ctx context.Context, _, addr string) (net.Conn, error) { return c.DialFromHost(ctx, addr) },
		TLSClientConfig: cfg,
	}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return 0, fmt.Errorf("from the host, GET %s: %w", url, err)
	}
	defer resp.Body.Close()
	return resp.StatusCode, nil
}

// PortsInUse says which of ports something listens on, on the host (TCP,
// IPv4 or IPv6, any address), read from /proc so that no tool is needed.
func PortsInUse(ctx context.Context, c *Client, ports []int) ([]int, error) {
	return PortsTaken(ctx, c, ports, nil)
}

// PortsTaken is PortsInUse before a control plane is written to the host:
// on a host that has one of manifests already (a start resumed after its
// write), the kubelet runs them and the ports are theirs, so none is
// reported.
func PortsTaken(ctx context.Context, c *Client, ports []int, manifests []string) ([]int, error) {
	var script strings.Builder
	for _, m := range manifests {
		fmt.Fprintf(&script, "if [ -e %s ]; then echo %s; exit 0; fi\n", Quote(m), manifestPresent)
	}
	script.WriteString("cat /proc/net/tcp /proc/net/tcp6 2>/dev/null\n")
	out, err := c.RunScript(ctx, script.String())
	if err != nil {
		return nil, fmt.Errorf("listing the host's listening ports: %w", err)
	}
	if strings.TrimSpace(out) == manifestPresent {
		return nil, nil
	}
	listening := parseListening(out)
	var used []int
	for _, p := range ports {
		if listening[p] {
			used = append(used, p)
		}
	}
	return used, nil
}

// manifestPresent is what PortsTaken's script prints when a manifest is
// there already (no line of /proc/net/tcp looks like it).
const manifestPresent = "apiary-manifest-present"

// parseListening reads /proc/net/tcp{,6}: the local port of every socket in
// state 0A (LISTEN).
func parseListening(procNetTCP string) map[int]bool {
	out := map[int]bool{}
	sc := bufio.NewScanner(strings.NewReader(procNetTCP))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || f[3] != "0A" {
			continue
		}
		_, portHex, ok := strings.Cut(f[1], ":")
		if !ok {
			continue
		}
		if p, err := strconv.ParseUint(portHex, 16, 16); err == nil {
			out[int(p)] = true
		}
	}
	return out
}
