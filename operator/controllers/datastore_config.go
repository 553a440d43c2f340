package controllers

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/apiaryhq/apiary/datastore"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
	"github.com/apiaryhq/apiary/operator/render/managedetcd"
)

// Reasons of DataStore problems found before etcd is even called.
const (
	reasonSecretNotFound = "SecretNotFound"
)

// connection is where a DataStore's etcd answers and where its TLS material
// is: the spec's for an external etcd, the operator's own for a managed one.
func connection(ds *apiary.DataStore, clusterDomain string) (endpoints []string, tls apiary.DataStoreTLS) {
	if ds.Spec.Managed == nil {
		if ds.Spec.TLS != nil {
			tls = *ds.Spec.TLS
		}
		return ds.Spec.Endpoints, tls
	}
	ns := ds.Spec.Managed.Namespace
	return managedetcd.Endpoints(ds, clusterDomain), apiary.DataStoreTLS{
		CASecretRef:     apiary.SecretReference{Namespace: ns, Name: managedetcd.SecretName(ds, managedetcd.SecretCA)},
		ClientSecretRef: apiary.SecretReference{Namespace: ns, Name: managedetcd.SecretName(ds, managedetcd.SecretRoot)},
	}
}

// dataStoreConfig reads the TLS material a DataStore refers to. It reads the
// API server directly: the operator does not cache Secrets it does not own.
func dataStoreConfig(ctx context.Context, r client.Reader, ds *apiary.DataStore, clusterDomain string) (datastore.Config, error) {
	endpoints, refs := connection(ds, clusterDomain)
	cfg := datastore.Config{Endpoints: endpoints}
	read := func(ref apiary.SecretReference, what string) (*corev1.Secret, error) {
		var s corev1.Secret
		err := r.Get(ctx, client.ObjectKey{Namespace: ref.Namespace, Name: ref.Name}, &s)
		if apierrors.IsNotFound(err) {
			return nil, &datastore.Error{Reason: reasonSecretNotFound, Err: fmt.Errorf("%s Secret %s/%s not found", what, ref.Namespace, ref.Name)}
		}
		if err != nil {
			return nil, fmt.Errorf("reading %s Secret %s/%s: %w", what, ref.Namespace, ref.Name, err)
		}
		for _, k := range []string{corev1.TLSCertKey, corev1.TLSPrivateKeyKey} {
			if len(s.Data[k]) == 0 {
				return nil, &datastore.Error{Reason: datastore.ReasonInvalidCredentials, Err: fmt.Errorf("%s Secret %s/%s has no %s", what, ref.Namespace, ref.Name, k)}
			}
		}
		return &s, nil
	}
	ca, err := read(refs.CASecretRef, "CA")
	if err != nil {
		return cfg, err
	}
	root, err := read(refs.ClientSecretRef, "root client")
	if err != nil {
		return cfg, err
	}
	cfg.CACert, cfg.CAKey = ca.Data[corev1.TLSCertKey], ca.Data[corev1.TLSPrivateKeyKey]
	cfg.ClientCert, cfg.ClientKey = root.Data[corev1.TLSCertKey], root.Data[corev1.TLSPrivateKeyKey]
	return cfg, nil
}
