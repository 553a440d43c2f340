package konnectivity

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"sigs.k8s.io/yaml"
)

// arg is the value of --name in args, or "" and false.
func arg(args []string, name string) (string, bool) {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
	}
	return "", false
}

// The command line is sorted, so that the same inputs always give the same
// pod template (a different order would roll the pods for nothing).
func TestServerArgsSorted(t *testing.T) {
	args := ServerArgs()
	if !slices.IsSorted(args) {
		t.Errorf("arguments are not sorted: %v", args)
	}
	for _, want := range []string{
		"--uds-name=/run/konnectivity/konnectivity-server.socket",
		"--cluster-cert=/etc/kubernetes/konnectivity/konnectivity-server.crt",
		"--kubeconfig=/etc/kubernetes/konnectivity/konnectivity-server.conf",
		"--agent-port=8132", "--admin-port=8133", "--health-port=8134",
		"--server-port=0",
	} {
		if !slices.Contains(args, want) {
			t.Errorf("missing %s in %v", want, args)
		}
	}
}

// The API server dials the socket the server listens on.
func TestEgressSelectorUsesTheServersSocket(t *testing.T) {
	var cfg struct {
		EgressSelections []struct {
			Name       string
			Connection struct {
				ProxyProtocol string `json:"proxyProtocol"`
				Transport     struct {
					UDS struct {
						UDSName string `json:"udsName"`
					} `json:"uds"`
				}
			}
		} `json:"egressSelections"`
	}
	if err := yaml.Unmarshal([]byte(EgressSelectorConfiguration), &cfg); err != nil {
		t.Fatal(err)
	}
	if len(cfg.EgressSelections) != 1 || cfg.EgressSelections[0].Name != "cluster" {
		t.Fatalf("egress selections %+v: want only cluster-bound traffic", cfg.EgressSelections)
	}
	uds, _ := arg(ServerArgs(), "uds-name")
	if got := cfg.EgressSelections[0].Connection.Transport.UDS.UDSName; got != uds || got != SocketPath {
		t.Errorf("API server dials %s, server listens on %s", got, uds)
	}
	// Both containers mount the socket's directory.
	ctr := ServerContainer("img", nil)
	if !slices.ContainsFunc(ctr.VolumeMounts, func(m corev1ac.VolumeMountApplyConfiguration) bool {
		return *m.Name == SocketVolume && *m.MountPath == SocketDir
	}) {
		t.Errorf("server does not mount %s at %s", SocketVolume, SocketDir)
	}
	if !strings.HasPrefix(SocketPath, *SocketMount().MountPath+"/") {
		t.Errorf("socket %s outside the API server's mount %s", SocketPath, *SocketMount().MountPath)
	}
}

// The two halves must agree on the port, the audience, the ServiceAccount
// and the leases, or the agents never connect.
func TestAgentAndServerAgree(t *testing.T) {
	pod := AgentPodSpec(AgentInputs{Image: AgentImage("mirror.example/k8s/"), ServerHost: "192.0.2.10"})
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers", len(pod.Containers))
	}
	agent, server := pod.Containers[0].Args, ServerArgs()
	if *pod.Containers[0].Image != "mirror.example/k8s/kas-network-proxy/proxy-agent:"+Version {
		t.Errorf("image %s", *pod.Containers[0].Image)
	}
	for _, c := range []struct{ agent, server string }{
		{"proxy-server-port", "agent-port"},
		{"lease-label", "lease-label"},
		{"lease-namespace", "lease-namespace"},
	} {
		a, aok := arg(agent, c.agent)
		s, sok := arg(server, c.server)
		if !aok || !sok || a != s {
			t.Errorf("agent --%s=%s, server --%s=%s", c.agent, a, c.server, s)
		}
	}
	if h, _ := arg(agent, "proxy-server-host"); h != "192.0.2.10" {
		t.Errorf("agent dials %q", h)
	}
	if sa, _ := arg(server, "agent-service-account"); *pod.ServiceAccountName != sa {
		t.Errorf("agents run as %s, server accepts %s", *pod.ServiceAccountName, sa)
	}
	aud, _ := arg(server, "authentication-audience")
	var token string
	for _, v := range pod.Volumes {
		if v.Projected != nil {
			token = *v.Projected.Sources[0].ServiceAccountToken.Audience
		}
	}
	if token != aud {
		t.Errorf("agents' tokens for %q, server checks %q", token, aud)
	}
	if svc := ServicePort(); *svc.Port != AgentPort || svc.TargetPort.StrVal != AgentPortName {
		t.Errorf("service port %d → %s", *svc.Port, svc.TargetPort.String())
	}
	if got, want := ServerImage(""), fmt.Sprintf("registry.k8s.io/kas-network-proxy/proxy-server:%s", Version); got != want {
		t.Errorf("server image %s, want %s", got, want)
	}
}

// A registered tenant's control-plane host runs an agent and a server on
// its network: none of the agent's ports may be one the server binds.
func TestAgentAndServerPortsDoNotClash(t *testing.T) {
	server := map[int]bool{AgentPort: true, AdminPort: true, HealthPort: true}
	args := strings.Join(AgentPodSpec(AgentInputs{Image: "x", ServerHost: "192.0.2.10"}).Containers[0].Args, " ")
	for _, p := range []int{AgentAdminPort, AgentHealthPort} {
		if server[p] {
			t.Errorf("agent port %d is also the server's", p)
		}
		if !strings.Contains(args, fmt.Sprintf("=%d", p)) {
			t.Errorf("agent args %s do not set port %d", args, p)
		}
	}
}
