// Package managedetcd renders the etcd of a DataStore with spec.managed: a
// StatefulSet of members that find each other through a headless Service,
// with client and peer TLS, authentication enabled by the operator once
// they form a cluster, and periodic compaction (tenants never compact: they
// have no root access). It also names its Secrets and the certificates in
// them, which the operator's credentials issuer writes.
//
// Like operator/render, these are pure functions pinned by golden files in
// testdata/. A managed etcd is not a tenant: it belongs to a DataStore and
// serves many tenants, so it has its own package; what it shares with a
// tenant's objects (labels, Secret kinds and keys, the flag format, pod
// hardening) is in operator/render/conventions. operator/render imports
// this package for the tenant's side of the boundary (its NetworkPolicy
// reaches the members' client port), never the other way round.
package managedetcd

import (
	"crypto/x509"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	appsv1ac "k8s.io/client-go/applyconfigurations/apps/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"
	policyv1ac "k8s.io/client-go/applyconfigurations/policy/v1"
	"k8s.io/utils/ptr"

	"github.com/apiaryhq/apiary/images"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/operator/render/conventions"
	"github.com/apiaryhq/apiary/pki"
)

const (
	// LabelDataStore names the DataStore a managed etcd object belongs to.
	LabelDataStore = "apiary.dev/datastore"
	component      = "etcd"

	// Ports of a member: tenants' API servers and the operator use the
	// client port, members the peer port, monitoring the metrics port.
	ClientPort  = 2379
	PeerPort    = 2380
	MetricsPort = 2381

	pkiDir  = "/etc/etcd/pki"
	dataDir = "/var/lib/etcd"

	// RootUser is the etcd user the operator administers etcd as.
	RootUser = "root"
)

// SecretKind names a managed etcd's Secret.
type SecretKind = conventions.SecretKind

// Secret kinds of a managed etcd; the Secret's name is "<datastore>-<kind>".
const (
	SecretCA     SecretKind = "etcd-ca"
	SecretServer SecretKind = "etcd-server"
	SecretPeer   SecretKind = "etcd-peer"
	SecretRoot   SecretKind = "etcd-root"
	// SecretPeerCA signs only peer certificates: the client port's CA
	// (SecretCA), which signs every tenant's client certificate, is not
	// trusted on the peer port.
	SecretPeerCA SecretKind = "etcd-peer-ca"
	// SecretPeerTrust holds the CA bundle the peer port trusts (key
	// ca.crt): the peer CA, and the client CA too while an older DataStore
	// moves its members to the peer CA.
	SecretPeerTrust SecretKind = "etcd-peer-trust"
)

// SecretKinds are every Secret of a managed etcd.
var SecretKinds = []SecretKind{SecretCA, SecretPeerCA, SecretServer, SecretPeer, SecretPeerTrust, SecretRoot}

// MountedSecrets are the Secrets the members mount (the CAs' keys stay
// with the operator).
var MountedSecrets = []SecretKind{SecretCA, SecretServer, SecretPeer, SecretPeerTrust}

// PeerCN is the common name of every peer certificate; members accept no
// other on the peer port (--peer-cert-allowed-cn).
const PeerCN = "etcd-peer"

// Name names the StatefulSet, its headless Service and PDB.
func Name(ds *apiary.DataStore) string { return ds.Name + "-etcd" }

// SecretName is the name of a managed etcd's Secret.
func SecretName(ds *apiary.DataStore, kind SecretKind) string {
	return ds.Name + "-" + string(kind)
}

// Labels are on every object of a managed etcd.
func Labels(ds *apiary.DataStore) map[string]string {
	return map[string]string{LabelDataStore: ds.Name, conventions.LabelManagedBy: conventions.ManagedBy, conventions.LabelComponent: component}
}

// Selector selects the pods of a managed etcd.
func Selector(ds *apiary.DataStore) map[string]string {
	return map[string]string{LabelDataStore: ds.Name, conventions.LabelComponent: component}
}

// memberDomain is the DNS suffix of the members: <pod>.<domain>.
func memberDomain(ds *apiary.DataStore, clusterDomain string) string {
	return fmt.Sprintf("%s.%s.svc.%s", Name(ds), ds.Spec.Managed.Namespace, clusterDomain)
}

