package cluster

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ComponentStatus is the state of one host process.
type ComponentStatus struct {
	Name    string
	PID     int
	Running bool
	Healthy bool
	Problem string
	Log     string
}

// Status is what `devcluster status` shows.
type Status struct {
	Components []ComponentStatus
	// Node is the node's Ready condition, Pods one line per pod; both empty
	// when the API server does not answer.
	Node    string
	Pods    []string
	LBRoute bool
}

// Running reports whether every component runs and is healthy.
func (s *Status) Running() bool {
	for _, c := range s.Components {
		if !c.Running || !c.Healthy {
			return false
		}
	}
	return true
}

// Status checks every component (PID file, process, health endpoint) and,
// when the API server answers, the node and the pods.
func (c *Cluster) Status(ctx context.Context) *Status {
	st := &Status{LBRoute: linkExists(LBInterface)}
	for _, name := range startOrder {
		comp := c.component(name)
		cs := ComponentStatus{Name: name, Log: c.paths.log(name)}
		if p, ok := c.running(name); ok {
			cs.PID, cs.Running = p.pid, true
			cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			err := comp.ready(cctx)
			cancel()
			cs.Healthy = err == nil
			if err != nil {
				cs.Problem = err.Error()
			}
		} else if p, ok := c.readPID(name); ok {
			cs.PID = p.pid
			cs.Problem = "exited"
		}
		st.Components = append(st.Components, cs)
	}
	if !c.apiUp(st) {
		return st
	}
	kcs, err := c.Clientset()
	if err != nil {
		return st
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if n, err := kcs.CoreV1().Nodes().Get(ctx, c.opts.NodeName, metav1.GetOptions{}); err == nil {
		ok, why := nodeReady(n)
		st.Node = fmt.Sprintf("%s Ready=%v (%s) podCIDR=%s version=%s", n.Name, ok, strings.TrimSpace(why),
			n.Spec.PodCIDR, n.Status.NodeInfo.KubeletVersion)
	} else {
		st.Node = "node " + c.opts.NodeName + ": " + err.Error()
	}
	if pods, err := kcs.CoreV1().Pods("").List(ctx, metav1.ListOptions{}); err == nil {
		for _, p := range pods.Items {
			ready := 0
			for _, s := range p.Status.ContainerStatuses {
				if s.Ready {
					ready++
				}
			}
			st.Pods = append(st.Pods, fmt.Sprintf("%s/%s\t%s\t%d/%d\t%s", p.Namespace, p.Name, p.Status.Phase,
				ready, len(p.Spec.Containers), p.Status.PodIP))
		}
		sort.Strings(st.Pods)
	}
	return st
}

func (c *Cluster) apiUp(st *Status) bool {
	for _, cs := range st.Components {
		if cs.Name == "kube-apiserver" {
			return cs.Healthy
		}
	}
	return false
}

func (s *Status) String() string {
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "COMPONENT\tPID\tRUNNING\tHEALTHY\tLOG\tPROBLEM")
	for _, c := range s.Components {
		pid := "-"
		if c.PID > 0 {
			pid = fmt.Sprint(c.PID)
		}
		fmt.Fprintf(w, "%s\t%s\t%v\t%v\t%s\t%s\n", c.Name, pid, c.Running, c.Healthy, c.Log, c.Problem)
	}
	w.Flush()
	fmt.Fprintf(&b, "LoadBalancer route (%s via %s): %v\n", LBPoolCIDR, LBInterface, s.LBRoute)
	if s.Node != "" {
		fmt.Fprintf(&b, "node: %s\n", s.Node)
	}
	if len(s.Pods) > 0 {
		w := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "POD\tPHASE\tREADY\tIP")
		for _, p := range s.Pods {
			fmt.Fprintln(w, p)
		}
		w.Flush()
	}
	return b.String()
}
