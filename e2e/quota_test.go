//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/apiaryhq/apiary/datastore"
	"github.com/apiaryhq/apiary/e2e/framework"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/operator/controllers"
	"github.com/apiaryhq/apiary/operator/render"
)

// testDataStoreQuota: beta, hostile, writes 256 KiB ConfigMaps as fast as
// it can past a quota 3 MiB above what it stores. Its own API server
// refuses it with the quota's message (the kubelet wrote the policy into
// the pods, no restart), while alpha on the same etcd keeps writing and
// etcd raises no NOSPACE. Deleting brings writes back.
func (e *env) testDataStoreQuota(t *testing.T) {
	const name = "beta"
	framework.Eventually(t, "beta's usage measured", time.Minute, func() error {
		c := meta.FindStatusCondition(e.TCP(t, name).Status.Conditions, apiary.ConditionWithinQuota)
		if c == nil || c.Status != metav1.ConditionTrue || e.TCP(t, name).Status.DataStore.Usage == nil {
			return fmt.Errorf("WithinQuota %+v", c)
		}
		return nil
	})
	// A control plane that goes over quota while its controller-manager
	// is still creating its controllers' ServiceAccounts restarts it until
	// the tenant is back under (those creates are refused too): let beta,
	// created moments ago, finish starting.
	betaCS := e.tenantClient(t, e.ExportKubeconfig(t, name))
	var accounts int
	settled := time.Now()
	framework.Eventually(t, "beta's controller-manager done creating ServiceAccounts", 2*time.Minute, func() error {
		list, err := betaCS.CoreV1().ServiceAccounts("kube-system").List(e.Ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		if len(list.Items) != accounts {
			accounts, settled = len(list.Items), time.Now()
		}
		if accounts < 10 || time.Since(settled) < 5*time.Second {
			return fmt.Errorf("%d ServiceAccounts in kube-system, unchanged for %s", accounts, time.Since(settled).Round(time.Second))
		}
		return nil
	})
	used := e.TCP(t, name).Status.DataStore.Usage.Bytes
	restartsBefore := e.restarts(t, name)
	budget := used + 3<<20
	tcp := e.TCP(t, name)
	tcp.Spec.DataStoreQuota = &apiary.TenantQuota{Bytes: resource.NewQuantity(budget, resource.BinarySI)}
	if err := e.C.Update(e.Ctx, tcp); err != nil {
		t.Fatal(err)
	}
	defer func() {
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			tcp := e.TCP(t, name)
			tcp.Spec.DataStoreQuota = nil
			return e.C.Update(e.Ctx, tcp)
		})
		if err != nil {
			t.Errorf("removing beta's quota: %v", err)
		}
	}()
	framework.Eventually(t, "beta's quota in force", 30*time.Second, func() error {
		u := e.TCP(t, name).Status.DataStore.Usage
		if u == nil || u.Quota.Bytes == nil || u.Quota.Bytes.Value() != budget {
			return fmt.Errorf("usage %+v", u)
		}
		return nil
	})

	// Alpha writes throughout, and must never be refused.
	alpha := e.tenantClient(t, e.ExportKubeconfig(t, "alpha")).CoreV1().ConfigMaps("default")
	ctx, stopAlpha := context.WithCancel(e.Ctx)
	var wg sync.WaitGroup
	var alphaWrites, alphaFailed int
	var alphaErr error
	wg.Go(func() {
		for i := 0; ctx.Err() == nil; i++ {
			_, err := alpha.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("alpha-during-quota-%04d", i), Labels: quotaLabels}, Data: map[string]string{"k": "v"}}, metav1.CreateOptions{})
			switch {
			case err == nil:
				alphaWrites++
			case ctx.Err() == nil:
				alphaFailed++
				alphaErr = err
			}
			time.Sleep(100 * time.Millisecond)
		}
	})

	beta := betaCS.CoreV1().ConfigMaps("default")
	value := strings.Repeat("q", 256<<10)
	var refused error
	var crossed time.Time
	var written int64
	created := 0
	start := time.Now()
	for i := range 400 {
		_, err := beta.Create(e.Ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("fill-%03d", i), Labels: quotaLabels}, Data: map[string]string{"v": value}}, metav1.CreateOptions{})
		if err != nil {
			refused = err
			break
		}
		created++
		written += int64(len(value))
		if crossed.IsZero() && used+written > budget {
			crossed = time.Now()
		}
	}
	stopAlpha()
	wg.Wait()
	if refused == nil {
		t.Fatalf("beta wrote %s past a quota of %s in %s without a refusal", datastore.FormatBytes(used+written-budget), datastore.FormatBytes(budget), time.Since(start).Round(time.Millisecond))
	}
	if !apierrors.IsForbidden(refused) || !strings.Contains(refused.Error(), "tenant "+framework.TenantsNS+"/beta is over its datastore quota") || !strings.Contains(refused.Error(), "deletes are allowed") {
		t.Fatalf("beta's refusal: %v; want Forbidden with the quota's message", refused)
	}
	past := used + written - budget
	t.Logf("FIGURE quota e2e: beta refused %s after crossing its quota, %s written past it (%d ConfigMaps of 256 KiB in %s)",
		time.Since(crossed).Round(time.Millisecond), datastore.FormatBytes(past), created, time.Since(start).Round(time.Millisecond))
	if past > 64<<20 {
		t.Errorf("beta wrote %s past its quota before the refusal", datastore.FormatBytes(past))
	}
	t.Logf("alpha during beta's fill: %d writes, %d failed (%v)", alphaWrites, alphaFailed, alphaErr)
	if alphaFailed > 0 || alphaWrites == 0 {
		t.Errorf("alpha, on the same etcd, was refused %d of %d writes during beta's fill: %v", alphaFailed, alphaWrites+alphaFailed, alphaErr)
	}
	dc := e.etcdRoot(t)
	sp, err := dc.Space(e.Ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(sp.NoSpace) > 0 {
		t.Errorf("etcd raised NOSPACE: %+v", sp)
	}
	framework.Eventually(t, "WithinQuota False", 30*time.Second, func() error {
		c := meta.FindStatusCondition(e.TCP(t, name).Status.Conditions, apiary.ConditionWithinQuota)
		if c == nil || c.Reason != controllers.ReasonQuotaExceeded {
			return fmt.Errorf("WithinQuota %+v", c)
		}
		return nil
	})
	// Updates are refused too; deletes are not.
	if _, err := beta.Update(e.Ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "fill-000"}, Data: map[string]string{"v": "smaller"}}, metav1.UpdateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("update over quota: %v, want Forbidden", err)
	}
	start = time.Now()
	if err := beta.DeleteCollection(e.Ctx, metav1.DeleteOptions{}, quotaSelector); err != nil {
		t.Fatalf("deleting over quota: %v", err)
	}
	framework.Eventually(t, "beta may write again", 2*time.Minute, func() error {
		_, err := beta.Create(e.Ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "after-quota", Labels: quotaLabels}}, metav1.CreateOptions{})
		return err
	})
	t.Logf("FIGURE quota e2e: beta may write %s after deleting its ConfigMaps", time.Since(start).Round(time.Millisecond))
	// alpha's writes go too.
	for _, cms := range []interface {
		DeleteCollection(context.Context, metav1.DeleteOptions, metav1.ListOptions) error
	}{alpha, beta} {
		if err := cms.DeleteCollection(e.Ctx, metav1.DeleteOptions{}, quotaSelector); err != nil {
			t.Errorf("cleaning up: %v", err)
		}
	}
	if after := e.restarts(t, name); after != restartsBefore {
		t.Errorf("beta's control-plane containers restarted during the quota test: %d restarts before, %d after", restartsBefore, after)
	}
}

var (
	quotaLabels   = map[string]string{"e2e": "quota"}
	quotaSelector = metav1.ListOptions{LabelSelector: "e2e=quota"}
)

// restarts sums the restart counts of a tenant's control-plane containers.
func (e *env) restarts(t *testing.T, name string) int32 {
	t.Helper()
	var pods corev1.PodList
	if err := e.C.List(e.Ctx, &pods, client.InNamespace(framework.TenantsNS), client.MatchingLabels{render.LabelTenant: name}); err != nil {
		t.Fatal(err)
	}
	var n int32
	for _, p := range pods.Items {
		for _, cs := range p.Status.ContainerStatuses {
			n += cs.RestartCount
		}
	}
	return n
}
