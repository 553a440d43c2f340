// Package v1alpha1 holds Apiary's API: TenantControlPlane and DataStore.
// +kubebuilder:object:generate=true
// +groupName=apiary.dev
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the API group and version of Apiary's resources.
	GroupVersion = schema.GroupVersion{Group: "apiary.dev", Version: "v1alpha1"}

	// SchemeBuilder registers the types of this package with a scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds the types of this package to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
