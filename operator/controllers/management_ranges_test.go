package controllers

import (
	"context"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
)

func TestManagementRanges(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := networkingv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	node := func(name string, podCIDRs []string, addrs ...string) *corev1.Node {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.NodeSpec{PodCIDRs: podCIDRs}}
		for _, a := range addrs {
			n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: a})
		}
		n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeHostName, Address: name})
		return n
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(
		&networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: "kubernetes"}, Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{"10.96.0.0/12", "fd00:96::/108"}}},
		node("a", []string{"10.244.0.0/24", "fd00:244::/64"}, "192.0.2.10", "2001:db8::10"),
		node("b", []string{"10.244.1.0/24"}, "192.0.2.11"),
	).Build()
	got, podRanges, err := managementRanges(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"10.244.0.0/24", "10.244.1.0/24", "10.96.0.0/12", "192.0.2.10/32", "192.0.2.11/32", "2001:db8::10/128", "fd00:244::/64", "fd00:96::/108"}
	if !podRanges || !slices.Equal(got, want) {
		t.Fatalf("got %v (pod ranges %t), want %v", got, podRanges, want)
	}
	// A CNI that does not record node pod ranges: the policy can name
	// Services and nodes only, and the condition says what is missing.
	c = fake.NewClientBuilder().WithScheme(scheme).WithObjects(node("c", nil, "192.0.2.12")).Build()
	got, podRanges, err = managementRanges(context.Background(), c)
	if err != nil || podRanges || !slices.Equal(got, []string{"192.0.2.12/32"}) {
		t.Fatalf("got %v (pod ranges %t) %v", got, podRanges, err)
	}
	if ok, reason, msg := isolationCondition(false, got, podRanges); ok || reason != ReasonPodRangesUnknown || !strings.Contains(msg, "--management-cidrs") {
		t.Fatalf("condition %t %s %s", ok, reason, msg)
	}
	if ok, reason, _ := isolationCondition(true, []string{"10.0.0.0/8"}, true); !ok || reason != ReasonManagementRangesFlag {
		t.Fatalf("given ranges: %t %s", ok, reason)
	}
}
