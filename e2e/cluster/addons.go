package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// corefile serves the cluster domain only. There is no `forward`: the
// host's resolver (/etc/resolv.conf) is off this machine, and nothing may
// be sent there; other names get SERVFAIL.
const corefile = `.:53 {
    errors
    health {
        lameduck 5s
    }
    ready
    kubernetes ` + ClusterDomain + ` in-addr.arpa ip6.arpa {
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 30
    }
    prometheus :9153
    cache 30
    reload
    loadbalance
}
`

// coreDNSManifests is CoreDNS as kubeadm deploys it (one replica), at the
// cluster DNS address the kubelet hands to pods.
func coreDNSManifests() string {
	cm, _ := json.Marshal(map[string]any{
		"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"name": "coredns", "namespace": "kube-system"},
		"data":     map[string]string{"Corefile": corefile},
	})
	return `apiVersion: v1
kind: ServiceAccount
metadata:
  name: coredns
  namespace: kube-system
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: system:coredns
rules:
- apiGroups: [""]
  resources: [endpoints, services, pods, namespaces]
  verbs: [list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: system:coredns
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: system:coredns
subjects:
- kind: ServiceAccount
  name: coredns
  namespace: kube-system
---
` + string(cm) + `
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: coredns
  namespace: kube-system
  labels: {k8s-app: kube-dns}
spec:
  replicas: 1
  selector:
    matchLabels: {k8s-app: kube-dns}
  strategy:
    type: RollingUpdate
    rollingUpdate: {maxUnavailable: 1}
  template:
    metadata:
      labels: {k8s-app: kube-dns}
    spec:
      serviceAccountName: coredns
      priorityClassName: system-cluster-critical
      dnsPolicy: Default
      terminationGracePeriodSeconds: 5
      containers:
      - name: coredns
        image: ` + CoreDNSImage + `
        args: ["-conf", "/etc/coredns/Corefile"]
        ports:
        - {name: dns, containerPort: 53, protocol: UDP}
        - {name: dns-tcp, containerPort: 53, protocol: TCP}
        - {name: metrics, containerPort: 9153, protocol: TCP}
        resources:
          requests: {cpu: 50m, memory: 50Mi}
          limits: {memory: 170Mi}
        securityContext:
          allowPrivilegeEscalation: false
          capabilities: {add: [NET_BIND_SERVICE], drop: [ALL]}
          readOnlyRootFilesystem: true
        readinessProbe:
          httpGet: {path: /ready, port: 8181}
          periodSeconds: 1
        livenessProbe:
          httpGet: {path: /health, port: 8080}
          initialDelaySeconds: 30
          timeoutSeconds: 5
          failureThreshold: 5
        volumeMounts:
        - {name: config-volume, mountPath: /etc/coredns, readOnly: true}
      volumes:
      - name: config-volume
        configMap:
          name: coredns
          items: [{key: Corefile, path: Corefile}]
---
apiVersion: v1
kind: Service
metadata:
  name: kube-dns
  namespace: kube-system
  labels: {k8s-app: kube-dns, kubernetes.io/name: CoreDNS}
spec:
  selector: {k8s-app: kube-dns}
  clusterIP: ` + DNSServiceIP + `
  ports:
  - {name: dns, port: 53, protocol: UDP}
  - {name: dns-tcp, port: 53, protocol: TCP}
  - {name: metrics, port: 9153, protocol: TCP}
`
}

