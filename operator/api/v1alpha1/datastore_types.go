package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
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

// ManagedEtcdStorage is where the members of a managed etcd keep their data.
type ManagedEtcdStorage struct {
	// Size of each member's PersistentVolumeClaim.
	// +optional
	Size *resource.Quantity `json:"size,omitempty"`
	// StorageClassName of the claims; empty uses the cluster's default class.
	// +optional
	StorageClassName *string `json:"storageClassName,omitempty"`
	// EmptyDir keeps the data in an emptyDir instead of a claim, for
	// clusters without a storage provisioner (development only: a member
	// whose pod is deleted loses its data, and a single member loses every
	// tenant's state; with several members the one whose pod was deleted
	// cannot rejoin and MembersReady stays False: Apiary does not replace
	// members yet).
	// +optional
	EmptyDir bool `json:"emptyDir,omitempty"`
}

// ManagedEtcd asks the operator to run the etcd of this DataStore.
type ManagedEtcd struct {
	// Replicas is the number of etcd members (an odd number for quorum).
	// A change scales the members one at a time: a new member joins as a
	// learner and votes once it has caught up; the highest ordinal leaves
	// first, after handing over the leadership. A DataStore with emptyDir
	// storage keeps its data only as long as its pods live.
	// +kubebuilder:validation:Enum=1;3;5;7
	// +kubebuilder:default=1
	// +optional
	Replicas int32 `json:"replicas,omitempty"`
	// Version of etcd (image registry.k8s.io/etcd:<version>-0).
	// +kubebuilder:validation:Pattern=`^3\.([6-9]|[1-9][0-9])\.[0-9]+$`
	// +kubebuilder:default="3.6.16"
	// +optional
	Version string `json:"version,omitempty"`
	// Namespace the etcd members and their Secrets live in (the Helm chart
	// sets its own namespace).
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.managed.namespace is immutable: the members' data lives there"
	Namespace string `json:"namespace"`
	// Storage of each member.
	// +optional
	Storage ManagedEtcdStorage `json:"storage,omitempty"`
	// Resources of each member's container.
	// +optional
	Resources corev1.ResourceRequirements `json:"resources,omitempty"`
}

// TenantQuota is a budget for one tenant's slice of a DataStore: its keys
// under its prefix, counted at their latest revision (what etcd keeps after
// compaction). An unset field is no limit.
type TenantQuota struct {
	// Bytes bounds the size of the tenant's keys and values.
	// +optional
	Bytes *resource.Quantity `json:"bytes,omitempty"`
	// Objects bounds the number of the tenant's keys (about one per
	// Kubernetes object).
	// +kubebuilder:validation:Minimum=1
	// +optional
	Objects *int64 `json:"objects,omitempty"`
}

// TenantQuotaPolicy is what a DataStore grants each tenant.
type TenantQuotaPolicy struct {
	// Default is each tenant's budget unless its spec.dataStoreQuota says
	// otherwise.
	// +optional
	Default TenantQuota `json:"default,omitempty"`
	// Max caps what a tenant's spec.dataStoreQuota may ask for (a field
	// unset here caps at Default's value); a tenant asking for more is held
	// to the cap, and its WithinQuota condition says so.
	// +optional
	Max *TenantQuota `json:"max,omitempty"`
}

// HostAccess makes a DataStore reachable from tenants' registered
// control-plane hosts, which run their kube-apiservers outside the
// management cluster. Each host still authenticates as its tenant's etcd
// user (client certificate), confined to its prefix.
type HostAccess struct {
	// Endpoints are the client URLs hosts dial, for an external DataStore
	// whose spec.endpoints are not reachable from hosts. Unset: the
	// spec.endpoints. Not allowed on a managed DataStore.
	// +kubebuilder:validation:items:Pattern=`^https://`
	// +listType=atomic
	// +optional
	Endpoints []string `json:"endpoints,omitempty"`
	// ServiceType of the Service that exposes a managed etcd's client port
	// (never its peer port) to hosts: LoadBalancer, the only type so far
	// (and the default). Its NetworkPolicy admits, on that port, only the
	// addresses of the joined control-plane Hosts of the tenants bound to the
	// DataStore.
	// +kubebuilder:validation:Enum=LoadBalancer
	// +optional
	ServiceType corev1.ServiceType `json:"serviceType,omitempty"`
	// Address asks for a fixed LoadBalancer IP (managed etcd).
	// +optional
	Address string `json:"address,omitempty"`
}

