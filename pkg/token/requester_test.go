package token

import (
	"encoding/base64"
	"encoding/json"
	"slices"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
)

// A clone token records its requester next to CDI's claims, which stay as
// they were: params keeps exactly targetNamespace and targetName, the
// issuer is cdi-apiserver, and the requester survives the round trip.
func TestRequesterRoundTrip(t *testing.T) {
	a, _ := testKeys(t)
	now := time.Unix(1_800_000_000, 0)
	user := authenticationv1.UserInfo{Username: "alice", UID: "42", Groups: []string{"devs", "system:authenticated"},
		Extra: map[string]authenticationv1.ExtraValue{"scopes.example.com": {"a", "b"}}}
	p := WithRequester(NewClonePayload(ResourcePVC, "src-ns", "src", "dst-ns", "dst"), RequesterOf(user))
	tok, err := newTestGenerator(a, CloneTokenIssuer, 5*time.Minute, now).Generate(p)
	if err != nil {
		t.Fatal(err)
	}
	got, err := newTestValidator(&a.PublicKey, CloneTokenIssuer, 0, now).Validate(tok)
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckClone(got, ResourcePVC, "src-ns", "src", "dst-ns", "dst"); err != nil {
		t.Fatal(err)
	}
	back := got.Requester.UserInfo()
	if back.Username != "alice" || back.UID != "42" || !slices.Equal(back.Groups, user.Groups) || !slices.Equal(back.Extra["scopes.example.com"], user.Extra["scopes.example.com"]) {
		t.Errorf("requester came back as %+v", back)
	}
	var claims map[string]any
	raw, _ := base64.RawURLEncoding.DecodeString(segments(t, tok)[1])
	if err := json.Unmarshal(raw, &claims); err != nil {
		t.Fatal(err)
	}
	if claims["iss"] != CloneTokenIssuer {
		t.Errorf("iss %v", claims["iss"])
	}
	params, _ := claims["params"].(map[string]any)
	if len(params) != 2 || params["targetNamespace"] != "dst-ns" || params["targetName"] != "dst" {
		t.Errorf("params %v: CDI's two keys and nothing else", params)
	}
	req, _ := claims["requester"].(map[string]any)
	if req["username"] != "alice" {
		t.Errorf("requester claim %v", claims["requester"])
	}
	// WithUID (the extended token) keeps the requester; WithRequester copies.
	ext := WithUID(got, "dv-uid")
	if ext.Requester == nil || ext.Requester.Username != "alice" || ext.Params[ParamUID] != "dv-uid" || got.Params[ParamUID] != "" {
		t.Errorf("extended payload %+v from %+v", ext, got)
	}
	// A token without one (an upload token, or one minted before Kubefill recorded requesters).
	var none *Requester
	if u := none.UserInfo(); u.Username != "" {
		t.Errorf("nil requester %+v", u)
	}
}