func memberHost(ds *apiary.DataStore, i int32, clusterDomain string) string {
	return MemberName(ds, i) + "." + memberDomain(ds, clusterDomain)
}

// MemberName is the name of member i, and of its pod.
func MemberName(ds *apiary.DataStore, i int32) string {
	return fmt.Sprintf("%s-%d", Name(ds), i)
}

// MemberOrdinal is the ordinal of a member (pod) name of ds, or -1 when the
// name is not one of ds's members.
func MemberOrdinal(ds *apiary.DataStore, name string) int32 {
	rest, ok := strings.CutPrefix(name, Name(ds)+"-")
	if !ok {
		return -1
	}
	n, err := strconv.ParseInt(rest, 10, 32)
	if err != nil || n < 0 || strconv.FormatInt(n, 10) != rest {
		return -1
	}
	return int32(n)
}

// claimPrefix: a member's claim is "data-<pod>", after the StatefulSet's
// volume claim template.
const claimPrefix = "data-"

// ClaimName is the name of member i's claim.
func ClaimName(ds *apiary.DataStore, i int32) string { return claimPrefix + MemberName(ds, i) }

// ClaimOrdinal is the ordinal of a member's claim name, or -1.
func ClaimOrdinal(ds *apiary.DataStore, name string) int32 {
	pod, ok := strings.CutPrefix(name, claimPrefix)
	if !ok {
		return -1
	}
	return MemberOrdinal(ds, pod)
}

// PeerURL is the peer URL member i advertises.
func PeerURL(ds *apiary.DataStore, i int32, clusterDomain string) string {
	return "https://" + net.JoinHostPort(memberHost(ds, i, clusterDomain), strconv.Itoa(PeerPort))
}

// MemberOfURL is the name of the member of ds a peer or client URL points
// at, or "" when it points at none.
func MemberOfURL(ds *apiary.DataStore, rawURL, clusterDomain string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		return ""
	}
	name, domain, ok := strings.Cut(u.Hostname(), ".")
	if !ok || domain != memberDomain(ds, clusterDomain) || MemberOrdinal(ds, name) < 0 {
		return ""
	}
	return name
}

func clientURL(ds *apiary.DataStore, i int32, clusterDomain string) string {
	return "https://" + net.JoinHostPort(memberHost(ds, i, clusterDomain), strconv.Itoa(ClientPort))
}

// Endpoints are the client URLs of the voting members: those etcd listed
// (status.members), or the spec's before etcd was listed. A learner
// refuses clients, and clients do not retry that refusal elsewhere.
func Endpoints(ds *apiary.DataStore, clusterDomain string) []string {
	var ordinals []int32
	for _, m := range ds.Status.Members {
		if i := MemberOrdinal(ds, m.Name); i >= 0 && !m.Learner {
			ordinals = append(ordinals, i)
		}
	}
	if len(ordinals) == 0 {
		for i := range ds.Spec.Managed.Replicas {
			ordinals = append(ordinals, i)
		}
	}
	slices.Sort(ordinals)
	eps := make([]string, 0, len(ordinals))
	for _, i := range ordinals {
		eps = append(eps, clientURL(ds, i, clusterDomain))
	}
	return eps
}

// MembersConfigMapName names the ConfigMap members read the cluster they
// start into from.
func MembersConfigMapName(ds *apiary.DataStore) string { return Name(ds) + "-members" }

// Keys of the members ConfigMap, read at each start as etcd's
// ETCD_INITIAL_CLUSTER and ETCD_INITIAL_CLUSTER_STATE.
const (
	KeyInitialCluster      = "initial-cluster"
	KeyInitialClusterState = "initial-cluster-state"
)

