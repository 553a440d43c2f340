package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// HostRole is what a Host becomes in its tenant.
// +kubebuilder:validation:Enum=worker;control-plane
type HostRole string

const (
	HostRoleWorker       HostRole = "worker"
	HostRoleControlPlane HostRole = "control-plane"
)

// HostPhase summarises where a Host is in its lifecycle.
type HostPhase string

const (
	HostPhasePending    HostPhase = "Pending"
	HostPhasePreflight  HostPhase = "Preflight"
	HostPhaseInstalling HostPhase = "Installing"
	HostPhaseJoining    HostPhase = "Joining"
	HostPhaseReady      HostPhase = "Ready"
	// HostPhaseStandby: a control-plane Host of a standalone tenant,
	// installed but not joined (a standalone tenant has no control-plane
	// Nodes). It joins when its tenant switches to registered, and leaves
	// again (Node deleted, kubeadm reset, software kept) once the switch
	// back has taken the control plane off it.
	HostPhaseStandby HostPhase = "Standby"
	// HostPhaseUpgrading: a joined worker moves to the version its
	// tenant's control plane runs (journal steps upgrade-*).
	HostPhaseUpgrading HostPhase = "Upgrading"
	HostPhaseDraining  HostPhase = "Draining"
	HostPhaseResetting HostPhase = "Resetting"
	HostPhaseFailed    HostPhase = "Failed"
)

// Condition types of a Host.
const (
	// HostConditionReachable: SSH connects to the pinned host key and
	// authenticates.
	HostConditionReachable = "Reachable"
	// HostConditionPreflightPassed: the host can run a kubelet (systemd,
	// containerd with CRI v1, no swap, kernel modules, free ports, no
	// other kubelet).
	HostConditionPreflightPassed = "PreflightPassed"
	// HostConditionInstalled: the node bundle of the tenant's version is
	// installed (kubelet, kubeadm, kubectl, CNI plugins, kubelet unit).
	HostConditionInstalled = "Installed"
	// HostConditionJoined: kubeadm join made the host a Node of the tenant.
	HostConditionJoined = "Joined"
	// HostConditionNodeReady mirrors the Node's Ready condition.
	HostConditionNodeReady = "NodeReady"
	// HostConditionUpToDate: the node software runs the version of the
	// tenant's control plane (status.version); False says why not yet.
	HostConditionUpToDate = "UpToDate"
	// HostConditionCAUpToDate: the host trusts its tenant's CA bundle and
	// its kubelet holds certificates of the tenant's CA; False while a CA
	// rotation moves it, or says which step failed.
	HostConditionCAUpToDate = "CAUpToDate"
)

// SSHPrivateKeyKey is the key of the private key in a Host's SSH key Secret
// (as in Secrets of type kubernetes.io/ssh-auth).
const SSHPrivateKeyKey = corev1.SSHAuthPrivateKey

// HostSpec is a machine that the SSH host agent joins to a tenant.
// +kubebuilder:validation:XValidation:rule="has(self.hostKey) != (has(self.insecureSkipHostKeyCheck) && self.insecureSkipHostKeyCheck)",message="spec.hostKey: set the host's pinned public key, or set insecureSkipHostKeyCheck: true (labs only), but not both"
type HostSpec struct {
	// TenantControlPlane names the tenant, in the Host's namespace, that
	// the host joins.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.tenantControlPlane is immutable: remove the Host and add it to the other tenant"
	TenantControlPlane string `json:"tenantControlPlane"`
	// Address is the host's IP address or DNS name for SSH.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.address is immutable: remove the Host and add it again"
	Address string `json:"address"`
	// Port of sshd; 22 when unset.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	// +optional
	Port int32 `json:"port,omitempty"`
	// User to log in as; root when unset. Other users need passwordless
	// sudo.
	// +optional
	User string `json:"user,omitempty"`
	// SSHKeySecretRef names a Secret in the Host's namespace whose
	// "ssh-privatekey" key holds the private key (type kubernetes.io/ssh-auth).
	SSHKeySecretRef corev1.LocalObjectReference `json:"sshKeySecretRef"`
	// HostKey is the host's public key in authorized_keys format
	// ("ssh-ed25519 AAAA..."). The agent refuses any other key: a
	// mismatch fails closed.
	// +optional
	HostKey string `json:"hostKey,omitempty"`
	// InsecureSkipHostKeyCheck accepts any host key (labs only); status
	// shows it.
	// +optional
	InsecureSkipHostKeyCheck bool `json:"insecureSkipHostKeyCheck,omitempty"`
	// Role in the tenant: worker, or control-plane (the control plane
	// runs there as static Pods while the tenant is registered; while it
	// is standalone the host is installed but not joined: phase Standby).
	// +kubebuilder:default=worker
	// +optional
	Role HostRole `json:"role,omitempty"`
	// Labels for the Node.
	// +optional
	Labels map[string]string `json:"labels,omitempty"`
	// Taints for the Node.
	// +optional
	Taints []corev1.Taint `json:"taints,omitempty"`
}

