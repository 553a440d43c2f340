package render

import (
	"crypto/x509"
	"fmt"
	"maps"
	"net"
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

	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/pki"
)

// Managed etcd of a DataStore: a StatefulSet of members that find each other
// through a headless Service, with client and peer TLS, authentication
// enabled by the operator once they form a cluster, and periodic
// compaction (tenants never compact: they have no root access).

const (
	// LabelDataStore names the DataStore a managed etcd object belongs to.
	LabelDataStore = "apiary.dev/datastore"
	componentEtcd  = "etcd"

	etcdClientPort  = 2379
	etcdPeerPort    = 2380
	etcdMetricsPort = 2381
	etcdPKIDir      = "/etc/etcd/pki"
	etcdDataDir     = "/var/lib/etcd"

	// EtcdRootUser is the etcd user the operator administers etcd as.
	EtcdRootUser = "root"
)

// Secret kinds of a managed etcd; the Secret's name is "<datastore>-<kind>".
const (
	EtcdSecretCA     SecretKind = "etcd-ca"
	EtcdSecretServer SecretKind = "etcd-server"
	EtcdSecretPeer   SecretKind = "etcd-peer"
	EtcdSecretRoot   SecretKind = "etcd-root"
	// EtcdSecretPeerCA signs only peer certificates: the client port's CA
	// (EtcdSecretCA), which signs every tenant's client certificate, is
	// not trusted on the peer port.
	EtcdSecretPeerCA SecretKind = "etcd-peer-ca"
	// EtcdSecretPeerTrust holds the CA bundle the peer port trusts (key
	// ca.crt): the peer CA, and the client CA too while an older DataStore
	// moves its members to the peer CA.
	EtcdSecretPeerTrust SecretKind = "etcd-peer-trust"
)

// EtcdSecretKinds are every Secret of a managed etcd.
var EtcdSecretKinds = []SecretKind{EtcdSecretCA, EtcdSecretPeerCA, EtcdSecretServer, EtcdSecretPeer, EtcdSecretPeerTrust, EtcdSecretRoot}

// EtcdMountedSecrets are the Secrets the members mount (the CAs' keys
// stay with the operator).
var EtcdMountedSecrets = []SecretKind{EtcdSecretCA, EtcdSecretServer, EtcdSecretPeer, EtcdSecretPeerTrust}

// EtcdPeerCN is the common name of every peer certificate; members accept
// no other on the peer port (--peer-cert-allowed-cn).
const EtcdPeerCN = "etcd-peer"

// EtcdName names the StatefulSet, its headless Service and PDB.
func EtcdName(ds *apiary.DataStore) string { return ds.Name + "-etcd" }

// EtcdSecretName is the name of a managed etcd's Secret.
func EtcdSecretName(ds *apiary.DataStore, kind SecretKind) string {
	return ds.Name + "-" + string(kind)
}

// EtcdLabels are on every object of a managed etcd.
func EtcdLabels(ds *apiary.DataStore) map[string]string {
	return map[string]string{LabelDataStore: ds.Name, LabelManagedBy: ManagedBy, LabelComponent: componentEtcd}
}

// EtcdSelector selects the pods of a managed etcd.
func EtcdSelector(ds *apiary.DataStore) map[string]string {
	return map[string]string{LabelDataStore: ds.Name, LabelComponent: componentEtcd}
}

// etcdDomain is the DNS suffix of the members: <pod>.<domain>.
func etcdDomain(ds *apiary.DataStore, clusterDomain string) string {
	return fmt.Sprintf("%s.%s.svc.%s", EtcdName(ds), ds.Spec.Managed.Namespace, clusterDomain)
}

func etcdMemberHost(ds *apiary.DataStore, i int32, clusterDomain string) string {
	return fmt.Sprintf("%s-%d.%s", EtcdName(ds), i, etcdDomain(ds, clusterDomain))
}

