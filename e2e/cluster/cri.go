package cluster

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func (c *Cluster) criClient() (runtimeapi.RuntimeServiceClient, func(), error) {
	conn, err := grpc.NewClient("unix://"+c.paths.containerdSock,
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, nil, err
	}
	return runtimeapi.NewRuntimeServiceClient(conn), func() { conn.Close() }, nil
}

// criReady: containerd answers the CRI and its runtime is ready (the
// network condition turns true only once the CNI config is loaded, which
// the kubelet waits for itself).
func (c *Cluster) criReady(ctx context.Context) error {
	rs, done, err := c.criClient()
	if err != nil {
		return err
	}
	defer done()
	st, err := rs.Status(ctx, &runtimeapi.StatusRequest{})
	if err != nil {
		return err
	}
	for _, cond := range st.GetStatus().GetConditions() {
		if cond.Type == runtimeapi.RuntimeReady && !cond.Status {
			return fmt.Errorf("runtime not ready: %s %s", cond.Reason, cond.Message)
		}
	}
	return nil
}

// criTeardown stops every container (SIGTERM, then SIGKILL after grace)
// and removes every pod sandbox through the CRI, so that containerd runs
// the CNI DEL of each (veth, IP, portmap and masquerade chains). The
// kubelet must already be stopped, or it would restart them.
func (c *Cluster) criTeardown(ctx context.Context, grace time.Duration) (int, error) {
	rs, done, err := c.criClient()
	if err != nil {
		return 0, err
	}
	defer done()
	ctx, cancel := context.WithTimeout(ctx, grace+30*time.Second)
	defer cancel()
	ctrs, err := rs.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
	if err != nil {
		return 0, err
	}
	var wg sync.WaitGroup
	for _, ct := range ctrs.GetContainers() {
		if ct.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
			continue
		}
		wg.Add(1)
		go func(id string) {
			defer wg.Done()
			_, _ = rs.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: id, Timeout: int64(grace / time.Second)})
		}(ct.Id)
	}
	wg.Wait()
	sbs, err := rs.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		return 0, err
	}
	var errs []error
	var mu sync.Mutex
	for _, sb := range sbs.GetItems() {
		wg.Add(1)
		go func(id string) {
			defer wg.Done()
			if _, err := rs.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: id}); err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("stopping sandbox %s: %w", id, err))
				mu.Unlock()
				return
			}
			if _, err := rs.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id}); err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("removing sandbox %s: %w", id, err))
				mu.Unlock()
			}
		}(sb.Id)
	}
	wg.Wait()
	return len(sbs.GetItems()), errors.Join(errs...)
}
