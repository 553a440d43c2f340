// Package hostnet holds the host networking that the local cluster and the
// SSH test hosts' dockerd share: IP forwarding, and removing their iptables
// chains and nothing else.
package hostnet

import (
	"fmt"
	"os"
	"regexp"
	"strings"
)

// CleanupScript turns the iptables-save output of one table into an
// iptables-restore --noflush script that deletes the rules of other chains
// that jump to owned chains, then flushes and deletes the owned chains. n
// is the number of owned chains (0: nothing to do, empty script).
func CleanupScript(table, save string, owned *regexp.Regexp) (script string, n int) {
	var chains, deletes []string
	for _, line := range strings.Split(save, "\n") {
		switch {
		case strings.HasPrefix(line, ":"):
			if name := strings.Fields(line[1:])[0]; owned.MatchString(name) {
				chains = append(chains, name)
			}
		case strings.HasPrefix(line, "-A "):
			f := strings.Fields(line)
			if len(f) < 2 || owned.MatchString(f[1]) {
				continue
			}
			if JumpsTo(f, owned) {
				deletes = append(deletes, "-D"+line[2:])
			}
		}
	}
	if len(chains) == 0 && len(deletes) == 0 {
		return "", 0
	}
	var b strings.Builder
	fmt.Fprintf(&b, "*%s\n", table)
	for _, d := range deletes {
		b.WriteString(d + "\n")
	}
	for _, ch := range chains {
		fmt.Fprintf(&b, "-F %s\n", ch)
	}
	for _, ch := range chains {
		fmt.Fprintf(&b, "-X %s\n", ch)
	}
	b.WriteString("COMMIT\n")
	return b.String(), max(len(chains), 1)
}

// JumpsTo says whether a rule's fields jump or go to an owned chain.
func JumpsTo(fields []string, owned *regexp.Regexp) bool {
	for i := 0; i+1 < len(fields); i++ {
		if (fields[i] == "-j" || fields[i] == "-g" || fields[i] == "--jump" || fields[i] == "--goto") && owned.MatchString(fields[i+1]) {
			return true
		}
	}
	return false
}

// EnsureIPForward turns IPv4 forwarding on; both the cluster's bridge and
// Docker's need it, so nothing turns it off again.
func EnsureIPForward() error {
	const f = "/proc/sys/net/ipv4/ip_forward"
	b, err := os.ReadFile(f)
	if err != nil {
		return err
	}
	if strings.TrimSpace(string(b)) == "1" {
		return nil
	}
	return os.WriteFile(f, []byte("1\n"), 0o644)
}