// EtcdEndpoints are the client URLs of the members.
func EtcdEndpoints(ds *apiary.DataStore, clusterDomain string) []string {
	var eps []string
	for i := range ds.Spec.Managed.Replicas {
		eps = append(eps, fmt.Sprintf("https://%s", net.JoinHostPort(etcdMemberHost(ds, i, clusterDomain), fmt.Sprint(etcdClientPort))))
	}
	return eps
}

// EtcdCACommonName names a managed etcd's CA.
func EtcdCACommonName(ds *apiary.DataStore) string {
	return fmt.Sprintf("apiary datastore %s etcd", ds.Name)
}

// EtcdPeerCACommonName names a managed etcd's peer CA.
func EtcdPeerCACommonName(ds *apiary.DataStore) string {
	return fmt.Sprintf("apiary datastore %s etcd peers", ds.Name)
}

// EtcdServingCertRequest covers every member name (one wildcard per DNS
// form) for the client port; with peer usage it serves the peer port too.
func EtcdServingCertRequest(ds *apiary.DataStore, clusterDomain string, peer bool) pki.Request {
	svc, ns := EtcdName(ds), ds.Spec.Managed.Namespace
	usages := []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	cn := "etcd-server"
	if peer {
		// Peers authenticate to each other with the same certificate.
		usages = append(usages, x509.ExtKeyUsageClientAuth)
		cn = EtcdPeerCN
	}
	return pki.Request{
		CommonName: cn,
		DNSNames: []string{
			"*." + svc + "." + ns + ".svc." + clusterDomain,
			"*." + svc + "." + ns + ".svc",
			svc + "." + ns + ".svc." + clusterDomain,
			"localhost",
		},
		IPs:    []net.IP{net.ParseIP("127.0.0.1")},
		Usages: usages,
	}
}

// EtcdRootCertRequest is the client certificate of etcd's root user.
func EtcdRootCertRequest() pki.Request {
	return ClientCertRequest(EtcdRootUser)
}

// EtcdSecret wraps issued material of a managed etcd in a Secret owned by
// the DataStore.
func EtcdSecret(ds *apiary.DataStore, kind SecretKind, data map[string][]byte) *corev1.Secret {
	labels := EtcdLabels(ds)
	labels[LabelSecret] = string(kind)
	typ := corev1.SecretTypeOpaque
	if _, ok := data[KeyTLSKey]; ok {
		typ = corev1.SecretTypeTLS
	}
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name:            EtcdSecretName(ds, kind),
			Namespace:       ds.Spec.Managed.Namespace,
			Labels:          labels,
			OwnerReferences: []metav1.OwnerReference{dataStoreOwner(ds)},
		},
		Type: typ,
		Data: data,
	}
}

func dataStoreOwner(ds *apiary.DataStore) metav1.OwnerReference {
	return metav1.OwnerReference{
		APIVersion: apiary.GroupVersion.String(), Kind: "DataStore", Name: ds.Name, UID: ds.UID,
		Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true),
	}
}

func dataStoreOwnerAC(ds *apiary.DataStore) *metav1ac.OwnerReferenceApplyConfiguration {
	return metav1ac.OwnerReference().
		WithAPIVersion(apiary.GroupVersion.String()).WithKind("DataStore").WithName(ds.Name).WithUID(ds.UID).
		WithController(true).WithBlockOwnerDeletion(true)
}

// EtcdService is the headless Service through which members and clients
// address each member by name. It publishes members before they are ready:
// a new cluster's members must find each other to become ready at all.
func EtcdService(ds *apiary.DataStore) *corev1ac.ServiceApplyConfiguration {
	return corev1ac.Service(EtcdName(ds), ds.Spec.Managed.Namespace).
		WithLabels(EtcdLabels(ds)).
		WithOwnerReferences(dataStoreOwnerAC(ds)).
		WithSpec(corev1ac.ServiceSpec().
			WithClusterIP(corev1.ClusterIPNone).
			WithPublishNotReadyAddresses(true).
			WithSelector(EtcdSelector(ds)).
			WithPorts(
				corev1ac.ServicePort().WithName("client").WithPort(etcdClientPort).WithTargetPort(intstr.FromString("client")),
				corev1ac.ServicePort().WithName("peer").WithPort(etcdPeerPort).WithTargetPort(intstr.FromString("peer")),
			))
}

