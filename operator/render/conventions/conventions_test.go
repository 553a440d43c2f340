package conventions

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

func TestFlags(t *testing.T) {
	got := Flags(
		map[string]string{"b": "1", "a": "2", FlagFeatureGates: "X=false"},
		map[string]string{"a": "3", FlagFeatureGates: "Y=true"},
	)
	want := []string{"--a=3", "--b=1", "--feature-gates=Y=true,X=false"}
	if !slices.Equal(got, want) {
		t.Errorf("Flags: %v, want %v", got, want)
	}
}

// The spec's requests replace the defaults one resource at a time, and
// neither is changed.
func TestResources(t *testing.T) {
	defaults := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("5m"), corev1.ResourceMemory: resource.MustParse("32Mi")}
	spec := corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi")},
		Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("2Gi")},
	}
	r := Resources(defaults, spec)
	if cpu, mem := (*r.Requests)[corev1.ResourceCPU], (*r.Requests)[corev1.ResourceMemory]; cpu.String() != "5m" || mem.String() != "1Gi" {
		t.Errorf("requests %v", *r.Requests)
	}
	if mem := (*r.Limits)[corev1.ResourceMemory]; mem.String() != "2Gi" {
		t.Errorf("limits %v", *r.Limits)
	}
	if mem := defaults[corev1.ResourceMemory]; mem.String() != "32Mi" {
		t.Errorf("defaults changed: %v", defaults)
	}
	if r := Resources(defaults, corev1.ResourceRequirements{}); r.Limits != nil {
		t.Errorf("limits without a spec: %v", *r.Limits)
	}
}
