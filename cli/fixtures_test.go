package cli

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	apiaryv1alpha1 "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

// now is the fixed "current time" of the formatting tests.
var now = time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)

func ago(d time.Duration) metav1.Time { return metav1.NewTime(now.Add(-d)) }

func cond(t string, s metav1.ConditionStatus, reason, msg string, since time.Duration) metav1.Condition {
	return metav1.Condition{Type: t, Status: s, Reason: reason, Message: msg, LastTransitionTime: ago(since)}
}

func allTrue(since time.Duration) []metav1.Condition {
	return []metav1.Condition{
		cond(apiaryv1alpha1.ConditionReady, metav1.ConditionTrue, "Ready", "the tenant API answers at its endpoint", since),
		cond(apiaryv1alpha1.ConditionDataStoreReady, metav1.ConditionTrue, "Bound", "bound to DataStore shared-1", since),
		cond(apiaryv1alpha1.ConditionCertificatesReady, metav1.ConditionTrue, "Issued", "8 certificates issued", since),
		cond(apiaryv1alpha1.ConditionEndpointReady, metav1.ConditionTrue, "Assigned", "LoadBalancer 203.0.113.10", since),
		cond(apiaryv1alpha1.ConditionControlPlaneAvailable, metav1.ConditionTrue, "Available", "2/2 pods ready", since),
	}
}

func spec(version string, mode apiaryv1alpha1.Mode, replicas int32) apiaryv1alpha1.TenantControlPlaneSpec {
	return apiaryv1alpha1.TenantControlPlaneSpec{
		Version:  version,
		Mode:     mode,
		Replicas: ptr.To(replicas),
		Network:  apiaryv1alpha1.NetworkSpec{ServiceType: corev1.ServiceTypeLoadBalancer, Port: 6443},
	}
}

// readyTenant is a healthy tenant.
func readyTenant() *apiaryv1alpha1.TenantControlPlane {
	return &apiaryv1alpha1.TenantControlPlane{
		ObjectMeta: metav1.ObjectMeta{Name: "alpha", Namespace: "team-a", Generation: 2, CreationTimestamp: ago(72 * time.Hour)},
		Spec:       spec("v1.37.2", apiaryv1alpha1.ModeStandalone, 2),
		Status: apiaryv1alpha1.TenantControlPlaneStatus{
			ObservedGeneration: 2,
			Conditions:         allTrue(70 * time.Hour),
			Phase:              apiaryv1alpha1.PhaseReady,
			Version:            "v1.37.2",
			Mode:               apiaryv1alpha1.ModeStandalone,
			Endpoint:           "https://203.0.113.10:6443",
			KubeconfigSecret:   "alpha-admin-kubeconfig",
			Replicas:           2,
			ReadyReplicas:      2,
			DataStore: apiaryv1alpha1.DataStoreBinding{Name: "shared-1", Prefix: "/apiary/team-a/alpha/", User: "apiary-team-a-alpha",
				Usage: &apiaryv1alpha1.DataStoreUsage{Bytes: 3 << 20, Objects: 412, Quota: apiaryv1alpha1.TenantQuota{Bytes: resource.NewQuantity(100<<20, resource.BinarySI), Objects: ptr.To[int64](10000)}}},
			CertificateRotation: &apiaryv1alpha1.CertificateRotation{Token: "2026-05-31T09:00:00Z", Requested: ago(27 * time.Hour), Completed: ptr.To(ago(27 * time.Hour))},
			Certificates: []apiaryv1alpha1.CertificateStatus{
				{Name: "ca", Secret: "alpha-ca", NotAfter: metav1.NewTime(now.Add(10 * 365 * 24 * time.Hour))},
				{Name: "apiserver", Secret: "alpha-apiserver", NotAfter: metav1.NewTime(now.Add(300 * 24 * time.Hour)), RenewAt: ptr.To(metav1.NewTime(now.Add(270 * 24 * time.Hour)))},
				{Name: "admin", Secret: "alpha-admin", NotAfter: metav1.NewTime(now.Add(-2 * 24 * time.Hour)), RenewAt: ptr.To(metav1.NewTime(now.Add(-32 * 24 * time.Hour)))},
			},
		},
	}
}

// failingTenant is stuck on its datastore, mid-upgrade, with a stale status.
func failingTenant() *apiaryv1alpha1.TenantControlPlane {
	return &apiaryv1alpha1.TenantControlPlane{
		ObjectMeta: metav1.ObjectMeta{Name: "beta", Namespace: "team-b", Generation: 4, CreationTimestamp: ago(5 * 24 * time.Hour)},
		Spec:       spec("v1.37.2", apiaryv1alpha1.ModeRegistered, 3),
		Status: apiaryv1alpha1.TenantControlPlaneStatus{
			ObservedGeneration: 3,
			Conditions: []metav1.Condition{
				cond(apiaryv1alpha1.ConditionReady, metav1.ConditionFalse, "DataStoreNotReady", "waiting for the datastore", 10*time.Minute),
				cond(apiaryv1alpha1.ConditionDataStoreReady, metav1.ConditionFalse, "Unreachable",
					"dial tcp 10.0.0.5:2379:\n\tconnection refused", 10*time.Minute),
				cond(apiaryv1alpha1.ConditionCertificatesReady, metav1.ConditionTrue, "Issued", "", 5*24*time.Hour),
				cond(apiaryv1alpha1.ConditionEndpointReady, metav1.ConditionTrue, "Assigned", "NodePort 30443", 5*24*time.Hour),
				cond(apiaryv1alpha1.ConditionControlPlaneAvailable, metav1.ConditionUnknown, "Progressing", "1/3 pods ready", 90*time.Second),
			},
			Phase:         apiaryv1alpha1.PhaseNotReady,
			Version:       "v1.36.4",
			Mode:          apiaryv1alpha1.ModeRegistered,
			Endpoint:      "https://192.0.2.7:30443",
			Replicas:      2,
			ReadyReplicas: 1,
			DataStore:     apiaryv1alpha1.DataStoreBinding{Name: "shared-2", Prefix: "/apiary/team-b/beta/", User: "apiary-team-b-beta"},
		},
	}
}

// newTenant has just been created: no status at all.
func newTenant() *apiaryv1alpha1.TenantControlPlane {
	t := &apiaryv1alpha1.TenantControlPlane{
		ObjectMeta: metav1.ObjectMeta{Name: "gamma", Namespace: "team-a", Generation: 1, CreationTimestamp: ago(5 * time.Second)},
		Spec:       spec("v1.36.4", apiaryv1alpha1.ModeStandalone, 1),
	}
	t.Spec.DataStore = "shared-1"
	return t
}

// deletingTenant is being deleted before the operator reported it.
func deletingTenant() *apiaryv1alpha1.TenantControlPlane {
	t := readyTenant()
	t.Name, t.Namespace = "delta", "team-b"
	t.DeletionTimestamp = ptr.To(ago(30 * time.Second))
	t.Status.Phase = ""
	t.Status.KubeconfigSecret = ""
	return t
}