// EtcdPodDisruptionBudget lets voluntary disruptions take one member at a
// time, which keeps quorum for three members or more.
func EtcdPodDisruptionBudget(ds *apiary.DataStore) *policyv1ac.PodDisruptionBudgetApplyConfiguration {
	return policyv1ac.PodDisruptionBudget(EtcdName(ds), ds.Spec.Managed.Namespace).
		WithLabels(EtcdLabels(ds)).
		WithOwnerReferences(dataStoreOwnerAC(ds)).
		WithSpec(policyv1ac.PodDisruptionBudgetSpec().
			WithMaxUnavailable(intstr.FromInt32(1)).
			WithSelector(metav1ac.LabelSelector().WithMatchLabels(EtcdSelector(ds))))
}

// EtcdInputs are what a managed etcd's StatefulSet depends on besides its
// spec.
type EtcdInputs struct {
	DataStore     *apiary.DataStore
	ClusterDomain string
	// ConfigHash of the mounted Secrets: a renewed certificate rolls the
	// members one at a time.
	ConfigHash      string
	ImageRepository string
	// PeerCAOnly: the peer port trusts only the peer CA, so it can also
	// require the peer common name. False while an older DataStore moves
	// to the peer CA.
	PeerCAOnly bool
}

// EtcdArgs is the command line of a member; $(POD_NAME) is expanded by the
// kubelet.
func EtcdArgs(in EtcdInputs) []string {
	ds := in.DataStore
	domain := etcdDomain(ds, in.ClusterDomain)
	var initial []string
	for i := range ds.Spec.Managed.Replicas {
		initial = append(initial, fmt.Sprintf("%s-%d=https://%s:%d", EtcdName(ds), i, etcdMemberHost(ds, i, in.ClusterDomain), etcdPeerPort))
	}
	args := map[string]string{
		"name":                        "$(POD_NAME)",
		"data-dir":                    etcdDataDir + "/data",
		"listen-client-urls":          fmt.Sprintf("https://0.0.0.0:%d", etcdClientPort),
		"advertise-client-urls":       fmt.Sprintf("https://$(POD_NAME).%s:%d", domain, etcdClientPort),
		"listen-peer-urls":            fmt.Sprintf("https://0.0.0.0:%d", etcdPeerPort),
		"initial-advertise-peer-urls": fmt.Sprintf("https://$(POD_NAME).%s:%d", domain, etcdPeerPort),
		"initial-cluster":             strings.Join(initial, ","),
		"initial-cluster-state":       "new",
		"initial-cluster-token":       string(ds.UID),
		"listen-metrics-urls":         fmt.Sprintf("http://0.0.0.0:%d", etcdMetricsPort),
		"client-cert-auth":            "true",
		"trusted-ca-file":             etcdPKIDir + "/ca.crt",
		"cert-file":                   etcdPKIDir + "/server.crt",
		"key-file":                    etcdPKIDir + "/server.key",
		"peer-client-cert-auth":       "true",
		"peer-trusted-ca-file":        etcdPKIDir + "/peer-trust.crt",
		"peer-cert-file":              etcdPKIDir + "/peer.crt",
		"peer-key-file":               etcdPKIDir + "/peer.key",
		// Tenants run with --etcd-compaction-interval=0: compaction is
		// global and needs root, so the datastore compacts itself.
		"auto-compaction-mode":      "periodic",
		"auto-compaction-retention": "5m",
		// Below the volume, so that a tenant filling etcd meets NOSPACE
		// (writes refused, reads and deletes still served) instead of a
		// full disk that crashes every member for every tenant.
		"quota-backend-bytes": strconv.FormatInt(EtcdQuotaBytes(ds.Spec.Managed), 10),
	}
	if in.PeerCAOnly {
		args["peer-cert-allowed-cn"] = EtcdPeerCN
	}
	return flags(args, nil)
}

