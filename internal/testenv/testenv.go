// Package testenv starts the real Kubernetes API server and etcd that
// Apiary's integration tests run against: binaries built from source by
// hack/build-upstream.sh (make tools), driven by controller-runtime's envtest.
package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// Versions the Makefile builds; the environment variables override the
// directories.
const (
	KubeVersion = "v1.37.2"
	EtcdVersion = "v3.6.16"
)

func cacheDir() string {
	if d := os.Getenv("APIARY_CACHE"); d != "" {
		return d
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".cache", "apiary")
}

// KubeBinary returns the path of a from-source Kubernetes binary
// (kube-apiserver, kubectl, ...).
func KubeBinary(name string) (string, error) {
	dir := os.Getenv("APIARY_KUBE_BIN")
	if dir == "" {
		dir = filepath.Join(cacheDir(), "bin", "kubernetes-"+KubeVersion)
	}
	return existing(filepath.Join(dir, name))
}

// EtcdBinary returns the path of the from-source etcd or etcdctl.
func EtcdBinary(name string) (string, error) {
	dir := os.Getenv("APIARY_ETCD_BIN")
	if dir == "" {
		dir = filepath.Join(cacheDir(), "bin", "etcd-"+EtcdVersion)
	}
	return existing(filepath.Join(dir, name))
}

func existing(path string) (string, error) {
	if _, err := os.Stat(path); err != nil {
		return "", fmt.Errorf("%s is missing: build it from source with `make tools` (%w)", path, err)
	}
	return path, nil
}

// RepoRoot is the root of the repository (to find CRDs and manifests).
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// AssetsDir returns a directory laid out the way envtest expects
// (kube-apiserver, etcd, kubectl side by side), made of symlinks to the
// from-source binaries. The test fails, never skips, when they are missing.
func AssetsDir(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	for name, find := range map[string]func(string) (string, error){
		"kube-apiserver": KubeBinary, "kubectl": KubeBinary, "etcd": EtcdBinary,
	} {
		path, err := find(name)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(path, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// Options select what the environment installs.
type Options struct {
	// Webhooks installs Apiary's webhook configurations, pointed at a local
	// server whose address and certificates envtest provides.
	Webhooks bool
}

// Start runs kube-apiserver and etcd with Apiary's CRDs installed, and stops
// them when the test ends.
func Start(t testing.TB, opts Options) (*envtest.Environment, *rest.Config) {
	t.Helper()
	root := RepoRoot()
	env := &envtest.Environment{
		BinaryAssetsDirectory: AssetsDir(t),
		CRDDirectoryPaths:     []string{filepath.Join(root, "charts", "apiary", "crds")},
		ErrorIfCRDPathMissing: true,
	}
	if opts.Webhooks {
		env.WebhookInstallOptions = envtest.WebhookInstallOptions{
			Paths: []string{filepath.Join(root, "operator", "config", "webhook")},
		}
	}
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("starting kube-apiserver and etcd (envtest): %v", err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Logf("stopping envtest: %v", err)
		}
	})
	return env, cfg
}
