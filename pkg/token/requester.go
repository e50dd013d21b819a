package token

import (
	"maps"
	"slices"

	authenticationv1 "k8s.io/api/authentication/v1"
)

// RequesterOf is the Requester a clone token records for user: every
// field a SubjectAccessReview for that user carries.
func RequesterOf(user authenticationv1.UserInfo) *Requester {
	r := &Requester{Username: user.Username, UID: user.UID, Groups: slices.Clone(user.Groups)}
	if len(user.Extra) > 0 {
		r.Extra = map[string][]string{}
		for k, v := range user.Extra {
			r.Extra[k] = slices.Clone([]string(v))
		}
	}
	return r
}

// UserInfo is the identity r records, for a SubjectAccessReview.
func (r *Requester) UserInfo() authenticationv1.UserInfo {
	if r == nil {
		return authenticationv1.UserInfo{}
	}
	u := authenticationv1.UserInfo{Username: r.Username, UID: r.UID, Groups: slices.Clone(r.Groups)}
	if len(r.Extra) > 0 {
		u.Extra = map[string]authenticationv1.ExtraValue{}
		for k, v := range r.Extra {
			u.Extra[k] = slices.Clone(v)
		}
	}
	return u
}

// WithRequester returns a copy of p that records r as its requester.
func WithRequester(p *Payload, r *Requester) *Payload {
	out := *p
	out.Params = maps.Clone(p.Params)
	if r != nil {
		c := *r
		c.Groups = slices.Clone(r.Groups)
		c.Extra = maps.Clone(r.Extra)
		out.Requester = &c
	}
	return &out
}
