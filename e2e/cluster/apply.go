package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"
)

// RESTConfig is the admin client configuration of the cluster.
func (c *Cluster) RESTConfig() (*rest.Config, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", c.paths.adminKubeconfig)
	if err != nil {
		return nil, fmt.Errorf("loading %s: %w", c.paths.adminKubeconfig, err)
	}
	cfg.QPS, cfg.Burst = 100, 200
	cfg.Timeout = 30 * time.Second
	return cfg, nil
}

// Clientset is a typed admin client of the cluster.
func (c *Cluster) Clientset() (kubernetes.Interface, error) {
	cfg, err := c.RESTConfig()
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(cfg)
}

// applier server-side applies YAML documents with one field manager.
type applier struct {
	dyn    dynamic.Interface
	mapper *restmapper.DeferredDiscoveryRESTMapper
}

func (c *Cluster) newApplier() (*applier, error) {
	cfg, err := c.RESTConfig()
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return &applier{dyn: dyn, mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))}, nil
}

// Apply server-side applies every object of a multi-document YAML stream
// (objects without a namespace that need one go to defaultNS).
func (a *applier) Apply(ctx context.Context, yamlDocs []byte) error {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(yamlDocs), 4096)
	for {
		var obj unstructured.Unstructured
		if err := dec.Decode(&obj.Object); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return fmt.Errorf("decoding manifest: %w", err)
		}
		if len(obj.Object) == 0 {
			continue
		}
		if err := a.applyOne(ctx, &obj); err != nil {
			return err
		}
	}
}

func (a *applier) applyOne(ctx context.Context, obj *unstructured.Unstructured) error {
	gvk := obj.GroupVersionKind()
	mapping, err := a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if meta.IsNoMatchError(err) {
		a.mapper.Reset() // a CRD applied just before
		mapping, err = a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	}
	if err != nil {
		return fmt.Errorf("mapping %s: %w", gvk, err)
	}
	var ri dynamic.ResourceInterface = a.dyn.Resource(mapping.Resource)
	if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
		ns := obj.GetNamespace()
		if ns == "" {
			ns = metav1.NamespaceDefault
			obj.SetNamespace(ns)
		}
		ri = a.dyn.Resource(mapping.Resource).Namespace(ns)
	}
	data, err := obj.MarshalJSON()
	if err != nil {
		return err
	}
	force := true
	if _, err := ri.Patch(ctx, obj.GetName(), types.ApplyPatchType, data,
		metav1.PatchOptions{FieldManager: FieldManager, Force: &force}); err != nil {
		return fmt.Errorf("applying %s %s/%s: %w", gvk.Kind, obj.GetNamespace(), obj.GetName(), err)
	}
	return nil
}

// poll calls f every interval until it reports done, fails, or the
// timeout expires (then the last reason is returned).
func poll(ctx context.Context, interval, timeout time.Duration, f func(ctx context.Context) (bool, string, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	last := ""
	for {
		done, why, err := f(ctx)
		if err != nil {
			return err
		}
		if done {
			return nil
		}
		if why != "" {
			last = why
		}
		select {
		case <-ctx.Done():
			if last == "" {
				last = ctx.Err().Error()
			}
			return fmt.Errorf("timed out after %s: %s", timeout, last)
		case <-time.After(interval):
		}
	}
}

func nodeReady(n *corev1.Node) (bool, string) {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue, c.Reason + ": " + c.Message
		}
	}
	return false, "no Ready condition yet"
}

func (c *Cluster) waitNodeReady(ctx context.Context, cs kubernetes.Interface, timeout time.Duration) error {
	return poll(ctx, 200*time.Millisecond, timeout, func(ctx context.Context) (bool, string, error) {
		n, err := cs.CoreV1().Nodes().Get(ctx, c.opts.NodeName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, "node " + c.opts.NodeName + " not registered yet", nil
		}
		if err != nil {
			return false, err.Error(), nil
		}
		ok, why := nodeReady(n)
		return ok, "node not Ready: " + why, nil
	})
}

// WaitDeployment waits until a Deployment has all its replicas updated and
// available; the reason on timeout quotes its pods' states.
func WaitDeployment(ctx context.Context, cs kubernetes.Interface, ns, name string, timeout time.Duration) error {
	return poll(ctx, 250*time.Millisecond, timeout, func(ctx context.Context) (bool, string, error) {
		d, err := cs.AppsV1().Deployments(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error(), nil
		}
		if deploymentAvailable(d) {
			return true, "", nil
		}
		return false, fmt.Sprintf("deployment %s/%s: %d/%d available; %s", ns, name,
			d.Status.AvailableReplicas, replicas(d), podStates(ctx, cs, ns, d.Spec.Selector)), nil
	})
}

func replicas(d *appsv1.Deployment) int32 {
	if d.Spec.Replicas == nil {
		return 1
	}
	return *d.Spec.Replicas
}

func deploymentAvailable(d *appsv1.Deployment) bool {
	return d.Status.ObservedGeneration >= d.Generation &&
		d.Status.UpdatedReplicas == replicas(d) &&
		d.Status.AvailableReplicas == replicas(d) &&
		d.Status.Replicas == replicas(d)
}

// podStates summarises the pods of a selector: phase and the reason of
// every container that is not running.
func podStates(ctx context.Context, cs kubernetes.Interface, ns string, sel *metav1.LabelSelector) string {
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		return ""
	}
	pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: s.String()})
	if err != nil {
		return err.Error()
	}
	var b bytes.Buffer
	for _, p := range pods.Items {
		fmt.Fprintf(&b, "pod %s %s", p.Name, p.Status.Phase)
		for _, cst := range p.Status.ContainerStatuses {
			switch {
			case cst.State.Waiting != nil:
				fmt.Fprintf(&b, " [%s waiting: %s %s]", cst.Name, cst.State.Waiting.Reason, cst.State.Waiting.Message)
			case cst.State.Terminated != nil:
				fmt.Fprintf(&b, " [%s terminated: %s %d]", cst.Name, cst.State.Terminated.Reason, cst.State.Terminated.ExitCode)
			case !cst.Ready:
				fmt.Fprintf(&b, " [%s running, not ready]", cst.Name)
			}
		}
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodScheduled && cond.Status != corev1.ConditionTrue {
				fmt.Fprintf(&b, " [unschedulable: %s]", cond.Message)
			}
		}
		b.WriteString("; ")
	}
	if b.Len() == 0 {
		return "no pods"
	}
	return b.String()
}

func (c *Cluster) waitCRDsEstablished(ctx context.Context, names []string, timeout time.Duration) error {
	cfg, err := c.RESTConfig()
	if err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	crds := dyn.Resource(schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"})
	return poll(ctx, 100*time.Millisecond, timeout, func(ctx context.Context) (bool, string, error) {
		for _, n := range names {
			u, err := crds.Get(ctx, n, metav1.GetOptions{})
			if err != nil {
				return false, err.Error(), nil
			}
			conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
			ok := false
			for _, cd := range conds {
				m, _ := cd.(map[string]any)
				if m["type"] == "Established" && m["status"] == "True" {
					ok = true
				}
			}
			if !ok {
				return false, "CRD " + n + " not established", nil
			}
		}
		return true, "", nil
	})
}
