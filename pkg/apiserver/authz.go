package apiserver

import (
	"context"
	"fmt"

	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Authorizer answers whether a user may act on a resource.
type Authorizer interface {
	Authorize(ctx context.Context, user *UserInfo, attrs authorizationv1.ResourceAttributes) (allowed bool, reason string, err error)
}

// SARAuthorizer asks kube-apiserver through SubjectAccessReviews, so that the
// cluster's own authorizers (RBAC and any others) decide.
type SARAuthorizer struct {
	Client kubernetes.Interface
}

// Authorize creates a SubjectAccessReview for user and attrs.
func (a SARAuthorizer) Authorize(ctx context.Context, user *UserInfo, attrs authorizationv1.ResourceAttributes) (bool, string, error) {
	sar := &authorizationv1.SubjectAccessReview{
		Spec: authorizationv1.SubjectAccessReviewSpec{
			User:               user.Name,
			UID:                user.UID,
			Groups:             user.Groups,
			ResourceAttributes: &attrs,
		},
	}
	if len(user.Extra) > 0 {
		sar.Spec.Extra = map[string]authorizationv1.ExtraValue{}
		for k, v := range user.Extra {
			sar.Spec.Extra[k] = authorizationv1.ExtraValue(v)
		}
	}
	res, err := a.Client.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
	if err != nil {
		return false, "", fmt.Errorf("creating SubjectAccessReview for %q %s %s: %w", user.Name, attrs.Verb, describeAttrs(attrs), err)
	}
	return res.Status.Allowed && !res.Status.Denied, res.Status.Reason, nil
}

// describeAttrs renders attributes the way kube-apiserver's forbidden
// messages do: resource "x" in API group "g" in the namespace "n".
func describeAttrs(a authorizationv1.ResourceAttributes) string {
	res := a.Resource
	if a.Subresource != "" {
		res += "/" + a.Subresource
	}
	s := fmt.Sprintf("resource %q in API group %q", res, a.Group)
	if a.Namespace != "" {
		s += fmt.Sprintf(" in the namespace %q", a.Namespace)
	}
	return s
}

// ForbiddenMessage is the user-facing text of a denied request.
func ForbiddenMessage(user *UserInfo, a authorizationv1.ResourceAttributes, reason string) string {
	msg := fmt.Sprintf("User %q cannot %s %s", user.Name, a.Verb, describeAttrs(a))
	if reason != "" {
		msg += ": " + reason
	}
	return msg
}
