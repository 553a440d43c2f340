package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Mode says where a tenant's control plane runs.
// +kubebuilder:validation:Enum=standalone;registered
type Mode string

const (
	// ModeStandalone runs the control plane only as hosted pods; it never
	// registers Nodes in the tenant.
	ModeStandalone Mode = "standalone"
	// ModeRegistered runs the control plane on the tenant's own
	// control-plane Hosts, registered as tainted Nodes.
	ModeRegistered Mode = "registered"
)

// ComponentSpec customises one control-plane component.
type ComponentSpec struct {
	// ExtraArgs are added to the component's command line as --key=value, and
	// replace a default of the same key. Keys are flag names
	// (^[a-z0-9][a-z0-9-]*$). Flags that carry the tenant boundary cannot be
	// set: etcd-*, authentication-*, authorization-*, requestheader-*,
	// kubelet-*, tls-*, egress-selector-config-file, anonymous-auth,
	// admission plugin removals, listeners and every credential path Apiary
	// sets; values must not point into Apiary's mounts (/etc/kubernetes).
	// The controller re-checks this when the webhook is off.
	// +optional
	ExtraArgs map[string]string `json:"extraArgs,omitempty"`
	// Resources of the component's container. Unset requests get small
	// defaults so that many tenants fit a management cluster.
	// +optional
	Resources corev1.ResourceRequirements `json:"resources,omitempty"`
}

// NetworkSpec says how the tenant API is exposed and addressed.
type NetworkSpec struct {
	// ServiceType of the tenant API Service.
	// +kubebuilder:validation:Enum=LoadBalancer;NodePort;ClusterIP
	// +optional
	ServiceType corev1.ServiceType `json:"serviceType,omitempty"`
	// Address asks for a fixed IP: the LoadBalancer IP for LoadBalancer
	// Services, the node address clients use for NodePort Services.
	// +optional
	Address string `json:"address,omitempty"`
	// Port the tenant API listens on, in the pod and on the Service.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	// +optional
	Port int32 `json:"port,omitempty"`
	// CertSANs are extra DNS names or IPs in the API serving certificate.
	// +listType=set
	// +optional
	CertSANs []string `json:"certSANs,omitempty"`
	// PodCIDR is the tenant's cluster CIDR, from which nodes get pod ranges.
	// +optional
	PodCIDR string `json:"podCIDR,omitempty"`
	// ServiceCIDR is the tenant's Service IP range.
	// +optional
	ServiceCIDR string `json:"serviceCIDR,omitempty"`
	// DNSServiceIP is the cluster DNS Service IP, inside ServiceCIDR.
	// +optional
	DNSServiceIP string `json:"dnsServiceIP,omitempty"`
	// ClusterDomain is the tenant's DNS domain.
	// +optional
	ClusterDomain string `json:"clusterDomain,omitempty"`
}

// AddonSpec toggles an addon applied inside the tenant.
type AddonSpec struct {
	// Enabled turns the addon on (the default) or off.
	// +optional
	Enabled *bool `json:"enabled,omitempty"`
}

// AddonsSpec toggles the addons Apiary applies inside the tenant.
type AddonsSpec struct {
	// +optional
	CoreDNS AddonSpec `json:"coreDNS,omitempty"`
	// +optional
	KubeProxy AddonSpec `json:"kubeProxy,omitempty"`
	// +optional
	Konnectivity AddonSpec `json:"konnectivity,omitempty"`
}

// HostUpgradePolicy paces the upgrade of a tenant's joined Hosts.
type HostUpgradePolicy struct {
	// MaxParallel is how many joined Hosts are upgraded at once; 1 when
	// unset. A Host whose upgrade fails counts until it succeeds, so a
	// failure stops the rollout. A registered tenant's control-plane Hosts
	// leave its Service one at a time whatever this says.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	// +optional
	MaxParallel int32 `json:"maxParallel,omitempty"`
	// Paused holds the joined Hosts that have not started their upgrade at
	// the version they run (a Host already upgrading finishes). A kubelet
	// may be up to three minors older than the API server; the Hosts'
	// UpToDate condition and the tenant's HostsUpToDate say which lag.
	// +optional
	Paused bool `json:"paused,omitempty"`
}

