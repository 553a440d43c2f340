//go:build integration

package controllers

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/apiaryhq/apiary/internal/testenv"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

// TestUpgradeLiftsOnlyItsOwnCordon drains two Nodes of a real API server
// for an upgrade, one schedulable and one its admin had cordoned, and ends
// the upgrade on both: only the cordon the upgrade made is lifted.
func TestUpgradeLiftsOnlyItsOwnCordon(t *testing.T) {
	_, cfg := testenv.Start(t, testenv.Options{})
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	for name, cordoned := range map[string]bool{"schedulable": false, "admin-cordoned": true} {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.NodeSpec{Unschedulable: cordoned}}
		if _, err := cs.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	r := &HostReconciler{}
	ta := &tenantAccess{cs: cs}
	marks := map[string]string{apiary.AnnotationCordonedForUpgrade: "v1.37.2"}
	for _, c := range []struct {
		node            string
		mark, cordoned  bool // after the drain
		lifted, stillOn bool // after the upgrade ends
	}{
		{node: "schedulable", mark: true, cordoned: true, lifted: true, stillOn: false},
		{node: "admin-cordoned", mark: false, cordoned: true, lifted: false, stillOn: true},
	} {
		// Twice: a drain pass runs again on every reconcile until the
		// Node is empty, and must not add a mark to its own cordon late.
		for range 2 {
			if remaining, err := r.drainOnce(ctx, ta, c.node, marks); err != nil || remaining != 0 {
				t.Fatalf("%s: drain: %d pods remain, %v", c.node, remaining, err)
			}
		}
		node, err := cs.CoreV1().Nodes().Get(ctx, c.node, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		_, marked := node.Annotations[apiary.AnnotationCordonedForUpgrade]
		if marked != c.mark || node.Spec.Unschedulable != c.cordoned {
			t.Errorf("%s after the drain: marked %v, cordoned %v; want %v, %v", c.node, marked, node.Spec.Unschedulable, c.mark, c.cordoned)
		}
		if lifted := liftUpgradeCordon(node); lifted != c.lifted {
			t.Errorf("%s: cordon lifted %v, want %v", c.node, lifted, c.lifted)
		} else if lifted {
			// The kubelet writes the Node between the read and the
			// lift: the write reports a stale read and changes nothing.
			fresh, err := cs.CoreV1().Nodes().Get(ctx, c.node, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			metav1.SetMetaDataLabel(&fresh.ObjectMeta, "written-by", "kubelet")
			if _, err := cs.CoreV1().Nodes().Update(ctx, fresh, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			if stale, err := writeLiftedCordon(ctx, cs, node); !stale || err != nil {
				t.Fatalf("%s: lift written over a newer Node: stale %v, %v; want stale", c.node, stale, err)
			}
			if n, err := cs.CoreV1().Nodes().Get(ctx, c.node, metav1.GetOptions{}); err != nil || !n.Spec.Unschedulable {
				t.Fatalf("%s: a stale lift uncordoned the Node (%v)", c.node, err)
			}
			node, err = cs.CoreV1().Nodes().Get(ctx, c.node, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if !liftUpgradeCordon(node) {
				t.Fatalf("%s: the mark is gone after a stale lift", c.node)
			}
			if stale, err := writeLiftedCordon(ctx, cs, node); stale || err != nil {
				t.Fatalf("%s: lift: stale %v, %v", c.node, stale, err)
			}
		}
		node, err = cs.CoreV1().Nodes().Get(ctx, c.node, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		_, marked = node.Annotations[apiary.AnnotationCordonedForUpgrade]
		if marked || node.Spec.Unschedulable != c.stillOn {
			t.Errorf("%s after the upgrade: marked %v, cordoned %v; want no mark, cordoned %v", c.node, marked, node.Spec.Unschedulable, c.stillOn)
		}
	}
}