// DataStoreSpec describes a shared etcd that stores tenant control planes:
// either an existing one (endpoints and tls) or one the operator runs
// (managed).
// +kubebuilder:validation:XValidation:rule="has(self.managed) != (has(self.endpoints) || has(self.tls))",message="set either managed, or endpoints and tls, not both"
// +kubebuilder:validation:XValidation:rule="has(self.managed) || (has(self.endpoints) && has(self.tls))",message="an external DataStore needs both endpoints and tls"
// +kubebuilder:validation:XValidation:rule="has(self.managed) == has(oldSelf.managed)",message="a DataStore cannot switch between managed and external"
// +kubebuilder:validation:XValidation:rule="!has(self.managed) || !has(self.hostAccess) || !has(self.hostAccess.endpoints)",message="spec.hostAccess.endpoints is for external DataStores: a managed etcd is exposed through spec.hostAccess.serviceType"
// +kubebuilder:validation:XValidation:rule="has(self.managed) || !has(self.hostAccess) || (!has(self.hostAccess.serviceType) && !has(self.hostAccess.address))",message="spec.hostAccess.serviceType and address are for managed DataStores: an external one names its host endpoints in spec.hostAccess.endpoints"
type DataStoreSpec struct {
	// Endpoints are the etcd client URLs (https://host:port) of an external
	// etcd.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:items:Pattern=`^https://`
	// +optional
	Endpoints []string `json:"endpoints,omitempty"`
	// TLS is the material used to reach an external etcd and to issue tenant
	// credentials.
	// +optional
	TLS *DataStoreTLS `json:"tls,omitempty"`
	// Managed makes the operator run etcd for this DataStore: a StatefulSet
	// with peer and client TLS, authentication enabled, a headless Service
	// and a PodDisruptionBudget, compacting itself.
	// +optional
	Managed *ManagedEtcd `json:"managed,omitempty"`
	// TenantQuota bounds each tenant's share of this DataStore: the
	// operator measures every tenant's keys under its prefix and, while a
	// tenant is over its budget, its API server refuses creates and updates
	// (deletes still work) until usage is back under 95 % of it. Unset: no
	// per-tenant limit (only etcd's backend quota, shared by all).
	// +optional
	TenantQuota *TenantQuotaPolicy `json:"tenantQuota,omitempty"`
	// NamespaceSelector selects the namespaces whose tenants may use this
	// DataStore (named in spec.dataStore, or placed on it). Unset: every
	// namespace. A tenant of another namespace is refused by the webhook
	// and, if it got past it, by the controller (DataStoreReady False,
	// NamespaceNotAllowed).
	// +optional
	NamespaceSelector *metav1.LabelSelector `json:"namespaceSelector,omitempty"`
	// HostAccess lets registered-mode tenants' control-plane hosts reach
	// this DataStore. Unset: only control planes in the management cluster
	// reach it.
	// +optional
	HostAccess *HostAccess `json:"hostAccess,omitempty"`
}

// DataStoreStatus is the observed state of a DataStore.
type DataStoreStatus struct {
	// ObservedGeneration is the generation the status was computed from.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Conditions: Ready says whether etcd answers with auth enabled and the
	// root credentials work; MembersReady (managed etcd) whether every
	// member is ready.
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
	// Endpoints in use: the spec's, or those of the managed members.
	// +optional
	Endpoints []string `json:"endpoints,omitempty"`
	// ReadyMembers is the number of ready members of a managed etcd.
	// +optional
	ReadyMembers int32 `json:"readyMembers,omitempty"`
	// Members of a managed etcd as etcd lists them (not as the spec asks):
	// a scale or a replacement moves them one step at a time.
	// +listType=map
	// +listMapKey=name
	// +optional
	Members []EtcdMember `json:"members,omitempty"`
	// HostEndpoints are the client URLs tenants' control-plane hosts dial
	// (spec.hostAccess): empty while the DataStore is not reachable from
	// hosts (condition HostAccessReady says why).
	// +listType=atomic
	// +optional
	HostEndpoints []string `json:"hostEndpoints,omitempty"`
}

// EtcdMember is one member of a managed etcd.
type EtcdMember struct {
	// Name is the member's (its pod's) name.
	Name string `json:"name"`
	// ID is etcd's member ID in hex, as etcdctl prints it.
	ID string `json:"id"`
	// Learner: the member receives the log but does not vote yet, and
	// serves no client.
	// +optional
	Learner bool `json:"learner,omitempty"`
}

// DataStore is a shared etcd on which tenant control planes store their
// state, each under its own user, role and key prefix.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=ds
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`
// +kubebuilder:printcolumn:name="Tenants",type=integer,JSONPath=`.status.tenants`
// +kubebuilder:printcolumn:name="Managed",type=integer,JSONPath=`.spec.managed.replicas`,priority=1
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
