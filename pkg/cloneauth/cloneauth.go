// Package cloneauth decides who may clone from a namespace: the
// SubjectAccessReviews CDI defines for a clone's source (create
// datavolumes/source there, or create pods, plus claims for a snapshot),
// run for the user who asked or for a ServiceAccount acting for them. The
// admission webhooks and the controller both ask it, so a clone is
// authorised by one rule wherever it is checked.
package cloneauth

import (
	"context"
	"fmt"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"

	"github.com/kubefill/kubefill/pkg/token"
)

// Source is what a clone reads from: a claim, a snapshot, or a DataSource
// whose own source is not known yet.
type Source struct {
	Resource  metav1.GroupVersionResource
	Namespace string
	Name      string
}

// IsSnapshot says whether the source is a VolumeSnapshot.
func (c Source) IsSnapshot() bool {
	return c.Resource.Resource == token.ResourceVolumeSnapshot.Resource
}

// IsDataSource says whether the source is a DataSource whose own source
// was not known yet (a golden image before its first import).
func (c Source) IsDataSource() bool {
	return c.Resource.Resource == token.ResourceDataSource.Resource
}

// AccessChecks returns the SubjectAccessReview attributes a user must
// pass to clone from src: either every one of explicit, or every one of implicit.
func AccessChecks(src Source) (explicit, implicit []authorizationv1.ResourceAttributes) {
	explicit = []authorizationv1.ResourceAttributes{{
		Namespace: src.Namespace, Verb: "create", Group: cdiv1.GroupName, Resource: "datavolumes",
		Subresource: cdiv1.DataVolumeCloneSourceSubresource, Name: src.Name,
	}}
	if src.IsDataSource() {
		// The object to be cloned is not known yet: the whole namespace.
		explicit[0].Name = ""
	}
	implicit = []authorizationv1.ResourceAttributes{{Namespace: src.Namespace, Verb: "create", Resource: "pods"}}
	if src.IsSnapshot() || src.IsDataSource() {
		// Restoring a snapshot also needs a claim in the source namespace
		// (and a DataSource not resolved yet may come to name a snapshot).
		implicit = append(implicit, authorizationv1.ResourceAttributes{Namespace: src.Namespace, Verb: "create", Resource: "persistentvolumeclaims"})
	}
	return explicit, implicit
}

// Authorizer runs the SubjectAccessReviews of a clone.
type Authorizer struct {
	Client client.Client
}

// Authorize returns whether user may clone from src and, if not, a message
// that names the permission to grant.
func (a Authorizer) Authorize(ctx context.Context, user authenticationv1.UserInfo, src Source) (bool, string, error) {
	explicit, implicit := AccessChecks(src)
	all := func(attrs []authorizationv1.ResourceAttributes) (bool, error) {
		for _, at := range attrs {
			ok, err := a.review(ctx, user, at)
			if err != nil || !ok {
				return false, err
			}
		}
		return true, nil
	}
	ok, err := all(explicit)
	if err != nil || ok {
		return ok, "", err
	}
	ok, err = all(implicit)
	if err != nil || ok {
		return ok, "", err
	}
	alt := "create pods"
	if src.IsSnapshot() || src.IsDataSource() {
		alt = "both create pods and create persistentvolumeclaims"
	}
	return false, fmt.Sprintf("user %q may not clone %s %s/%s: it needs create on datavolumes/source (API group %s) in namespace %q, or %s there",
		user.Username, singular(src.Resource.Resource), src.Namespace, src.Name, cdiv1.GroupName, src.Namespace, alt), nil
}

func singular(resource string) string {
	switch resource {
	case "persistentvolumeclaims":
		return "PersistentVolumeClaim"
	case "volumesnapshots":
		return "VolumeSnapshot"
	case "datasources":
		return "DataSource"
	}
	return resource
}

func (a Authorizer) review(ctx context.Context, user authenticationv1.UserInfo, attrs authorizationv1.ResourceAttributes) (bool, error) {
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User: user.Username, UID: user.UID, Groups: user.Groups, ResourceAttributes: &attrs,
	}}
	if len(user.Extra) > 0 {
		sar.Spec.Extra = map[string]authorizationv1.ExtraValue{}
		for k, v := range user.Extra {
			sar.Spec.Extra[k] = authorizationv1.ExtraValue(v)
		}
	}
	if err := a.Client.Create(ctx, sar); err != nil {
		return false, fmt.Errorf("SubjectAccessReview for %s %s in %s: %w", attrs.Verb, attrs.Resource, attrs.Namespace, err)
	}
	return sar.Status.Allowed && !sar.Status.Denied, nil
}

// ServiceAccountUser is the identity kube-apiserver gives ServiceAccount
// namespace/name: what a SubjectAccessReview for it must carry, groups
// included, so that bindings to system:serviceaccounts:<namespace> count.
func ServiceAccountUser(namespace, name string) authenticationv1.UserInfo {
	return authenticationv1.UserInfo{
		Username: "system:serviceaccount:" + namespace + ":" + name,
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"},
	}
}