// HostFacts are what preflight observed on the host.
type HostFacts struct {
	OS                      string `json:"os,omitempty"`
	Arch                    string `json:"arch,omitempty"`
	Kernel                  string `json:"kernel,omitempty"`
	ContainerRuntime        string `json:"containerRuntime,omitempty"`
	ContainerRuntimeVersion string `json:"containerRuntimeVersion,omitempty"`
}

// Results of a journal step (HostStep.Result).
const (
	HostStepPending   = "Pending"
	HostStepRunning   = "Running"
	HostStepSucceeded = "Succeeded"
	HostStepFailed    = "Failed"
)

// HostStep is one entry of a Host's journal: every step the agent takes on
// the host is recorded so that it resumes, not repeats, after a restart.
type HostStep struct {
	// Name of the step (preflight, install, join, upgrade-drain,
	// upgrade-install, upgrade-node, upgrade-ready, leave, drain, reset).
	Name string `json:"name"`
	// Started is when the step last began.
	Started metav1.Time `json:"started"`
	// Finished is when it ended; unset while it runs.
	// +optional
	Finished *metav1.Time `json:"finished,omitempty"`
	// Result: Running (journaled before the agent touches the host, so a
	// restarted operator resumes it), Succeeded, Failed, or Pending (to be
	// run again after a spec change).
	Result string `json:"result"`
	// Message says what happened, or why it failed.
	// +optional
	Message string `json:"message,omitempty"`
	// Attempts counts the tries of this step.
	// +optional
	Attempts int32 `json:"attempts,omitempty"`
}

// HostStatus is what the agent observed and did.
type HostStatus struct {
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// +optional
	Phase HostPhase `json:"phase,omitempty"`
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// HostKeyCheck is "pinned" or "skipped (insecureSkipHostKeyCheck)".
	// +optional
	HostKeyCheck string `json:"hostKeyCheck,omitempty"`
	// NodeName and NodeUID identify the Node the host became.
	// +optional
	NodeName string `json:"nodeName,omitempty"`
	// +optional
	NodeUID string `json:"nodeUID,omitempty"`
	// BootstrapTokenID is the tenant bootstrap token made for this host's
	// join, recorded before the token is created so that a restarted
	// operator reuses it and deletes it afterwards: never a second token.
	// +optional
	BootstrapTokenID string `json:"bootstrapTokenID,omitempty"`
	// Version is the Kubernetes version of the node software installed
	// (kubelet, kubeadm).
	// +optional
	Version string `json:"version,omitempty"`
	// UpgradingTo is the version an upgrade under way moves the host to,
	// recorded before it starts; empty when none is.
	// +optional
	UpgradingTo string `json:"upgradingTo,omitempty"`
	// CA is what the host's kubelet holds of its tenant's cluster CA, as
	// last written by the operator: the CA rotation moves on once every
	// joined Host has caught up.
	// +optional
	CA *HostCA `json:"ca,omitempty"`
	// +optional
	Facts *HostFacts `json:"facts,omitempty"`
	// Journal of the steps taken on the host, oldest first.
	// +listType=map
	// +listMapKey=name
	// +optional
	Journal []HostStep `json:"journal,omitempty"`
}

// HostCA is what a joined host trusts and holds of its tenant's CA.
type HostCA struct {
	// Trust is the fingerprint of the CA bundle in the host's
	// /etc/kubernetes/pki/ca.crt and kubelet kubeconfig.
	// +optional
	Trust string `json:"trust,omitempty"`
	// KubeletIssuer is the fingerprint of the CA that signed the kubelet's
	// client certificate.
	// +optional
	KubeletIssuer string `json:"kubeletIssuer,omitempty"`
}

// Host is a machine reachable over SSH that the operator prepares and joins
// to a tenant as a Node.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Tenant",type=string,JSONPath=`.spec.tenantControlPlane`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.status.nodeName`
// +kubebuilder:printcolumn:name="Address",type=string,JSONPath=`.spec.address`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Host struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   HostSpec   `json:"spec,omitempty"`
	Status HostStatus `json:"status,omitempty"`
}

// HostList is a list of Hosts.
// +kubebuilder:object:root=true
type HostList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Host `json:"items"`
}

func init() {
	SchemeBuilder.Register(&Host{}, &HostList{})
}