// MembersConfigMap says which cluster a member that starts without data
// joins. It lives outside the pod template so that a membership change
// restarts no member; etcd reads it only on a member's first start (a
// member with data knows its cluster). members is etcd's list, nil before
// etcd was first listed: then the bootstrap members form a new cluster.
// A lone listed member is also "new": it is its whole cluster, and a
// join into "existing" would have no one to join.
func MembersConfigMap(ds *apiary.DataStore, clusterDomain string, members []apiary.EtcdMember, bootstrap int32) *corev1ac.ConfigMapApplyConfiguration {
	var ordinals []int32
	if members == nil {
		for i := range bootstrap {
			ordinals = append(ordinals, i)
		}
	}
	for _, m := range members {
		if i := MemberOrdinal(ds, m.Name); i >= 0 {
			ordinals = append(ordinals, i)
		}
	}
	slices.Sort(ordinals)
	initial := make([]string, 0, len(ordinals))
	for _, i := range ordinals {
		initial = append(initial, MemberName(ds, i)+"="+PeerURL(ds, i, clusterDomain))
	}
	state := "existing"
	if members == nil || len(members) == 1 {
		state = "new"
	}
	return corev1ac.ConfigMap(MembersConfigMapName(ds), ds.Spec.Managed.Namespace).
		WithLabels(Labels(ds)).
		WithOwnerReferences(OwnerReference(ds)).
		WithData(map[string]string{KeyInitialCluster: strings.Join(initial, ","), KeyInitialClusterState: state})
}

// Pods is how many pods the StatefulSet runs: one past the highest listed
// member's ordinal (a new learner's pod among them), or the bootstrap
// members before etcd was listed.
func Pods(ds *apiary.DataStore, members []apiary.EtcdMember, bootstrap int32) int32 {
	if members == nil {
		return bootstrap
	}
	var n int32
	for _, m := range members {
		n = max(n, MemberOrdinal(ds, m.Name)+1)
	}
	return n
}

// CACommonName names a managed etcd's CA.
func CACommonName(ds *apiary.DataStore) string {
	return fmt.Sprintf("apiary datastore %s etcd", ds.Name)
}

// PeerCACommonName names a managed etcd's peer CA.
func PeerCACommonName(ds *apiary.DataStore) string {
	return fmt.Sprintf("apiary datastore %s etcd peers", ds.Name)
}

// ServingCertRequest covers every member name (one wildcard per DNS
// form) for the client port; with peer usage it serves the peer port too.
// hostIPs are the addresses hosts reach the client port at (the host
// Service's); the client port's certificate names them.
func ServingCertRequest(ds *apiary.DataStore, clusterDomain string, peer bool, hostIPs ...net.IP) pki.Request {
	svc, ns := Name(ds), ds.Spec.Managed.Namespace
	usages := []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	cn := "etcd-server"
	if peer {
		// Peers authenticate to each other with the same certificate.
		usages = append(usages, x509.ExtKeyUsageClientAuth)
		cn = PeerCN
	}
	return pki.Request{
		CommonName: cn,
		DNSNames: []string{
			"*." + svc + "." + ns + ".svc." + clusterDomain,
			"*." + svc + "." + ns + ".svc",
			svc + "." + ns + ".svc." + clusterDomain,
			"localhost",
		},
		IPs:    append([]net.IP{net.ParseIP("127.0.0.1")}, hostIPs...),
		Usages: usages,
	}
}

// RootCertRequest is the client certificate of etcd's root user.
func RootCertRequest() pki.Request {
	return pki.Request{CommonName: RootUser, Usages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
}

// Secret wraps issued material of a managed etcd in a Secret owned by the
// DataStore.
func Secret(ds *apiary.DataStore, kind SecretKind, data map[string][]byte) *corev1.Secret {
	labels := Labels(ds)
	labels[conventions.LabelSecret] = string(kind)
	typ := corev1.SecretTypeOpaque
	if _, ok := data[conventions.KeyTLSKey]; ok {
		typ = corev1.SecretTypeTLS
	}
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name:      SecretName(ds, kind),
			Namespace: ds.Spec.Managed.Namespace,
			Labels:    labels,
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: apiary.GroupVersion.String(), Kind: "DataStore", Name: ds.Name, UID: ds.UID,
				Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true),
			}},
		},
		Type: typ,
		Data: data,
	}
}

// OwnerReference makes the DataStore the controller of an object.
func OwnerReference(ds *apiary.DataStore) *metav1ac.OwnerReferenceApplyConfiguration {
	return metav1ac.OwnerReference().
		WithAPIVersion(apiary.GroupVersion.String()).WithKind("DataStore").WithName(ds.Name).WithUID(ds.UID).
		WithController(true).WithBlockOwnerDeletion(true)
}

