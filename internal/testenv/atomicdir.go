package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// AtomicDir writes files the way the kubelet updates a ConfigMap or Secret
// volume: each version into a new hidden directory, then a rename of the
// ..data symlink to it, every file a symlink through ..data. A process
// watching the directory sees what it would see in a pod.
type AtomicDir struct {
	Dir string
	n   int
}

// NewAtomicDir creates dir (which must not exist) and writes files into it.
func NewAtomicDir(t testing.TB, dir string, files map[string]string) *AtomicDir {
	t.Helper()
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	a := &AtomicDir{Dir: dir}
	a.Write(t, files)
	return a
}

// Write replaces the directory's content with files.
func (a *AtomicDir) Write(t testing.TB, files map[string]string) {
	t.Helper()
	if err := a.write(files); err != nil {
		t.Fatal(err)
	}
}

// Update is Write for a goroutine other than the test's.
func (a *AtomicDir) Update(files map[string]string) error { return a.write(files) }

func (a *AtomicDir) write(files map[string]string) error {
	a.n++
	version := fmt.Sprintf("..%d", a.n)
	if err := os.Mkdir(filepath.Join(a.Dir, version), 0o755); err != nil {
		return err
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(a.Dir, version, name), []byte(data), 0o644); err != nil {
			return err
		}
		link := filepath.Join(a.Dir, name)
		if _, err := os.Lstat(link); os.IsNotExist(err) {
			if err := os.Symlink(filepath.Join("..data", name), link); err != nil {
				return err
			}
		}
	}
	tmp := filepath.Join(a.Dir, "..data_tmp")
	if err := os.Symlink(version, tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(a.Dir, "..data")); err != nil {
		return err
	}
	if a.n > 1 {
		return os.RemoveAll(filepath.Join(a.Dir, fmt.Sprintf("..%d", a.n-1)))
	}
	return nil
}