// defaultEtcdStorage is a member's volume size when the spec sets none.
var defaultEtcdStorage = resource.MustParse("1Gi")

// EtcdQuotaBytes is a member's backend quota: 80 % of its volume, leaving
// room for the write-ahead log and snapshots.
func EtcdQuotaBytes(m *apiary.ManagedEtcd) int64 {
	size := defaultEtcdStorage
	if m.Storage.Size != nil {
		size = *m.Storage.Size
	}
	return size.Value() / 5 * 4
}

var defaultEtcdRequests = corev1.ResourceList{
	corev1.ResourceCPU:    resource.MustParse("50m"),
	corev1.ResourceMemory: resource.MustParse("128Mi"),
}

// EtcdStatefulSet runs the members.
func EtcdStatefulSet(in EtcdInputs) *appsv1ac.StatefulSetApplyConfiguration {
	ds := in.DataStore
	m := ds.Spec.Managed
	repo := in.ImageRepository
	if repo == "" {
		repo = defaultImageRepository
	}
	requests := maps.Clone(defaultEtcdRequests)
	maps.Copy(requests, m.Resources.Requests)
	res := corev1ac.ResourceRequirements().WithRequests(requests)
	if len(m.Resources.Limits) > 0 {
		res.WithLimits(m.Resources.Limits)
	}
	probe := func(path string, period, failures int32) *corev1ac.ProbeApplyConfiguration {
		return corev1ac.Probe().
			WithHTTPGet(corev1ac.HTTPGetAction().WithPath(path).WithPort(intstr.FromString("metrics"))).
			WithPeriodSeconds(period).WithTimeoutSeconds(5).WithFailureThreshold(failures)
	}
	ctr := corev1ac.Container().
		WithName(componentEtcd).
		WithImage(fmt.Sprintf("%s/etcd:%s-0", repo, m.Version)).
		WithImagePullPolicy(corev1.PullIfNotPresent).
		WithCommand("etcd").
		WithArgs(EtcdArgs(in)...).
		WithEnv(corev1ac.EnvVar().WithName("POD_NAME").WithValueFrom(corev1ac.EnvVarSource().WithFieldRef(corev1ac.ObjectFieldSelector().WithFieldPath("metadata.name")))).
		WithPorts(
			corev1ac.ContainerPort().WithName("client").WithContainerPort(etcdClientPort),
			corev1ac.ContainerPort().WithName("peer").WithContainerPort(etcdPeerPort),
			corev1ac.ContainerPort().WithName("metrics").WithContainerPort(etcdMetricsPort),
		).
		WithResources(res).
		WithStartupProbe(probe("/livez", 2, 60)).
		WithReadinessProbe(probe("/readyz", 5, 3)).
		WithLivenessProbe(probe("/livez", 10, 8)).
		WithVolumeMounts(
			corev1ac.VolumeMount().WithName("pki").WithMountPath(etcdPKIDir).WithReadOnly(true),
			corev1ac.VolumeMount().WithName("data").WithMountPath(etcdDataDir),
		).
		WithSecurityContext(corev1ac.SecurityContext().
			WithAllowPrivilegeEscalation(false).
			WithReadOnlyRootFilesystem(true).
			WithCapabilities(corev1ac.Capabilities().WithDrop("ALL"))).
		WithTerminationMessagePolicy(corev1.TerminationMessageFallbackToLogsOnError)

	item := func(kind SecretKind, keyToPath ...string) *corev1ac.VolumeProjectionApplyConfiguration {
		src := corev1ac.SecretProjection().WithName(EtcdSecretName(ds, kind))
		for i := 0; i+1 < len(keyToPath); i += 2 {
			src.WithItems(corev1ac.KeyToPath().WithKey(keyToPath[i]).WithPath(keyToPath[i+1]))
		}
		return corev1ac.VolumeProjection().WithSecret(src)
	}
	volumes := []*corev1ac.VolumeApplyConfiguration{
		// The CA key stays with the operator: members only get the CA
		// certificate.
		corev1ac.Volume().WithName("pki").WithProjected(corev1ac.ProjectedVolumeSource().WithDefaultMode(0o440).WithSources(
			item(EtcdSecretCA, KeyTLSCert, "ca.crt"),
			item(EtcdSecretServer, KeyTLSCert, "server.crt", KeyTLSKey, "server.key"),
			item(EtcdSecretPeer, KeyTLSCert, "peer.crt", KeyTLSKey, "peer.key"),
			item(EtcdSecretPeerTrust, KeyCACert, "peer-trust.crt"),
		)),
	}
	spec := appsv1ac.StatefulSetSpec().
		WithReplicas(m.Replicas).
		WithServiceName(EtcdName(ds)).
		// All members must start together to form the initial cluster.
		WithPodManagementPolicy("Parallel").
		WithSelector(metav1ac.LabelSelector().WithMatchLabels(EtcdSelector(ds))).
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
		size := defaultEtcdStorage
		if m.Storage.Size != nil {
			size = *m.Storage.Size
		}
		pvc := (&corev1ac.PersistentVolumeClaimApplyConfiguration{}).
			WithName("data").
			WithSpec(corev1ac.PersistentVolumeClaimSpec().
				WithAccessModes(corev1.ReadWriteOnce).
				WithResources(corev1ac.VolumeResourceRequirements().WithRequests(corev1.ResourceList{corev1.ResourceStorage: size})))
		if m.Storage.StorageClassName != nil {
			pvc.Spec.WithStorageClassName(*m.Storage.StorageClassName)
		}
		spec.WithVolumeClaimTemplates(pvc).
			WithPersistentVolumeClaimRetentionPolicy(appsv1ac.StatefulSetPersistentVolumeClaimRetentionPolicy().
				WithWhenDeleted("Delete").WithWhenScaled("Retain"))
	}
	podLabels := EtcdLabels(ds)
	spec.WithTemplate(corev1ac.PodTemplateSpec().
		WithLabels(podLabels).
		WithAnnotations(map[string]string{AnnotationConfigHash: in.ConfigHash}).
		WithSpec(corev1ac.PodSpec().
			WithContainers(ctr).
			WithVolumes(volumes...).
			WithAutomountServiceAccountToken(false).
			WithEnableServiceLinks(false).
			WithSecurityContext(corev1ac.PodSecurityContext().
				WithRunAsNonRoot(true).WithRunAsUser(nonRootUID).WithRunAsGroup(nonRootUID).WithFSGroup(nonRootUID).
				WithSeccompProfile(corev1ac.SeccompProfile().WithType(corev1.SeccompProfileTypeRuntimeDefault))).
			WithAffinity(corev1ac.Affinity().WithPodAntiAffinity(corev1ac.PodAntiAffinity().
				WithPreferredDuringSchedulingIgnoredDuringExecution(corev1ac.WeightedPodAffinityTerm().
					WithWeight(100).
					WithPodAffinityTerm(corev1ac.PodAffinityTerm().
						WithTopologyKey(corev1.LabelHostname).
						WithLabelSelector(metav1ac.LabelSelector().WithMatchLabels(EtcdSelector(ds)))))))))
	return appsv1ac.StatefulSet(EtcdName(ds), m.Namespace).
		WithLabels(EtcdLabels(ds)).
		WithOwnerReferences(dataStoreOwnerAC(ds)).
		WithSpec(spec)
}
