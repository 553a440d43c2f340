package images

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The base layer of every image: what distroless/static gives upstream's
// images and the binaries expect (users root and nonroot, name-service
// config for Go's resolver, a sticky /tmp).
var baseFiles = []File{
	{Path: "/etc/passwd", Data: []byte("root:x:0:0:root:/root:/sbin/nologin\n" +
		"nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n" +
		"nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")},
	{Path: "/etc/group", Data: []byte("root:x:0:\nnobody:x:65534:\ntty:x:5:\nstaff:x:50:\nnonroot:x:65532:\n")},
	{Path: "/etc/nsswitch.conf", Data: []byte("passwd: files\ngroup: files\nshadow: files\n" +
		"hosts: files dns\nnetworks: files\nprotocols: files\nservices: files\n")},
	{Path: "/tmp", Dir: true, Mode: 0o777 | os.ModeSticky},
	{Path: "/root", Dir: true, Mode: 0o700},
	{Path: "/home/nonroot", Dir: true, Mode: 0o700, UID: NonrootUID, GID: NonrootUID},
}

// cacheDir is where compressed layers are kept between runs.
func cacheDir(im Image) string {
	if im.Cache != "" {
		return im.Cache
	}
	return filepath.Join(DefaultCacheDir(), "images", "layers")
}

// Check returns an error naming the hack/build-upstream.sh command for every
// binary that images need and that is not built yet (nil if none).
func Check(images []Image) error {
	var missing, cmds []string
	seen := map[string]bool{}
	for _, im := range images {
		for _, l := range im.Layers {
			for _, f := range l.Files {
				if f.Src == "" || f.Missing == "" {
					continue
				}
				if _, err := os.Stat(f.Src); err != nil {
					missing = append(missing, f.Src)
					name := strings.TrimPrefix(f.Missing, "hack/build-upstream.sh ")
					if !seen[name] {
						seen[name] = true
						cmds = append(cmds, name)
					}
				}
			}
		}
	}
	if len(missing) == 0 {
		return nil
	}
	return fmt.Errorf("binaries not built yet (%s): run hack/build-upstream.sh %s",
		strings.Join(missing, ", "), strings.Join(cmds, " "))
}

// Build makes the image im: Prepare, then the base layer and im's layers,
// then the config (linux/amd64, OCI media types, fixed times).
func Build(ctx context.Context, im Image, log func(string, ...any)) (v1.Image, error) {
	log = orNop(log)
	if err := Check([]Image{im}); err != nil {
		return nil, fmt.Errorf("%s: %w", im.Ref, err)
	}
	if im.Prepare != nil {
		if err := im.Prepare(ctx, log); err != nil {
			return nil, fmt.Errorf("%s: %w", im.Ref, err)
		}
	}
	layers := append([]Layer{{Name: "base: passwd, group, nsswitch.conf, /tmp", Files: baseFiles}}, im.Layers...)
	img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	var adds []mutate.Addendum
	for _, l := range layers {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		files := l.Files
		if l.Resolve != nil {
			more, err := l.Resolve()
			if err != nil {
				return nil, fmt.Errorf("%s: layer %s: %w", im.Ref, l.Name, err)
			}
			files = append(append([]File(nil), files...), more...)
		}
		files, err := normalize(files)
		if err != nil {
			return nil, fmt.Errorf("%s: layer %s: %w", im.Ref, l.Name, err)
		}
		layer, err := newLayer(cacheDir(im), files)
		if err != nil {
			return nil, fmt.Errorf("%s: layer %s: %w", im.Ref, l.Name, err)
		}
		adds = append(adds, mutate.Addendum{
			Layer:     layer,
			MediaType: types.OCILayer,
			History:   v1.History{Created: v1.Time{Time: Epoch}, CreatedBy: "apiary hack/images: " + l.Name},
		})
	}
	img, err := mutate.Append(img, adds...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", im.Ref, err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", im.Ref, err)
	}
	cf = cf.DeepCopy()
	cf.Created = v1.Time{Time: Epoch}
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config = v1.Config{
		Entrypoint: im.Entrypoint,
		Cmd:        im.Cmd,
		User:       im.User,
		Env:        append([]string{defaultPath}, im.Env...),
		WorkingDir: im.WorkingDir,
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", im.Ref, err)
	}
	return img, nil
}

func orNop(log func(string, ...any)) func(string, ...any) {
	if log == nil {
		return func(string, ...any) {}
	}
	return log
}

// SourceDir is the root of the apiary source tree: $APIARY_SRC, else the
// first directory at or above the working directory whose go.mod is the
// module github.com/apiaryhq/apiary.
func SourceDir() (string, error) {
	if d := os.Getenv("APIARY_SRC"); d != "" {
		return d, nil
	}
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := wd; ; d = filepath.Dir(d) {
		if isApiaryModule(filepath.Join(d, "go.mod")) {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("no go.mod of github.com/apiaryhq/apiary at or above %s: run from the source tree or set APIARY_SRC", wd)
		}
	}
}

func isApiaryModule(gomod string) bool {
	f, err := os.Open(gomod)
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fields := strings.Fields(sc.Text()); len(fields) == 2 && fields[0] == "module" {
			return fields[1] == "github.com/apiaryhq/apiary"
		}
	}
	return false
}

// goBuild builds the package pkg of the apiary source tree into out, static
// and reproducible (-trimpath, no VCS stamp), so that the same source gives
// the same binary and image digest. go build does nothing when out is up to
// date.
func goBuild(ctx context.Context, log func(string, ...any), pkg, out, ldflags string) error {
	src, err := SourceDir()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	start := time.Now()
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-buildvcs=false",
		"-ldflags", strings.TrimSpace("-s -w "+ldflags), "-o", out, pkg)
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	var outb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &outb, &outb
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build %s: %w\n%s", pkg, err, outb.String())
	}
	log("go build %s -> %s (%s)", pkg, out, time.Since(start).Round(time.Millisecond))
	return nil
}
