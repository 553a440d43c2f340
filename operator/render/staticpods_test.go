package render

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"sigs.k8s.io/yaml"

	"github.com/apiaryhq/apiary/internal/golden"
	"github.com/apiaryhq/apiary/konnectivity"
)

// issuedInputs are inputs with every Secret issued, each key holding a
// recognisable value ("<kind>/<key>").
func issuedInputs() Inputs {
	in := inputs(fixture())
	in.Secrets = map[SecretKind]map[string][]byte{}
	for _, kind := range AllSecretKinds {
		in.Secrets[kind] = map[string][]byte{}
		for _, key := range []string{KeyTLSCert, KeyTLSKey, KeyCACert, KeySAKey, KeySAPub, "admin.conf", "kubeconfig"} {
			in.Secrets[kind][key] = fmt.Appendf(nil, "%s/%s", kind, key)
		}
	}
	return in
}

func staticPods(t *testing.T, in Inputs) (files, manifests []HostFile, pods map[string]corev1.Pod) {
	t.Helper()
	files, manifests, err := StaticPods(in, nil)
	if err != nil {
		t.Fatal(err)
	}
	pods = map[string]corev1.Pod{}
	for _, m := range manifests {
		var p corev1.Pod
		if err := yaml.UnmarshalStrict(m.Data, &p); err != nil {
			t.Fatalf("%s: %v", m.Path, err)
		}
		pods[p.Name] = p
	}
	return files, manifests, pods
}

func TestStaticPodsGolden(t *testing.T) {
	files, manifests, _ := staticPods(t, issuedInputs())
	for _, m := range manifests {
		golden.Bytes(t, "static-"+strings.TrimSuffix(m.Path[len(ManifestsDir)+1:], ".yaml")+".golden.yaml", m.Data)
	}
	// The files by path, with where their content comes from.
	var list bytes.Buffer
	for _, f := range files {
		fmt.Fprintf(&list, "%s\t%s\n", f.Path, firstLine(f.Data))
	}
	golden.Bytes(t, "static-files.golden.txt", list.Bytes())
}

func firstLine(b []byte) string {
	s, _, _ := strings.Cut(string(b), "\n")
	return s
}

// A spec that sets the host's watch grace period itself keeps its value.
func TestStaticAPIServerKeepsASetWatchGracePeriod(t *testing.T) {
	in := issuedInputs()
	in.TCP.Spec.APIServer.ExtraArgs = map[string]string{"shutdown-watch-termination-grace-period": "20s"}
	_, _, pods := staticPods(t, in)
	args := strings.Join(pods[containerAPIServer].Spec.Containers[0].Args, " ")
	if strings.Count(args, "--shutdown-watch-termination-grace-period") != 1 || !strings.Contains(args, "--shutdown-watch-termination-grace-period=20s") {
		t.Errorf("kube-apiserver args %s, want the spec's 20s alone", args)
	}
}

// One source of truth: each component runs the same image, command,
// arguments, ports, probes and resources in both forms.
func TestStaticPodsRunWhatTheDeploymentRuns(t *testing.T) {
	in := issuedInputs()
	in.TCP.Spec.APIServer.ExtraArgs = map[string]string{"audit-log-maxage": "7"}
	dep := Deployment(in)
	_, _, pods := staticPods(t, in)
	if len(pods) != len(dep.Spec.Template.Spec.Containers) {
		t.Fatalf("%d static Pods for %d containers", len(pods), len(dep.Spec.Template.Spec.Containers))
	}
	for _, want := range dep.Spec.Template.Spec.Containers {
		p, ok := pods[*want.Name]
		if !ok || len(p.Spec.Containers) != 1 {
			t.Fatalf("no static Pod of one container for %s", *want.Name)
		}
		got := p.Spec.Containers[0]
		wantArgs := want.Args
		if got.Name == containerAPIServer {
			// The differences: on a host, which leaves the Service
			// before it stops, a shorter shutdown delay, and its watches
			// closed soon after it.
			wantArgs = slices.DeleteFunc(slices.Clone(wantArgs), func(a string) bool { return strings.HasPrefix(a, "--shutdown-delay-duration=") })
			wantArgs = append(wantArgs, "--shutdown-delay-duration=5s", "--shutdown-watch-termination-grace-period=5s")
			slices.Sort(wantArgs)
		}
		if got.Image != *want.Image || !slices.Equal(got.Command, want.Command) || !slices.Equal(got.Args, wantArgs) {
			t.Errorf("%s: %s %v %v, the Deployment runs %s %v %v", got.Name, got.Image, got.Command, got.Args, *want.Image, want.Command, wantArgs)
		}
		if len(got.Ports) != len(want.Ports) || (want.LivenessProbe != nil) != (got.LivenessProbe != nil) || (want.ReadinessProbe != nil) != (got.ReadinessProbe != nil) {
			t.Errorf("%s: ports or probes differ from the Deployment's", got.Name)
		}
		if want.Resources == nil || want.Resources.Requests == nil || !equality.Semantic.DeepEqual(got.Resources.Requests, *want.Resources.Requests) {
			t.Errorf("%s: requests %v, the Deployment asks %v", got.Name, got.Resources.Requests, want.Resources.Requests)
		}
		if strings.Contains(strings.Join(got.Args, " "), "audit-log-maxage=7") != (got.Name == containerAPIServer) {
			t.Errorf("%s: extraArgs not applied as in the Deployment", got.Name)
		}
	}
}