// TenantControlPlaneSpec is the desired tenant control plane.
type TenantControlPlaneSpec struct {
	// Version of Kubernetes, vMAJOR.MINOR.PATCH. Upgrades go one minor at a
	// time; downgrades are refused.
	// +optional
	Version string `json:"version,omitempty"`
	// Mode: standalone (hosted pods only) or registered (control plane on the
	// tenant's own Hosts, registered as Nodes).
	// +optional
	Mode Mode `json:"mode,omitempty"`
	// Replicas of the control-plane Deployment.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=7
	// +optional
	Replicas *int32 `json:"replicas,omitempty"`
	// HostUpgrades says how the tenant's joined Hosts (workers, and a
	// registered tenant's control-plane Hosts) follow a version change,
	// once the control plane runs it: drained, upgraded and back Ready one
	// host (or maxParallel) at a time.
	// +optional
	HostUpgrades *HostUpgradePolicy `json:"hostUpgrades,omitempty"`
	// DataStore names the DataStore holding the tenant's state. Empty lets
	// placement choose one; the choice is recorded in status.dataStore and
	// cannot change afterwards.
	// +optional
	DataStore string `json:"dataStore,omitempty"`
	// DataStoreQuota overrides the DataStore's default tenant quota for
	// this tenant, within the DataStore's spec.tenantQuota.max.
	// +optional
	DataStoreQuota *TenantQuota `json:"dataStoreQuota,omitempty"`
	// +optional
	Network NetworkSpec `json:"network,omitempty"`
	// +optional
	APIServer ComponentSpec `json:"apiServer,omitempty"`
	// +optional
	ControllerManager ComponentSpec `json:"controllerManager,omitempty"`
	// +optional
	Scheduler ComponentSpec `json:"scheduler,omitempty"`
	// +optional
	Addons AddonsSpec `json:"addons,omitempty"`
	// Certificates: how long the tenant's certificates are valid and when
	// they are renewed.
	// +optional
	Certificates CertificatesSpec `json:"certificates,omitempty"`
	// Authentication adds token issuers (OpenID Connect) the tenant API
	// accepts; see docs/authentication.md.
	// +optional
	Authentication *AuthenticationSpec `json:"authentication,omitempty"`
}

// CertificatesSpec sets the lifetime of the tenant's leaf certificates
// (serving, client and kubeconfig certificates, and its DataStore client
// certificate). Certificate authorities are not affected.
type CertificatesSpec struct {
	// Validity of a leaf certificate when issued (default 8760h, one year,
	// as kubeadm). Between 2m and 87600h (minutes are for tests). Shortening it re-issues the
	// certificates that live longer; lengthening it applies at their next
	// renewal.
	// +optional
	Validity *metav1.Duration `json:"validity,omitempty"`
	// RenewBefore: a certificate is re-issued once less than this remains
	// of it (default 720h, 30 days, or a third of a shorter validity, at
	// least 1m), whether or not anything else changes.
	// At least 1m and at most half the validity. Certificates issued
	// together are renewed together, so the control plane rolls once.
	// +optional
	RenewBefore *metav1.Duration `json:"renewBefore,omitempty"`
}

// DataStoreBinding records where a tenant's state lives.
type DataStoreBinding struct {
	// Name of the DataStore.
	Name string `json:"name,omitempty"`
	// Prefix of the tenant's keys in etcd.
	Prefix string `json:"prefix,omitempty"`
	// User is the tenant's etcd user (and role).
	User string `json:"user,omitempty"`
	// Usage is what the tenant stores under its prefix, as last measured.
	// +optional
	Usage *DataStoreUsage `json:"usage,omitempty"`
}

