package images

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Result is what Push or Save did with one image.
type Result struct {
	// Ref is the upstream reference, Target where it went (registry
	// reference or tarball path).
	Ref, Target string
	Digest      v1.Hash
	// Size is the manifest, config and compressed layers, in bytes.
	Size int64
	// Skipped: the target already had this digest, nothing was written.
	Skipped bool
	// Build is the time to build the image (prepare, hash, compress when
	// not cached), Write the time to check and upload or write it.
	Build, Write time.Duration
}

func (r Result) String() string {
	what := "pushed"
	if r.Skipped {
		what = "skipped (already there)"
	}
	return fmt.Sprintf("%s %s -> %s %s, %.1f MB, build %s, write %s", what, r.Ref, r.Target,
		r.Digest, float64(r.Size)/1e6, r.Build.Round(time.Millisecond), r.Write.Round(time.Millisecond))
}

// Push builds each image and pushes it to the plain-HTTP registry at addr
// (e.g. "127.0.0.1:5000") under its upstream path without the host (see
// Mirror), skipping an image whose digest is already there. log, if not nil,
// gets one line per image.
func Push(ctx context.Context, addr string, images []Image, log func(string, ...any)) error {
	_, err := PushResults(ctx, addr, images, log)
	return err
}

// PushResults is Push, returning what it pushed or skipped, with timings.
func PushResults(ctx context.Context, addr string, images []Image, log func(string, ...any)) ([]Result, error) {
	log = orNop(log)
	if err := Check(images); err != nil {
		return nil, err
	}
	opts := []remote.Option{remote.WithContext(ctx), remote.WithAuth(authn.Anonymous)}
	var results []Result
	for _, im := range images {
		target, err := Mirror(addr, im.Ref)
		if err != nil {
			return results, err
		}
		ref, err := name.ParseReference(target, name.Insecure)
		if err != nil {
			return results, err
		}
		r, img, err := build(ctx, im, target, log)
		if err != nil {
			return results, err
		}
		start := time.Now()
		if desc, err := remote.Head(ref, opts...); err == nil && desc.Digest == r.Digest {
			r.Skipped = true
		} else if err := remote.Write(ref, img, opts...); err != nil {
			return results, fmt.Errorf("push %s to %s: %w", im.Ref, target, err)
		}
		r.Write = time.Since(start)
		log("%s", r)
		results = append(results, r)
	}
	return results, nil
}

func build(ctx context.Context, im Image, target string, log func(string, ...any)) (Result, v1.Image, error) {
	start := time.Now()
	img, err := Build(ctx, im, log)
	if err != nil {
		return Result{}, nil, err
	}
	r := Result{Ref: im.Ref, Target: target}
	if r.Digest, err = img.Digest(); err != nil {
		return r, nil, err
	}
	if r.Size, err = imageSize(img); err != nil {
		return r, nil, err
	}
	r.Build = time.Since(start)
	return r, img, nil
}

// imageSize is the manifest, config and compressed layers, in bytes.
func imageSize(img v1.Image) (int64, error) {
	m, err := img.Manifest()
	if err != nil {
		return 0, err
	}
	raw, err := img.RawManifest()
	if err != nil {
		return 0, err
	}
	n := int64(len(raw)) + m.Config.Size
	for _, l := range m.Layers {
		n += l.Size
	}
	return n, nil
}

// TarballName is the file Save writes for ref, e.g.
// registry.k8s.io_kube-apiserver_v1.37.2.tar.
func TarballName(ref string) string {
	return strings.NewReplacer("/", "_", ":", "_").Replace(ref) + ".tar"
}

// Save writes each image as a docker-save tarball (tarball.Write, tagged with
// its upstream reference) into dir, named by TarballName: the fallback for
// `ctr -n k8s.io images import` when there is no registry. A tarball whose
// image digest is unchanged (recorded beside it in NAME.digest) is not
// written again.
func Save(ctx context.Context, dir string, images []Image, log func(string, ...any)) ([]Result, error) {
	log = orNop(log)
	if err := Check(images); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var results []Result
	for _, im := range images {
		tag, err := name.NewTag(im.Ref)
		if err != nil {
			return results, err
		}
		out := filepath.Join(dir, TarballName(im.Ref))
		r, img, err := build(ctx, im, out, log)
		if err != nil {
			return results, err
		}
		start := time.Now()
		if b, err := os.ReadFile(out + ".digest"); err == nil && strings.TrimSpace(string(b)) == r.Digest.String() && fileExists(out) {
			r.Skipped = true
		} else {
			os.Remove(out + ".digest")
			tmp := out + ".tmp"
			if err := tarball.WriteToFile(tmp, tag, img); err != nil {
				os.Remove(tmp)
				return results, fmt.Errorf("save %s: %w", im.Ref, err)
			}
			if err := os.Rename(tmp, out); err != nil {
				return results, err
			}
			if err := os.WriteFile(out+".digest", []byte(r.Digest.String()+"\n"), 0o644); err != nil {
				return results, err
			}
		}
		r.Write = time.Since(start)
		log("%s", strings.Replace(r.String(), "pushed", "saved", 1))
		results = append(results, r)
	}
	return results, nil
}
