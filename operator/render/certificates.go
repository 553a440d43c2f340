package render

import (
	"crypto/x509"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/pki"
	"github.com/apiaryhq/apiary/tenant"
)

// Common names and groups of the tenant's client certificates, as kubeadm
// names them.
const (
	AdminCN = "kubernetes-admin"
	// OperatorCN is the operator's own client certificate in each tenant.
	OperatorCN          = "apiary-operator"
	ControllerManagerCN = "system:kube-controller-manager"
	SchedulerCN         = "system:kube-scheduler"
	KubeletClientCN     = "kube-apiserver-kubelet-client"
	// MastersGroup is bound to cluster-admin by the API server itself and
	// cannot be revoked: only the operator's and the kubelet-client
	// certificates carry it, never one a user exports.
	MastersGroup = "system:masters"
	// ClusterAdminsGroup is kubeadm's group of the admin kubeconfig, bound
	// to cluster-admin by a ClusterRoleBinding the bootstrap creates once
	// inside the tenant (deleting it revokes every exported admin
	// kubeconfig).
	ClusterAdminsGroup = tenant.ClusterAdminsGroup
)

// CACommonName names a tenant's cluster CA so that a certificate found on
// disk says whose it is.
func CACommonName(tcp *apiary.TenantControlPlane) string {
	return fmt.Sprintf("apiary %s/%s kubernetes", tcp.Namespace, tcp.Name)
}

// FrontProxyCACommonName names a tenant's front-proxy CA.
func FrontProxyCACommonName(tcp *apiary.TenantControlPlane) string {
	return fmt.Sprintf("apiary %s/%s front-proxy", tcp.Namespace, tcp.Name)
}

// Endpoint is where the tenant API is reached, as observed on its Service.
type Endpoint struct {
	// Host is an IP address or DNS name.
	Host string
	Port int32
	// ClusterIP of the tenant Service in the management cluster.
	ClusterIP string
}

// URL of the endpoint.
func (e Endpoint) URL() string {
	return "https://" + net.JoinHostPort(e.Host, fmt.Sprint(e.Port))
}

// InternalURL addresses the tenant Service by its cluster DNS name, for
// clients inside the management cluster.
func InternalURL(tcp *apiary.TenantControlPlane) string {
	return fmt.Sprintf("https://%s.%s.svc:%d", ServiceName(tcp), tcp.Namespace, tcp.Spec.Network.Port)
}

// LoopbackURL is how the components of a control-plane pod reach their own
// API server.
func LoopbackURL(tcp *apiary.TenantControlPlane) string {
	return fmt.Sprintf("https://127.0.0.1:%d", tcp.Spec.Network.Port)
}

// APIServerCertRequest lists every name the tenant API is reached by:
// inside the tenant (kubernetes.default..., the first Service IP), in the
// management cluster (the Service's DNS names and ClusterIP), from outside
// (the endpoint, network.address, certSANs) and from its own pod (loopback).
func APIServerCertRequest(tcp *apiary.TenantControlPlane, ep Endpoint, mgmtClusterDomain string) pki.Request {
	n := tcp.Spec.Network
	svc, ns := ServiceName(tcp), tcp.Namespace
	dns := []string{
		"kubernetes", "kubernetes.default", "kubernetes.default.svc",
		"kubernetes.default.svc." + n.ClusterDomain,
		svc, svc + "." + ns, svc + "." + ns + ".svc", svc + "." + ns + ".svc." + mgmtClusterDomain,
		"localhost",
	}
	var ips []net.IP
	addIP := func(s string) {
		if ip := net.ParseIP(s); ip != nil && !slices.ContainsFunc(ips, ip.Equal) {
			ips = append(ips, ip)
		}
	}
	addName := func(s string) {
		if s != "" && !slices.Contains(dns, s) {
			dns = append(dns, s)
		}
	}
	addIP("127.0.0.1")
	if first, ok := apiary.NthIP(n.ServiceCIDR, 1); ok {
		addIP(first.String())
	}
	addIP(ep.ClusterIP)
	for _, host := range append([]string{ep.Host, n.Address}, n.CertSANs...) {
		if _, err := netip.ParseAddr(host); err == nil {
			addIP(host)
		} else {
			addName(host)
		}
	}
	return pki.Request{
		CommonName: "kube-apiserver",
		DNSNames:   dns,
		IPs:        ips,
		Usages:     []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
}

// ClientCertRequest is a client certificate for a user and its groups.
func ClientCertRequest(user string, groups ...string) pki.Request {
	return pki.Request{
		CommonName:   user,
		Organization: groups,
		Usages:       []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
}

// Kubeconfig renders a kubeconfig with one cluster, user and context, with
// all credentials inline.
func Kubeconfig(clusterName, server string, caPEM []byte, user string, certPEM, keyPEM []byte) ([]byte, error) {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[clusterName] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: caPEM}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{ClientCertificateData: certPEM, ClientKeyData: keyPEM}
	cfg.Contexts[clusterName] = &clientcmdapi.Context{Cluster: clusterName, AuthInfo: user}
	cfg.CurrentContext = clusterName
	out, err := clientcmd.Write(*cfg)
	if err != nil {
		return nil, fmt.Errorf("encoding kubeconfig for %s: %w", user, err)
	}
	return out, nil
}