// Every file a container reads is written to the host and mounted
// read-only at the Deployment's path, and nothing else of the host is
// mounted; the DataStore CA key is never among them.
func TestStaticPodsMountExactlyTheirFiles(t *testing.T) {
	in := issuedInputs()
	files, _, pods := staticPods(t, in)
	written := map[string][]byte{}
	for _, f := range files {
		if _, dup := written[f.Path]; dup {
			t.Errorf("%s written twice", f.Path)
		}
		written[f.Path] = f.Data
		if bytes.Contains(f.Data, []byte("datastore-ca/"+KeyTLSKey)) {
			t.Errorf("%s holds the DataStore CA key", f.Path)
		}
	}
	for _, c := range controlPlane(in) {
		p := pods[c.name]
		if sc := p.Spec.SecurityContext; sc == nil || sc.RunAsUser == nil || *sc.RunAsUser != 0 {
			t.Errorf("%s does not run as root, which alone reads the 0600 files", c.name)
		}
		if !p.Spec.HostNetwork || p.Namespace != "kube-system" || p.Spec.PriorityClassName != "system-node-critical" {
			t.Errorf("%s: hostNetwork %v namespace %q priority class %q", c.name, p.Spec.HostNetwork, p.Namespace, p.Spec.PriorityClassName)
		}
		volumes := map[string]corev1.Volume{}
		for _, v := range p.Spec.Volumes {
			if v.HostPath == nil {
				t.Errorf("%s: volume %s is not a hostPath", c.name, v.Name)
				continue
			}
			volumes[v.Name] = v
		}
		for _, m := range p.Spec.Containers[0].VolumeMounts {
			v, ok := volumes[m.Name]
			if !ok {
				t.Errorf("%s: mount %s has no volume", c.name, m.Name)
				continue
			}
			if *v.HostPath.Type == corev1.HostPathFile {
				if _, ok := written[v.HostPath.Path]; !ok || !m.ReadOnly || m.MountPath != v.HostPath.Path {
					t.Errorf("%s: %s mounted at %s (read-only %v) but not written to the host", c.name, v.HostPath.Path, m.MountPath, m.ReadOnly)
				}
			}
		}
		for _, f := range c.files {
			found := false
			for _, m := range p.Spec.Containers[0].VolumeMounts {
				found = found || m.MountPath == f.path
			}
			if !found {
				t.Errorf("%s reads %s in the Deployment but not as a static Pod", c.name, f.path)
			}
		}
	}
	// kube-apiserver never gets a CA key; the controller-manager gets the
	// cluster CA's, which signs kubelet certificates.
	mounted := func(pod, path string) bool {
		for _, m := range pods[pod].Spec.Containers[0].VolumeMounts {
			if m.MountPath == path {
				return true
			}
		}
		return false
	}
	if mounted(containerAPIServer, pathCAKey) || !mounted(containerControllerManager, pathCAKey) {
		t.Error("the cluster CA key is mounted in the wrong containers")
	}
	// kube-apiserver and konnectivity-server share the socket directory.
	if !mounted(containerAPIServer, konnectivity.SocketDir) || !mounted(konnectivity.ServerName, konnectivity.SocketDir) {
		t.Error("the konnectivity socket is not shared")
	}
}

