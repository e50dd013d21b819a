package token

import (
	"errors"
	"testing"
	"time"
)

func TestExtendedCloneToken(t *testing.T) {
	key, err := GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	short := NewClonePayload(ResourcePVC, "src-ns", "golden", "tgt-ns", "disk")
	ext := WithUID(short, "dv-uid")
	if _, ok := short.Params[ParamUID]; ok {
		t.Fatal("WithUID changed its argument")
	}
	gen := NewGenerator(ExtendedCloneTokenIssuer, key, DefaultExtendedCloneTokenLifetime)
	tok, err := gen.Generate(ext)
	if err != nil {
		t.Fatal(err)
	}
	// Only the extended issuer's validator accepts it.
	if _, err := NewValidator(CloneTokenIssuer, &key.PublicKey, DefaultCloneTokenLeeway).Validate(tok); err == nil {
		t.Error("a cdi-apiserver validator accepted an extended token")
	}
	v := NewValidator(ExtendedCloneTokenIssuer, &key.PublicKey, DefaultCloneTokenLeeway)
	got, err := v.Validate(tok)
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckExtendedClone(got, ResourcePVC, "src-ns", "golden", "tgt-ns", "disk", "dv-uid"); err != nil {
		t.Errorf("CheckExtendedClone: %v", err)
	}
	for name, uid := range map[string]string{"other target": "claim-uid", "empty": ""} {
		if err := CheckExtendedClone(got, ResourcePVC, "src-ns", "golden", "tgt-ns", "disk", uid); !errors.Is(err, ErrPayloadMismatch) {
			t.Errorf("%s: CheckExtendedClone = %v, want a mismatch", name, err)
		}
	}
	if err := CheckUID(short, "dv-uid"); !errors.Is(err, ErrPayloadMismatch) {
		t.Errorf("a short token without uid passed CheckUID: %v", err)
	}
	if err := CheckUID(nil, "x"); err == nil {
		t.Error("CheckUID(nil) passed")
	}
	// Ten years, as CDI.
	if DefaultExtendedCloneTokenLifetime < 9*365*24*time.Hour {
		t.Errorf("extended lifetime %s", DefaultExtendedCloneTokenLifetime)
	}
	// Re-binding keeps the rest of the payload.
	again := WithUID(got, "claim-uid")
	if again.Params[ParamTargetName] != "disk" || again.Params[ParamUID] != "claim-uid" || got.Params[ParamUID] != "dv-uid" {
		t.Errorf("WithUID: %+v from %+v", again.Params, got.Params)
	}
}