// DataStoreUsage is a tenant's measured share of its DataStore and the
// budget it is held to.
type DataStoreUsage struct {
	// Bytes of the tenant's keys and values.
	Bytes int64 `json:"bytes"`
	// Objects is the number of the tenant's keys.
	Objects int64 `json:"objects"`
	// Quota is the budget in force (the DataStore's default, or the
	// tenant's override within the DataStore's max); empty: no limit.
	// +optional
	Quota TenantQuota `json:"quota,omitempty"`
}

// CertificateStatus records one issued certificate.
type CertificateStatus struct {
	// Name of the certificate (ca, apiserver, ...).
	Name string `json:"name"`
	// Secret holding it.
	Secret string `json:"secret"`
	// NotAfter is when it expires.
	NotAfter metav1.Time `json:"notAfter"`
	// RenewAt is when it is re-issued (certificate authorities: empty,
	// they are not renewed on a timer).
	// +optional
	RenewAt *metav1.Time `json:"renewAt,omitempty"`
}

// CertificateRotation records a rotation of the leaf certificates asked
// for with the apiary.dev/rotate-certificates annotation.
type CertificateRotation struct {
	// Token is the annotation's value this rotation answers.
	Token string `json:"token"`
	// Requested is when the operator saw it: every leaf issued before is
	// re-issued.
	Requested metav1.Time `json:"requested"`
	// Completed is when every leaf had been re-issued.
	// +optional
	Completed *metav1.Time `json:"completed,omitempty"`
}

// Phases of a CA rotation, in the order they run.
const (
	// CARotationTrustNew: a new CA exists and everything that verifies a
	// certificate of the tenant (API servers, kubeconfigs, kubelets,
	// cluster-info, the pods' kube-root-ca.crt, konnectivity agents)
	// learns to trust it alongside the old one, which still issues.
	CARotationTrustNew = "TrustNew"
	// CARotationReissue: the new CA issues; every leaf certificate is
	// re-issued, the control plane rolls, then each Host's kubelet gets new
	// client and serving certificates through CSRs. Both CAs are trusted.
	CARotationReissue = "Reissue"
	// CARotationDropOld: only the new CA is trusted; the old one's
	// certificates are refused everywhere once this phase ends.
	CARotationDropOld = "DropOld"
	// CARotationCompleted: the old CA is gone.
	CARotationCompleted = "Completed"
)

// CARotation records a rotation of the tenant's cluster CA.
type CARotation struct {
	// Token is the apiary.dev/rotate-ca annotation's value this rotation
	// answers.
	Token string `json:"token"`
	// Requested is when the operator started it.
	Requested metav1.Time `json:"requested"`
	// Phase is where it is (TrustNew, Reissue, DropOld; Completed).
	Phase string `json:"phase"`
	// PhaseStarted is when the phase began.
	PhaseStarted metav1.Time `json:"phaseStarted"`
	// Message says what the phase waits for.
	// +optional
	Message string `json:"message,omitempty"`
	// Trust is the fingerprint of the CA bundle everything trusts now
	// (the tenant's ca-trust Secret): each Host trusts it once its
	// status.ca.trust says so.
	// +optional
	Trust string `json:"trust,omitempty"`
	// KubeletIssuer is the fingerprint of the CA the Hosts' kubelets must
	// hold client certificates of, set in the Reissue phase once the
	// control plane signs with the new CA.
	// +optional
	KubeletIssuer string `json:"kubeletIssuer,omitempty"`
	// AddonsTrust is the fingerprint of the CA bundle the tenant's addon
	// pods (konnectivity-agent, kube-proxy, CoreDNS) were restarted to
	// read: they read it once, at start, from kube-root-ca.crt, so they
	// restart each time the tenant publishes a new one.
	// +optional
	AddonsTrust string `json:"addonsTrust,omitempty"`
	// Completed is when the old CA stopped being trusted anywhere.
	// +optional
	Completed *metav1.Time `json:"completed,omitempty"`
}

