// Command build-images builds Apiary's images (package
// github.com/apiaryhq/apiary/hack/images) from the binaries that
// hack/build-upstream.sh put in the cache, and pushes them to a plain-HTTP
// registry or saves them as docker-save tarballs for `ctr images import`.
//
//	go run ./hack/images/cmd/build-images -push 127.0.0.1:5000 [NAME...]
//	go run ./hack/images/cmd/build-images -save DIR [NAME...]
//	go run ./hack/images/cmd/build-images -list
//	go run ./hack/images/cmd/build-images -previous -save DIR kube-apiserver:v1.36.3
//
// NAME is an image's reference, repository or last path element (pause,
// kube-apiserver, proxy-agent, ...); the default is every image.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/apiaryhq/apiary/hack/images"
)

func main() {
	cache := flag.String("cache", images.DefaultCacheDir(), "where hack/build-upstream.sh put the binaries ($APIARY_CACHE)")
	version := flag.String("apiary-version", "v0.1.0", "tag of ghcr.io/apiaryhq/apiary, stamped into the binary")
	push := flag.String("push", "", "push to this plain-HTTP registry (host:port)")
	save := flag.String("save", "", "write docker-save tarballs into this directory")
	list := flag.Bool("list", false, "list the images and exit")
	previous := flag.Bool("previous", false, "also the images of the previous Kubernetes minor ("+images.PreviousKubeVersion+": control plane, kube-proxy, node bundle; needs hack/build-upstream.sh kubernetes-previous)")
	flag.Parse()

	all := images.All(*cache, *version)
	if *previous {
		all = append(all, images.Previous(*cache)...)
	}
	sel := all
	if flag.NArg() > 0 {
		var err error
		if sel, err = images.Select(all, flag.Args()...); err != nil {
			fail(err)
		}
	}
	if *list {
		for _, im := range sel {
			fmt.Println(im.Ref)
		}
		return
	}
	if *push == "" && *save == "" {
		fail(fmt.Errorf("nothing to do: give -push ADDR and/or -save DIR (or -list)"))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := func(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }
	start := time.Now()
	if *push != "" {
		if err := images.Push(ctx, *push, sel, log); err != nil {
			fail(err)
		}
	}
	if *save != "" {
		if _, err := images.Save(ctx, *save, sel, log); err != nil {
			fail(err)
		}
	}
	log("%d images in %s", len(sel), time.Since(start).Round(time.Millisecond))
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "build-images:", err)
	os.Exit(1)
}
