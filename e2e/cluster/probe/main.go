// Command probe is the tiny static program of the devcluster's test image
// (apiary-devcluster/probe): an HTTP "hello" server, a DNS check, and a
// pause process, chosen by its first argument (or by being called pause).
//
//	probe serve [ADDR]           HTTP on ADDR (default :8080): / says hello,
//	                             /lookup?name=N resolves N, /dial?addr=H:P
//	                             opens a TCP connection, /healthz
//	probe lookup NAME [TIMEOUT]  resolve NAME until it works or TIMEOUT (60s)
//	probe pause                  sleep until SIGTERM/SIGINT, reaping children
package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

func main() {
	args := os.Args[1:]
	mode := filepath.Base(os.Args[0])
	if mode != "pause" {
		if len(args) == 0 {
			fmt.Fprintln(os.Stderr, "usage: probe serve [ADDR] | lookup NAME [TIMEOUT] | pause")
			os.Exit(2)
		}
		mode, args = args[0], args[1:]
	}
	switch mode {
	case "serve":
		addr := ":8080"
		if len(args) > 0 {
			addr = args[0]
		}
		serve(addr)
	case "lookup":
		if len(args) == 0 {
			fmt.Fprintln(os.Stderr, "lookup: name missing")
			os.Exit(2)
		}
		timeout := 60 * time.Second
		if len(args) > 1 {
			d, err := time.ParseDuration(args[1])
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(2)
			}
			timeout = d
		}
		os.Exit(lookup(args[0], timeout))
	case "pause":
		pause()
	default:
		fmt.Fprintf(os.Stderr, "unknown mode %q\n", mode)
		os.Exit(2)
	}
}

func serve(addr string) {
	host, _ := os.Hostname()
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/lookup", func(w http.ResponseWriter, r *http.Request) {
		name := r.URL.Query().Get("name")
		ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
		defer cancel()
		ips, err := net.DefaultResolver.LookupHost(ctx, name)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		fmt.Fprintln(w, strings.Join(ips, " "))
	})
	mux.HandleFunc("/dial", func(w http.ResponseWriter, r *http.Request) {
		addr := r.URL.Query().Get("addr")
		d := net.Dialer{Timeout: 5 * time.Second}
		conn, err := d.DialContext(r.Context(), "tcp", addr)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer conn.Close()
		fmt.Fprintf(w, "connected to %s (%s)\n", addr, conn.RemoteAddr())
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello from %s\n", host)
	})
	srv := &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
		<-sig
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}()
	fmt.Printf("serving on %s\n", addr)
	if err := srv.ListenAndServe(); err != nil && err != http.ErrServerClosed {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func lookup(name string, timeout time.Duration) int {
	deadline := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		ips, err := net.DefaultResolver.LookupHost(ctx, name)
		cancel()
		if err == nil {
			fmt.Printf("%s: %s\n", name, strings.Join(ips, " "))
			return 0
		}
		if time.Now().After(deadline) {
			fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
			return 1
		}
		fmt.Fprintf(os.Stderr, "%s: %v (retrying)\n", name, err)
		time.Sleep(250 * time.Millisecond)
	}
}

func pause() {
	sig := make(chan os.Signal, 4)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for s := range sig {
		if s == syscall.SIGCHLD {
			for {
				pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
				if pid <= 0 || err != nil {
					break
				}
			}
			continue
		}
		os.Exit(0)
	}
}
