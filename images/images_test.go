package images

import "testing"

func TestRef(t *testing.T) {
	for _, c := range []struct {
		repository, want string
	}{
		{"", "registry.k8s.io/kube-apiserver:v1.37.2"},
		{"mirror.example.com/k8s", "mirror.example.com/k8s/kube-apiserver:v1.37.2"},
		{"mirror.example.com/k8s/", "mirror.example.com/k8s/kube-apiserver:v1.37.2"},
		{"mirror.example.com/k8s//", "mirror.example.com/k8s/kube-apiserver:v1.37.2"},
		{"127.0.0.1:5000", "127.0.0.1:5000/kube-apiserver:v1.37.2"},
		{"127.0.0.1:5000/upstream/k8s/", "127.0.0.1:5000/upstream/k8s/kube-apiserver:v1.37.2"},
		{"/", "registry.k8s.io/kube-apiserver:v1.37.2"},
	} {
		if got := Ref(c.repository, "kube-apiserver", "v1.37.2"); got != c.want {
			t.Errorf("Ref(%q): %s, want %s", c.repository, got, c.want)
		}
	}
	if got := Ref("localhost:5000/", "kas-network-proxy/proxy-agent", "v0.36.0"); got != "localhost:5000/kas-network-proxy/proxy-agent:v0.36.0" {
		t.Errorf("nested name: %s", got)
	}
}

func TestRepository(t *testing.T) {
	for in, want := range map[string]string{
		"":                    "registry.k8s.io",
		"registry.k8s.io":     "registry.k8s.io",
		"mirror.example/k8s/": "mirror.example/k8s",
		"10.0.0.1:5000/k8s":   "10.0.0.1:5000/k8s",
		"[fd00::1]:5000/k8s/": "[fd00::1]:5000/k8s",
	} {
		if got := Repository(in); got != want {
			t.Errorf("Repository(%q) = %s, want %s", in, got, want)
		}
	}
}
