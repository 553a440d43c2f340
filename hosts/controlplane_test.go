package hosts

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// controlPlaneHost is this machine behind an SSH server with a shell and
// SFTP, as the operator reaches a host; the files go under a temporary
// directory.
func controlPlaneHost(t *testing.T) (*Client, string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("the control-plane files are owned by root: run as root (CI does)")
	}
	c := dialTestServer(t, serverOptions{shell: true, sftp: "local"})
	dir := t.TempDir()
	old := cpStageDir
	cpStageDir = filepath.Join(dir, "stage")
	t.Cleanup(func() { cpStageDir = old })
	return c, dir
}

func TestWriteControlPlane(t *testing.T) {
	c, dir := controlPlaneHost(t)
	files := []File{
		{Path: dir + "/etc/kubernetes/pki/apiserver.key", Data: []byte("KEY")},
		{Path: dir + "/etc/kubernetes/pki/ca.crt", Data: []byte("CA")},
	}
	manifests := []File{{Path: dir + "/etc/kubernetes/manifests/kube-apiserver.yaml", Data: []byte("kind: Pod\n")}}
	n, err := WriteControlPlane(t.Context(), c, files, manifests)
	if err != nil || n != 3 {
		t.Fatalf("first write: %d files, %v; want 3", n, err)
	}
	for _, f := range append(files, manifests...) {
		got, err := os.ReadFile(f.Path)
		if err != nil || string(got) != string(f.Data) {
			t.Errorf("%s: %q, %v", f.Path, got, err)
		}
		st, err := os.Stat(f.Path)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o600 || st.Sys().(*syscall.Stat_t).Uid != 0 {
			t.Errorf("%s: mode %v uid %d, want 0600 root", f.Path, st.Mode().Perm(), st.Sys().(*syscall.Stat_t).Uid)
		}
	}
	if _, err := os.Stat(cpStageDir); !os.IsNotExist(err) {
		t.Errorf("staging directory left behind: %v", err)
	}
	// Unchanged: nothing written, so the kubelet restarts no pod.
	before, _ := os.Stat(manifests[0].Path)
	time.Sleep(10 * time.Millisecond)
	if n, err := WriteControlPlane(t.Context(), c, files, manifests); err != nil || n != 0 {
		t.Fatalf("second write: %d files, %v; want 0", n, err)
	}
	if after, _ := os.Stat(manifests[0].Path); !after.ModTime().Equal(before.ModTime()) {
		t.Error("an unchanged manifest was rewritten")
	}
	// A file of the right content but another mode (kubeadm writes the
	// cluster CA 0644) is fixed in place, not rewritten.
	if err := os.Chmod(files[1].Path, 0o644); err != nil {
		t.Fatal(err)
	}
	if n, err := WriteControlPlane(t.Context(), c, files, manifests); err != nil || n != 0 {
		t.Fatalf("mode fix: %d files written, %v; want 0", n, err)
	}
	if st, _ := os.Stat(files[1].Path); st.Mode().Perm() != 0o600 {
		t.Errorf("mode left at %v", st.Mode().Perm())
	}
	// A renewed key: that file alone.
	files[0].Data = []byte("RENEWED")
	if n, err := WriteControlPlane(t.Context(), c, files, manifests); err != nil || n != 1 {
		t.Fatalf("renewal: %d files, %v; want 1", n, err)
	}
	if got, _ := os.ReadFile(files[0].Path); string(got) != "RENEWED" {
		t.Errorf("renewed key: %q", got)
	}
	for _, bad := range []string{"relative/path", dir + "/../x", dir + "/it's"} {
		if _, err := WriteControlPlane(t.Context(), c, []File{{Path: bad}}, nil); err == nil || !strings.Contains(err.Error(), "refusing") {
			t.Errorf("%q: %v, want a refusal", bad, err)
		}
	}
}

func TestRemoveControlPlane(t *testing.T) {
	c, dir := controlPlaneHost(t)
	manifest := dir + "/manifests/kube-apiserver.yaml"
	key, ca := dir+"/pki/apiserver.key", dir+"/pki/ca.crt"
	if _, err := WriteControlPlane(t.Context(), c, []File{{Path: key, Data: []byte("K")}, {Path: ca, Data: []byte("C")}}, []File{{Path: manifest, Data: []byte("M")}}); err != nil {
		t.Fatal(err)
	}
	// A control-plane process that does not go away fails the removal.
	// (Its own name: this machine may run a real kube-apiserver.)
	old := ControlPlaneProcesses
	ControlPlaneProcesses = []string{"apiary-test-kas"}
	t.Cleanup(func() { ControlPlaneProcesses = old })
	bin := filepath.Join(dir, "apiary-test-kas")
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(sleep)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	proc := exec.Command(bin, "60")
	if err := proc.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = proc.Process.Kill(); _, _ = proc.Process.Wait() }()
	err = RemoveControlPlane(t.Context(), c, []string{manifest}, []string{key, ca}, []string{ca}, 1)
	if err == nil || !strings.Contains(err.Error(), "still running") || !strings.Contains(err.Error(), "apiary-test-kas") {
		t.Fatalf("removal with a control-plane process running: %v", err)
	}
	if _, err := os.Stat(manifest); !os.IsNotExist(err) {
		t.Error("the manifest stayed")
	}
	if _, err := os.Stat(key); err != nil {
		t.Error("files were removed while the process still ran")
	}
	_ = proc.Process.Kill()
	_, _ = proc.Process.Wait()
	if err := RemoveControlPlane(t.Context(), c, []string{manifest}, []string{key, ca}, []string{ca}, 5); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(key); !os.IsNotExist(err) {
		t.Error("the key stayed")
	}
	if _, err := os.Stat(ca); err != nil {
		t.Error("the kubelet's CA was removed")
	}
}
