// Package tenant renders what the operator applies inside a tenant cluster
// through the tenant API: the kubeadm-compatible bootstrap (cluster-info,
// kubeadm-config, kubelet-config and the bootstrap-token RBAC, so that
// `kubeadm join` works against a hosted control plane) and the addons
// (CoreDNS, kube-proxy, konnectivity-agent).
//
// Like operator/render, these are pure functions: the same inputs always
// give the same objects (golden-file tests in testdata/). Every object
// carries LabelManagedBy so that the operator can find what it applied.
package tenant
