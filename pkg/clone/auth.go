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
func (k *Kind) AuthorizeSource(ctx context.Context, target *corev1.PersistentVolumeClaim) (populators.SourceVerdict, error) {
	if populators.AnnotatedSourceNamespace(target) == "" {
		if k.Grants == nil {
			return populators.SourceVerdict{Message: fmt.Sprintf("%s: this controller checks no ReferenceGrants; give the claim annotation %s and a clone token instead",
				refusalPrefix(target), cdiv1.AnnDataSourceNamespace)}, nil
		}
		allowed, msg, err := k.Grants.Allowed(ctx, target)
		return populators.SourceVerdict{Allowed: allowed, Message: msg}, err
	}
	msg, pending := k.checkToken(target, nil)
	return populators.SourceVerdict{Allowed: msg == "", Message: msg, Pending: pending}, nil
}

func refusalPrefix(target *corev1.PersistentVolumeClaim) string {
	return fmt.Sprintf("PersistentVolumeClaim %s/%s may not clone from namespace %s", target.Namespace, target.Name, populators.SourceNamespace(target))
}

// checkToken checks the target's clone token for a clone from its source
// namespace into it, and, with source, from that very source. It returns
// why it refuses, or "", and whether the refusal is only a short wait
// for what a DataVolume is about to add. On a claim only the extended token counts (issuer
// cdi-deployment), which the DataVolume controller mints after its own
// check, bound to the claim's UID: the short token of the DataVolume
// webhook (issuer cdi-apiserver) is a bearer credential anyone who may read
// the DataVolume sees, and CDI's acceptance of it on a bare claim let it be
// replayed onto a claim of the same name.
func (k *Kind) checkToken(target *corev1.PersistentVolumeClaim, source *corev1.TypedLocalObjectReference) (refusal string, pending bool) {
	const what = "extended clone token"
	value := target.Annotations[cdiv1.AnnExtendedCloneToken]
	refuse := func(format string, args ...any) string {
		return refusalPrefix(target) + ": " + fmt.Sprintf(format, args...)
	}
	if value == "" {
		if dv := metav1.GetControllerOf(target); dv != nil && dv.Kind == "DataVolume" {
			// The DataVolume controller adds it just after it creates the
			// claim (the token names the claim's UID, unknown before): a
			// short wait, and the annotation brings the claim back.
			return refuse("waiting for the %s bound to this claim, which DataVolume %s adds once it has checked its own clone token", what, dv.Name), true
		}
		hint := ""
		if target.Annotations[cdiv1.AnnCloneToken] != "" {
			hint = fmt.Sprintf(" (its %s is not accepted on a claim: it is the DataVolume webhook's, for a DataVolume)", cdiv1.AnnCloneToken)
		}
		return refuse("no %s (%s)%s; clone from another namespace with a DataVolume, whose controller adds that token after checking the clone is authorised, "+
			"or name the source namespace in spec.dataSourceRef.namespace and have a ReferenceGrant there allow it", what, cdiv1.AnnExtendedCloneToken, hint), false
	}
	if k.ExtendedTokens == nil {
		return refuse("this controller has no key to check the %s with", what), false
	}
	p, err := k.ExtendedTokens.Validate(value)
	if err != nil {
		if errors.Is(err, token.ErrClaims) && strings.Contains(err.Error(), "expired") {
			return refuse("the %s has expired; create the clone again to get a new one", what), false
		}
		return refuse("the %s is not valid: %v", what, err), false
	}
	if p.Params[token.ParamUID] == "" {
		return refuse("the %s is bound to no claim (it has no uid)", what), false
	}
	return tokenMismatch(p, target, source, what, refuse), false
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
