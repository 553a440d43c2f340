package bench

import (
	"encoding/json"
	"testing"

	"github.com/apiaryhq/apiary/datastore"
	"github.com/apiaryhq/apiary/operator/render"
)

// renderFixture is one tenant with realistic (really issued) Secret data.
func renderFixture(b *testing.B) render.Inputs {
	b.Helper()
	tcp := tenant()
	secrets, err := issueAll(tcp, newDataStoreCA(b))
	if err != nil {
		b.Fatal(err)
	}
	return render.Inputs{
		TCP:         tcp,
		Version:     tcp.Spec.Version,
		Endpoint:    endpoint,
		Secrets:     secrets,
		EtcdServers: []string{"https://etcd-0.etcd.apiary-system.svc:2379", "https://etcd-1.etcd.apiary-system.svc:2379", "https://etcd-2.etcd.apiary-system.svc:2379"},
		EtcdPrefix:  datastore.TenantFor(tcp.UID).Prefix,
	}
}

var sink any

// BenchmarkRender is a full render of one tenant: ConfigHash over the nine
// mounted Secrets (about 11 KB of PEM and kubeconfigs), the Deployment, the
// Service and the three argument lists.
func BenchmarkRender(b *testing.B) {
	in := renderFixture(b)
	b.ReportAllocs()
	for b.Loop() {
		dep := render.Deployment(in)
		svc := render.Service(in.TCP)
		a := render.APIServerArgs(in)
		c := render.ControllerManagerArgs(in)
		s := render.SchedulerArgs(in)
		sink = [...]any{dep, svc, a, c, s}
	}
}

// BenchmarkRenderParts splits BenchmarkRender, and adds the JSON encoding of
// the Deployment that client.Apply sends (not part of render).
func BenchmarkRenderParts(b *testing.B) {
	in := renderFixture(b)
	b.Run("ConfigHash", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			sink = in.ConfigHash()
		}
	})
	b.Run("Deployment", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			sink = render.Deployment(in)
		}
	})
	b.Run("Service", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			sink = render.Service(in.TCP)
		}
	})
	b.Run("Args", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			sink = [...][]string{render.APIServerArgs(in), render.ControllerManagerArgs(in), render.SchedulerArgs(in)}
		}
	})
	b.Run("DeploymentJSON", func(b *testing.B) {
		dep := render.Deployment(in)
		b.ReportAllocs()
		for b.Loop() {
			raw, err := json.Marshal(dep)
			if err != nil {
				b.Fatal(err)
			}
			sink = raw
		}
	})
}