// metalLBManifests is MetalLB's controller only (no speaker: the host
// routes the pool and kube-proxy DNATs it), with its RBAC from MetalLB's
// config/rbac, and the address pool. The validating webhook is disabled
// (--webhook-mode=disabled): it would need a serving certificate and a
// webhook Service, and only guards against malformed pools, which here are
// ours.
func metalLBManifests() string {
	return `apiVersion: v1
kind: Namespace
metadata:
  name: metallb-system
---
apiVersion: v1
kind: ServiceAccount
metadata:
  name: controller
  namespace: metallb-system
  labels: {app: metallb}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: metallb-system:controller
  labels: {app: metallb}
rules:
- apiGroups: [""]
  resources: [services, namespaces]
  verbs: [get, list, watch]
- apiGroups: [""]
  resources: [nodes]
  verbs: [list]
- apiGroups: [""]
  resources: [services/status]
  verbs: [update]
- apiGroups: [""]
  resources: [events]
  verbs: [create, patch]
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  verbs: [get, list, watch]
- apiGroups: [metallb.io]
  resources: [configurationstates]
  verbs: [create, delete, get, list, patch, update, watch]
- apiGroups: [metallb.io]
  resources: [configurationstates/status]
  verbs: [get, patch, update]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: metallb-system:controller
  labels: {app: metallb}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: metallb-system:controller
subjects:
- kind: ServiceAccount
  name: controller
  namespace: metallb-system
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: controller
  namespace: metallb-system
  labels: {app: metallb}
rules:
- apiGroups: [""]
  resources: [secrets, configmaps]
  verbs: [get, list, watch]
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list]
- apiGroups: [apps]
  resources: [deployments]
  resourceNames: [controller]
  verbs: [get]
- apiGroups: [metallb.io]
  resources: [bgppeers, bfdprofiles, ipaddresspools, bgpadvertisements, l2advertisements, communities, servicebgpstatuses]
  verbs: [get, list, watch]
- apiGroups: [metallb.io]
  resources: [ipaddresspools/status]
  verbs: [update]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: controller
  namespace: metallb-system
  labels: {app: metallb}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: controller
subjects:
- kind: ServiceAccount
  name: controller
  namespace: metallb-system
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: controller
  namespace: metallb-system
  labels: {app: metallb, component: controller}
spec:
  replicas: 1
  revisionHistoryLimit: 3
  selector:
    matchLabels: {app: metallb, component: controller}
  template:
    metadata:
      labels: {app: metallb, component: controller}
    spec:
      serviceAccountName: controller
      terminationGracePeriodSeconds: 0
      securityContext: {runAsNonRoot: true, runAsUser: 65534, fsGroup: 65534}
      containers:
      - name: controller
        image: ` + MetalLBImage + `
        args: [--port=9120, --log-level=info, --webhook-mode=disabled]
        env:
        - name: METALLB_POD_NAME
          valueFrom: {fieldRef: {fieldPath: metadata.name}}
        - {name: METALLB_DEPLOYMENT, value: controller}
        ports:
        - {name: metricshttps, containerPort: 9120}
        readinessProbe:
          httpGet: {path: /readyz, port: 17472}
          periodSeconds: 1
        livenessProbe:
          httpGet: {path: /healthz, port: 17472}
          initialDelaySeconds: 10
          periodSeconds: 10
        securityContext:
          allowPrivilegeEscalation: false
          capabilities: {drop: [ALL]}
          readOnlyRootFilesystem: true
        volumeMounts:
        - {name: tmp, mountPath: /tmp}
      volumes:
      - name: tmp
        emptyDir: {}
`
}

func lbPoolManifest() string {
	return `apiVersion: metallb.io/v1beta1
kind: IPAddressPool
metadata:
  name: ` + LBPoolName + `
  namespace: metallb-system
spec:
  addresses: ["` + LBPoolCIDR + `"]
  autoAssign: true
  # never the .0 and .255 of the /24
  avoidBuggyIPs: true
`
}

// metalLBCRDs reads MetalLB's CRDs (config/crd/bases) from the Go module
// cache, downloading the module through the proxy when it is not there.
func (c *Cluster) metalLBCRDs(ctx context.Context) ([]byte, []string, error) {
	dir, err := moduleDir(ctx, "go.universe.tf/metallb", MetalLBVersion)
	if err != nil {
		return nil, nil, err
	}
	files, err := filepath.Glob(filepath.Join(dir, "config", "crd", "bases", "*.yaml"))
	if err != nil || len(files) == 0 {
		return nil, nil, fmt.Errorf("no MetalLB CRDs in %s/config/crd/bases", dir)
	}
	sort.Strings(files)
	var all bytes.Buffer
	var names []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, nil, err
		}
		all.WriteString("\n---\n")
		all.Write(b)
		// metallb.io_ipaddresspools.yaml -> ipaddresspools.metallb.io
		base := strings.TrimSuffix(filepath.Base(f), ".yaml")
		if group, plural, ok := strings.Cut(base, "_"); ok {
			names = append(names, plural+"."+group)
		}
	}
	return all.Bytes(), names, nil
}

