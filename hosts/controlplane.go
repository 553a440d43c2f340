package hosts

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path"
	"strings"
)

// A registered tenant's control plane runs on its control-plane hosts as
// static Pods (operator/render/staticpods.go). The operator copies the
// files they read and their manifests over SFTP, and removes them when
// the tenant goes back to standalone.

// File is a file the operator writes on a host: mode 0600, owner root.
type File struct {
	// Path is absolute.
	Path string
	Data []byte
}

// cpStageDir receives the files over SFTP, as the SSH user, before root
// moves them into place (a variable for tests, which run on this machine).
var cpStageDir = stateDir + "/stage-control-plane"

// ControlPlaneProcesses are the processes of the static Pods; none may run
// on a host once its control plane is removed.
var ControlPlaneProcesses = []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "proxy-server"}

// WriteControlPlane writes files, then manifests, each only when its
// content differs from the host's (an unchanged manifest does not restart
// its pod), each atomically (a temporary file in the same directory,
// renamed over the old one) so that the kubelet never reads half a
// manifest and a pod never starts on half its files. Every file is
// 0600 and owned by root. It returns how many files it wrote.
func WriteControlPlane(ctx context.Context, c *Client, files, manifests []File) (int, error) {
	all := append(append([]File(nil), files...), manifests...)
	for _, f := range all {
		if !path.IsAbs(f.Path) || path.Clean(f.Path) != f.Path || strings.ContainsAny(f.Path, "'\n") {
			return 0, fmt.Errorf("control plane: refusing to write %q: not a clean absolute path", f.Path)
		}
	}
	// What the host has: one sha256 per file ("-" when missing).
	var sums strings.Builder
	fmt.Fprintf(&sums, "set -e\nrm -rf %s\nmkdir -p %s\nchmod 0700 %s\nchown %s %s\n", cpStageDir, cpStageDir, cpStageDir, Quote(c.user), cpStageDir)
	for _, f := range all {
		fmt.Fprintf(&sums, "if [ -f '%s' ]; then echo \"$(sha256sum '%s' | cut -d' ' -f1) $(stat -c '%%a:%%u:%%g' '%s')\"; else echo - -; fi\n", f.Path, f.Path, f.Path)
	}
	out, err := c.RunScript(ctx, sums.String())
	if err != nil {
		return 0, fmt.Errorf("control plane: reading the host's files: %w", err)
	}
	have := strings.Fields(out)
	if len(have) != 2*len(all) {
		return 0, fmt.Errorf("control plane: the host listed %d checksums for %d files", len(have)/2, len(all))
	}
	// changed files are written; same content with another mode or owner
	// (a file kubeadm wrote, such as the cluster CA at 0644) is fixed in
	// place, which restarts nothing.
	var changed, perms []int
	for i, f := range all {
		sum := sha256.Sum256(f.Data)
		switch {
		case have[2*i] != hex.EncodeToString(sum[:]):
			changed = append(changed, i)
		case have[2*i+1] != "600:0:0":
			perms = append(perms, i)
		}
	}
	if len(perms) > 0 {
		var fix strings.Builder
		fix.WriteString("set -e\n")
		for _, i := range perms {
			fmt.Fprintf(&fix, "chown root:root '%s'\nchmod 0600 '%s'\n", all[i].Path, all[i].Path)
		}
		if _, err := c.RunScript(ctx, fix.String()); err != nil {
			return 0, fmt.Errorf("control plane: setting the files' mode: %w", err)
		}
	}
	if len(changed) == 0 {
		return 0, nil
	}
	sc, err := c.sftp(ctx)
	if err != nil {
		return 0, err
	}
	defer sc.Close()
	for _, i := range changed {
		staged := path.Join(cpStageDir, fmt.Sprint(i))
		w, err := sc.OpenFile(staged, os.O_WRONLY|os.O_CREATE|os.O_TRUNC)
		if err != nil {
			return 0, &Error{ReasonCommandFailed, fmt.Errorf("control plane: creating %s: %w", staged, err)}
		}
		if err := sc.Chmod(staged, 0o600); err != nil {
			w.Close()
			return 0, &Error{ReasonCommandFailed, fmt.Errorf("control plane: %s: %w", staged, err)}
		}
		if _, err := bytes.NewReader(all[i].Data).WriteTo(w); err != nil {
			w.Close()
			if ctx.Err() != nil {
				return 0, fmt.Errorf("control plane: writing %s: %w", all[i].Path, context.Cause(ctx))
			}
			return 0, &Error{ReasonCommandFailed, fmt.Errorf("control plane: writing %s: %w", all[i].Path, err)}
		}
		if err := w.Close(); err != nil {
			return 0, &Error{ReasonCommandFailed, fmt.Errorf("control plane: writing %s: %w", all[i].Path, err)}
		}
	}
	// Files before manifests: changed keeps the order of all.
	var place strings.Builder
	place.WriteString("set -e\n")
	for _, i := range changed {
		p := all[i].Path
		fmt.Fprintf(&place, "install -D -m 0600 -o root -g root %s/%d '%s.apiary-new'\nmv -f '%s.apiary-new' '%s'\n", cpStageDir, i, p, p, p)
	}
	fmt.Fprintf(&place, "rm -rf %s\n", cpStageDir)
	if _, err := c.RunScript(ctx, place.String()); err != nil {
		return 0, fmt.Errorf("control plane: moving the files into place: %w", err)
	}
	return len(changed), nil
}

// waitForNoControlPlane is a script that waits up to wait seconds for the
// control-plane processes to exit, and fails naming those still running.
func waitForNoControlPlane(wait int) string {
	// pgrep matches the kernel's command name, cut to 15 characters.
	var names []string
	for _, p := range ControlPlaneProcesses {
		names = append(names, p[:min(len(p), 15)])
	}
	pattern := strings.Join(names, "|")
	return fmt.Sprintf("i=0\nwhile pgrep -x '%s' >/dev/null 2>&1; do\n  i=$((i+1))\n  if [ $i -gt %d ]; then echo \"still running: $(pgrep -l -x '%s' | tr '\\n' ' ')\" >&2; exit 1; fi\n  sleep 1\ndone\n",
		pattern, wait, pattern)
}

// RemoveControlPlane removes the manifests (the kubelet stops their pods),
// waits up to wait seconds for the control-plane processes to exit, then
// removes the files (but keep, which the kubelet itself reads: the cluster
// CA). A process still running after the wait is an error: a host of a
// standalone tenant must run no control plane.
func RemoveControlPlane(ctx context.Context, c *Client, manifests, files []string, keep []string, wait int) error {
	var s strings.Builder
	s.WriteString("set -e\n")
	for _, m := range manifests {
		fmt.Fprintf(&s, "rm -f '%s'\n", m)
	}
	// Manifests a kubelet upgrade held aside go too.
	fmt.Fprintf(&s, "rm -rf '%s'\n", heldManifestsDir)
	s.WriteString(waitForNoControlPlane(wait))
	for _, f := range files {
		kept := false
		for _, k := range keep {
			kept = kept || k == f
		}
		if !kept {
			fmt.Fprintf(&s, "rm -f '%s'\n", f)
		}
	}
	if _, err := c.RunScript(ctx, s.String()); err != nil {
		return fmt.Errorf("control plane: removing it: %w", err)
	}
	return nil
}
