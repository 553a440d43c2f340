// Package konnectivity is everything Apiary knows about konnectivity, the
// tunnel through which a hosted API server reaches its tenant's network.
//
// A tenant's kube-apiserver runs in the management cluster, which has no
// route to the tenant's nodes, pods or Services. So every control-plane pod
// runs konnectivity-server beside kube-apiserver: the API server sends its
// cluster-bound traffic (logs, exec, port-forward, webhooks, aggregated
// APIs) over a Unix socket on a volume they share (the egress selector
// configuration), and konnectivity-server forwards it through the tunnels
// that konnectivity-agents open. The agents run on every tenant node
// (a DaemonSet inside the tenant) and dial the servers at the tenant's
// public address, on AgentPort of the tenant Service, so all connections go
// from the tenant to the management cluster. Agents authenticate with a
// ServiceAccount token of the tenant (audience Audience), which the servers
// review as ServerUser; each server publishes a lease in the tenant, and the
// agents count the leases to know how many servers to connect to.
//
// Both halves live here, as pure functions of explicit inputs: the server
// side (EgressSelectorConfiguration, ServerArgs, ServerContainer,
// ServicePort) that operator/render puts into the control-plane pod and the
// tenant Service, and the agent side (AgentPodSpec, the RBAC rules) that
// package tenant applies inside the tenant. The ports, names and audience
// the two halves must agree on are therefore written once.
//
// It is a leaf: it imports neither operator/render nor tenant (both import
// it), only Kubernetes types and the images helper. The wrappers that know
// about a tenant (labels, owner references, the volumes of the tenant's
// Secrets, the ConfigMap objects) stay in those packages.
package konnectivity
