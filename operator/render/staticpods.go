package render

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/apiaryhq/apiary/konnectivity"
)

// Registered mode runs the same control plane as the Deployment on the
// tenant's control-plane hosts, as kubeadm does: one static Pod per
// component in /etc/kubernetes/manifests, credentials and configuration at
// kubeadm's paths. The containers, arguments, images and probes are
// controlPlane's, as in the Deployment; only where the files come from
// differs (the host's files instead of projected Secrets) and the pods run
// in the host's network namespace.
const (
	// ManifestsDir is the kubelet's staticPodPath (kubeadm's).
	ManifestsDir = kubernetesDir + "/manifests"
	// socketHostDir holds the socket kube-apiserver and
	// konnectivity-server share, which are two pods on a host.
	socketHostDir = kubernetesDir + "/konnectivity-server"
	// HostFileMode is the mode of every file the operator writes on a
	// host: credentials are readable by root alone, as kubeadm writes them.
	HostFileMode = 0o600
	// labelKubeadmComponent and labelTier are kubeadm's labels on its
	// static Pods: tools that look for kube-apiserver by them find Apiary's.
	labelKubeadmComponent = "component"
	labelTier             = "tier"
	tierHost              = "control-plane"
	// priorityNodeCritical is system-node-critical's value, which the
	// kubelet needs on the pod itself (it reads no PriorityClass).
	priorityNodeCritical = 2000001000
)

// KubeletCAPath is the tenant CA the kubelet of a joined host trusts
// (kubeadm's path); removing the control plane from a host keeps it.
const KubeletCAPath = pathCACert

// HostFile is a file of a control-plane host, written with HostFileMode by
// root.
type HostFile struct {
	// Path is absolute.
	Path string
	Data []byte
}

// StaticPods renders what one control-plane host runs: every file its
// components read (certificates, keys, kubeconfigs, configuration), then
// one manifest per component in ManifestsDir. The caller writes the files
// first and the manifests last, each atomically: a manifest starts a pod,
// which must find its files. exceeded is the quota state, as the
// Deployment's admission ConfigMap carries it.
func StaticPods(in Inputs, exceeded *QuotaExceeded) (files, manifests []HostFile, err error) {
	in.OnHost = true
	cm, err := AdmissionConfigMap(in.TCP, exceeded)
	if err != nil {
		return nil, nil, err
	}
	configMaps := map[string]map[string]string{
		AdmissionConfigMapName(in.TCP):    cm.Data,
		KonnectivityConfigMapName(in.TCP): {KeyEgressSelectorConfig: konnectivity.EgressSelectorConfiguration},
	}
	if in.Authentication != "" {
		configMaps[AuthenticationConfigMapName(in.TCP)] = map[string]string{KeyAuthenticationConfig: in.Authentication}
	}
	comps := controlPlane(in)
	for _, f := range hostFiles(comps) {
		data, err := f.data(in, configMaps)
		if err != nil {
			return nil, nil, err
		}
		files = append(files, HostFile{Path: f.path, Data: data})
	}
	if StaticAdmissionSupported(in.Version) {
		files = append(files, HostFile{Path: quotaPolicyPath, Data: []byte(cm.Data[KeyQuotaPolicy])})
	}
	hash := in.ConfigHash()
	for _, c := range comps {
		pod := staticPod(in, c, hash)
		b, err := yaml.Marshal(pod)
		if err != nil {
			return nil, nil, fmt.Errorf("static Pod %s: %w", c.name, err)
		}
		manifests = append(manifests, HostFile{Path: StaticPodManifest(c.name), Data: b})
	}
	return files, manifests, nil
}

// StaticPodPaths are the paths StaticPods writes, without their contents
// (no credential needed).
func StaticPodPaths(in Inputs) (files, manifests []string) {
	comps := controlPlane(in)
	for _, f := range hostFiles(comps) {
		files = append(files, f.path)
	}
	if StaticAdmissionSupported(in.Version) {
		files = append(files, quotaPolicyPath)
	}
	for _, c := range comps {
		manifests = append(manifests, StaticPodManifest(c.name))
	}
	return files, manifests
}

// WithEarlierSpecFiles adds to files those a host may keep from an
// earlier spec of its tenant (the authentication configuration, written
// only while the spec names issuers): taking a control plane off a host
// removes them whatever the spec says now.
func WithEarlierSpecFiles(files []string) []string {
	out := slices.Clone(files)
	if !slices.Contains(out, pathAuthenticationConfig) {
		out = append(out, pathAuthenticationConfig)
	}
	return out
}

// quotaPolicyPath is where a host keeps the datastore quota's admission
// policy (kube-apiserver reads it from the admission configuration).
const quotaPolicyPath = policiesDir + "/" + KeyQuotaPolicy

// hostFiles are the files the components read, each once, in the order
// the components name them.
func hostFiles(comps []component) []mountedFile {
	seen := map[string]bool{}
	var out []mountedFile
	for _, c := range comps {
		for _, f := range c.files {
			if !seen[f.path] {
				seen[f.path] = true
				out = append(out, f)
			}
		}
	}
	return out
}

// StaticPodManifest is the path of a component's manifest on a host.
func StaticPodManifest(component string) string {
	return ManifestsDir + "/" + component + ".yaml"
}

