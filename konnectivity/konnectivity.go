package konnectivity

import "github.com/apiaryhq/apiary/images"

// Version of the konnectivity images (kas-network-proxy) the operator
// deploys.
const Version = "v0.36.0"

// Ports of konnectivity-server in the control-plane pod. The agent port is
// also a port of the tenant Service, on the API's address.
const (
	AgentPort  = 8132
	AdminPort  = 8133
	HealthPort = 8134
)

// The agents' own admin and health ports (upstream's defaults), on their
// nodes' network. They differ from the server's: a registered tenant's
// control-plane host runs both (the agent DaemonSet tolerates every taint).
const (
	AgentHealthPort = 8093
	AgentAdminPort  = 8094
)

// Namespace of the tenant that holds the agents, their ServiceAccount and
// the servers' leases.
const Namespace = "kube-system"

// AgentServiceAccount is the agents' ServiceAccount in Namespace;
// konnectivity-server only accepts its tokens.
const AgentServiceAccount = "konnectivity-agent"

// LeaseLabel selects the leases konnectivity-servers publish in Namespace;
// agents count them to know how many servers to connect to.
const LeaseLabel = "k8s-app=konnectivity-server"

// Audience is the audience of the agents' ServiceAccount tokens, which
// konnectivity-server checks with a TokenReview.
const Audience = "system:konnectivity-server"

// ServerUser is the user of konnectivity-server's client certificate for the
// tenant API; it may review the agents' tokens and manage the leases.
const ServerUser = "system:konnectivity-server"

// ServerImage is konnectivity-server's image in repository (see
// images.Repository).
func ServerImage(repository string) string {
	return images.Ref(repository, "kas-network-proxy/proxy-server", Version)
}

// AgentImage is konnectivity-agent's image in repository.
func AgentImage(repository string) string {
	return images.Ref(repository, "kas-network-proxy/proxy-agent", Version)
}
