package clone

import (
	"context"
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/populators"
	"github.com/kubefill/kubefill/pkg/token"
)

// AuthorizeSource implements populators.SourceAuthorizer. A clone from the
// namespace cdi.kubevirt.io/dataSourceNamespace names is CDI's: the
// target's clone token decides, read from the target alone, before anything
// in the source's namespace is read. A dataSourceRef that itself names
// another namespace is the Kubernetes way: a ReferenceGrant decides.
func (k *Kind) AuthorizeSource(ctx context.Context, target *corev1.PersistentVolumeClaim) (bool, string, error) {
	if populators.AnnotatedSourceNamespace(target) == "" {
		if k.Grants == nil {
			return false, fmt.Sprintf("%s: this controller checks no ReferenceGrants; give the claim annotation %s and a clone token instead",
				refusalPrefix(target), cdiv1.AnnDataSourceNamespace), nil
		}
		return k.Grants.Allowed(ctx, target)
	}
	msg := k.checkToken(target, nil)
	return msg == "", msg, nil
}

func refusalPrefix(target *corev1.PersistentVolumeClaim) string {
	return fmt.Sprintf("PersistentVolumeClaim %s/%s may not clone from namespace %s", target.Namespace, target.Name, populators.SourceNamespace(target))
}

// checkToken checks the target's clone token for a clone from its source
// namespace into it, and, with source, from that very source. It returns
// why it refuses, or "". The extended token (issuer cdi-deployment) is
// preferred when present, else the short one (issuer cdi-apiserver), as
// CDI does.
func (k *Kind) checkToken(target *corev1.PersistentVolumeClaim, source *corev1.TypedLocalObjectReference) string {
	validator, value, what := k.ExtendedTokens, target.Annotations[cdiv1.AnnExtendedCloneToken], "extended clone token"
	if value == "" {
		validator, value, what = k.CloneTokens, target.Annotations[cdiv1.AnnCloneToken], "clone token"
	}
	refuse := func(format string, args ...any) string {
		return refusalPrefix(target) + ": " + fmt.Sprintf(format, args...)
	}
	if value == "" {
		return refuse("no clone token; a clone from another namespace needs annotation %s (the DataVolume webhook sets it for a user allowed to clone the source) or %s",
			cdiv1.AnnCloneToken, cdiv1.AnnExtendedCloneToken)
	}
	if validator == nil {
		return refuse("this controller has no key to check the %s with", what)
	}
	p, err := validator.Validate(value)
	if err != nil {
		if errors.Is(err, token.ErrClaims) && strings.Contains(err.Error(), "expired") {
			if dv := metav1.GetControllerOf(target); dv != nil && dv.Kind == "DataVolume" && what == "clone token" {
				// The DataVolume controller adds the extended token just
				// after it creates the claim: this wait is short, and the
				// annotation brings the claim back.
				return refuse("the short clone token has expired and the claim has no extended clone token yet; DataVolume %s adds it", dv.Name)
			}
			return refuse("the %s has expired; create the clone again to get a new one", what)
		}
		return refuse("the %s is not valid: %v", what, err)
	}
	return tokenMismatch(p, target, source, what, refuse)
}

// tokenMismatch compares a valid token's payload with the clone it is used
// for; pure.
func tokenMismatch(p *token.Payload, target *corev1.PersistentVolumeClaim, source *corev1.TypedLocalObjectReference, what string, refuse func(string, ...any) string) string {
	ns := populators.SourceNamespace(target)
	switch {
	case p.Operation != token.OperationClone:
		return refuse("the %s allows %q, not a clone", what, p.Operation)
	case p.Params[token.ParamTargetNamespace] != target.Namespace || p.Params[token.ParamTargetName] != target.Name:
		return refuse("the %s was issued for another target (%s/%s)", what, p.Params[token.ParamTargetNamespace], p.Params[token.ParamTargetName])
	case p.Params[token.ParamUID] != "" && p.Params[token.ParamUID] != string(target.UID):
		return refuse("the %s was issued for another target (UID %s, not this claim's %s)", what, p.Params[token.ParamUID], target.UID)
	case p.Namespace != ns:
		return refuse("the %s allows a clone from namespace %q", what, p.Namespace)
	}
	if source == nil {
		return ""
	}
	resource := token.ResourcePVC
	if source.Kind == "VolumeSnapshot" {
		resource = token.ResourceVolumeSnapshot
	}
	if err := token.CheckClone(p, resource, ns, source.Name, target.Namespace, target.Name); err != nil {
		return refuse("the %s was issued for another source: %v", what, err)
	}
	return ""
}