// A renewed credential changes every manifest (the kubelet restarts the
// pods with the new files); an unrelated Secret changes none.
func TestStaticPodsRestartOnNewCredentials(t *testing.T) {
	in := issuedInputs()
	_, before, _ := staticPods(t, in)
	in.Secrets[SecretAdminKubeconfig] = map[string][]byte{"admin.conf": []byte("other")}
	_, same, _ := staticPods(t, in)
	in.Secrets[SecretAPIServer] = map[string][]byte{KeyTLSCert: []byte("renewed"), KeyTLSKey: []byte("renewed")}
	_, after, _ := staticPods(t, in)
	for i := range before {
		if !bytes.Equal(before[i].Data, same[i].Data) {
			t.Errorf("%s changed with the admin kubeconfig, which it does not read", before[i].Path)
		}
		if bytes.Equal(before[i].Data, after[i].Data) {
			t.Errorf("%s did not change with a renewed serving certificate", before[i].Path)
		}
	}
}

func TestStaticPodsNeedEveryCredential(t *testing.T) {
	in := issuedInputs()
	delete(in.Secrets, SecretDataStoreClient)
	_, _, err := StaticPods(in, nil)
	if err == nil || !strings.Contains(err.Error(), "acme-datastore-client") {
		t.Fatalf("a missing Secret gave %v, want an error naming it", err)
	}
}

// Without konnectivity there is no konnectivity-server pod and no socket.
func TestStaticPodsWithoutKonnectivity(t *testing.T) {
	in := issuedInputs()
	in.TCP.Spec.Addons.Konnectivity.Enabled = new(false)
	_, manifests, pods := staticPods(t, in)
	if len(manifests) != 3 {
		t.Fatalf("%d manifests, want 3", len(manifests))
	}
	for _, m := range pods[containerAPIServer].Spec.Containers[0].VolumeMounts {
		if m.MountPath == konnectivity.SocketDir {
			t.Error("kube-apiserver mounts the konnectivity socket without konnectivity")
		}
	}
}

func TestStaticPodPorts(t *testing.T) {
	in := issuedInputs()
	if got, want := StaticPodPorts(in), []int{6443, 8132, 8133, 8134, 10257, 10259}; !slices.Equal(got, want) {
		t.Errorf("ports %v, want %v", got, want)
	}
	in.TCP.Spec.Network.Port = 443
	in.TCP.Spec.Addons.Konnectivity.Enabled = new(false)
	if got, want := StaticPodPorts(in), []int{443, 10257, 10259}; !slices.Equal(got, want) {
		t.Errorf("ports without konnectivity %v, want %v", got, want)
	}
}

// StaticPodPaths lists, without credentials, exactly the paths StaticPods
// writes, with and without konnectivity.
func TestStaticPodPaths(t *testing.T) {
	for _, konn := range []bool{true, false} {
		in := issuedInputs()
		in.TCP.Spec.Addons.Konnectivity.Enabled = new(konn)
		files, manifests, _ := staticPods(t, in)
		var wantFiles, wantManifests []string
		for _, f := range files {
			wantFiles = append(wantFiles, f.Path)
		}
		for _, m := range manifests {
			wantManifests = append(wantManifests, m.Path)
		}
		bare := in
		bare.Secrets = nil
		gotFiles, gotManifests := StaticPodPaths(bare)
		if !slices.Equal(gotFiles, wantFiles) || !slices.Equal(gotManifests, wantManifests) {
			t.Errorf("konnectivity %v: paths %v %v, want %v %v", konn, gotFiles, gotManifests, wantFiles, wantManifests)
		}
	}
}

// Taking a control plane off a host removes the authentication file even
// when the spec names no issuers now, once.
func TestWithEarlierSpecFiles(t *testing.T) {
	files, _ := StaticPodPaths(issuedInputs())
	if slices.Contains(files, pathAuthenticationConfig) {
		t.Fatalf("without issuers StaticPodPaths lists %s", pathAuthenticationConfig)
	}
	got := WithEarlierSpecFiles(files)
	if !slices.Contains(got, pathAuthenticationConfig) || len(got) != len(files)+1 {
		t.Errorf("WithEarlierSpecFiles %v, want %v and %s", got, files, pathAuthenticationConfig)
	}
	if again := WithEarlierSpecFiles(got); len(again) != len(got) {
		t.Errorf("listed twice: %v", again)
	}
}
