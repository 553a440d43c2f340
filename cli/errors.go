package cli

import (
	"errors"
	"fmt"
	"net/url"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
)

// Resources as RBAC names them, for error messages.
const (
	resourceTenantControlPlanes = "tenantcontrolplanes.apiary.dev"
	resourceSecrets             = "secrets"
)

// request describes one API call of the CLI, so that its failures can say
// what was attempted and which permission is missing.
type request struct {
	verb      string // RBAC verb: get, list
	resource  string // RBAC resource, with its group when not core
	namespace string // empty: all namespaces
	name      string // empty for list
}

func (r request) String() string {
	s := r.verb + " " + r.resource
	if r.name != "" {
		s += fmt.Sprintf(" %q", r.name)
	}
	if r.namespace != "" {
		s += fmt.Sprintf(" in namespace %q", r.namespace)
	} else {
		s += " in all namespaces"
	}
	return s
}

// explain turns an API error (other than NotFound, which callers handle with
// their own hints) into a message that says what was attempted and what to do.
func (r request) explain(err error) error {
	switch {
	case apierrors.IsForbidden(err):
		scope := fmt.Sprintf("in namespace %q", r.namespace)
		if r.namespace == "" {
			scope = "cluster-wide (for --all-namespaces)"
		}
		return fmt.Errorf("forbidden: cannot %s: your credentials need RBAC verb %q on resource %q %s; "+
			"ask a cluster administrator for access, or use another --context (server: %s)",
			r, r.verb, r.resource, scope, statusMessage(err))
	case apierrors.IsUnauthorized(err):
		return fmt.Errorf("unauthorized: the management cluster rejected your credentials while trying to %s; "+
			"refresh them or use another --context: %w", r, err)
	case meta.IsNoMatchError(err), isCRDMissing(err, r):
		return fmt.Errorf("the TenantControlPlane API (apiary.dev/v1alpha1) is not served by this cluster: " +
			"is Apiary installed (its CRDs come with the charts/apiary chart)? Check the --context")
	}
	var urlErr *url.Error
	if errors.As(err, &urlErr) {
		return fmt.Errorf("cannot %s: the management cluster did not answer; check --kubeconfig and --context: %w", r, err)
	}
	return fmt.Errorf("cannot %s: %w", r, err)
}

// isCRDMissing reports a 404 on a list, which is what a missing CRD looks like
// once the REST mapping was cached.
func isCRDMissing(err error, r request) bool {
	return r.name == "" && r.resource == resourceTenantControlPlanes && apierrors.IsNotFound(err)
}

func statusMessage(err error) string {
	if s, ok := err.(apierrors.APIStatus); ok {
		return s.Status().Message
	}
	return err.Error()
}
