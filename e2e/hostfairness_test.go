//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/apiaryhq/apiary/e2e/framework"
	"github.com/apiaryhq/apiary/e2e/sshhost"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/operator/controllers"
)

// testStalledHostsHoldNoOtherTenant: a hostile host owner stalls the
// install of more of its tenant's Hosts than the operator has Host workers
// (4): its sshd's SFTP server is stopped (SIGSTOP) whenever one starts, so
// each install would sit at its 10 minute limit. Another tenant's Host,
// added meanwhile, must install and join in its usual time; the stalling
// tenant's Hosts past its share wait their turn, saying so.
func (e *env) testStalledHostsHoldNoOtherTenant(t *testing.T, d *sshhost.Docker, image string) {
	// One more than the Host controller's workers, and than a tenant's
	// share of steps.
	const stalled, maxStalled = 5, 4
	took := e.CreateTenant(t, "stall", nil)
	t.Logf("FIGURE tenant stall: create → Ready in %s", took.Round(100*time.Millisecond))
	defer e.deleteTenant(t, "stall")
	bad := e.startHost(t, d, image, "e2e-stall")
	// The owner's doing, on its own machine: every SFTP server stopped as
	// it starts, until told to stop.
	stalling := make(chan error, 1)
	go func() {
		_, err := d.Exec(e.Ctx, bad.Name, "sh", "-c",
			"while [ ! -e /tmp/stall-off ]; do pkill -STOP -x sftp-server; sleep 0.05; done; pkill -CONT -x sftp-server")
		stalling <- err
	}()
	stopStalling := func() {
		_, _ = d.Exec(context.Background(), bad.Name, "touch", "/tmp/stall-off")
		<-stalling
	}
	// running: the stalling tenant's installs under way; waiting: its
	// steps (the fifth Host's preflight) waiting their turn.
	steps := func() (running, waiting []string, err error) {
		var list apiary.HostList
		if err := e.C.List(e.Ctx, &list, client.InNamespace(framework.TenantsNS)); err != nil {
			return nil, nil, err
		}
		for _, h := range list.Items {
			if h.Spec.TenantControlPlane != "stall" {
				continue
			}
			for _, st := range h.Status.Journal {
				switch {
				case st.Result != controllers.StepRunning:
				case strings.HasPrefix(st.Message, controllers.StepWaitsForTurn):
					waiting = append(waiting, h.Name+" "+st.Name+": "+st.Message)
				case st.Name == controllers.StepInstall:
					running = append(running, h.Name)
				}
			}
		}
		return running, waiting, nil
	}
	// One at a time, each once the one before is stalled: the agent's
	// scripts take a lock on the machine, and five preflights at once
	// would mostly fail with HostBusy and back off.
	start := time.Now()
	var hosts []*apiary.Host
	// Deleted before the SFTP servers go on: a deletion cancels the
	// stalled installs, then resets the host (no SFTP).
	defer stopStalling()
	defer func() {
		for _, h := range hosts {
			deleteHostAndWait(t, e, h)
		}
	}()
	var waiting []string
	for i := range stalled {
		h := e.newHostFor(t, fmt.Sprintf("stall-%d", i), bad, "stall")
		if err := e.C.Create(e.Ctx, h); err != nil {
			t.Fatal(err)
		}
		hosts = append(hosts, h)
		framework.Eventually(t, fmt.Sprintf("Host %s stalled in install or waiting its turn", h.Name), 2*time.Minute, func() error {
			running, w, err := steps()
			if err != nil {
				return err
			}
			if len(running)+len(w) != i+1 || len(running) > maxStalled {
				return fmt.Errorf("installs running %v, waiting %v", running, w)
			}
			waiting = w
			return nil
		})
	}
	if len(waiting) != 1 {
		t.Fatalf("waiting its turn: %v, want the fifth Host", waiting)
	}
	t.Logf("FIGURE tenant stall: %d installs stalled and 1 Host waiting after %s: %s", maxStalled, time.Since(start).Round(100*time.Millisecond), waiting[0])
	// Stalled for real: a few seconds on, none has moved.
	time.Sleep(5 * time.Second)
	if running, w, err := steps(); err != nil || len(running) != maxStalled || len(w) != 1 {
		t.Fatalf("the stall did not hold: running %v, waiting %v (%v)", running, w, err)
	}

	fair := e.newHostFor(t, "fair", e.startHost(t, d, image, "e2e-fair"), "alpha")
	start = time.Now()
	if err := e.C.Create(e.Ctx, fair); err != nil {
		t.Fatal(err)
	}
	defer deleteHostAndWait(t, e, fair)
	framework.Eventually(t, "Host fair joined while tenant stall's installs are stalled", 2*time.Minute, func() error {
		var h apiary.Host
		if err := e.C.Get(e.Ctx, client.ObjectKeyFromObject(fair), &h); err != nil {
			return err
		}
		return framework.ConditionIs(h.Status.Conditions, apiary.HostConditionJoined, metav1.ConditionTrue, controllers.ReasonJoined)
	})
	joined := time.Since(start)
	running, _, err := steps()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("FIGURE Host fair (tenant alpha) preflight, install and join in %s while %d installs of tenant stall were stalled", joined.Round(100*time.Millisecond), len(running))
	if len(running) != maxStalled {
		t.Errorf("only %d of tenant stall's installs still stalled when Host fair joined: the test did not hold the workers", len(running))
	}
}
