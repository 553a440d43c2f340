//go:build integration

package operator_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/operator/controllers"
	"github.com/apiaryhq/apiary/operator/render"
)

// testQuota runs a tenant's real kube-apiserver (the rendered arguments and
// admission configuration) and gives it a quota a few objects above what
// it stores: creates past it are refused inside the tenant with the
// quota's message, deletes work, an object held by a finalizer can still
// be deleted, writes stay refused between 95 and 100 % and come back once
// usage is under 95 %.
func (s *suite) testQuota(t *testing.T) {
	const name = "quota"
	tcp := newTCP(name, "default")
	tcp.Spec.Network.ServiceType = corev1.ServiceTypeLoadBalancer
	tcp.Spec.Network.Port = freePort(t)
	s.must(s.c.Create(s.ctx, tcp))
	eventually(t, "waiting for a LoadBalancer address", 30*time.Second, func() error {
		return s.tcpCondition(name, apiary.ConditionEndpointReady, metav1.ConditionFalse, controllers.ReasonWaitingForAddress)
	})
	s.playMetalLB(name)
	var dep appsv1.Deployment
	eventually(t, "Deployment rendered", 30*time.Second, func() error {
		return s.c.Get(s.ctx, client.ObjectKey{Namespace: tenantsNS, Name: name}, &dep)
	})
	stop := s.runTenantAPIServer(t, &dep)
	defer stop()
	s.playKubelet(&dep)
	eventually(t, "Ready", 60*time.Second, func() error {
		return s.tcpCondition(name, apiary.ConditionReady, metav1.ConditionTrue, controllers.ReasonAPIAnswering)
	})
	eventually(t, "usage shown without a quota", 30*time.Second, func() error {
		return s.tcpCondition(name, apiary.ConditionWithinQuota, metav1.ConditionTrue, controllers.ReasonNoQuota)
	})
	restCfg, err := clientcmd.BuildConfigFromFlags("", s.exportKubeconfig(t, name))
	s.must(err)
	tenant, err := kubernetes.NewForConfig(restCfg)
	s.must(err)
	cms := tenant.CoreV1().ConfigMaps("default")
	// Something to delete later that a finalizer holds, and spare objects
	// to delete at the end.
	_, err = cms.Create(s.ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "held", Finalizers: []string{"example.com/hold"}}}, metav1.CreateOptions{})
	s.must(err)
	const spares = 20
	for i := range spares {
		_, err = cms.Create(s.ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("spare-%02d", i)}}, metav1.CreateOptions{})
		s.must(err)
	}

	// The new API server and the bootstrap keep creating objects for a
	// while: wait until the count holds still for 3 s.
	var used int64
	settled := time.Now()
	eventually(t, "usage settled", 60*time.Second, func() error {
		u := s.getTCP(name).Status.DataStore.Usage
		if u == nil || u.Objects == 0 || !meta.IsStatusConditionTrue(s.getTCP(name).Status.Conditions, apiary.ConditionTenantBootstrapped) {
			return fmt.Errorf("usage %+v", u)
		}
		if u.Objects != used {
			used, settled = u.Objects, time.Now()
		}
		if time.Since(settled) < 3*time.Second {
			return fmt.Errorf("%d objects for %s", used, time.Since(settled).Round(time.Second))
		}
		return nil
	})
	budget := used + 10
	s.must(s.updateTCP(name, func(p *apiary.TenantControlPlane) {
		p.Spec.DataStoreQuota = &apiary.TenantQuota{Objects: ptr.To(budget)}
	}))
	eventually(t, "the quota in force", 30*time.Second, func() error {
		u := s.getTCP(name).Status.DataStore.Usage
		if u == nil || u.Quota.Objects == nil || *u.Quota.Objects != budget {
			return fmt.Errorf("usage %+v", u)
		}
		return s.tcpCondition(name, apiary.ConditionWithinQuota, metav1.ConditionTrue, controllers.ReasonWithinQuota)
	})

	// Write until refused; the refusal must come within a few objects of
	// the budget (the watch sees each write; the policy reloads at once).
	var refused error
	var crossed time.Time
	created := 0
	for i := range 100 {
		_, err := cms.Create(s.ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("fill-%03d", i)}, Data: map[string]string{"k": strings.Repeat("v", 100)}}, metav1.CreateOptions{})
		if err != nil {
			refused = err
			break
		}
		created++
		if crossed.IsZero() && used+int64(created) > budget {
			crossed = time.Now()
		}
		time.Sleep(50 * time.Millisecond)
	}
	if refused == nil {
		t.Fatalf("100 ConfigMaps created past a budget of %d objects (%d used before)", budget, used)
	}
	if !apierrors.IsForbidden(refused) || !strings.Contains(refused.Error(), "tenant tenants/quota is over its datastore quota ("+fmt.Sprint(budget)+" objects)") || !strings.Contains(refused.Error(), "deletes are allowed") {
		t.Fatalf("refusal %v, want Forbidden with the quota message", refused)
	}
	past := used + int64(created) - budget
	t.Logf("FIGURE quota: refused %s after the write that crossed it; %d objects written past a budget of %d", time.Since(crossed).Round(time.Millisecond), past, budget)
	if past > 20 {
		t.Errorf("%d objects written past the budget before the refusal", past)
	}
	// The status is written after the policy is applied.
	eventually(t, "WithinQuota False", 10*time.Second, func() error {
		c := meta.FindStatusCondition(s.getTCP(name).Status.Conditions, apiary.ConditionWithinQuota)
		if c == nil || c.Status != metav1.ConditionFalse || c.Reason != controllers.ReasonQuotaExceeded || !strings.Contains(c.Message, "refuses creates and updates") {
			return fmt.Errorf("WithinQuota %+v", c)
		}
		return nil
	})
	if !s.hasEvent(t, name, controllers.ReasonQuotaExceeded) {
		t.Errorf("no QuotaExceeded event")
	}
	var cm corev1.ConfigMap
	s.must(s.c.Get(s.ctx, client.ObjectKey{Namespace: tenantsNS, Name: render.AdmissionConfigMapName(tcp)}, &cm))
	if !strings.Contains(cm.Data[render.KeyQuotaPolicy], render.QuotaPolicyName) {
		t.Errorf("admission ConfigMap without the policy: %v", cm.Data)
	}

	// Deletes work, also of an object whose finalizer must come off.
	s.must(cms.Delete(s.ctx, "held", metav1.DeleteOptions{}))
	held, err := cms.Get(s.ctx, "held", metav1.GetOptions{})
	s.must(err)
	held.Finalizers = nil
	if _, err := cms.Update(s.ctx, held, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("removing the finalizer of a ConfigMap being deleted, over quota: %v", err)
	}
	for i := range created {
		s.must(cms.Delete(s.ctx, fmt.Sprintf("fill-%03d", i), metav1.DeleteOptions{}))
	}
	// Back under the budget but above 95 % of it: still refused, so that a
	// tenant at its limit does not flap.
	time.Sleep(2 * time.Second)
	if _, err := cms.Create(s.ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "too-soon"}}, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("create above 95 %% of the budget: %v, want Forbidden", err)
	}
	for i := range spares {
		s.must(cms.Delete(s.ctx, fmt.Sprintf("spare-%02d", i), metav1.DeleteOptions{}))
	}
	start := time.Now()
	eventually(t, "writes allowed again", 30*time.Second, func() error {
		_, err := cms.Create(s.ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "after"}}, metav1.CreateOptions{})
		return err
	})
	t.Logf("FIGURE quota: writes allowed %s after the deletions", time.Since(start).Round(time.Millisecond))
	if err := s.tcpCondition(name, apiary.ConditionWithinQuota, metav1.ConditionTrue, controllers.ReasonWithinQuota); err != nil {
		t.Error(err)
	}
	s.must(s.c.Delete(s.ctx, s.getTCP(name)))
}
