//go:build e2e

package e2e

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/apiaryhq/apiary/e2e/framework"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/operator/controllers"
	"github.com/apiaryhq/apiary/operator/render"
	"github.com/apiaryhq/apiary/operator/render/managedetcd"
	"github.com/apiaryhq/apiary/pki"
)

// testPeerCAMove puts the 3-member DataStore trio back into the layout
// DataStores had before the peer CA existed (one CA for clients and peers,
// the peer port trusting it, no peer name required), with the operator
// stopped, and checks that the datastore's root client certificate then
// passes the peer port (what the move closes). With a tenant writing through its API every
// 250 ms, the operator is started again: it moves the members to the peer
// CA in three rolling updates, and no write fails.
func (e *env) testPeerCAMove(t *testing.T, ds *apiary.DataStore) {
	ctx := e.Ctx
	secret := func(kind render.SecretKind) *corev1.Secret {
		t.Helper()
		var s corev1.Secret
		if err := e.C.Get(ctx, client.ObjectKey{Namespace: framework.SystemNS, Name: managedetcd.SecretName(ds, kind)}, &s); err != nil {
			t.Fatal(err)
		}
		return &s
	}
	peerAccepts := func(cert tls.Certificate) (bool, error) {
		port := e.portForward(t, "trio-etcd-0", 2380)
		hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
			Certificates:       []tls.Certificate{cert},
			InsecureSkipVerify: true, //nolint:gosec // what the server accepts is under test, not its name
		}}}
		resp, err := hc.Get("https://127.0.0.1:" + port + "/members")
		if err != nil {
			return false, err
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	}
	rootSecret := secret(managedetcd.SecretRoot)
	root, err := tls.X509KeyPair(rootSecret.Data[corev1.TLSCertKey], rootSecret.Data[corev1.TLSPrivateKeyKey])
	if err != nil {
		t.Fatal(err)
	}

	// The operator stops.
	var dep appsv1.Deployment
	depKey := client.ObjectKey{Namespace: framework.SystemNS, Name: framework.Release}
	if err := e.C.Get(ctx, depKey, &dep); err != nil {
		t.Fatal(err)
	}
	replicas := *dep.Spec.Replicas
	scale := func(n int32) {
		t.Helper()
		if err := e.C.Get(ctx, depKey, &dep); err != nil {
			t.Fatal(err)
		}
		dep.Spec.Replicas = ptr.To(n)
		if err := e.C.Update(ctx, &dep); err != nil {
			t.Fatal(err)
		}
	}
	scale(0)
	t.Cleanup(func() { scale(replicas) })
	framework.Eventually(t, "no operator pod", 2*time.Minute, func() error {
		var pods corev1.PodList
		if err := e.C.List(ctx, &pods, client.InNamespace(framework.SystemNS), client.MatchingLabels{"app.kubernetes.io/component": "operator"}); err != nil {
			return err
		}
		if len(pods.Items) > 0 {
			return fmt.Errorf("%d operator pods", len(pods.Items))
		}
		return nil
	})

	// The layout before the peer CA: the peer certificate signed by the
	// client CA, the peer port trusting the client CA, no peer name.
	caSecret := secret(managedetcd.SecretCA)
	ca, err := pki.ParseKeyPair(caSecret.Data[corev1.TLSCertKey], caSecret.Data[corev1.TLSPrivateKeyKey])
	if err != nil {
		t.Fatal(err)
	}
	peer, err := ca.Sign(managedetcd.ServingCertRequest(ds, "cluster.local", true))
	if err != nil {
		t.Fatal(err)
	}
	peerKey, err := peer.KeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	peerSecret := secret(managedetcd.SecretPeer)
	peerSecret.Data = map[string][]byte{corev1.TLSCertKey: peer.CertPEM(), corev1.TLSPrivateKeyKey: peerKey}
	if err := e.C.Update(ctx, peerSecret); err != nil {
		t.Fatal(err)
	}
	for _, kind := range []render.SecretKind{managedetcd.SecretPeerCA, managedetcd.SecretPeerTrust} {
		if err := e.C.Delete(ctx, secret(kind)); err != nil {
			t.Fatal(err)
		}
	}
	var sts appsv1.StatefulSet
	stsKey := client.ObjectKey{Namespace: framework.SystemNS, Name: managedetcd.Name(ds)}
	if err := e.C.Get(ctx, stsKey, &sts); err != nil {
		t.Fatal(err)
	}
	pod := &sts.Spec.Template.Spec
	args := []string{}
	for _, a := range pod.Containers[0].Args {
		switch {
		case strings.HasPrefix(a, "--peer-trusted-ca-file="):
			args = append(args, "--peer-trusted-ca-file=/etc/etcd/pki/ca.crt")
		case strings.HasPrefix(a, "--peer-cert-allowed-cn="):
		default:
			args = append(args, a)
		}
	}
	pod.Containers[0].Args = args
	for i := range pod.Volumes {
		if p := pod.Volumes[i].Projected; p != nil {
			p.Sources = slices.DeleteFunc(p.Sources, func(s corev1.VolumeProjection) bool {
				return s.Secret != nil && s.Secret.Name == managedetcd.SecretName(ds, managedetcd.SecretPeerTrust)
			})
		}
	}
	sts.Spec.Template.Annotations[render.AnnotationConfigHash] = "before-the-peer-ca"
	// Members were restarted by the StatefulSet controller then.
	sts.Spec.UpdateStrategy = appsv1.StatefulSetUpdateStrategy{Type: appsv1.RollingUpdateStatefulSetStrategyType}
	if err := e.C.Update(ctx, &sts); err != nil {
		t.Fatal(err)
	}
	// All members at once: a member of one layout and one of the other
	// do not trust each other, so a rolling update would stall.
	if err := e.C.DeleteAllOf(ctx, &corev1.Pod{}, client.InNamespace(framework.SystemNS), client.MatchingLabels{managedetcd.LabelDataStore: "trio"}); err != nil {
		t.Fatal(err)
	}
	kc := e.ExportKubeconfig(t, "on-trio")
	framework.Eventually(t, "trio back in the old layout, the tenant writing", 3*time.Minute, func() error {
		out, err := framework.KubectlErr(kc, "--request-timeout=5s", "create", "configmap", "old-layout", "-n", "default", "--from-literal=k=v")
		if err != nil && !strings.Contains(out, "AlreadyExists") {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	})
	framework.Eventually(t, "the old layout's peer port accepts the datastore's root client certificate", time.Minute, func() error {
		ok, err := peerAccepts(root)
		if !ok {
			return fmt.Errorf("root client certificate at 2380: accepted %t, %v", ok, err)
		}
		return nil
	})

	// The move is what is measured: start from a settled trio (after the
	// restart above a member may still be catching up, and a write then
	// waits for it).
	hc := &http.Client{Timeout: 400 * time.Millisecond}
	framework.Eventually(t, "trio settled: every member up, one leader", 2*time.Minute, func() error {
		line, settled, err := e.trioMembers(ctx, hc)
		if err != nil || !settled {
			return fmt.Errorf("%s %v", line, err)
		}
		return nil
	})

	// A tenant client writing throughout. It writes first until ten
	// writes in a row succeed: after every member restarted at once, the
	// etcd client of the tenant API server this client reaches may still
	// be in its reconnect backoff while another one (kubectl's above)
	// already writes. Seen in CI: the first two writes timed out before
	// the operator had started.
	cs := e.tenantClient(t, kc)
	framework.Eventually(t, "the tenant's writes succeed ten times in a row", 2*time.Minute, func() error {
		for i := range 10 {
			reqCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_, err := cs.CoreV1().ConfigMaps("default").Create(reqCtx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{GenerateName: "peer-ca-move-"}}, metav1.CreateOptions{})
			cancel()
			if err != nil {
				return fmt.Errorf("write %d: %w", i+1, err)
			}
		}
		return nil
	})
	pollCtx, stopPoll := context.WithCancel(ctx)
	var mu sync.Mutex
	var writes, failed int
	var failures []string
	var lastOK time.Time
	var longest time.Duration
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; pollCtx.Err() == nil; i++ {
			reqCtx, cancel := context.WithTimeout(pollCtx, 5*time.Second)
			_, err := cs.CoreV1().ConfigMaps("default").Create(reqCtx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{GenerateName: "peer-ca-move-"}}, metav1.CreateOptions{})
			cancel()
			mu.Lock()
			now := time.Now()
			switch {
			case err == nil:
				writes++
				if !lastOK.IsZero() {
					longest = max(longest, now.Sub(lastOK))
				}
				lastOK = now
			case pollCtx.Err() == nil:
				failed++
				failures = append(failures, fmt.Sprintf("%s: %v", now.Format(time.TimeOnly), err))
			}
			mu.Unlock()
			time.Sleep(250 * time.Millisecond)
		}
	})

	timeline := e.sampleMembers(t, pollCtx)
	start := time.Now()
	scale(replicas)
	// The status still says what the operator saw before it stopped.
	framework.Eventually(t, "the operator sees the old layout", 3*time.Minute, func() error {
		var got apiary.DataStore
		if err := e.C.Get(ctx, client.ObjectKey{Name: "trio"}, &got); err != nil {
			return err
		}
		if c := meta.FindStatusCondition(got.Status.Conditions, apiary.ConditionPeerCASeparate); c == nil || c.Reason != controllers.ReasonMovingToPeerCA {
			return fmt.Errorf("PeerCASeparate %+v", c)
		}
		return nil
	})
	var stages []string
	framework.Eventually(t, "the members on the peer CA", 10*time.Minute, func() error {
		var got apiary.DataStore
		if err := e.C.Get(ctx, client.ObjectKey{Name: "trio"}, &got); err != nil {
			return err
		}
		c := meta.FindStatusCondition(got.Status.Conditions, apiary.ConditionPeerCASeparate)
		if c != nil && (len(stages) == 0 || stages[len(stages)-1] != c.Message) {
			stages = append(stages, c.Message)
			t.Logf("%s after the operator's start: PeerCASeparate=%s %s: %s", time.Since(start).Round(time.Second), c.Status, c.Reason, c.Message)
		}
		if c == nil || c.Status != metav1.ConditionTrue || c.Reason != controllers.ReasonPeerCASeparate {
			return fmt.Errorf("PeerCASeparate %+v", c)
		}
		if err := e.C.Get(ctx, stsKey, &sts); err != nil {
			return err
		}
		st := sts.Status
		if st.ObservedGeneration < sts.Generation || st.UpdatedReplicas != 3 || st.ReadyReplicas != 3 {
			return fmt.Errorf("StatefulSet rolling: %+v", st)
		}
		if ok, _ := peerAccepts(root); ok {
			return fmt.Errorf("the peer port still accepts the root client certificate")
		}
		return nil
	})
	took := time.Since(start)
	time.Sleep(2 * time.Second)
	stopPoll()
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	var evs eventsv1.EventList
	if err := e.C.List(ctx, &evs, client.InNamespace("default")); err != nil {
		t.Fatal(err)
	}
	restarts, moves := 0, 0
	for _, ev := range evs.Items {
		if ev.Regarding.Kind != "DataStore" || ev.Regarding.Name != "trio" || ev.EventTime.Time.Before(start) {
			continue
		}
		switch ev.Reason {
		case controllers.ReasonMemberRestart:
			restarts++
		case controllers.ReasonLeaderMoved:
			moves++
		}
	}
	t.Logf("FIGURE managed etcd of 3 members moved to the peer CA in %s (%d stages seen, %d member restarts, %d leadership moves); tenant writes every 250 ms: %d succeeded, %d failed, longest gap between successes %s",
		took.Round(time.Second), len(stages), restarts, moves, writes, failed, longest.Round(time.Millisecond))
	if failed > 0 || writes == 0 {
		t.Errorf("the tenant's writes failed %d times during the move: %s", failed, strings.Join(failures, "; "))
		t.Logf("members over time (pod: ready, leader):\n%s", strings.Join(timeline(), "\n"))
		e.logEtcdMembers(t)
	}
	if ok, err := peerAccepts(root); ok {
		t.Errorf("after the move the peer port still accepts the datastore's root client certificate (%v)", err)
	} else {
		t.Logf("after the move, the root client certificate at the peer port: %v", err)
	}
	if out, err := framework.KubectlErr(kc, "delete", "configmaps", "-n", "default", "--all"); err != nil {
		t.Logf("cleaning up: %v: %s", err, out)
	}
}

