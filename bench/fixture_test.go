package bench

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/apiaryhq/apiary/datastore"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/operator/render"
	"github.com/apiaryhq/apiary/pki"
)

// tenant is a defaulted TenantControlPlane like the ones the integration
// benchmark creates (ClusterIP Service), with a few certSANs.
func tenant() *apiary.TenantControlPlane {
	tcp := &apiary.TenantControlPlane{
		ObjectMeta: metav1.ObjectMeta{Name: "acme", Namespace: "tenants", UID: "0a1b2c3d-0000-4000-8000-000000000001"},
		Spec: apiary.TenantControlPlaneSpec{
			DataStore: "default",
			Network: apiary.NetworkSpec{
				ServiceType: "ClusterIP",
				CertSANs:    []string{"api.acme.example.com", "198.51.100.7"},
			},
		},
	}
	tcp.Default()
	return tcp
}

// endpoint is what the operator observes on a ClusterIP Service.
var endpoint = render.Endpoint{Host: "10.0.0.42", Port: 6443, ClusterIP: "10.0.0.42"}

// dataStoreCA is a DataStore's CA as the operator reads it from its Secret
// on every reconcile (PEM).
type dataStoreCA struct {
	certPEM, keyPEM []byte
}

func newDataStoreCA(tb testing.TB) dataStoreCA {
	tb.Helper()
	ca, err := pki.NewCA("etcd-ca")
	if err != nil {
		tb.Fatal(err)
	}
	key, err := ca.KeyPEM()
	if err != nil {
		tb.Fatal(err)
	}
	return dataStoreCA{certPEM: ca.CertPEM(), keyPEM: key}
}

// issueAll issues every credential of a new tenant the way
// operator/controllers/credentials.go does on the first reconcile: two CAs
// and the trust bundle,
// the service-account key, seven leaf certificates (the datastore client
// signed by the DataStore CA), four kubeconfigs in three Secrets, and wraps
// each in its Secret. It returns the Secrets' data by kind.
func issueAll(tcp *apiary.TenantControlPlane, ds dataStoreCA) (map[render.SecretKind]map[string][]byte, error) {
	out := make(map[render.SecretKind]map[string][]byte, len(render.AllSecretKinds))
	put := func(kind render.SecretKind, data map[string][]byte) {
		_ = render.Secret(tcp, kind, data)
		out[kind] = data
	}
	newCA := func(kind render.SecretKind, cn string) (*pki.KeyPair, error) {
		kp, err := pki.NewCA(cn)
		if err != nil {
			return nil, err
		}
		key, err := kp.KeyPEM()
		if err != nil {
			return nil, err
		}
		put(kind, map[string][]byte{render.KeyTLSCert: kp.CertPEM(), render.KeyTLSKey: key})
		return kp, nil
	}
	leaf := func(kind render.SecretKind, ca *pki.KeyPair, req pki.Request, extra map[string][]byte) error {
		kp, err := ca.Sign(req)
		if err != nil {
			return err
		}
		key, err := kp.KeyPEM()
		if err != nil {
			return err
		}
		data := map[string][]byte{render.KeyTLSCert: kp.CertPEM(), render.KeyTLSKey: key}
		for k, v := range extra {
			data[k] = v
		}
		put(kind, data)
		return nil
	}
	kubeconfigs := func(kind render.SecretKind, ca *pki.KeyPair, req pki.Request, keyToServer ...string) error {
		kp, err := ca.Sign(req)
		if err != nil {
			return err
		}
		key, err := kp.KeyPEM()
		if err != nil {
			return err
		}
		caPEM := ca.CertPEM()
		data := map[string][]byte{}
		for i := 0; i+1 < len(keyToServer); i += 2 {
			raw, err := render.Kubeconfig(tcp.Name, keyToServer[i+1], caPEM, req.CommonName, kp.CertPEM(), key)
			if err != nil {
				return err
			}
			data[keyToServer[i]] = raw
		}
		put(kind, data)
		return nil
	}

	ca, err := newCA(render.SecretCA, render.CACommonName(tcp))
	if err != nil {
		return nil, err
	}
	put(render.SecretCATrust, map[string][]byte{render.KeyCACert: ca.CertPEM()})
	frontProxyCA, err := newCA(render.SecretFrontProxyCA, render.FrontProxyCACommonName(tcp))
	if err != nil {
		return nil, err
	}
	saKey, saPub, err := pki.NewServiceAccountKey()
	if err != nil {
		return nil, err
	}
	put(render.SecretServiceAccount, map[string][]byte{render.KeySAKey: saKey, render.KeySAPub: saPub})
	// The operator parses the DataStore CA on every reconcile.
	dsCA, err := pki.ParseKeyPair(ds.certPEM, ds.keyPEM)
	if err != nil {
		return nil, err
	}
	dsTenant := datastore.TenantFor(tcp.UID)
	if err := leaf(render.SecretDataStoreClient, dsCA, datastore.ClientCertRequest(dsTenant), map[string][]byte{render.KeyCACert: ds.certPEM}); err != nil {
		return nil, err
	}
	if err := leaf(render.SecretAPIServerKubeletClient, ca, render.ClientCertRequest(render.KubeletClientCN, render.MastersGroup), nil); err != nil {
		return nil, err
	}
	if err := leaf(render.SecretFrontProxyClient, frontProxyCA, render.ClientCertRequest(render.FrontProxyClientCN), nil); err != nil {
		return nil, err
	}
	loopback := render.LoopbackURL(tcp)
	if err := kubeconfigs(render.SecretControllerManagerConfig, ca, render.ClientCertRequest(render.ControllerManagerCN), apiary.KubeconfigKey, loopback); err != nil {
		return nil, err
	}
	if err := kubeconfigs(render.SecretSchedulerConfig, ca, render.ClientCertRequest(render.SchedulerCN), apiary.KubeconfigKey, loopback); err != nil {
		return nil, err
	}
	if err := leaf(render.SecretAPIServer, ca, render.APIServerCertRequest(tcp, endpoint, "cluster.local"), nil); err != nil {
		return nil, err
	}
	if err := kubeconfigs(render.SecretOperatorKubeconfig, ca, render.ClientCertRequest(render.OperatorCN, render.MastersGroup),
		apiary.KubeconfigKey, endpoint.URL()); err != nil {
		return nil, err
	}
	if err := kubeconfigs(render.SecretAdminKubeconfig, ca, render.ClientCertRequest(render.AdminCN, render.ClusterAdminsGroup),
		apiary.KubeconfigKey, endpoint.URL(), apiary.InternalKubeconfigKey, render.InternalURL(tcp)); err != nil {
		return nil, err
	}
	return out, nil
}
