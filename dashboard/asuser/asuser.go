// Package asuser gives the dashboard API clients that act as the
// signed-in user: every request impersonates the session's user and
// groups, so the management cluster's RBAC, not the dashboard, decides
// what each user sees and does. The dashboard's own identity needs only
// the right to impersonate.
package asuser

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/apiaryhq/apiary/dashboard/session"
	apiary "github.com/apiaryhq/apiary/operator/api/v1alpha1"
)

// Clients makes per-user clients from the dashboard's own configuration.
type Clients struct {
	base   *rest.Config
	scheme *runtime.Scheme
}

// New takes the dashboard's own configuration (its ServiceAccount's).
func New(base *rest.Config) (*Clients, error) {
	if base.Impersonate.UserName != "" {
		return nil, fmt.Errorf("the dashboard's configuration already impersonates %q", base.Impersonate.UserName)
	}
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, apiary.AddToScheme} {
		if err := add(scheme); err != nil {
			return nil, fmt.Errorf("scheme: %w", err)
		}
	}
	return &Clients{base: base, scheme: scheme}, nil
}

// Config is the dashboard's configuration acting as the session's user.
// The dashboard's own groups and extra fields are not carried over: the
// user's requests hold only what the identity provider said.
func (c *Clients) Config(s session.Session) *rest.Config {
	cfg := rest.CopyConfig(c.base)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: s.User, Groups: s.Groups}
	return cfg
}

// For is a client acting as the session's user; its watches are the
// user's too.
func (c *Clients) For(s session.Session) (client.WithWatch, error) {
	if s.User == "" {
		return nil, fmt.Errorf("no user to act as")
	}
	cl, err := client.NewWithWatch(c.Config(s), client.Options{Scheme: c.scheme})
	if err != nil {
		return nil, fmt.Errorf("client as %s: %w", s.User, err)
	}
	return cl, nil
}

// Tenants lists the tenants the user may list in namespace, or in every
// namespace when namespace is empty. A refusal says which right is
// missing, for the page to show.
func (c *Clients) Tenants(ctx context.Context, s session.Session, namespace string) ([]apiary.TenantControlPlane, error) {
	cl, err := c.For(s)
	if err != nil {
		return nil, err
	}
	var list apiary.TenantControlPlaneList
	if err := cl.List(ctx, &list, client.InNamespace(namespace)); err != nil {
		if apierrors.IsForbidden(err) {
			where := "in namespace " + namespace
			if namespace == "" {
				where = "in all namespaces; choose a namespace"
			}
			return nil, fmt.Errorf("%s may not list TenantControlPlanes %s", s.User, where)
		}
		return nil, fmt.Errorf("listing TenantControlPlanes as %s: %w", s.User, err)
	}
	return list.Items, nil
}