// Service is the headless Service through which members and clients
// address each member by name. It publishes members before they are ready:
// a new cluster's members must find each other to become ready at all.
func Service(ds *apiary.DataStore) *corev1ac.ServiceApplyConfiguration {
	return corev1ac.Service(Name(ds), ds.Spec.Managed.Namespace).
		WithLabels(Labels(ds)).
		WithOwnerReferences(OwnerReference(ds)).
		WithSpec(corev1ac.ServiceSpec().
			WithClusterIP(corev1.ClusterIPNone).
			WithPublishNotReadyAddresses(true).
			WithSelector(Selector(ds)).
			WithPorts(
				corev1ac.ServicePort().WithName("client").WithPort(ClientPort).WithTargetPort(intstr.FromString("client")),
				corev1ac.ServicePort().WithName("peer").WithPort(PeerPort).WithTargetPort(intstr.FromString("peer")),
			))
}

// HostServiceName exposes the client port to registered-mode hosts.
func HostServiceName(ds *apiary.DataStore) string { return Name(ds) + "-hosts" }

// HostService exposes the client port, and only it, to tenants'
// registered control-plane hosts outside the management cluster
// (spec.hostAccess). Traffic keeps its source address (Local), so that the
// NetworkPolicy can admit the hosts by address; only ready members serve.
func HostService(ds *apiary.DataStore) *corev1ac.ServiceApplyConfiguration {
	spec := corev1ac.ServiceSpec().
		WithType(corev1.ServiceTypeLoadBalancer).
		WithExternalTrafficPolicy(corev1.ServiceExternalTrafficPolicyLocal).
		WithSelector(Selector(ds)).
		WithPorts(corev1ac.ServicePort().WithName("client").WithPort(ClientPort).WithTargetPort(intstr.FromString("client")))
	svc := corev1ac.Service(HostServiceName(ds), ds.Spec.Managed.Namespace).
		WithLabels(Labels(ds)).
		WithOwnerReferences(OwnerReference(ds))
	if a := ds.Spec.HostAccess; a != nil && a.Address != "" {
		svc.WithAnnotations(map[string]string{conventions.AnnotationMetalLBIPs: a.Address})
	}
	return svc.WithSpec(spec)
}

// PodDisruptionBudget lets voluntary disruptions take one member at a
// time, which keeps quorum for three members or more.
func PodDisruptionBudget(ds *apiary.DataStore) *policyv1ac.PodDisruptionBudgetApplyConfiguration {
	return policyv1ac.PodDisruptionBudget(Name(ds), ds.Spec.Managed.Namespace).
		WithLabels(Labels(ds)).
		WithOwnerReferences(OwnerReference(ds)).
		WithSpec(policyv1ac.PodDisruptionBudgetSpec().
			WithMaxUnavailable(intstr.FromInt32(1)).
			WithSelector(metav1ac.LabelSelector().WithMatchLabels(Selector(ds))))
}

// Inputs are what a managed etcd's StatefulSet depends on besides its
// spec.
type Inputs struct {
	DataStore     *apiary.DataStore
	ClusterDomain string
	// ConfigHash of the mounted Secrets: a renewed certificate rolls the
	// members one at a time.
	ConfigHash string
	// ImageRepository replaces registry.k8s.io in the etcd image (see
	// images.Repository).
	ImageRepository string
	// PeerCAOnly: the peer port trusts only the peer CA, so it can also
	// require the peer common name. False while an older DataStore moves
	// to the peer CA.
	PeerCAOnly bool
	// Pods is the StatefulSet's replica count (see Pods).
	Pods int32
}