// moduleDir is the module cache directory of module@version.
func moduleDir(ctx context.Context, module, version string) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "env", "GOMODCACHE").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMODCACHE: %w", err)
	}
	dir := filepath.Join(strings.TrimSpace(string(out)), module+"@"+version)
	if _, err := os.Stat(dir); err == nil {
		return dir, nil
	}
	cmd := exec.CommandContext(ctx, "go", "mod", "download", "-json", module+"@"+version)
	cmd.Dir = os.TempDir()
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GO111MODULE=on")
	b, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go mod download %s@%s: %w", module, version, err)
	}
	var info struct{ Dir, Error string }
	if err := json.Unmarshal(b, &info); err != nil || info.Dir == "" {
		return "", fmt.Errorf("go mod download %s@%s: %s", module, version, info.Error)
	}
	return info.Dir, nil
}

// ensureAddons applies CoreDNS and MetalLB (CRDs, controller, pool) and
// waits until both Deployments are available.
func (c *Cluster) ensureAddons(ctx context.Context, cs kubernetes.Interface) error {
	a, err := c.newApplier()
	if err != nil {
		return err
	}
	crds, crdNames, err := c.metalLBCRDs(ctx)
	if err != nil {
		return err
	}
	manifests := map[string]string{
		"coredns.yaml":      coreDNSManifests(),
		"metallb.yaml":      metalLBManifests(),
		"metallb-crds.yaml": string(crds),
		"metallb-pool.yaml": lbPoolManifest(),
	}
	for name, m := range manifests {
		if _, err := writeIfChanged(filepath.Join(c.paths.manifests, name), []byte(m), 0o644); err != nil {
			return err
		}
	}
	for _, m := range []string{coreDNSManifests(), string(crds), metalLBManifests()} {
		if err := a.Apply(ctx, []byte(m)); err != nil {
			return err
		}
	}
	if err := c.waitCRDsEstablished(ctx, crdNames, 30*time.Second); err != nil {
		return err
	}
	if err := a.Apply(ctx, []byte(lbPoolManifest())); err != nil {
		return err
	}
	errs := make(chan error, 2)
	go func() {
		err := WaitDeployment(ctx, cs, "kube-system", "coredns", 120*time.Second)
		if err != nil {
			err = fmt.Errorf("CoreDNS: %w (kubelet log: %s)", err, c.paths.log("kubelet"))
		}
		errs <- err
	}()
	go func() {
		err := WaitDeployment(ctx, cs, "metallb-system", "controller", 120*time.Second)
		if err != nil {
			err = fmt.Errorf("MetalLB controller: %w (kubelet log: %s)", err, c.paths.log("kubelet"))
		}
		errs <- err
	}()
	err1, err2 := <-errs, <-errs
	if err1 != nil {
		return err1
	}
	return err2
}

// checkDNSFromPod runs a pod of the probe image that resolves
// kubernetes.default through the cluster DNS, and waits for it to succeed.
func (c *Cluster) checkDNSFromPod(ctx context.Context, cs kubernetes.Interface) error {
	image, err := c.ProbeImage(ctx)
	if err != nil {
		return err
	}
	const ns, name = "kube-system", "apiary-devcluster-dns-check"
	pods := cs.CoreV1().Pods(ns)
	_ = pods.Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	if err := poll(ctx, 100*time.Millisecond, 30*time.Second, func(ctx context.Context) (bool, string, error) {
		_, err := pods.Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), "old pod still there", nil
	}); err != nil {
		return err
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			AutomountServiceAccountToken:  ptr.To(false),
			TerminationGracePeriodSeconds: ptr.To[int64](0),
			ServiceAccountName:            "coredns",
			Containers: []corev1.Container{{
				Name: "lookup", Image: image,
				Args: []string{"lookup", "kubernetes.default", "60s"},
			}},
		},
	}
	if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return err
	}
	defer func() {
		_ = pods.Delete(context.WithoutCancel(ctx), name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	}()
	var phase corev1.PodPhase
	err = poll(ctx, 200*time.Millisecond, 90*time.Second, func(ctx context.Context) (bool, string, error) {
		p, err := pods.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error(), nil
		}
		phase = p.Status.Phase
		return phase == corev1.PodSucceeded || phase == corev1.PodFailed, "DNS check pod " + string(phase), nil
	})
	logs, _ := pods.GetLogs(name, &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil {
		return fmt.Errorf("%w; pod log: %s", err, strings.TrimSpace(string(logs)))
	}
	if phase != corev1.PodSucceeded {
		return fmt.Errorf("resolving kubernetes.default from a pod failed: %s (CoreDNS: kubectl -n kube-system logs deploy/coredns)", strings.TrimSpace(string(logs)))
	}
	return nil
}
