package bench

import (
	"bytes"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/apiaryhq/apiary/datastore"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/operator/render"
	"github.com/apiaryhq/apiary/pki"
)

// BenchmarkIssueCredentials issues a new tenant's full PKI, as its first
// reconcile does: CA, front-proxy CA, service-account key, seven leaf
// certificates and four kubeconfigs in three Secrets, all ECDSA P-256.
// The API writes of the ten Secrets are not included.
func BenchmarkIssueCredentials(b *testing.B) {
	tcp, ds := tenant(), newDataStoreCA(b)
	b.ReportAllocs()
	for b.Loop() {
		secrets, err := issueAll(tcp, ds)
		if err != nil {
			b.Fatal(err)
		}
		sink = secrets
	}
}

// BenchmarkIssueCredentialsParts shows where BenchmarkIssueCredentials
// spends its time: per tenant there are 2 NewCA, 1 ServiceAccountKey,
// 7 Sign (one of them the API server's serving certificate), 10 KeyPEM,
// 4 Kubeconfig and 1 ParseKeyPair (the DataStore CA).
func BenchmarkIssueCredentialsParts(b *testing.B) {
	tcp, ds := tenant(), newDataStoreCA(b)
	ca, err := pki.NewCA(render.CACommonName(tcp))
	if err != nil {
		b.Fatal(err)
	}
	client := render.ClientCertRequest(render.AdminCN, render.MastersGroup)
	serving := render.APIServerCertRequest(tcp, endpoint, "cluster.local")
	leaf, err := ca.Sign(client)
	if err != nil {
		b.Fatal(err)
	}
	leafKey, err := leaf.KeyPEM()
	if err != nil {
		b.Fatal(err)
	}

	b.Run("NewCA", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			kp, err := pki.NewCA("bench")
			if err != nil {
				b.Fatal(err)
			}
			sink = kp
		}
	})
	b.Run("ServiceAccountKey", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			priv, _, err := pki.NewServiceAccountKey()
			if err != nil {
				b.Fatal(err)
			}
			sink = priv
		}
	})
	b.Run("SignClient", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			kp, err := ca.Sign(client)
			if err != nil {
				b.Fatal(err)
			}
			sink = kp
		}
	})
	b.Run("SignAPIServer", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			kp, err := ca.Sign(serving)
			if err != nil {
				b.Fatal(err)
			}
			sink = kp
		}
	})
	b.Run("KeyPEM", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			key, err := leaf.KeyPEM()
			if err != nil {
				b.Fatal(err)
			}
			sink = key
		}
	})
	b.Run("Kubeconfig", func(b *testing.B) {
		caPEM, certPEM := ca.CertPEM(), leaf.CertPEM()
		b.ReportAllocs()
		for b.Loop() {
			raw, err := render.Kubeconfig(tcp.Name, endpoint.URL(), caPEM, render.AdminCN, certPEM, leafKey)
			if err != nil {
				b.Fatal(err)
			}
			sink = raw
		}
	})
	b.Run("ParseKeyPair", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			kp, err := pki.ParseKeyPair(ds.certPEM, ds.keyPEM)
			if err != nil {
				b.Fatal(err)
			}
			sink = kp
		}
	})
}

// BenchmarkVerifyCredentials is the credential work of every later
// reconcile of an unchanged tenant: the operator re-reads all ten Secrets
// and checks each certificate (parse, key match, signature, expiry, names)
// and each kubeconfig, mirroring operator/controllers/credentials.go,
// including its second ParseKeyPair of each kept leaf.
func BenchmarkVerifyCredentials(b *testing.B) {
	tcp, ds := tenant(), newDataStoreCA(b)
	secrets, err := issueAll(tcp, ds)
	if err != nil {
		b.Fatal(err)
	}
	now := time.Now()
	dsTenant := datastore.TenantFor(tcp.UID)
	check := func(ok bool, what string) {
		if !ok {
			b.Fatalf("verification failed: %s", what)
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		parseCA := func(kind render.SecretKind) *pki.KeyPair {
			kp, err := pki.ParseKeyPair(secrets[kind][render.KeyTLSCert], secrets[kind][render.KeyTLSKey])
			check(err == nil && pki.CAProblem(kp.Cert, now) == "", string(kind))
			return kp
		}
		leaf := func(kind render.SecretKind, ca *pki.KeyPair, req pki.Request, extra map[string][]byte) {
			data := secrets[kind]
			kp, err := pki.ParseKeyPair(data[render.KeyTLSCert], data[render.KeyTLSKey])
			check(err == nil, string(kind))
			for k, v := range extra {
				check(bytes.Equal(data[k], v), k)
			}
			check(pki.Problem(kp.Cert, ca.Cert, req, now) == "", string(kind))
			// credentials.leaf parses the kept pair a second time.
			_, err = pki.ParseKeyPair(data[render.KeyTLSCert], data[render.KeyTLSKey])
			check(err == nil, string(kind))
		}
		kubeconfigs := func(kind render.SecretKind, ca *pki.KeyPair, req pki.Request, keys ...string) {
			caPEM := ca.CertPEM()
			for _, key := range keys {
				cfg, err := clientcmd.Load(secrets[kind][key])
				check(err == nil, key)
				ctx := cfg.Contexts[cfg.CurrentContext]
				cluster, user := cfg.Clusters[ctx.Cluster], cfg.AuthInfos[ctx.AuthInfo]
				check(bytes.Equal(cluster.CertificateAuthorityData, caPEM), key)
				kp, err := pki.ParseKeyPair(user.ClientCertificateData, user.ClientKeyData)
				check(err == nil && pki.Problem(kp.Cert, ca.Cert, req, now) == "", key)
			}
		}

		ca := parseCA(render.SecretCA)
		frontProxyCA := parseCA(render.SecretFrontProxyCA)
		sa := secrets[render.SecretServiceAccount]
		check(pki.ServiceAccountKeyProblem(sa[render.KeySAKey], sa[render.KeySAPub]) == "", "sa")
		dsCA, err := pki.ParseKeyPair(ds.certPEM, ds.keyPEM)
		check(err == nil, "datastore CA")
		leaf(render.SecretDataStoreClient, dsCA, datastore.ClientCertRequest(dsTenant), map[string][]byte{render.KeyCACert: ds.certPEM})
		leaf(render.SecretAPIServerKubeletClient, ca, render.ClientCertRequest(render.KubeletClientCN, render.MastersGroup), nil)
		leaf(render.SecretFrontProxyClient, frontProxyCA, render.ClientCertRequest(render.FrontProxyClientCN), nil)
		kubeconfigs(render.SecretControllerManagerConfig, ca, render.ClientCertRequest(render.ControllerManagerCN), apiary.KubeconfigKey)
		kubeconfigs(render.SecretSchedulerConfig, ca, render.ClientCertRequest(render.SchedulerCN), apiary.KubeconfigKey)
		leaf(render.SecretAPIServer, ca, render.APIServerCertRequest(tcp, endpoint, "cluster.local"), nil)
		kubeconfigs(render.SecretOperatorKubeconfig, ca, render.ClientCertRequest(render.OperatorCN, render.MastersGroup), apiary.KubeconfigKey)
		kubeconfigs(render.SecretAdminKubeconfig, ca, render.ClientCertRequest(render.AdminCN, render.ClusterAdminsGroup), apiary.KubeconfigKey, apiary.InternalKubeconfigKey)
	}
}