// Args is the command line of a member; $(POD_NAME) is expanded by the
// kubelet.
func Args(in Inputs) []string {
	ds := in.DataStore
	domain := memberDomain(ds, in.ClusterDomain)
	// The initial cluster and its state come from the members ConfigMap
	// (environment), not from here: see MembersConfigMap.
	args := map[string]string{
		"name":                        "$(POD_NAME)",
		"data-dir":                    dataDir + "/data",
		"listen-client-urls":          fmt.Sprintf("https://0.0.0.0:%d", ClientPort),
		"advertise-client-urls":       fmt.Sprintf("https://$(POD_NAME).%s:%d", domain, ClientPort),
		"listen-peer-urls":            fmt.Sprintf("https://0.0.0.0:%d", PeerPort),
		"initial-advertise-peer-urls": fmt.Sprintf("https://$(POD_NAME).%s:%d", domain, PeerPort),
		"initial-cluster-token":       string(ds.UID),
		"listen-metrics-urls":         fmt.Sprintf("http://0.0.0.0:%d", MetricsPort),
		"client-cert-auth":            "true",
		"trusted-ca-file":             pkiDir + "/ca.crt",
		"cert-file":                   pkiDir + "/server.crt",
		"key-file":                    pkiDir + "/server.key",
		"peer-client-cert-auth":       "true",
		"peer-trusted-ca-file":        pkiDir + "/peer-trust.crt",
		"peer-cert-file":              pkiDir + "/peer.crt",
		"peer-key-file":               pkiDir + "/peer.key",
		// Tenants run with --etcd-compaction-interval=0: compaction is
		// global and needs root, so the datastore compacts itself.
		"auto-compaction-mode":      "periodic",
		"auto-compaction-retention": "5m",
		// Below the volume, so that a tenant filling etcd meets NOSPACE
		// (writes refused, reads and deletes still served) instead of a
		// full disk that crashes every member for every tenant.
		"quota-backend-bytes": strconv.FormatInt(QuotaBytes(ds.Spec.Managed), 10),
	}
	if in.PeerCAOnly {
		args["peer-cert-allowed-cn"] = PeerCN
	}
	return conventions.Flags(args, nil)
}

func membersEnv(name string, ds *apiary.DataStore, key string) *corev1ac.EnvVarApplyConfiguration {
	return corev1ac.EnvVar().WithName(name).WithValueFrom(corev1ac.EnvVarSource().WithConfigMapKeyRef(
		corev1ac.ConfigMapKeySelector().WithName(MembersConfigMapName(ds)).WithKey(key)))
}

// defaultStorage is a member's volume size when the spec sets none.
var defaultStorage = resource.MustParse("1Gi")

// QuotaBytes is a member's backend quota: 80 % of its volume, leaving
// room for the write-ahead log and snapshots.
func QuotaBytes(m *apiary.ManagedEtcd) int64 {
	size := defaultStorage
	if m.Storage.Size != nil {
		size = *m.Storage.Size
	}
	return size.Value() / 5 * 4
}

var defaultRequests = corev1.ResourceList{
	corev1.ResourceCPU:    resource.MustParse("50m"),
	corev1.ResourceMemory: resource.MustParse("128Mi"),
}

