package managedetcd

import (
	"net"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/apiaryhq/apiary/internal/golden"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

func fixture(replicas int32) *apiary.DataStore {
	return &apiary.DataStore{
		ObjectMeta: metav1.ObjectMeta{Name: "default", UID: "5e7c1d2a-0000-4000-8000-000000000002"},
		Spec: apiary.DataStoreSpec{Managed: &apiary.ManagedEtcd{
			Namespace: "apiary-system", Replicas: replicas, Version: "3.6.16",
		}},
	}
}

func TestGolden(t *testing.T) {
	in := Inputs{DataStore: fixture(3), ClusterDomain: "cluster.local", ConfigHash: "fedcba9876543210", PeerCAOnly: true, Pods: 3}
	golden.YAML(t, "etcd-statefulset", StatefulSet(in))
	// Before etcd was listed: the bootstrap members form a new cluster.
	golden.YAML(t, "etcd-members-new", MembersConfigMap(in.DataStore, "cluster.local", nil, 3))
	// A learner joining a listed pair (1 → 3, first step).
	golden.YAML(t, "etcd-members-joining", MembersConfigMap(in.DataStore, "cluster.local", []apiary.EtcdMember{
		{Name: "default-etcd-1", ID: "b2", Learner: true}, {Name: "default-etcd-0", ID: "a1"},
	}, 3))
	golden.YAML(t, "etcd-members-lone", MembersConfigMap(in.DataStore, "cluster.local", []apiary.EtcdMember{{Name: "default-etcd-0", ID: "a1"}}, 3))
	golden.YAML(t, "etcd-service", Service(in.DataStore))
	golden.YAML(t, "etcd-pdb", PodDisruptionBudget(in.DataStore))
	dev := fixture(1)
	dev.Spec.Managed.Storage.EmptyDir = true
	golden.YAML(t, "etcd-statefulset-emptydir", StatefulSet(Inputs{DataStore: dev, ClusterDomain: "cluster.local", ConfigHash: "0", Pods: 1}))
}

func TestImageRepository(t *testing.T) {
	for repo, want := range map[string]string{
		"":                        "registry.k8s.io/etcd:3.6.16-0",
		"mirror.example.com/k8s/": "mirror.example.com/k8s/etcd:3.6.16-0",
	} {
		sts := StatefulSet(Inputs{DataStore: fixture(1), ClusterDomain: "cluster.local", ImageRepository: repo})
		if got := *sts.Spec.Template.Spec.Containers[0].Image; got != want {
			t.Errorf("repository %q: image %s, want %s", repo, got, want)
		}
	}
}

func TestNames(t *testing.T) {
	ds := fixture(3)
	eps := Endpoints(ds, "cluster.local")
	want := []string{
		"https://default-etcd-0.default-etcd.apiary-system.svc.cluster.local:2379",
		"https://default-etcd-1.default-etcd.apiary-system.svc.cluster.local:2379",
		"https://default-etcd-2.default-etcd.apiary-system.svc.cluster.local:2379",
	}
	if !slices.Equal(eps, want) {
		t.Errorf("endpoints %v", eps)
	}
	// Every member's name is covered by the serving certificate.
	req := ServingCertRequest(ds, "cluster.local", true)
	if !slices.Contains(req.DNSNames, "*.default-etcd.apiary-system.svc.cluster.local") {
		t.Errorf("SANs %v", req.DNSNames)
	}
	args := Args(Inputs{DataStore: ds, ClusterDomain: "cluster.local"})
	for _, a := range []string{
		"--client-cert-auth=true", "--peer-client-cert-auth=true", "--auto-compaction-mode=periodic",
		// 80 % of the default 1Gi volume.
		"--quota-backend-bytes=858993456",
		"--peer-trusted-ca-file=/etc/etcd/pki/peer-trust.crt",
	} {
		if !slices.Contains(args, a) {
			t.Errorf("missing %s in %v", a, args)
		}
	}
	// The peer common name is required only once the client CA is no
	// longer trusted on the peer port.
	if slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--peer-cert-allowed-cn") }) {
		t.Errorf("peer-cert-allowed-cn while moving to the peer CA: %v", args)
	}
	separate := Args(Inputs{DataStore: ds, ClusterDomain: "cluster.local", PeerCAOnly: true})
	if !slices.Contains(separate, "--peer-cert-allowed-cn="+PeerCN) {
		t.Errorf("separate peer CA without peer-cert-allowed-cn: %v", separate)
	}
}