// TenantControlPlaneStatus is the observed state of a tenant control plane.
type TenantControlPlaneStatus struct {
	// ObservedGeneration is the generation the status was computed from.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Conditions: DataStoreReady, CertificatesReady, EndpointReady,
	// ControlPlaneAvailable, TenantBootstrapped (the kubeadm bootstrap and
	// addons applied inside the tenant), ModeSwitched (spec.mode is in
	// effect, no switch running) and Ready (all of them, and the tenant
	// API answering through its endpoint).
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// Phase summarises the conditions: Provisioning, Ready, NotReady or
	// Deleting.
	// +optional
	Phase Phase `json:"phase,omitempty"`
	// FirstReady is when the tenant was first Ready; set once.
	// +optional
	FirstReady *metav1.Time `json:"firstReady,omitempty"`
	// Version running (the version of the available control-plane pods).
	// +optional
	Version string `json:"version,omitempty"`
	// Mode in effect.
	// +optional
	Mode Mode `json:"mode,omitempty"`
	// Endpoint is the tenant API URL clients use.
	// +optional
	Endpoint string `json:"endpoint,omitempty"`
	// KubeconfigSecret names the Secret with the admin kubeconfig.
	// +optional
	KubeconfigSecret string `json:"kubeconfigSecret,omitempty"`
	// Replicas is the number of control-plane pods.
	// +optional
	Replicas int32 `json:"replicas,omitempty"`
	// ReadyReplicas is the number of ready control-plane pods.
	// +optional
	ReadyReplicas int32 `json:"readyReplicas,omitempty"`
	// Selector of the control-plane pods, for the scale subresource.
	// +optional
	Selector string `json:"selector,omitempty"`
	// DataStore binding of the tenant.
	// +optional
	DataStore DataStoreBinding `json:"dataStore,omitempty"`
	// AdminBindingCreated records that the bootstrap created the
	// kubeadm:cluster-admins ClusterRoleBinding inside the tenant; it is
	// never created again, so deleting it revokes the exported admin
	// kubeconfigs for good.
	// +optional
	AdminBindingCreated bool `json:"adminBindingCreated,omitempty"`
	// Certificates issued for the tenant, with their expiry.
	// +listType=map
	// +listMapKey=name
	// +optional
	Certificates []CertificateStatus `json:"certificates,omitempty"`
	// CertificateRotation is the last rotation asked for with the
	// apiary.dev/rotate-certificates annotation.
	// +optional
	CertificateRotation *CertificateRotation `json:"certificateRotation,omitempty"`
	// CARotation is the last rotation of the cluster CA asked for with
	// the apiary.dev/rotate-ca annotation (kept once completed, replaced
	// by the next one).
	// +optional
	CARotation *CARotation `json:"caRotation,omitempty"`
	// ModeSwitch is the journal of the last switch between modes (kept
	// once completed, replaced by the next one).
	// +optional
	ModeSwitch *ModeSwitchStatus `json:"modeSwitch,omitempty"`
	// ControlPlaneHosts are the Hosts that run, or are being brought to or
	// from running, the tenant's control plane as static Pods, each with
	// the last step taken on it. Every step is recorded here before the
	// host is touched, so a restarted operator resumes it.
	// +listType=map
	// +listMapKey=host
	// +optional
	ControlPlaneHosts []ControlPlaneHostStatus `json:"controlPlaneHosts,omitempty"`
}

// Phases of a mode switch, in the order they run.
const (
	// SwitchStartingHosts (to registered): one host at a time, the control
	// plane is written to each control-plane Host and, once its
	// kube-apiserver answers /readyz, the host joins the tenant Service.
	SwitchStartingHosts = "StartingHosts"
	// SwitchScalingDown (to registered): the Deployment scales to zero;
	// each pod leaves the Service as it terminates, and serves what it
	// already has meanwhile.
	SwitchScalingDown = "ScalingDown"
	// SwitchScalingUp (to standalone): the Deployment comes back and
	// waits until every replica is ready.
	SwitchScalingUp = "ScalingUp"
	// SwitchHandingBack (to standalone): the hosted pods rejoin the
	// tenant Service.
	SwitchHandingBack = "HandingBack"
	// SwitchStoppingHosts (to standalone): one host at a time leaves the
	// Service, drains, and its static Pods and files are removed.
	SwitchStoppingHosts = "StoppingHosts"
	// SwitchCompleted: the target mode is in effect (status.mode).
	SwitchCompleted = "Completed"
)