// logEtcdMembers logs what trio's members said that was not routine.
func (e *env) logEtcdMembers(t *testing.T) {
	for i := range 3 {
		pod := fmt.Sprintf("trio-etcd-%d", i)
		for _, previous := range []bool{false, true} {
			out, _ := framework.KubectlErr(e.Kubeconfig, "-n", framework.SystemNS, "logs", pod, fmt.Sprintf("--previous=%t", previous), "--tail=400")
			var keep []string
			for _, l := range strings.Split(out, "\n") {
				if strings.Contains(l, `"level":"warn"`) || strings.Contains(l, `"level":"error"`) || strings.Contains(l, "elected leader") || strings.Contains(l, "lost leader") || strings.Contains(l, "received signal") {
					keep = append(keep, l)
				}
			}
			t.Logf("%s (previous %t), %d notable lines:\n%s", pod, previous, len(keep), strings.Join(keep[max(0, len(keep)-40):], "\n"))
		}
	}
}

// sampleMembers records, every 500 ms until ctx ends, which of trio's
// members are ready and which leads (their metrics port, from this
// machine), as lines that change.
func (e *env) sampleMembers(t *testing.T, ctx context.Context) func() []string {
	var mu sync.Mutex
	var lines []string
	last := ""
	hc := &http.Client{Timeout: 400 * time.Millisecond}
	go func() {
		for ctx.Err() == nil {
			if line, _, err := e.trioMembers(ctx, hc); err == nil && line != last {
				last = line
				mu.Lock()
				lines = append(lines, time.Now().Format("15:04:05.0")+" "+last)
				mu.Unlock()
			}
			time.Sleep(500 * time.Millisecond)
		}
	}()
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(lines)
	}
}

