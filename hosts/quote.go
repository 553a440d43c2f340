package hosts

import (
	"fmt"
	"net"
	"regexp"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// Quote makes s one word for a POSIX shell, whatever it holds: it is put
// in single quotes, inside which the shell interprets nothing, and each
// single quote in s is closed, escaped and reopened ('\”). Every value a
// script interpolates goes through it, validated first.
func Quote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

var (
	tokenPattern  = regexp.MustCompile(`^[a-z0-9]{6}\.[a-z0-9]{16}$`)
	caHashPattern = regexp.MustCompile(`^sha256:[a-f0-9]{64}$`)
)

// Validate checks each field against the strict form kubeadm takes, so
// that a value that is not what it should be never reaches a shell (and
// is quoted when it does).
func (r JoinRequest) Validate() error {
	host, port, err := net.SplitHostPort(r.Endpoint)
	if err != nil {
		return fmt.Errorf("join: endpoint %q is not host:port: %w", r.Endpoint, err)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return fmt.Errorf("join: endpoint %q has no valid port", r.Endpoint)
	}
	if net.ParseIP(host) == nil && len(validation.IsDNS1123Subdomain(host)) > 0 {
		return fmt.Errorf("join: endpoint host %q is neither an IP address nor a DNS name", host)
	}
	if !tokenPattern.MatchString(r.Token) {
		return fmt.Errorf("join: the bootstrap token is not <6 chars>.<16 chars> of [a-z0-9]")
	}
	if !caHashPattern.MatchString(r.CACertHash) {
		return fmt.Errorf("join: CA hash %q is not sha256:<64 hex digits>", r.CACertHash)
	}
	if errs := validation.IsDNS1123Subdomain(r.NodeName); len(errs) > 0 {
		return fmt.Errorf("join: node name %q: %s", r.NodeName, strings.Join(errs, "; "))
	}
	return nil
}