// StatefulSet runs the members.
func StatefulSet(in Inputs) *appsv1ac.StatefulSetApplyConfiguration {
	ds := in.DataStore
	m := ds.Spec.Managed
	probe := func(path string, period, failures int32) *corev1ac.ProbeApplyConfiguration {
		return corev1ac.Probe().
			WithHTTPGet(corev1ac.HTTPGetAction().WithPath(path).WithPort(intstr.FromString("metrics"))).
			WithPeriodSeconds(period).WithTimeoutSeconds(5).WithFailureThreshold(failures)
	}
	ctr := conventions.Harden(corev1ac.Container().
		WithName(component).
		// kubeadm's tag of an etcd version.
		WithImage(images.Ref(in.ImageRepository, "etcd", m.Version+"-0")).
		WithCommand("etcd").
		WithArgs(Args(in)...).
		WithEnv(
			corev1ac.EnvVar().WithName("POD_NAME").WithValueFrom(corev1ac.EnvVarSource().WithFieldRef(corev1ac.ObjectFieldSelector().WithFieldPath("metadata.name"))),
			membersEnv("ETCD_INITIAL_CLUSTER", ds, KeyInitialCluster),
			membersEnv("ETCD_INITIAL_CLUSTER_STATE", ds, KeyInitialClusterState),
		).
		WithPorts(
			corev1ac.ContainerPort().WithName("client").WithContainerPort(ClientPort),
			corev1ac.ContainerPort().WithName("peer").WithContainerPort(PeerPort),
			corev1ac.ContainerPort().WithName("metrics").WithContainerPort(MetricsPort),
		).
		WithResources(conventions.Resources(defaultRequests, m.Resources)).
		WithStartupProbe(probe("/livez", 2, 60)).
		WithReadinessProbe(probe("/readyz", 5, 3)).
		WithLivenessProbe(probe("/livez", 10, 8)).
		WithVolumeMounts(
			corev1ac.VolumeMount().WithName("pki").WithMountPath(pkiDir).WithReadOnly(true),
			corev1ac.VolumeMount().WithName("data").WithMountPath(dataDir),
		))

	item := func(kind SecretKind, keyToPath ...string) *corev1ac.VolumeProjectionApplyConfiguration {
		src := corev1ac.SecretProjection().WithName(SecretName(ds, kind))
		for i := 0; i+1 < len(keyToPath); i += 2 {
			src.WithItems(corev1ac.KeyToPath().WithKey(keyToPath[i]).WithPath(keyToPath[i+1]))
		}
		return corev1ac.VolumeProjection().WithSecret(src)
	}
	volumes := []*corev1ac.VolumeApplyConfiguration{
		// The CA key stays with the operator: members only get the CA
		// certificate.
		corev1ac.Volume().WithName("pki").WithProjected(corev1ac.ProjectedVolumeSource().WithDefaultMode(0o440).WithSources(
			item(SecretCA, conventions.KeyTLSCert, "ca.crt"),
			item(SecretServer, conventions.KeyTLSCert, "server.crt", conventions.KeyTLSKey, "server.key"),
			item(SecretPeer, conventions.KeyTLSCert, "peer.crt", conventions.KeyTLSKey, "peer.key"),
			item(SecretPeerTrust, conventions.KeyCACert, "peer-trust.crt"),
		)),
	}
	spec := appsv1ac.StatefulSetSpec().
		WithReplicas(in.Pods).
		WithServiceName(Name(ds)).
		// The bootstrap members must start together to form the initial
		// cluster; later members join one at a time (the operator's
		// membership steps).
		WithPodManagementPolicy("Parallel").
		WithSelector(metav1ac.LabelSelector().WithMatchLabels(Selector(ds))).
		// The operator restarts members itself (DataStoreReconciler's
		// roll): one at a time, only while every member is caught up
		// with the leader, and the leader last after handing its
		// leadership over. A RollingUpdate knows none of this and, on
		// a pod's readiness alone, could take a second member down
		// before the first has rejoined, or the leader mid-write.
		WithUpdateStrategy(appsv1ac.StatefulSetUpdateStrategy().WithType(appsv1.OnDeleteStatefulSetStrategyType))
	if m.Storage.EmptyDir {
		volumes = append(volumes, corev1ac.Volume().WithName("data").WithEmptyDir(corev1ac.EmptyDirVolumeSource()))
	} else {
		size := defaultStorage
		if m.Storage.Size != nil {
			size = *m.Storage.Size
		}
		pvc := (&corev1ac.PersistentVolumeClaimApplyConfiguration{}).
			WithName(strings.TrimSuffix(claimPrefix, "-")).
			WithSpec(corev1ac.PersistentVolumeClaimSpec().
				WithAccessModes(corev1.ReadWriteOnce).
				WithResources(corev1ac.VolumeResourceRequirements().WithRequests(corev1.ResourceList{corev1.ResourceStorage: size})))
		if m.Storage.StorageClassName != nil {
			pvc.Spec.WithStorageClassName(*m.Storage.StorageClassName)
		}
		spec.WithVolumeClaimTemplates(pvc).
			WithPersistentVolumeClaimRetentionPolicy(appsv1ac.StatefulSetPersistentVolumeClaimRetentionPolicy().
				WithWhenDeleted("Delete").
				// A removed member's data must not come back with a later
				// member of its ordinal: etcd would refuse it.
				WithWhenScaled("Delete"))
	}
	spec.WithTemplate(corev1ac.PodTemplateSpec().
		WithLabels(Labels(ds)).
		WithAnnotations(map[string]string{conventions.AnnotationConfigHash: in.ConfigHash}).
		WithSpec(corev1ac.PodSpec().
			WithContainers(ctr).
			WithVolumes(volumes...).
			WithAutomountServiceAccountToken(false).
			WithEnableServiceLinks(false).
			WithSecurityContext(conventions.PodSecurityContext()).
			WithAffinity(conventions.SpreadOverNodes(Selector(ds)))))
	return appsv1ac.StatefulSet(Name(ds), m.Namespace).
		WithLabels(Labels(ds)).
		WithOwnerReferences(OwnerReference(ds)).
		WithSpec(spec)
}
