package token

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"
)

// FuzzValidate: a garbled or forged token string is rejected with one of
// Validate's errors and never panics; the only strings accepted are ones
// carrying exactly the payload the key's holder signed (base64 may allow
// a few spellings of the same bytes, never other claims).
func FuzzValidate(f *testing.F) {
	// The same two keys as testKeys, which takes a *testing.T.
	keyOnce.Do(func() {
		var err error
		if keyA, err = GenerateKey(); err != nil {
			panic(err)
		}
		if keyB, err = GenerateKey(); err != nil {
			panic(err)
		}
	})
	a, b := keyA, keyB
	now := time.Unix(1_800_000_000, 0)
	signed := NewClonePayload(ResourcePVC, "src-ns", "src", "dst-ns", "dst")
	good, err := newTestGenerator(a, CloneTokenIssuer, time.Minute, now).Generate(signed)
	if err != nil {
		f.Fatal(err)
	}
	other, err := newTestGenerator(b, CloneTokenIssuer, time.Minute, now).Generate(NewUploadPayload("ns", "pvc"))
	if err != nil {
		f.Fatal(err)
	}
	parts := strings.Split(good, ".")
	f.Add(good)
	f.Add(other)
	f.Add(parts[0] + "." + parts[1] + ".")
	f.Add("eyJhbGciOiJub25lIn0." + parts[1] + ".")                             // alg none
	f.Add("eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9." + parts[1] + "." + parts[2]) // HS256 header
	f.Add(strings.Repeat("a.", 1000))
	f.Add("")
	v := newTestValidator(&a.PublicKey, CloneTokenIssuer, DefaultCloneTokenLeeway, now)
	f.Fuzz(func(t *testing.T, s string) {
		p, err := v.Validate(s)
		if err != nil {
			if p != nil {
				t.Fatalf("payload %+v returned with error %v", p, err)
			}
			if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrSignature) && !errors.Is(err, ErrClaims) && !errors.Is(err, ErrMissingClaim) {
				t.Fatalf("error %v is none of Validate's errors", err)
			}
			return
		}
		if !reflect.DeepEqual(p, signed) {
			t.Fatalf("accepted %q with payload %+v, which was never signed", s, p)
		}
	})
}
