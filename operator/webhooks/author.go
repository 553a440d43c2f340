package webhooks

import (
	"context"
	"fmt"

	authorizationv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create

// authorMay asks the API server whether the author of the request being
// admitted may get an object (a Secret or ConfigMap the object names).
// The operator reads what its objects name with its own rights; this
// check keeps it from reading for someone who could not (a confused
// deputy). It returns the author's name for messages.
func authorMay(ctx context.Context, c client.Client, namespace, resource, name string) (bool, string, error) {
	req, err := admission.RequestFromContext(ctx)
	if err != nil {
		return false, "", apierrors.NewInternalError(err)
	}
	u := req.UserInfo
	extra := map[string]authorizationv1.ExtraValue{}
	for k, v := range u.Extra {
		extra[k] = authorizationv1.ExtraValue(v)
	}
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User: u.Username, Groups: u.Groups, UID: u.UID, Extra: extra,
		ResourceAttributes: &authorizationv1.ResourceAttributes{
			Namespace: namespace, Verb: "get", Resource: resource, Name: name,
		},
	}}
	if err := c.Create(ctx, sar); err != nil {
		return false, u.Username, apierrors.NewInternalError(fmt.Errorf("asking whether %s may get %s %s/%s: %w", u.Username, resource, namespace, name, err))
	}
	return sar.Status.Allowed, u.Username, nil
}
