package cli

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	apiaryv1alpha1 "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

func TestPrintHostsShowsWhatIsWrong(t *testing.T) {
	now := time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC)
	h := apiaryv1alpha1.Host{
		ObjectMeta: metav1.ObjectMeta{Name: "node-1", Namespace: "team-a", CreationTimestamp: metav1.NewTime(now.Add(-3 * time.Minute))},
		Spec:       apiaryv1alpha1.HostSpec{TenantControlPlane: "dev", Address: "192.0.2.21"},
		Status: apiaryv1alpha1.HostStatus{Phase: apiaryv1alpha1.HostPhaseFailed, Conditions: []metav1.Condition{
			{Type: apiaryv1alpha1.HostConditionReachable, Status: metav1.ConditionFalse, Reason: "HostKeyMismatch", Message: "host key mismatch"},
		}},
	}
	var b bytes.Buffer
	if err := PrintHosts(&b, []apiaryv1alpha1.Host{h}, true, now); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"NAMESPACE", "team-a", "node-1", "dev", "Failed", "192.0.2.21", "3m", "Reachable: host key mismatch"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	b.Reset()
	_ = PrintHosts(&b, nil, false, now)
	if !strings.Contains(b.String(), "No hosts found") {
		t.Errorf("empty list: %q", b.String())
	}
}

func TestAddHostRefusesBadFlagsAndCreatesNothing(t *testing.T) {
	for _, tc := range []struct {
		o    HostAddOptions
		want string
	}{
		{HostAddOptions{Address: "a", SSHKeySecret: "s"}, "--tenant and --address are required"},
		{HostAddOptions{Tenant: "t", Address: "a"}, "exactly one of --ssh-key-file and --ssh-key-secret"},
		{HostAddOptions{Tenant: "t", Address: "a", SSHKeySecret: "s", SSHKeyFile: "f"}, "exactly one of"},
		{HostAddOptions{Tenant: "t", Address: "a", SSHKeySecret: "s", HostKey: "k", InsecureSkipHostKeyCheck: true}, "exclude each other"},
		{HostAddOptions{Tenant: "t", Address: "a", SSHKeySecret: "s", HostKey: "k", Labels: []string{"nolabel"}}, "want KEY=VALUE"},
		{HostAddOptions{Tenant: "t", Address: "a", SSHKeySecret: "s", HostKey: "k", Taints: []string{"k=v"}}, "KEY[=VALUE]:EFFECT"},
	} {
		// A nil client: any API call would panic, so these must fail first.
		err := AddHost(context.Background(), nil, "ns", "h", tc.o, strings.NewReader(""), &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.o, err, tc.want)
		}
	}
}