// ModeSwitchStatus records a switch between standalone and registered.
type ModeSwitchStatus struct {
	// Target is the mode switched to.
	Target Mode `json:"target"`
	// From is the mode in effect when the switch started.
	From Mode `json:"from"`
	// Started is when the switch began.
	Started metav1.Time `json:"started"`
	// Phase is where the switch is (StartingHosts, ScalingDown; ScalingUp, HandingBack, StoppingHosts; Completed).
	Phase string `json:"phase"`
	// PhaseStarted is when the phase began.
	PhaseStarted metav1.Time `json:"phaseStarted"`
	// Finished is when the switch completed.
	// +optional
	Finished *metav1.Time `json:"finished,omitempty"`
	// Reversed counts the times spec.mode changed back mid-switch.
	// +optional
	Reversed int32 `json:"reversed,omitempty"`
}

// Steps of a control-plane Host.
const (
	// HostStepStart writes the control plane to the host and waits until
	// its kube-apiserver answers; the host then serves.
	HostStepStart = "start"
	// HostStepUpdate takes a serving host out of the Service, rewrites
	// what changed (renewed credentials, a new version) and brings it back.
	HostStepUpdate = "update"
	// HostStepKubelet takes a serving host out of the Service while its
	// Host upgrades the kubelet (a new kubelet may restart the static
	// Pods), and brings it back once it answers again.
	HostStepKubelet = "kubelet"
	// HostStepStop takes the host out of the Service, lets connections
	// drain and removes its static Pods and files.
	HostStepStop = "stop"
)

// ControlPlaneHostStatus is the last step taken on one control-plane host.
type ControlPlaneHostStatus struct {
	// Host is the Host's name.
	Host string `json:"host"`
	// Address the host serves at (the Host's spec.address when the step
	// began).
	Address string `json:"address"`
	// Step: start, update, kubelet or stop.
	Step string `json:"step"`
	// Result: Running (recorded before the host is touched), Succeeded or
	// Failed.
	Result string `json:"result"`
	// Started is when the step last began.
	Started metav1.Time `json:"started"`
	// Finished is when it ended; unset while it runs.
	// +optional
	Finished *metav1.Time `json:"finished,omitempty"`
	// Attempts counts the tries of this step.
	// +optional
	Attempts int32 `json:"attempts,omitempty"`
	// Message says what happened, or why it failed.
	// +optional
	Message string `json:"message,omitempty"`
	// Serving: the host is in the tenant Service (its kube-apiserver
	// answered /readyz when last probed).
	// +optional
	Serving bool `json:"serving,omitempty"`
	// ConfigHash identifies the files and manifests last written.
	// +optional
	ConfigHash string `json:"configHash,omitempty"`
}

// Phase summarises a TenantControlPlane's conditions.
type Phase string

const (
	PhaseProvisioning Phase = "Provisioning"
	PhaseReady        Phase = "Ready"
	PhaseNotReady     Phase = "NotReady"
	PhaseDeleting     Phase = "Deleting"
)