// trioMembers reads trio's members once: a line of "ordinal=state(IP)"
// (state down, up, no-leader or LEADER, from each member's metrics port)
// and whether they are settled: every pod answers, one leads and the
// others follow it.
func (e *env) trioMembers(ctx context.Context, hc *http.Client) (line string, settled bool, err error) {
	var pods corev1.PodList
	if err := e.C.List(ctx, &pods, client.InNamespace(framework.SystemNS), client.MatchingLabels{managedetcd.LabelDataStore: "trio"}); err != nil {
		return "", false, err
	}
	slices.SortFunc(pods.Items, func(a, b corev1.Pod) int { return strings.Compare(a.Name, b.Name) })
	var b strings.Builder
	leaders, up := 0, 0
	for _, p := range pods.Items {
		state := "down"
		if p.Status.PodIP != "" {
			if resp, err := hc.Get("http://" + p.Status.PodIP + ":2381/metrics"); err == nil {
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				state = "up"
				if strings.Contains(string(body), "\netcd_server_is_leader 1") {
					state = "LEADER"
					leaders++
				} else if strings.Contains(string(body), "\netcd_server_has_leader 0") {
					state = "no-leader"
				} else {
					up++
				}
			}
		}
		fmt.Fprintf(&b, "%s=%s(%s) ", strings.TrimPrefix(p.Name, "trio-etcd-"), state, p.Status.PodIP)
	}
	return b.String(), len(pods.Items) > 0 && leaders == 1 && up == len(pods.Items)-1, nil
}
