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
	old, oldHeld := cpStageDir, heldManifestsDir
	cpStageDir, heldManifestsDir = filepath.Join(dir, "stage"), filepath.Join(dir, "manifests-held")
	t.Cleanup(func() { cpStageDir, heldManifestsDir = old, oldHeld })
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
	proc := fakeControlPlane(t, dir)
	defer func() { _ = proc.Process.Kill(); _, _ = proc.Process.Wait() }()
	err := RemoveControlPlane(t.Context(), c, []string{manifest}, []string{key, ca}, []string{ca}, 1)
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

// A kubelet upgrade holds the manifests aside while the control plane
// stops, and puts them back whatever happens next: here kubeadm fails.
func TestUpgradeKubeletPutsTheManifestsBack(t *testing.T) {
	c, dir := controlPlaneHost(t)
	oldM, oldH, oldP, oldK := manifestsDir, heldManifestsDir, ControlPlaneProcesses, kubeletConfigPhase
	manifestsDir, heldManifestsDir = filepath.Join(dir, "manifests"), filepath.Join(dir, "manifests-held")
	ControlPlaneProcesses = []string{"apiary-test-kas"}
	kubeletConfigPhase = "echo kubeadm here; false"
	t.Cleanup(func() {
		manifestsDir, heldManifestsDir, ControlPlaneProcesses, kubeletConfigPhase = oldM, oldH, oldP, oldK
	})
	manifest := filepath.Join(manifestsDir, "kube-apiserver.yaml")
	if err := os.MkdirAll(manifestsDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(manifest, []byte("kind: Pod\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// The control plane takes a second to stop once its manifest is gone.
	proc := fakeControlPlane(t, dir)
	heldWhileRunning := make(chan bool, 1)
	go func() {
		deadline := time.Now().Add(5 * time.Second)
		for time.Now().Before(deadline) {
			if _, err := os.Stat(filepath.Join(heldManifestsDir, "kube-apiserver.yaml")); err == nil {
				_, gone := os.Stat(manifest)
				heldWhileRunning <- os.IsNotExist(gone)
				time.Sleep(time.Second)
				_ = proc.Process.Kill()
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		heldWhileRunning <- false
		_ = proc.Process.Kill()
	}()
	defer func() { _ = proc.Process.Kill(); _, _ = proc.Process.Wait() }()
	go func() { _, _ = proc.Process.Wait() }()
	start := time.Now()
	out, err := UpgradeKubelet(t.Context(), c, 10)
	if err == nil || !strings.Contains(out, "kubeadm here") {
		t.Fatalf("kubeadm failed, yet: %v\n%s", err, out)
	}
	if !<-heldWhileRunning {
		t.Error("the manifest was not held aside while the control plane ran")
	}
	if took := time.Since(start); took < time.Second {
		t.Errorf("kubeadm ran after %s: before the control plane had stopped", took)
	}
	if got, err := os.ReadFile(manifest); err != nil || string(got) != "kind: Pod\n" {
		t.Errorf("the manifest after the failure: %q, %v", got, err)
	}
	if _, err := os.Stat(heldManifestsDir); !os.IsNotExist(err) {
		t.Errorf("the held directory stayed: %v", err)
	}
}

// fakeControlPlane starts a process named apiary-test-kas (a copy of
// sleep, for a minute): a control-plane process of its own name, as this
// machine may run a real kube-apiserver.
func fakeControlPlane(t *testing.T, dir string) *exec.Cmd {
	t.Helper()
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
	return proc
}