// StaticPodComponents are the components a registered host runs, in the
// order StaticPods renders them.
func StaticPodComponents(in Inputs) []string {
	var names []string
	for _, c := range controlPlane(in) {
		names = append(names, c.name)
	}
	return names
}

// StaticPodPorts are the TCP ports a registered host's control plane
// listens on (hostNetwork): every container port, and konnectivity-server's
// admin port, which it binds without declaring it. They must be free
// before the manifests are written.
func StaticPodPorts(in Inputs) []int {
	var ports []int
	for _, c := range controlPlane(in) {
		for _, p := range c.container.Ports {
			if p.ContainerPort != nil {
				ports = append(ports, int(*p.ContainerPort))
			}
		}
		if c.name == konnectivity.ServerName {
			ports = append(ports, konnectivity.AdminPort)
		}
	}
	slices.Sort(ports)
	return slices.Compact(ports)
}

func (f mountedFile) data(in Inputs, configMaps map[string]map[string]string) ([]byte, error) {
	if f.configMap != "" {
		v, ok := configMaps[f.configMap][f.key]
		if !ok {
			return nil, fmt.Errorf("%s needs key %s of ConfigMap %s, which is not rendered", f.path, f.key, f.configMap)
		}
		return []byte(v), nil
	}
	v, ok := in.Secrets[f.secret][f.key]
	if !ok || len(v) == 0 {
		return nil, fmt.Errorf("%s needs key %s of Secret %s, which is not issued yet", f.path, f.key, SecretName(in.TCP, f.secret))
	}
	return v, nil
}

// staticPod is one component as a static Pod: its container from
// controlPlane with each file mounted from the host, read-only, at the
// path the Deployment's projected volume puts it.
func staticPod(in Inputs, c component, hash string) *corev1ac.PodApplyConfiguration {
	ctr := *c.container
	ctr.VolumeMounts = nil
	var volumes []*corev1ac.VolumeApplyConfiguration
	for _, m := range c.container.VolumeMounts {
		var name string
		if m.Name != nil {
			name = *m.Name
		}
		switch name {
		case c.name:
			// The files, one hostPath each, so that the container sees
			// exactly what it sees in the Deployment.
			for _, f := range c.files {
				name := hostVolumeName(f.path)
				ctr.VolumeMounts = append(ctr.VolumeMounts, *corev1ac.VolumeMount().WithName(name).WithMountPath(f.path).WithReadOnly(true))
				volumes = append(volumes, hostPathVolume(name, f.path, corev1.HostPathFile))
			}
		case volumePolicies:
			// A directory: kube-apiserver watches it for the policy
			// the operator swaps in.
			ctr.VolumeMounts = append(ctr.VolumeMounts, m)
			volumes = append(volumes, hostPathVolume(volumePolicies, policiesDir, corev1.HostPathDirectoryOrCreate))
		case konnectivity.SocketVolume:
			ctr.VolumeMounts = append(ctr.VolumeMounts, m)
			volumes = append(volumes, hostPathVolume(konnectivity.SocketVolume, socketHostDir, corev1.HostPathDirectoryOrCreate))
		default:
			ctr.VolumeMounts = append(ctr.VolumeMounts, m)
		}
	}
	slices.SortStableFunc(volumes, func(a, b *corev1ac.VolumeApplyConfiguration) int { return strings.Compare(*a.Name, *b.Name) })
	return corev1ac.Pod(c.name, "kube-system").
		WithLabels(map[string]string{labelKubeadmComponent: c.name, labelTier: tierHost, LabelManagedBy: ManagedBy}).
		// A new credential changes the manifest, and the kubelet restarts
		// the pod with the new files.
		WithAnnotations(map[string]string{AnnotationConfigHash: hash}).
		WithSpec(corev1ac.PodSpec().
			WithHostNetwork(true).
			WithPriorityClassName("system-node-critical").
			WithPriority(priorityNodeCritical).
			// Root reads the 0600 root-owned files, as in kubeadm's
			// static Pods, whatever user an image defaults to (upstream's
			// konnectivity-server image is nonroot, 65532); the containers
			// keep no capability, a read-only root and no privilege
			// escalation.
			WithSecurityContext(corev1ac.PodSecurityContext().
				WithRunAsUser(0).
				WithRunAsGroup(0).
				WithRunAsNonRoot(false).
				WithSeccompProfile(corev1ac.SeccompProfile().WithType(corev1.SeccompProfileTypeRuntimeDefault))).
			WithContainers(&ctr).
			WithVolumes(volumes...))
}

func hostPathVolume(name, p string, typ corev1.HostPathType) *corev1ac.VolumeApplyConfiguration {
	return corev1ac.Volume().WithName(name).WithHostPath(corev1ac.HostPathVolumeSource().WithPath(p).WithType(typ))
}

// hostVolumeName names a file's volume after its path:
// /etc/kubernetes/pki/ca.crt → pki-ca-crt.
func hostVolumeName(p string) string {
	rel := strings.TrimPrefix(p, kubernetesDir+"/")
	if rel == p {
		rel = strings.TrimPrefix(p, "/")
	}
	n := strings.NewReplacer("/", "-", ".", "-", "_", "-").Replace(rel)
	if len(n) > 63 {
		n = strings.TrimRight(n[:63], "-")
	}
	return n
}
