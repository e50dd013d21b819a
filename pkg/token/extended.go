package token

import (
	"fmt"
	"maps"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The extended clone token (CDI issue #2777): the DataVolume controller
// validates the short token the mutating webhook put on a cross-namespace
// clone DataVolume, and re-signs its payload with issuer
// ExtendedCloneTokenIssuer and a ten-year lifetime, bound by ParamUID to the
// DataVolume's UID. When it creates the claim it re-signs it once more, bound
// to the claim's UID. A clone created long before its source thus stays
// authorised, and a token copied onto another object is refused.

// WithUID returns a copy of p whose params.uid is uid.
func WithUID(p *Payload, uid string) *Payload {
	out := *p
	out.Params = maps.Clone(p.Params)
	if out.Params == nil {
		out.Params = map[string]string{}
	}
	out.Params[ParamUID] = uid
	return &out
}

// CheckUID returns nil when p is bound to uid.
func CheckUID(p *Payload, uid string) error {
	if p == nil {
		return fmt.Errorf("%w: no payload", ErrPayloadMismatch)
	}
	if got := p.Params[ParamUID]; uid == "" || got != uid {
		return fmt.Errorf("%w: uid is %q, want %q", ErrPayloadMismatch, got, uid)
	}
	return nil
}

// CheckExtendedClone returns nil when p allows the clone CheckClone checks
// and is bound to the target's uid.
func CheckExtendedClone(p *Payload, resource metav1.GroupVersionResource, sourceNamespace, sourceName, targetNamespace, targetName, uid string) error {
	if err := CheckClone(p, resource, sourceNamespace, sourceName, targetNamespace, targetName); err != nil {
		return err
	}
	return CheckUID(p, uid)
}
