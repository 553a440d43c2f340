// Command testhost starts and removes the machines make quickstart joins to a
// tenant: Docker containers made like the e2e tests' SSH hosts (e2e/sshhost:
// a debootstrapped Debian with systemd, sshd and containerd, on a dockerd of
// its own), for trying Apiary on one machine.
//
//	go run ./hack/testhost up NAME [-dir DIR] [-registry-mirror URL]
//	go run ./hack/testhost down
//
// up starts dockerd (unless it runs), builds the host image (once, cached),
// creates the network and the host, writes DIR/NAME.key (the SSH private key
// root accepts) and DIR/NAME.pub (the host's own key, to pin), and prints the
// host's address on stdout. down removes every such host and network and
// stops the dockerd it started, with Docker's iptables chains.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/apiaryhq/apiary/e2e/sshhost"
)

const (
	// Network and subnet of quickstart's hosts (the e2e tests use
	// 172.31.250.0/24 and the benchmark 172.31.251.0/24; all stay clear of the
	// management cluster's).
	network = "apiary-quickstart-hosts"
	subnet  = "172.31.252.0/24"
)

const usage = `usage:
  testhost up NAME [-dir DIR] [-registry-mirror URL]   start a host; print its address
  testhost down                                        remove every host and stop dockerd
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "testhost:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, usage)
		return fmt.Errorf("a command is required")
	}
	switch args[0] {
	case "up":
		fs := flag.NewFlagSet("up", flag.ContinueOnError)
		dir := fs.String("dir", ".", "where NAME.key and NAME.pub are written")
		mirror := fs.String("registry-mirror", "", "registry the host's containerd pulls every image from, e.g. http://192.0.2.2:5000")
		if len(args) < 2 {
			return fmt.Errorf("up needs a NAME\n%s", usage)
		}
		name := args[1]
		if err := fs.Parse(args[2:]); err != nil {
			return err
		}
		return up(ctx, name, *dir, *mirror)
	case "down":
		return sshhost.StopDaemon(ctx)
	default:
		return fmt.Errorf("unknown command %q\n%s", args[0], usage)
	}
}

func up(ctx context.Context, name, dir, mirror string) error {
	logf := func(format string, a ...any) { fmt.Fprintf(os.Stderr, format+"\n", a...) }
	d, err := sshhost.EnsureDocker(ctx)
	if err != nil {
		return err
	}
	image, err := d.EnsureImage(ctx, logf)
	if err != nil {
		return err
	}
	if err := d.EnsureNetwork(ctx, network, subnet); err != nil {
		return err
	}
	h, err := d.StartHost(ctx, sshhost.HostOptions{Name: name, Network: network, Image: image, RegistryMirror: mirror})
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, name+".key"), h.PrivateKeyPEM, 0o600); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, name+".pub"), []byte(h.HostKeyAuthorized+"\n"), 0o644); err != nil {
		return err
	}
	logf("host %s up at %s in %s (systemd %s)", name, h.Address, h.StartupTime.Round(1e6), h.SystemState)
	fmt.Println(h.Address)
	return nil
}
