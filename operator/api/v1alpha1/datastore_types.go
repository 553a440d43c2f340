package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// SecretReference names a Secret in a given namespace.
type SecretReference struct {
	// Name of the Secret.
	// +kubebuilder:validation:MinLength=1
	Name string `json:"name"`
	// Namespace of the Secret.
	// +kubebuilder:validation:MinLength=1
	Namespace string `json:"namespace"`
}

// DataStoreTLS holds the TLS material Apiary uses to administer an etcd.
type DataStoreTLS struct {
	// CASecretRef names a kubernetes.io/tls Secret holding the etcd CA:
	// tls.crt verifies the etcd servers, and tls.key signs the client
	// certificate of each tenant (etcd maps its common name to the user).
	CASecretRef SecretReference `json:"caSecretRef"`
	// ClientSecretRef names a kubernetes.io/tls Secret holding the client
	// certificate of etcd's root user (tls.crt, tls.key), used to create and
	// remove tenant users, roles and keys.
	ClientSecretRef SecretReference `json:"clientSecretRef"`
}

// DataStoreSpec describes a shared etcd that stores tenant control planes.
type DataStoreSpec struct {
	// Endpoints are the etcd client URLs (https://host:port).
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:items:Pattern=`^https://`
	Endpoints []string `json:"endpoints"`
	// TLS is the material used to reach etcd and to issue tenant credentials.
	TLS DataStoreTLS `json:"tls"`
}

// DataStoreStatus is the observed state of a DataStore.
type DataStoreStatus struct {
	// ObservedGeneration is the generation the status was computed from.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Conditions: Ready says whether etcd answers with auth enabled and the
	// root credentials work.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// Tenants is the number of tenant control planes bound to this DataStore.
	// +optional
	Tenants int32 `json:"tenants"`
	// UsedBy lists the bound tenants as namespace/name, sorted.
	// +listType=set
	// +optional
	UsedBy []string `json:"usedBy,omitempty"`
}

// DataStore is a shared etcd on which tenant control planes store their
// state, each under its own user, role and key prefix.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=ds
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`
// +kubebuilder:printcolumn:name="Tenants",type=integer,JSONPath=`.status.tenants`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type DataStore struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   DataStoreSpec   `json:"spec"`
	Status DataStoreStatus `json:"status,omitempty"`
}

// DataStoreList is a list of DataStores.
// +kubebuilder:object:root=true
type DataStoreList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []DataStore `json:"items"`
}

func init() {
	SchemeBuilder.Register(&DataStore{}, &DataStoreList{})
}
