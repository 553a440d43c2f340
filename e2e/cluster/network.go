package cluster

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strings"

	"github.com/apiaryhq/apiary/internal/hostnet"
)

// primaryIPv4 is the IPv4 address of the interface that holds the default
// route (read from /proc/net/route: no packet is sent).
func primaryIPv4() (net.IP, error) {
	f, err := os.Open("/proc/net/route")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	var iface string
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 8 && fields[1] == "00000000" && fields[7] == "00000000" {
			iface = fields[0]
			break
		}
	}
	if iface == "" {
		return nil, errors.New("no IPv4 default route")
	}
	ifi, err := net.InterfaceByName(iface)
	if err != nil {
		return nil, err
	}
	addrs, err := ifi.Addrs()
	if err != nil {
		return nil, err
	}
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil {
			return ipn.IP.To4(), nil
		}
	}
	return nil, fmt.Errorf("interface %s of the default route has no IPv4 address", iface)
}

func linkExists(name string) bool {
	_, err := net.InterfaceByName(name)
	return err == nil
}

// ensureLBRoute makes the host route the LoadBalancer pool into a bridge
// without ports. Host-originated packets and packets the host forwards (from
// Docker networks, say) to a pool address are DNATed by kube-proxy to a pod
// in nat OUTPUT/PREROUTING, before that route is used; any other packet to
// the pool dies in the bridge, so none leaves through the default route.
// (No dummy interface: this kernel has no dummy module.)
func (c *Cluster) ensureLBRoute(ctx context.Context) error {
	if !linkExists(LBInterface) {
		if _, err := run(ctx, "ip", "link", "add", LBInterface, "type", "bridge"); err != nil {
			return err
		}
	}
	if _, err := run(ctx, "ip", "link", "set", LBInterface, "up"); err != nil {
		return err
	}
	_, err := run(ctx, "ip", "route", "replace", LBPoolCIDR, "dev", LBInterface)
	return err
}

// deleteLinks removes the CNI bridge and the LoadBalancer bridge (its route
// goes with it). veth peers went with the pod network namespaces.
func deleteLinks(ctx context.Context) error {
	var errs []error
	for _, l := range []string{BridgeName, LBInterface} {
		if linkExists(l) {
			if _, err := run(ctx, "ip", "link", "del", l); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

var ownedChain = regexp.MustCompile(`^(KUBE|CNI)-`)

// cleanIptables removes, in every table of iptables and ip6tables, the
// KUBE-* and CNI-* chains and the rules of other chains that jump to them.
// Nothing else is touched. It returns how many chains it removed.
func cleanIptables(ctx context.Context) (int, error) {
	total := 0
	var errs []error
	for _, fam := range []string{"iptables", "ip6tables"} {
		save, err := lookPath(fam + "-save")
		if err != nil {
			continue
		}
		for _, table := range []string{"filter", "nat", "mangle", "raw"} {
			out, err := exec.CommandContext(ctx, save, "-t", table).Output()
			if err != nil {
				continue // table not available
			}
			script, n := iptablesCleanupScript(table, string(out))
			if n == 0 {
				continue
			}
			if _, err := runStdin(ctx, script, fam+"-restore", "--noflush"); err != nil {
				errs = append(errs, err)
				continue
			}
			total += n
		}
	}
	return total, errors.Join(errs...)
}

// iptablesCleanupScript removes the cluster's KUBE-* and CNI-* chains.
func iptablesCleanupScript(table, save string) (script string, n int) {
	return hostnet.CleanupScript(table, save, ownedChain)
}

func jumpsToOwned(fields []string) bool { return hostnet.JumpsTo(fields, ownedChain) }

func runStdin(ctx context.Context, stdin string, name string, args ...string) (string, error) {
	path, err := lookPath(name)
	if err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// IptablesNonOwned is what Down must leave as it found it: the rules of
// iptables-save and ip6tables-save without owned (KUBE-*, CNI-*) chains,
// rules that jump to them, counters, and built-in chains with the default
// ACCEPT policy (so an empty table that iptables-nft created equals an
// absent one). Tests compare it before Up and after Down.
func IptablesNonOwned(ctx context.Context) (string, error) {
	var b strings.Builder
	for _, fam := range []string{"iptables", "ip6tables"} {
		save, err := lookPath(fam + "-save")
		if err != nil {
			return "", err
		}
		out, err := exec.CommandContext(ctx, save).Output()
		if err != nil {
			return "", fmt.Errorf("%s: %w", save, err)
		}
		table := ""
		for _, line := range strings.Split(string(out), "\n") {
			switch {
			case strings.HasPrefix(line, "*"):
				table = line[1:]
			case strings.HasPrefix(line, ":"):
				f := strings.Fields(line[1:])
				if len(f) < 2 || ownedChain.MatchString(f[0]) || f[1] == "ACCEPT" {
					continue
				}
				fmt.Fprintf(&b, "%s %s :%s %s\n", fam, table, f[0], f[1])
			case strings.HasPrefix(line, "-A "):
				f := strings.Fields(line)
				if ownedChain.MatchString(f[1]) || jumpsToOwned(f) {
					continue
				}
				fmt.Fprintf(&b, "%s %s %s\n", fam, table, line)
			}
		}
	}
	return b.String(), nil
}

// OwnedChains lists the KUBE-*/CNI-* chains left in any table.
func OwnedChains(ctx context.Context) ([]string, error) {
	var chains []string
	for _, fam := range []string{"iptables", "ip6tables"} {
		save, err := lookPath(fam + "-save")
		if err != nil {
			return nil, err
		}
		out, err := exec.CommandContext(ctx, save).Output()
		if err != nil {
			return nil, err
		}
		table := ""
		for _, line := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(line, "*") {
				table = line[1:]
			}
			if strings.HasPrefix(line, ":") {
				name := strings.Fields(line[1:])[0]
				if ownedChain.MatchString(name) {
					chains = append(chains, fam+"/"+table+"/"+name)
				}
			}
		}
	}
	return chains, nil
}

// destroyIPSets destroys kube-router's ipsets (KUBE-*, inet6:KUBE-*), once
// no iptables rule refers to them.
func destroyIPSets(ctx context.Context) (int, error) {
	if _, err := exec.LookPath("ipset"); err != nil {
		return 0, nil
	}
	out, err := exec.CommandContext(ctx, "ipset", "list", "-n").Output()
	if err != nil {
		return 0, fmt.Errorf("ipset list: %w", err)
	}
	n := 0
	var errs []error
	for _, name := range strings.Fields(string(out)) {
		if !strings.HasPrefix(strings.TrimPrefix(name, "inet6:"), "KUBE-") {
			continue
		}
		if b, err := exec.CommandContext(ctx, "ipset", "destroy", name).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("ipset destroy %s: %v: %s", name, err, strings.TrimSpace(string(b))))
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}
