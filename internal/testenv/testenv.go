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
	HelmVersion = "v3.22.0"
	// PrometheusVersion is hack/tools/prometheus's (promtool and the server).
	PrometheusVersion = "v0.316.0"
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

// HelmBinary is the from-source helm.
func HelmBinary() (string, error) {
	return CacheBinary("helm-"+HelmVersion, "helm")
}

// PromtoolBinary returns Prometheus's promtool built from source.
func PromtoolBinary() (string, error) {
	return CacheBinary("prometheus-"+PrometheusVersion, "promtool")
}

// PrometheusBinary returns the Prometheus server built from source (static
// scrape targets only: built with the tag remove_all_sd).
func PrometheusBinary() (string, error) {
	return CacheBinary("prometheus-"+PrometheusVersion, "prometheus")
}

// CacheBinary returns a binary that hack/build-upstream.sh built into
// $APIARY_CACHE/bin/<dir>/<name>.
func CacheBinary(dir, name string) (string, error) {
	return existing(filepath.Join(cacheDir(), "bin", dir, name))
}

func existing(path string) (string, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return "", fmt.Errorf("%s is missing: run `make tools` to build it from source (%w)", path, err)
	}
	if fi.IsDir() || fi.Mode().Perm()&0o111 == 0 {
		return "", fmt.Errorf("%s is not an executable file: run `make tools` to rebuild it", path)
	}
	return path, nil
}

// RepoRoot is the root of the repository (to find CRDs and manifests).
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// assetsDir makes a directory laid out the way envtest expects
// (kube-apiserver, etcd, kubectl side by side), of symlinks to the
// from-source binaries.
func assetsDir() (string, error) {
	dir, err := os.MkdirTemp("", "apiary-envtest-")
	if err != nil {
		return "", err
	}
	for name, find := range map[string]func(string) (string, error){
		"kube-apiserver": KubeBinary, "kubectl": KubeBinary, "etcd": EtcdBinary,
	} {
		path, err := find(name)
		if err == nil {
			err = os.Symlink(path, filepath.Join(dir, name))
		}
		if err != nil {
			_ = os.RemoveAll(dir)
			return "", err
		}
	}
	return dir, nil
}

// Options select what the environment installs.
type Options struct {
	// Webhooks installs Apiary's webhook configurations, pointed at a local
	// server whose address and certificates envtest provides.
	Webhooks bool
	// APIServerArgs are set on kube-apiserver's command line (name without
	// dashes → value).
	APIServerArgs map[string]string
}

// Env is a running kube-apiserver and etcd with Apiary's CRDs.
type Env struct {
	*envtest.Environment
	Config *rest.Config
	assets string
}

// Stop stops the processes and removes the assets directory.
func (e *Env) Stop() error {
	err := e.Environment.Stop()
	_ = os.RemoveAll(e.assets)
	return err
}

// New starts kube-apiserver and etcd with Apiary's CRDs installed. It fails,
// never skips, when the from-source binaries are missing.
func New(opts Options) (*Env, error) {
	assets, err := assetsDir()
	if err != nil {
		return nil, err
	}
	// These would take precedence over BinaryAssetsDirectory and run other
	// binaries than the ones built from source.
	for _, v := range []string{"KUBEBUILDER_ASSETS", "TEST_ASSET_KUBE_APISERVER", "TEST_ASSET_ETCD", "TEST_ASSET_KUBECTL"} {
		_ = os.Unsetenv(v)
	}
	root := RepoRoot()
	env := &envtest.Environment{
		BinaryAssetsDirectory: assets,
		CRDDirectoryPaths:     []string{filepath.Join(root, "charts", "apiary", "crds")},
		ErrorIfCRDPathMissing: true,
	}
	if opts.Webhooks {
		env.WebhookInstallOptions = envtest.WebhookInstallOptions{
			Paths: []string{filepath.Join(root, "charts", "apiary", "files", "webhook")},
		}
	}
	for k, v := range opts.APIServerArgs {
		env.ControlPlane.GetAPIServer().Configure().Set(k, v)
	}
	if os.Getenv("APIARY_TEST_LOGS") != "" {
		env.ControlPlane.GetAPIServer().Out = os.Stderr
		env.ControlPlane.GetAPIServer().Err = os.Stderr
	}
	cfg, err := env.Start()
	if err != nil {
		_ = os.RemoveAll(assets)
		return nil, fmt.Errorf("starting kube-apiserver and etcd (envtest): %w", err)
	}
	return &Env{Environment: env, Config: cfg, assets: assets}, nil
}

// Start is New for one test: it fails the test on error and stops the
// environment when the test ends.
func Start(t testing.TB, opts Options) (*envtest.Environment, *rest.Config) {
	t.Helper()
	env, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Logf("stopping envtest: %v", err)
		}
	})
	return env.Environment, env.Config
}
