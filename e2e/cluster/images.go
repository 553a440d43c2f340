package cluster

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/apiaryhq/apiary/hack/images"
)

// ApiaryImage is the repository of Apiary's own image.
const ApiaryImage = "ghcr.io/apiaryhq/apiary"

// ProbeRepo is where the probe image (e2e/cluster/probe: hello server, DNS
// lookup, pause) goes in the local registry. Pods name it with the
// registry's address, which containerd's hosts.toml maps to plain HTTP.
const ProbeRepo = RegistryAddr + "/apiary-devcluster/probe"

// clusterImages are the images the management cluster itself runs; Up
// pushes them before the kubelet starts and the others after.
var clusterImages = []string{PauseImage, CoreDNSImage, MetalLBImage}

// imagesToPush splits hack/images' images into those the cluster runs and
// the rest (without Apiary's own unless opts.ApiaryImage).
func (c *Cluster) imagesToPush() (first, rest []images.Image) {
	// The previous Kubernetes minor's too: upgrade tests start tenants
	// there.
	for _, im := range append(images.All(c.opts.CacheDir, c.opts.ApiaryVersion), images.Previous(c.opts.CacheDir)...) {
		switch {
		case slices.Contains(clusterImages, im.Ref):
			first = append(first, im)
		case strings.HasPrefix(im.Ref, ApiaryImage+":") && !c.opts.ApiaryImage:
		default:
			rest = append(rest, im)
		}
	}
	return first, rest
}

// ApiaryVersion is the tag the chart deploys by default: $APIARY_VERSION,
// else the appVersion of charts/apiary/Chart.yaml, else "dev".
func ApiaryVersion(repoRoot string) string {
	if v := os.Getenv("APIARY_VERSION"); v != "" {
		return v
	}
	if b, err := os.ReadFile(filepath.Join(repoRoot, "charts", "apiary", "Chart.yaml")); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "appVersion:"); ok {
				if v = strings.Trim(strings.TrimSpace(v), `"'`); v != "" {
					return v
				}
			}
		}
	}
	return "dev"
}

// pushImages pushes the images the cluster runs and the probe image; with
// the default pusher, it returns a function that pushes the others.
func (c *Cluster) pushImages(ctx context.Context) (rest func(context.Context) error, err error) {
	logf := func(format string, args ...any) { c.logf("    images: "+format, args...) }
	wrap := func(err error) error {
		if err == nil {
			return nil
		}
		return fmt.Errorf("pushing images to %s: %w (registry log: %s)", RegistryAddr, err, c.paths.log("registry"))
	}
	rest = func(context.Context) error { return nil }
	if c.opts.PushImages != nil {
		if err := c.opts.PushImages(ctx, RegistryAddr, logf); err != nil {
			return nil, wrap(err)
		}
	} else {
		first, others := c.imagesToPush()
		if err := images.Push(ctx, RegistryAddr, first, logf); err != nil {
			return nil, wrap(err)
		}
		rest = func(ctx context.Context) error { return wrap(images.Push(ctx, RegistryAddr, others, logf)) }
	}
	if _, err := c.ProbeImage(ctx); err != nil {
		return nil, wrap(err)
	}
	return rest, nil
}

// ProbeImage builds e2e/cluster/probe (static), pushes it as an image to
// the local registry and returns its by-digest reference. Its entrypoint is
// /probe: args "serve [ADDR]" (HTTP hello on :8080, /lookup?name=N),
// "lookup NAME [TIMEOUT]" or "pause".
func (c *Cluster) ProbeImage(ctx context.Context) (string, error) {
	c.mu.Lock()
	ref := c.probeRef
	c.mu.Unlock()
	if ref != "" {
		return ref, nil
	}
	if c.opts.RepoRoot == "" {
		return "", fmt.Errorf("the probe image is built from the repository: run inside it")
	}
	bin := filepath.Join(c.opts.CacheDir, "bin", "apiary-devcluster", "probe")
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-buildvcs=false", "-ldflags=-s -w", "-o", bin,
		"./e2e/cluster/probe")
	cmd.Dir = c.opts.RepoRoot
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("go build ./e2e/cluster/probe: %w\n%s", err, out.String())
	}
	im := images.Image{
		Ref:        ProbeRepo + ":latest",
		Entrypoint: []string{"/probe"},
		Layers:     []images.Layer{{Name: "probe", Files: []images.File{{Path: "/probe", Src: bin, Mode: 0o755}}}},
		Cache:      filepath.Join(c.opts.CacheDir, "images", "layers"),
	}
	res, err := images.PushResults(ctx, RegistryAddr, []images.Image{im}, nil)
	if err != nil {
		return "", err
	}
	if len(res) != 1 {
		return "", fmt.Errorf("pushing the probe image: no result")
	}
	ref = ProbeRepo + "@" + res[0].Digest.String()
	c.mu.Lock()
	c.probeRef = ref
	c.mu.Unlock()
	return ref, nil
}

// waitRegistry waits until the registry answers (Up's image push runs
// beside the control plane's start).
func (c *Cluster) waitRegistry(ctx context.Context) error {
	return poll(ctx, 100*time.Millisecond, 30*time.Second, func(ctx context.Context) (bool, string, error) {
		err := c.httpHealthy("http://" + RegistryAddr + "/v2/")(ctx)
		if err != nil {
			return false, err.Error(), nil
		}
		return true, "", nil
	})
}
