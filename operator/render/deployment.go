package render

import (
	"crypto/sha256"
	"encoding/hex"
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/intstr"
	appsv1ac "k8s.io/client-go/applyconfigurations/apps/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"

	"github.com/apiaryhq/apiary/images"
	"github.com/apiaryhq/apiary/konnectivity"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/operator/render/conventions"
)

const (
	containerAPIServer         = "kube-apiserver"
	containerControllerManager = "kube-controller-manager"
	containerScheduler         = "kube-scheduler"
)

// ContainerAPIServer names the kube-apiserver container of a control-plane
// pod; its image's tag is the version the pod runs.
const ContainerAPIServer = containerAPIServer

// ConfigHash hashes the content of the given Secrets (name → data), in a
// stable order.
func ConfigHash(secrets map[string]map[string][]byte) string {
	h := sha256.New()
	for _, name := range slices.Sorted(maps.Keys(secrets)) {
		h.Write([]byte(name))
		h.Write([]byte{0})
		data := secrets[name]
		for _, k := range slices.Sorted(maps.Keys(data)) {
			h.Write([]byte(k))
			h.Write([]byte{0})
			h.Write(data[k])
			h.Write([]byte{0})
		}
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// MountedSecrets are the Secret kinds mounted into the control-plane pods:
// a change to any of them must roll the pods (ConfigHash).
var MountedSecrets = []SecretKind{
	SecretCA, SecretCATrust, SecretAPIServer, SecretAPIServerKubeletClient, SecretFrontProxyCA,
	SecretFrontProxyClient, SecretServiceAccount, SecretDataStoreClient,
	SecretControllerManagerConfig, SecretSchedulerConfig,
	SecretKonnectivityServer, SecretKonnectivityKubeconfig,
}

func image(in Inputs, component string) string {
	return images.Ref(in.ImageRepository, component, in.Version)
}

// mountedFile is one file a control-plane container reads under
// /etc/kubernetes: a key of one of the tenant's Secrets or ConfigMaps. The
// same tables build the Deployment's projected volumes and a registered
// host's files and mounts (staticpods.go), so both forms read the same
// files at the same paths.
type mountedFile struct {
	secret    SecretKind
	configMap string
	key       string
	// path is absolute, under /etc/kubernetes.
	path string
}

func secretFiles(kind SecretKind, keyToPath ...string) []mountedFile {
	var out []mountedFile
	for i := 0; i+1 < len(keyToPath); i += 2 {
		out = append(out, mountedFile{secret: kind, key: keyToPath[i], path: keyToPath[i+1]})
	}
	return out
}

// Each container sees exactly the files it needs under /etc/kubernetes: the
// API server never gets the CA keys; the controller-manager gets the cluster
// CA key (it signs kubelet certificates) but no serving or etcd credentials.
func apiServerFiles(in Inputs) []mountedFile {
	tcp := in.TCP
	files := slices.Concat(
		secretFiles(SecretCATrust, KeyCACert, pathCACert),
		secretFiles(SecretAPIServer, KeyTLSCert, pathAPIServerCert, KeyTLSKey, pathAPIServerKey),
		secretFiles(SecretAPIServerKubeletClient, KeyTLSCert, pathKubeletClientCert, KeyTLSKey, pathKubeletClientKey),
		secretFiles(SecretFrontProxyCA, KeyTLSCert, pathFrontProxyCACert),
		secretFiles(SecretFrontProxyClient, KeyTLSCert, pathFrontProxyClientCert, KeyTLSKey, pathFrontProxyClientKey),
		secretFiles(SecretServiceAccount, KeySAKey, pathSAKey, KeySAPub, pathSAPub),
		secretFiles(SecretDataStoreClient, KeyCACert, pathEtcdCACert, KeyTLSCert, pathEtcdClientCert, KeyTLSKey, pathEtcdClientKey),
	)
	if StaticAdmissionSupported(in.Version) {
		files = append(files, mountedFile{configMap: AdmissionConfigMapName(tcp), key: KeyAdmissionConfig, path: pathAdmissionConfig})
	}
	if in.Authentication != "" {
		files = append(files, mountedFile{configMap: AuthenticationConfigMapName(tcp), key: KeyAuthenticationConfig, path: pathAuthenticationConfig})
	}
	if KonnectivityEnabled(tcp) {
		files = append(files, mountedFile{configMap: KonnectivityConfigMapName(tcp), key: KeyEgressSelectorConfig, path: kubernetesDir + "/" + konnectivity.EgressSelectorConfigFile})
	}
	return files
}

func controllerManagerFiles() []mountedFile {
	return slices.Concat(
		secretFiles(SecretCATrust, KeyCACert, pathCACert),
		secretFiles(SecretCA, KeyTLSCert, pathCAIssuerCert, KeyTLSKey, pathCAKey),
		secretFiles(SecretFrontProxyCA, KeyTLSCert, pathFrontProxyCACert),
		secretFiles(SecretServiceAccount, KeySAKey, pathSAKey),
		secretFiles(SecretControllerManagerConfig, apiary.KubeconfigKey, pathControllerManagerCfg),
	)
}

func schedulerFiles() []mountedFile {
	return secretFiles(SecretSchedulerConfig, apiary.KubeconfigKey, pathSchedulerCfg)
}

func konnectivityFiles() []mountedFile {
	dir := konnectivity.ConfigDir + "/"
	return slices.Concat(
		secretFiles(SecretKonnectivityServer, KeyTLSCert, dir+konnectivity.CertFile, KeyTLSKey, dir+konnectivity.KeyFile),
		secretFiles(SecretKonnectivityKubeconfig, apiary.KubeconfigKey, dir+konnectivity.KubeconfigFile),
	)
}

// projectedFiles is a volume of the files, mounted at /etc/kubernetes: one
// projection per run of files from the same Secret or ConfigMap.
func projectedFiles(tcp *apiary.TenantControlPlane, name string, files []mountedFile) *corev1ac.VolumeApplyConfiguration {
	var sources []*corev1ac.VolumeProjectionApplyConfiguration
	for i := 0; i < len(files); {
		j := i
		var items []*corev1ac.KeyToPathApplyConfiguration
		for ; j < len(files) && files[j].secret == files[i].secret && files[j].configMap == files[i].configMap; j++ {
			items = append(items, corev1ac.KeyToPath().WithKey(files[j].key).WithPath(files[j].path[rel:]))
		}
		if files[i].configMap != "" {
			sources = append(sources, corev1ac.VolumeProjection().WithConfigMap(corev1ac.ConfigMapProjection().WithName(files[i].configMap).WithItems(items...)))
		} else {
			sources = append(sources, corev1ac.VolumeProjection().WithSecret(corev1ac.SecretProjection().WithName(SecretName(tcp, files[i].secret)).WithItems(items...)))
		}
		i = j
	}
	return projectedVolume(name, sources...)
}

const rel = len(kubernetesDir) + 1

func projectedVolume(name string, sources ...*corev1ac.VolumeProjectionApplyConfiguration) *corev1ac.VolumeApplyConfiguration {
	return corev1ac.Volume().WithName(name).WithProjected(
		corev1ac.ProjectedVolumeSource().WithDefaultMode(0o440).WithSources(sources...))
}

// defaultRequests keep many tenants schedulable on a small management
// cluster: they are what an idle tenant uses (docs/benchmarks.md: idle RSS
// 276/116/68 MiB, CPU a few millicores), so that a full node means a busy
// one. Users set limits and larger requests per component.
var defaultRequests = map[string]corev1.ResourceList{
	containerAPIServer:         {corev1.ResourceCPU: resource.MustParse("25m"), corev1.ResourceMemory: resource.MustParse("256Mi")},
	containerControllerManager: {corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("96Mi")},
	containerScheduler:         {corev1.ResourceCPU: resource.MustParse("5m"), corev1.ResourceMemory: resource.MustParse("48Mi")},
	konnectivity.ServerName:    {corev1.ResourceCPU: resource.MustParse("5m"), corev1.ResourceMemory: resource.MustParse("32Mi")},
}

func resources(component string, spec apiary.ComponentSpec) *corev1ac.ResourceRequirementsApplyConfiguration {
	return conventions.Resources(defaultRequests[component], spec.Resources)
}

func httpsProbe(path string, port int32, period, failures int32) *corev1ac.ProbeApplyConfiguration {
	return corev1ac.Probe().
		WithHTTPGet(corev1ac.HTTPGetAction().WithPath(path).WithPort(intstr.FromInt32(port)).WithScheme(corev1.URISchemeHTTPS)).
		WithPeriodSeconds(period).
		WithTimeoutSeconds(3).
		WithFailureThreshold(failures)
}

func container(name string, in Inputs, args []string, spec apiary.ComponentSpec, port int32) *corev1ac.ContainerApplyConfiguration {
	return conventions.Harden(corev1ac.Container().
		WithName(name).
		WithImage(image(in, name)).
		WithCommand(name).
		WithArgs(args...).
		WithPorts(corev1ac.ContainerPort().WithName(portName(name)).WithContainerPort(port).WithProtocol(corev1.ProtocolTCP)).
		WithResources(resources(name, spec)).
		// The component's files (mountedFile), by the component's name.
		WithVolumeMounts(corev1ac.VolumeMount().WithName(name).WithMountPath(kubernetesDir).WithReadOnly(true)))
}

func portName(container string) string {
	switch container {
	case containerAPIServer:
		return "https"
	case containerControllerManager:
		return "kcm-https"
	default:
		return "sched-https"
	}
}

// component is one container of the control plane and the files it reads
// under /etc/kubernetes (mounted from its volume of the same name in the
// Deployment; from the host's files in a static Pod).
type component struct {
	name      string
	container *corev1ac.ContainerApplyConfiguration
	files     []mountedFile
}

// controlPlane is the control plane's containers in pod order: the one
// source of both forms, the Deployment and the static Pods. Besides its
// files, kube-apiserver mounts the admission policies (volumePolicies) and
// konnectivity's socket (konnectivity.SocketVolume), which each form
// provides in its own way.
func controlPlane(in Inputs) []component {
	s := in.TCP.Spec
	port := s.Network.Port

	// Only the API server gates the pod's readiness (it alone serves the
	// Service); the controller-manager and scheduler start after it anyway,
	// and a startup probe on them would delay a new tenant by seconds. Their
	// liveness probes allow a minute before restarting them.
	apiServer := container(containerAPIServer, in, APIServerArgs(in), s.APIServer, port).
		// Probed every second so that a new tenant turns Ready as soon as
		// it serves: readiness gates the Service and the rollout.
		WithStartupProbe(httpsProbe("/livez", port, 1, 120)).
		WithReadinessProbe(httpsProbe("/readyz", port, 1, 3)).
		WithLivenessProbe(httpsProbe("/livez", port, 10, 6))
	controllerManager := container(containerControllerManager, in, ControllerManagerArgs(in), s.ControllerManager, controllerManagerPort).
		WithLivenessProbe(httpsProbe("/healthz", controllerManagerPort, 10, 6).WithInitialDelaySeconds(10))
	scheduler := container(containerScheduler, in, SchedulerArgs(in), s.Scheduler, schedulerPort).
		WithLivenessProbe(httpsProbe("/healthz", schedulerPort, 10, 6).WithInitialDelaySeconds(10))
	if StaticAdmissionSupported(in.Version) {
		apiServer.WithVolumeMounts(corev1ac.VolumeMount().WithName(volumePolicies).WithMountPath(policiesDir).WithReadOnly(true))
	}
	comps := []component{
		{containerAPIServer, apiServer, apiServerFiles(in)},
		{containerControllerManager, controllerManager, controllerManagerFiles()},
		{containerScheduler, scheduler, schedulerFiles()},
	}
	if KonnectivityEnabled(in.TCP) {
		// The API server dials konnectivity-server's socket on a volume
		// they share.
		apiServer.WithVolumeMounts(konnectivity.SocketMount())
		comps = append(comps, component{konnectivity.ServerName, konnectivityContainer(in), konnectivityFiles()})
	}
	return comps
}

// Deployment is the tenant's control plane: kube-apiserver,
// kube-controller-manager and kube-scheduler in one pod, N replicas.
func Deployment(in Inputs) *appsv1ac.DeploymentApplyConfiguration {
	tcp := in.TCP
	s := tcp.Spec

	selector := SelectorLabels(tcp)
	podLabels := maps.Clone(Labels(tcp))
	maps.Copy(podLabels, selector)

	var containers []*corev1ac.ContainerApplyConfiguration
	var volumes, last []*corev1ac.VolumeApplyConfiguration
	for _, c := range controlPlane(in) {
		containers = append(containers, c.container)
		v := projectedFiles(tcp, c.name, c.files)
		if c.name == konnectivity.ServerName {
			last = append(last, v, corev1ac.Volume().WithName(konnectivity.SocketVolume).WithEmptyDir(corev1ac.EmptyDirVolumeSource()))
			continue
		}
		volumes = append(volumes, v)
	}
	if StaticAdmissionSupported(in.Version) {
		volumes = append(volumes, admissionPoliciesVolume(tcp))
	}
	volumes = append(volumes, last...)

	pod := corev1ac.PodSpec().
		WithContainers(containers...).
		WithVolumes(volumes...).
		// The pod never talks to the management cluster's API.
		WithAutomountServiceAccountToken(false).
		WithEnableServiceLinks(false).
		WithSecurityContext(conventions.PodSecurityContext()).
		// Spread replicas over nodes when there are several.
		WithAffinity(conventions.SpreadOverNodes(selector))

	replicas := *s.Replicas
	if in.HostsOnly {
		replicas = 0
	}
	return appsv1ac.Deployment(DeploymentName(tcp), tcp.Namespace).
		WithLabels(Labels(tcp)).
		WithOwnerReferences(OwnerReference(tcp)).
		WithSpec(appsv1ac.DeploymentSpec().
			WithReplicas(replicas).
			WithRevisionHistoryLimit(3).
			WithSelector(metav1ac.LabelSelector().WithMatchLabels(selector)).
			// Never fewer ready API servers than asked for during a rollout.
			WithStrategy(appsv1ac.DeploymentStrategy().
				WithType("RollingUpdate").
				WithRollingUpdate(appsv1ac.RollingUpdateDeployment().
					WithMaxUnavailable(intstr.FromInt32(0)).
					WithMaxSurge(intstr.FromInt32(1)))).
			WithTemplate(corev1ac.PodTemplateSpec().
				WithLabels(podLabels).
				WithAnnotations(map[string]string{AnnotationConfigHash: in.ConfigHash()}).
				WithSpec(pod)))
}

// OwnerReference makes the tenant the controller of an object.
func OwnerReference(tcp *apiary.TenantControlPlane) *metav1ac.OwnerReferenceApplyConfiguration {
	return metav1ac.OwnerReference().
		WithAPIVersion(apiary.GroupVersion.String()).
		WithKind("TenantControlPlane").
		WithName(tcp.Name).
		WithUID(tcp.UID).
		WithController(true).
		WithBlockOwnerDeletion(true)
}
