//go:build integration

package main

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	apiaryv1alpha1 "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

// "apiary dashboard --local" serves the overview and the live stream with
// the user's kubeconfig, on loopback only; without --local, or on another
// address, it refuses with what to do.
func TestDashboardLocal(t *testing.T) {
	e := environment(t)
	e.namespace(t, "dash")
	e.tenant(t, "dash", "shown", apiaryv1alpha1.TenantControlPlaneStatus{Phase: apiaryv1alpha1.PhaseReady, Conditions: readyConditions()})
	kubeconfig := e.writeKubeconfig(t, e.kubeconfig, "")

	for args, want := range map[string]string{
		"dashboard": "only --local is available",
		"dashboard --local --listen 0.0.0.0:8080":      "want a loopback address",
		"dashboard --local --listen dashboard.example": "want a loopback address",
	} {
		if code, _, errOut := apiary(t, append(strings.Fields(args), "--kubeconfig", kubeconfig)...); code == 0 || !strings.Contains(errOut, want) {
			t.Errorf("apiary %s: exit %d, %q, want %q", args, code, errOut, want)
		}
	}

	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	out, w := io.Pipe()
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"dashboard", "--local", "--listen", "127.0.0.1:0", "--kubeconfig", kubeconfig}, w, io.Discard)
		_ = w.Close()
	}()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("no address printed: %v", err)
	}
	go func() { _, _ = io.Copy(io.Discard, out) }()
	url := regexp.MustCompile(`http://127\.0\.0\.1:\d+/`).FindString(line)
	if url == "" {
		t.Fatalf("printed %q, want the dashboard's address", line)
	}
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "local, with your kubeconfig") {
		t.Errorf("overview: %s %s", resp.Status, body)
	}
	resp, err = http.Get(url + "api/tenants/stream?namespace=dash")
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(resp.Body)
	var data string
	for sc.Scan() && data == "" {
		if strings.HasPrefix(sc.Text(), "data: ") {
			data = sc.Text()
		}
	}
	_ = resp.Body.Close()
	if !strings.Contains(data, `"name":"shown"`) || !strings.Contains(data, `"phase":"Ready"`) {
		t.Errorf("the stream's first event %q, want tenant shown, Ready", data)
	}
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("stopped with exit %d", code)
		}
	case <-time.After(10 * time.Second):
		t.Error("the dashboard did not stop with its context")
	}
}