func TestQuotaBytes(t *testing.T) {
	for size, want := range map[string]int64{"": 858993456, "10Gi": 8589934592, "500M": 400000000} {
		m := &apiary.ManagedEtcd{}
		if size != "" {
			q := resource.MustParse(size)
			m.Storage.Size = &q
		}
		if got := QuotaBytes(m); got != want {
			t.Errorf("size %q: quota %d, want %d", size, got, want)
		}
	}
}

func TestHostServiceGolden(t *testing.T) {
	ds := fixture(3)
	ds.Spec.HostAccess = &apiary.HostAccess{Address: "192.0.2.77"}
	golden.YAML(t, "etcd-host-service", HostService(ds))
}

// The client port's certificate names the hosts' address; the peer
// certificate is made of the same request without it.
func TestServingCertNamesHostAddresses(t *testing.T) {
	req := ServingCertRequest(fixture(3), "cluster.local", false, net.ParseIP("192.0.2.77"))
	if len(req.IPs) != 2 || !req.IPs[1].Equal(net.ParseIP("192.0.2.77")) {
		t.Errorf("IPs %v", req.IPs)
	}
	if peer := ServingCertRequest(fixture(3), "cluster.local", true); len(peer.IPs) != 1 {
		t.Errorf("peer IPs %v", peer.IPs)
	}
}

func TestMembership(t *testing.T) {
	ds := fixture(5)
	ds.Status.Members = []apiary.EtcdMember{
		{Name: "default-etcd-2", ID: "c3"},
		{Name: "default-etcd-0", ID: "a1"},
		{Name: "default-etcd-3", ID: "d4", Learner: true},
		{Name: "other-etcd-1", ID: "ff"},
	}
	// Voting members only, by ordinal; a foreign name is nobody.
	want := []string{
		"https://default-etcd-0.default-etcd.apiary-system.svc.cluster.local:2379",
		"https://default-etcd-2.default-etcd.apiary-system.svc.cluster.local:2379",
	}
	if eps := Endpoints(ds, "cluster.local"); !slices.Equal(eps, want) {
		t.Errorf("endpoints %v, want %v", eps, want)
	}
	if n := Pods(ds, ds.Status.Members, 1); n != 4 {
		t.Errorf("pods %d, want 4 (one past the learner default-etcd-3)", n)
	}
	if n := Pods(ds, nil, 3); n != 3 {
		t.Errorf("pods before listing %d, want the bootstrap 3", n)
	}
	for name, want := range map[string]int32{
		"default-etcd-0": 0, "default-etcd-12": 12, "default-etcd-": -1, "default-etcd-01": -1,
		"default-etcd--1": -1, "other-etcd-1": -1, "default-etcd-1x": -1, "default-etcd-99999999999": -1,
	} {
		if got := MemberOrdinal(ds, name); got != want {
			t.Errorf("MemberOrdinal(%q) = %d, want %d", name, got, want)
		}
	}
	for u, want := range map[string]string{
		PeerURL(ds, 3, "cluster.local"):                                            "default-etcd-3",
		"https://default-etcd-3.default-etcd.apiary-system.svc.cluster.local:2379": "default-etcd-3",
		"https://default-etcd-3.default-etcd.elsewhere.svc.cluster.local:2380":     "",
		"https://10.0.0.1:2380":                                                    "",
		"::not a url":                                                              "",
	} {
		if got := MemberOfURL(ds, u, "cluster.local"); got != want {
			t.Errorf("MemberOfURL(%q) = %q, want %q", u, got, want)
		}
	}
}
