package framework

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/apiaryhq/apiary/operator/render"
)

// StaticVolumes makes a StorageClass without a provisioner and n hostPath
// PersistentVolumes of it, in directories under /var/lib/apiary-e2e/name
// the etcd user owns (the local cluster has no volume provisioner), and
// removes them all when the test ends. It returns the class name.
//
// A killed run leaves its volumes and their data behind: its volumes,
// released by claims that are gone, bind no new claim (they are Retain),
// and a member on used data would find another cluster's members (ID
// mismatch). Both are removed first, so the DataStore that used them must
// be gone before.
func (e *Env) StaticVolumes(t testing.TB, name string, n int) string {
	t.Helper()
	class := "e2e-static-" + name
	root := filepath.Join("/var/lib/apiary-e2e", name)
	objs := []client.Object{&storagev1.StorageClass{
		ObjectMeta:        metav1.ObjectMeta{Name: class},
		Provisioner:       "kubernetes.io/no-provisioner",
		VolumeBindingMode: ptr.To(storagev1.VolumeBindingWaitForFirstConsumer),
	}}
	var dirs []string
	for i := range n {
		dir := filepath.Join(root, fmt.Sprintf("pv-%d", i))
		dirs = append(dirs, dir)
		objs = append(objs, &corev1.PersistentVolume{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", class, i)},
			Spec: corev1.PersistentVolumeSpec{
				StorageClassName:              class,
				Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
				AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
				PersistentVolumeSource: corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{
					Path: dir, Type: ptr.To(corev1.HostPathDirectory),
				}},
			},
		})
	}

	for _, o := range objs {
		if err := e.C.Delete(e.Ctx, o); err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
	}
	Eventually(t, "leftover volumes of class "+class+" gone", 2*time.Minute, func() error {
		for _, o := range objs {
			err := e.C.Get(e.Ctx, client.ObjectKeyFromObject(o), o.DeepCopyObject().(client.Object))
			if err == nil {
				return fmt.Errorf("%s still there", o.GetName())
			}
			if !apierrors.IsNotFound(err) {
				return err
			}
		}
		return nil
	})
	if err := os.RemoveAll(root); err != nil {
		t.Fatal(err)
	}
	for _, dir := range dirs {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		// The members run as this user; hostPath volumes are not chowned.
		if err := os.Chown(dir, 65532, 65532); err != nil {
			t.Fatal(err)
		}
	}

	t.Cleanup(func() {
		ctx := context.Background()
		for _, o := range objs {
			_ = e.C.Delete(ctx, o)
		}
		_ = os.RemoveAll(root)
	})
	for _, o := range objs {
		if err := e.C.Create(e.Ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	return class
}

// WaitEtcdServers waits until every replica of a tenant's control plane
// runs with n etcd servers (the DataStore's voting members): its
// Deployment has n --etcd-servers and has finished rolling.
func (e *Env) WaitEtcdServers(t testing.TB, tenant string, n int, timeout time.Duration) {
	t.Helper()
	Eventually(t, fmt.Sprintf("%s's API servers on %d etcd members", tenant, n), timeout, func() error {
		tcp := e.TCP(t, tenant)
		var dep appsv1.Deployment
		if err := e.C.Get(e.Ctx, client.ObjectKey{Namespace: tcp.Namespace, Name: render.DeploymentName(tcp)}, &dep); err != nil {
			return err
		}
		servers := ""
		for _, c := range dep.Spec.Template.Spec.Containers {
			for _, a := range c.Args {
				if v, ok := strings.CutPrefix(a, "--etcd-servers="); ok {
					servers = v
				}
			}
		}
		if servers == "" || len(strings.Split(servers, ",")) != n {
			return fmt.Errorf("--etcd-servers=%s", servers)
		}
		want := ptr.Deref(dep.Spec.Replicas, 1)
		if dep.Status.ObservedGeneration != dep.Generation || dep.Status.UpdatedReplicas != want ||
			dep.Status.Replicas != want || dep.Status.AvailableReplicas != want {
			return fmt.Errorf("rolling: %d updated, %d replicas, %d available of %d", dep.Status.UpdatedReplicas, dep.Status.Replicas, dep.Status.AvailableReplicas, want)
		}
		return nil
	})
}