// Condition types of a TenantControlPlane. Ready is also used by DataStore.
const (
	ConditionDataStoreReady        = "DataStoreReady"
	ConditionCertificatesReady     = "CertificatesReady"
	ConditionEndpointReady         = "EndpointReady"
	ConditionControlPlaneAvailable = "ControlPlaneAvailable"
	// ConditionTenantBootstrapped: the kubeadm-compatible bootstrap and the
	// enabled addons are applied inside the tenant.
	ConditionTenantBootstrapped = "TenantBootstrapped"
	// ConditionWithinQuota: the tenant stores no more than its DataStore
	// quota allows. False (QuotaExceeded) while its API server refuses
	// creates and updates.
	ConditionWithinQuota = "WithinQuota"
	// ConditionNetworkIsolated: the tenant's NetworkPolicy keeps its
	// control plane from the management cluster's pods, Services and
	// nodes (but for DNS and its DataStore). False when the operator does
	// not know the pod ranges, or applies no policies.
	ConditionNetworkIsolated = "NetworkIsolated"
	ConditionReady           = "Ready"
	// ConditionModeSwitched: status.mode is spec.mode and no switch is in
	// progress. False while one runs (the reason is its phase) or when it
	// stopped (the reason says why, the message names host and step).
	ConditionModeSwitched = "ModeSwitched"
	// ConditionVersionRolledOut: the control plane runs spec.version
	// (status.version). False while an upgrade rolls (reason Upgrading),
	// when it stopped (ImagePullFailed, NewVersionFailing: the message
	// names pod, container and error; the tenant keeps serving on the old
	// version) or while a mode switch holds it (HeldForModeSwitch).
	ConditionVersionRolledOut = "VersionRolledOut"
	// ConditionHostsUpToDate: every joined Host runs the version
	// the control plane runs; False names the Hosts that lag and why.
	ConditionHostsUpToDate = "HostsUpToDate"

	// ConditionMembersReady is a managed DataStore's: every etcd member ready.
	ConditionMembersReady = "MembersReady"
	// ConditionMembersUpdated is a managed DataStore's: every etcd member
	// runs the current configuration (False while the operator restarts
	// them one at a time).
	ConditionMembersUpdated = "MembersUpdated"
	// ConditionPeerCASeparate is a managed DataStore's: the peer port
	// trusts only the peer CA, which signs nothing but member certificates.
	ConditionPeerCASeparate = "PeerCASeparate"
	// ConditionPeerPortClosed is an external DataStore's: every member's
	// peer port refused a certificate of the DataStore's CA made like a
	// tenant's (the operator probes it), so no tenant can speak raft.
	ConditionPeerPortClosed = "PeerPortClosed"
	// ConditionHostAccessReady is a DataStore's: registered-mode hosts can
	// reach it at status.hostEndpoints (spec.hostAccess set, its Service
	// has an address, the serving certificate names it).
	ConditionHostAccessReady = "HostAccessReady"
	// ConditionSpaceAvailable is a DataStore's: no etcd member has raised
	// NOSPACE, so tenants can write.
	ConditionSpaceAvailable = "SpaceAvailable"
)

// TenantControlPlane is a Kubernetes control plane hosted for a tenant.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:subresource:scale:specpath=.spec.replicas,statuspath=.status.replicas,selectorpath=.status.selector
// +kubebuilder:resource:shortName=tcp
// +kubebuilder:validation:XValidation:rule="self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$') && size(self.metadata.name) <= 63",message="metadata.name must be a DNS-1035 label: at most 63 lower-case letters, digits and '-', starting with a letter and ending with a letter or digit (it names the tenant's Service)"
// +kubebuilder:printcolumn:name="Version",type=string,JSONPath=`.spec.version`
// +kubebuilder:printcolumn:name="Mode",type=string,JSONPath=`.status.mode`
// +kubebuilder:printcolumn:name="Switch",type=string,JSONPath=`.status.conditions[?(@.type=="ModeSwitched")].reason`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Endpoint",type=string,JSONPath=`.status.endpoint`
// +kubebuilder:printcolumn:name="DataStore",type=string,JSONPath=`.status.dataStore.name`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type TenantControlPlane struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   TenantControlPlaneSpec   `json:"spec,omitempty"`
	Status TenantControlPlaneStatus `json:"status,omitempty"`
}

// TenantControlPlaneList is a list of TenantControlPlanes.
// +kubebuilder:object:root=true
type TenantControlPlaneList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []TenantControlPlane `json:"items"`
}

func init() {
	SchemeBuilder.Register(&TenantControlPlane{}, &TenantControlPlaneList{})
}
