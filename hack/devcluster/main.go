// Command devcluster starts and stops Apiary's local management cluster: a
// real single-node Kubernetes cluster of host processes on this machine
// (package github.com/apiaryhq/apiary/e2e/cluster has the details).
//
//	go run ./hack/devcluster up [-apiary-image=false] [-build=false]
//	go run ./hack/devcluster down
//	go run ./hack/devcluster status
//	go run ./hack/devcluster kubeconfig [-path]
//	go run ./hack/devcluster logs [COMPONENT] [-n LINES]
//
// Environment: APIARY_CACHE (binaries, registry storage; default
// ~/.cache/apiary), APIARY_DEVCLUSTER_DIR (state, logs, kubeconfig; default
// $APIARY_CACHE/devcluster), APIARY_DEVCLUSTER_NODE_IP (default: the address
// of the default route's interface), APIARY_VERSION (tag of the Apiary image
// pushed to the local registry; default the chart's appVersion).
//
// Must run as root. Exit status 1 on any failure; errors name the log file
// to read.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"github.com/apiaryhq/apiary/e2e/cluster"
)

const usage = `usage: devcluster COMMAND [FLAGS]

commands:
  up          start the cluster (or check a running one) and push the images
  down        stop everything and remove what the cluster made on this host
  status      show each component (pid, running, healthy), the node and the pods
  kubeconfig  print the admin kubeconfig (-path: only its path)
  logs        list the log files; logs COMPONENT [-n N] prints one (last N lines)
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1], os.Args[2:]); err != nil {
		fmt.Fprintln(os.Stderr, "devcluster:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, cmd string, args []string) error {
	fs := flag.NewFlagSet(cmd, flag.ExitOnError)
	apiaryImage := fs.Bool("apiary-image", true, "up: also build and push Apiary's own image (go build ./cmd/apiary)")
	build := fs.Bool("build", true, "up: build missing binaries with hack/build-upstream.sh")
	pathOnly := fs.Bool("path", false, "kubeconfig: print only the path")
	lines := fs.Int("n", 0, "logs: print only the last N lines")
	// Flags may come before or after the one positional argument of logs.
	var pos []string
	for len(args) > 0 {
		if err := fs.Parse(args); err != nil {
			return err
		}
		if fs.NArg() == 0 {
			break
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}

	c, err := cluster.New(cluster.Options{BuildMissing: *build, Log: os.Stderr, ApiaryImage: *apiaryImage})
	if err != nil {
		return err
	}
	switch cmd {
	case "up":
		if err := c.Up(ctx); err != nil {
			return err
		}
		fmt.Printf("export KUBECONFIG=%s\n", c.KubeconfigPath())
		return nil
	case "down":
		return c.Down(ctx)
	case "status":
		st := c.Status(ctx)
		fmt.Print(st)
		if !st.Running() {
			return fmt.Errorf("not (completely) running")
		}
		return nil
	case "kubeconfig":
		if *pathOnly {
			if _, err := c.Kubeconfig(); err != nil {
				return err
			}
			fmt.Println(c.KubeconfigPath())
			return nil
		}
		b, err := c.Kubeconfig()
		if err != nil {
			return err
		}
		_, err = os.Stdout.Write(b)
		return err
	case "logs":
		if len(pos) == 0 {
			return listLogs(filepath.Join(c.StateDir(), "logs"))
		}
		return printLog(c.LogFile(pos[0]), *lines)
	default:
		fmt.Fprint(os.Stderr, usage)
		return fmt.Errorf("unknown command %q", cmd)
	}
}

func listLogs(dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	var names []string
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".log") {
			names = append(names, e.Name())
		}
	}
	sort.Strings(names)
	for _, n := range names {
		fi, err := os.Stat(filepath.Join(dir, n))
		if err != nil {
			continue
		}
		fmt.Printf("%-28s %10d  %s\n", strings.TrimSuffix(n, ".log"), fi.Size(), filepath.Join(dir, n))
	}
	return nil
}

func printLog(path string, n int) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if n <= 0 {
		_, err := io.Copy(os.Stdout, f)
		return err
	}
	var ring []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		ring = append(ring, sc.Text())
		if len(ring) > n {
			ring = ring[1:]
		}
	}
	for _, l := range ring {
		fmt.Println(l)
	}
	return sc.Err()
}
