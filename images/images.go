// Package images builds the references of the upstream images Apiary runs
// (control plane, etcd, addons, konnectivity) from the repository an
// operator is configured with, so that every image name is made the same
// way: registry.k8s.io unless a mirror is given (air-gapped installs), and a
// mirror written with or without a trailing "/" gives the same reference.
//
// It is a leaf: the render packages, tenant, konnectivity and cmd all use
// it. (hack/images, which builds those images from source, is another
// package.)
package images

import "strings"

// DefaultRepository is where upstream publishes the images.
const DefaultRepository = "registry.k8s.io"

// Repository is the repository images are pulled from: repository without
// a trailing "/", or DefaultRepository when it is empty.
func Repository(repository string) string {
	if r := strings.TrimRight(repository, "/"); r != "" {
		return r
	}
	return DefaultRepository
}

// Ref is the reference of image name (e.g. "kube-apiserver",
// "kas-network-proxy/proxy-agent") at tag in repository (see Repository).
func Ref(repository, name, tag string) string {
	return Repository(repository) + "/" + name + ":" + tag
}
