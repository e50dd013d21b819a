package token

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
)

var (
	keyOnce sync.Once
	keyA    *rsa.PrivateKey
	keyB    *rsa.PrivateKey
)

// testKeys returns two distinct 2048-bit keys, generated once per test binary.
func testKeys(t *testing.T) (*rsa.PrivateKey, *rsa.PrivateKey) {
	t.Helper()
	keyOnce.Do(func() {
		var err error
		if keyA, err = GenerateKey(); err != nil {
			panic(err)
		}
		if keyB, err = GenerateKey(); err != nil {
			panic(err)
		}
	})
	return keyA, keyB
}

func fixedClock(t time.Time) func() time.Time { return func() time.Time { return t } }

func newTestGenerator(key *rsa.PrivateKey, issuer string, lifetime time.Duration, now time.Time) Generator {
	g := NewGenerator(issuer, key, lifetime).(*generator)
	g.now = fixedClock(now)
	return g
}

func newTestValidator(key *rsa.PublicKey, issuer string, leeway time.Duration, now time.Time) Validator {
	v := NewValidator(issuer, key, leeway).(*validator)
	v.now = fixedClock(now)
	return v
}

func segments(t *testing.T, tok string) []string {
	t.Helper()
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		t.Fatalf("token has %d segments, want 3", len(parts))
	}
	return parts
}

func b64(v any) string {
	data, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return base64.RawURLEncoding.EncodeToString(data)
}

func TestRoundTripAndWireFormat(t *testing.T) {
	a, _ := testKeys(t)
	now := time.Unix(1_800_000_000, 0)
	p := NewClonePayload(ResourcePVC, "src-ns", "src", "dst-ns", "dst")
	tok, err := newTestGenerator(a, CloneTokenIssuer, 5*time.Minute, now).Generate(p)
	if err != nil {
		t.Fatal(err)
	}
	got, err := newTestValidator(&a.PublicKey, CloneTokenIssuer, 0, now.Add(time.Minute)).Validate(tok)
	if err != nil {
		t.Fatalf("validate: %v", err)
	}
	if err := CheckClone(got, ResourcePVC, "src-ns", "src", "dst-ns", "dst"); err != nil {
		t.Fatalf("round-tripped payload: %v", err)
	}

	// The header says PS256 and the claims carry exactly CDI's JSON keys.
	parts := segments(t, tok)
	var hdr map[string]any
	raw, _ := base64.RawURLEncoding.DecodeString(parts[0])
	if err := json.Unmarshal(raw, &hdr); err != nil {
		t.Fatal(err)
	}
	if hdr["alg"] != "PS256" || hdr["kid"] != KeyID(&a.PublicKey) {
		t.Fatalf("header = %v, want alg PS256 and kid %s", hdr, KeyID(&a.PublicKey))
	}
	var claims map[string]any
	raw, _ = base64.RawURLEncoding.DecodeString(parts[1])
	if err := json.Unmarshal(raw, &claims); err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]any{
		"iss": "cdi-apiserver", "operation": "Clone", "name": "src", "namespace": "src-ns",
		"iat": float64(now.Unix()), "nbf": float64(now.Unix()), "exp": float64(now.Add(5 * time.Minute).Unix()),
	} {
		if claims[k] != want {
			t.Errorf("claim %s = %v, want %v", k, claims[k], want)
		}
	}
	res, _ := claims["resource"].(map[string]any)
	if res["group"] != "" || res["version"] != "v1" || res["resource"] != "persistentvolumeclaims" {
		t.Errorf("resource claim = %v", claims["resource"])
	}
	params, _ := claims["params"].(map[string]any)
	if params["targetNamespace"] != "dst-ns" || params["targetName"] != "dst" {
		t.Errorf("params claim = %v", claims["params"])
	}
	t.Logf("token length %d bytes, kid %s", len(tok), hdr["kid"])
}

func TestExpiryAndNotBeforeWithLeeway(t *testing.T) {
	a, _ := testKeys(t)
	issued := time.Unix(1_800_000_000, 0)
	tok, err := newTestGenerator(a, UploadTokenIssuer, 5*time.Minute, issued).Generate(NewUploadPayload("ns", "pvc"))
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		at     time.Time
		leeway time.Duration
		ok     bool
	}{
		{"just issued", issued, 0, true},
		{"one second before expiry", issued.Add(5*time.Minute - time.Second), 0, true},
		{"expired, no leeway", issued.Add(5*time.Minute + time.Second), 0, false},
		{"expired, within 10s leeway", issued.Add(5*time.Minute + 9*time.Second), 10 * time.Second, true},
		{"expired, beyond 10s leeway", issued.Add(5*time.Minute + 11*time.Second), 10 * time.Second, false},
		{"before nbf, no leeway", issued.Add(-2 * time.Second), 0, false},
		{"before nbf, within leeway", issued.Add(-5 * time.Second), 10 * time.Second, true},
		{"before nbf, beyond leeway", issued.Add(-11 * time.Second), 10 * time.Second, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := newTestValidator(&a.PublicKey, UploadTokenIssuer, tc.leeway, tc.at).Validate(tok)
			if tc.ok && err != nil {
				t.Fatalf("want valid, got %v", err)
			}
			if !tc.ok {
				if err == nil {
					t.Fatal("want rejection, got valid")
				}
				if !errors.Is(err, ErrClaims) {
					t.Fatalf("want ErrClaims, got %v", err)
				}
			}
		})
	}
}

func TestRejections(t *testing.T) {
	a, b := testKeys(t)
	now := time.Unix(1_800_000_000, 0)
	good, err := newTestGenerator(a, UploadTokenIssuer, 5*time.Minute, now).Generate(NewUploadPayload("ns", "pvc"))
	if err != nil {
		t.Fatal(err)
	}
	parts := segments(t, good)
	pubPEM, err := EncodePublicKeyPEM(&a.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	hs256 := func(secret []byte, header, claims map[string]any) string {
		signing := b64(header) + "." + b64(claims)
		m := hmac.New(sha256.New, secret)
		m.Write([]byte(signing))
		return signing + "." + base64.RawURLEncoding.EncodeToString(m.Sum(nil))
	}
	claims := map[string]any{
		"iss": UploadTokenIssuer, "iat": now.Unix(), "nbf": now.Unix(), "exp": now.Add(time.Hour).Unix(),
		"operation": "Upload", "name": "pvc", "namespace": "ns",
		"resource": map[string]string{"group": "", "version": "v1", "resource": "persistentvolumeclaims"},
	}
	otherKey, err := newTestGenerator(b, UploadTokenIssuer, 5*time.Minute, now).Generate(NewUploadPayload("ns", "pvc"))
	if err != nil {
		t.Fatal(err)
	}
	wrongIssuer, err := newTestGenerator(a, "someone-else", 5*time.Minute, now).Generate(NewUploadPayload("ns", "pvc"))
	if err != nil {
		t.Fatal(err)
	}
	// A PS256 token signed with the right key but without exp/nbf/iat.
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.PS256, Key: a}, nil)
	if err != nil {
		t.Fatal(err)
	}
	noExpiry, err := jwt.Signed(signer).Claims(NewUploadPayload("ns", "pvc")).Claims(jwt.Claims{Issuer: UploadTokenIssuer}).Serialize()
	if err != nil {
		t.Fatal(err)
	}
	// RS256 with the right key: a valid signature, but not the algorithm we accept.
	rsSigner, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.RS256, Key: a}, nil)
	if err != nil {
		t.Fatal(err)
	}
	rs256, err := jwt.Signed(rsSigner).Claims(NewUploadPayload("ns", "pvc")).Claims(jwt.Claims{
		Issuer: UploadTokenIssuer, IssuedAt: jwt.NewNumericDate(now), NotBefore: jwt.NewNumericDate(now), Expiry: jwt.NewNumericDate(now.Add(time.Minute)),
	}).Serialize()
	if err != nil {
		t.Fatal(err)
	}

	tamperedPayload := map[string]any{}
	raw, _ := base64.RawURLEncoding.DecodeString(parts[1])
	if err := json.Unmarshal(raw, &tamperedPayload); err != nil {
		t.Fatal(err)
	}
	tamperedPayload["name"] = "someone-elses-pvc"
	sig, _ := base64.RawURLEncoding.DecodeString(parts[2])
	sig[len(sig)/2] ^= 0x01

	cases := []struct {
		name  string
		token string
		want  error
	}{
		{"alg none", b64(map[string]any{"alg": "none", "typ": "JWT"}) + "." + b64(claims) + ".", ErrMalformed},
		{"HS256 with the public key PEM as secret", hs256(pubPEM, map[string]any{"alg": "HS256", "typ": "JWT"}, claims), ErrMalformed},
		{"HS256 with the DER modulus as secret", hs256(a.N.Bytes(), map[string]any{"alg": "HS256"}, claims), ErrMalformed},
		{"RS256 signed by the right key", rs256, ErrMalformed},
		{"tampered payload", parts[0] + "." + b64(tamperedPayload) + "." + parts[2], ErrSignature},
		{"tampered signature", parts[0] + "." + parts[1] + "." + base64.RawURLEncoding.EncodeToString(sig), ErrSignature},
		{"signature stripped", parts[0] + "." + parts[1] + ".", ErrSignature},
		{"signed by another key", otherKey, ErrSignature},
		{"wrong issuer", wrongIssuer, ErrClaims},
		{"no exp, nbf or iat", noExpiry, ErrMissingClaim},
		{"garbage", "not-a-token", ErrMalformed},
		{"empty", "", ErrMalformed},
	}
	v := newTestValidator(&a.PublicKey, UploadTokenIssuer, 10*time.Second, now)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, err := v.Validate(tc.token)
			if err == nil {
				t.Fatalf("accepted, payload %+v", p)
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("error %v, want %v", err, tc.want)
			}
		})
	}
	// The untouched token still passes, so the cases above fail for their own reason.
	if _, err := v.Validate(good); err != nil {
		t.Fatalf("good token rejected: %v", err)
	}
}

func TestGeneratorRefusesWeakKeyAndBadLifetime(t *testing.T) {
	a, _ := testKeys(t)
	if _, err := NewGenerator("x", a, 0).Generate(NewUploadPayload("ns", "p")); err == nil {
		t.Fatal("zero lifetime accepted")
	}
	if _, err := NewGenerator("x", a, time.Minute).Generate(nil); err == nil {
		t.Fatal("nil payload accepted")
	}
	weak, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewGenerator("x", weak, time.Minute).Generate(NewUploadPayload("ns", "p")); err == nil {
		t.Fatal("1024-bit key accepted")
	}
}

func TestMultiKeyValidatorAcceptsCurrentAndPrevious(t *testing.T) {
	a, b := testKeys(t)
	now := time.Unix(1_800_000_000, 0)
	// a is the previous key, b the current one, rotated a minute ago.
	ks := &KeySet{Current: &b.PublicKey, Previous: &a.PublicKey, RotatedAt: now.Add(-time.Minute)}
	window := 5*time.Minute + 10*time.Second
	mk := func(at time.Time) Validator {
		v := NewMultiKeyValidator(UploadTokenIssuer, func() ([]*rsa.PublicKey, error) { return ks.TrustedKeys(at, window), nil }, 10*time.Second).(*validator)
		v.now = fixedClock(at)
		return v
	}
	oldTok, err := newTestGenerator(a, UploadTokenIssuer, 5*time.Minute, now.Add(-2*time.Minute)).Generate(NewUploadPayload("ns", "p"))
	if err != nil {
		t.Fatal(err)
	}
	newTok, err := newTestGenerator(b, UploadTokenIssuer, 5*time.Minute, now).Generate(NewUploadPayload("ns", "p"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mk(now).Validate(oldTok); err != nil {
		t.Fatalf("token of the previous key rejected within the window: %v", err)
	}
	if _, err := mk(now).Validate(newTok); err != nil {
		t.Fatalf("token of the current key rejected: %v", err)
	}
	// After the window the previous key is no longer trusted at all.
	late := now.Add(window)
	if keys := ks.TrustedKeys(late, window); len(keys) != 1 || !keys[0].Equal(&b.PublicKey) {
		t.Fatalf("trusted keys after the window: %d", len(keys))
	}
	if _, err := mk(late).Validate(oldTok); !errors.Is(err, ErrSignature) {
		t.Fatalf("token of the previous key after the window: %v, want ErrSignature", err)
	}
}

func TestCheckPayload(t *testing.T) {
	up := NewUploadPayload("ns", "pvc")
	clone := NewClonePayload(ResourcePVC, "src-ns", "src", "dst-ns", "dst")
	mutate := func(p *Payload, f func(*Payload)) *Payload {
		c := *p
		c.Params = map[string]string{}
		for k, v := range p.Params {
			c.Params[k] = v
		}
		f(&c)
		return &c
	}
	uploadCases := []struct {
		name string
		p    *Payload
		ok   bool
	}{
		{"matching", up, true},
		{"version omitted like older tokens", mutate(up, func(p *Payload) { p.Resource.Version = "" }), true},
		{"clone operation", mutate(up, func(p *Payload) { p.Operation = OperationClone }), false},
		{"other pvc", mutate(up, func(p *Payload) { p.Name = "other" }), false},
		{"other namespace", mutate(up, func(p *Payload) { p.Namespace = "other" }), false},
		{"other resource", mutate(up, func(p *Payload) { p.Resource.Resource = "secrets" }), false},
		{"other group", mutate(up, func(p *Payload) { p.Resource.Group = "evil.io" }), false},
		{"nil", nil, false},
	}
	for _, tc := range uploadCases {
		t.Run("upload/"+tc.name, func(t *testing.T) {
			err := CheckUpload(tc.p, "ns", "pvc")
			if (err == nil) != tc.ok {
				t.Fatalf("CheckUpload = %v, want ok=%v", err, tc.ok)
			}
			if err != nil && !errors.Is(err, ErrPayloadMismatch) {
				t.Fatalf("error %v does not wrap ErrPayloadMismatch", err)
			}
		})
	}
	if err := CheckUpload(up, "", ""); err == nil {
		t.Fatal("empty expectations accepted")
	}
	cloneCases := []struct {
		name string
		p    *Payload
		ok   bool
	}{
		{"matching", clone, true},
		{"upload operation", mutate(clone, func(p *Payload) { p.Operation = OperationUpload }), false},
		{"other source name", mutate(clone, func(p *Payload) { p.Name = "foo" }), false},
		{"other source namespace", mutate(clone, func(p *Payload) { p.Namespace = "foo" }), false},
		{"snapshot resource", mutate(clone, func(p *Payload) { p.Resource = ResourceVolumeSnapshot }), false},
		{"other target name", mutate(clone, func(p *Payload) { p.Params[ParamTargetName] = "foo" }), false},
		{"other target namespace", mutate(clone, func(p *Payload) { p.Params[ParamTargetNamespace] = "foo" }), false},
		{"missing params", mutate(clone, func(p *Payload) { p.Params = nil }), false},
	}
	for _, tc := range cloneCases {
		t.Run("clone/"+tc.name, func(t *testing.T) {
			err := CheckClone(tc.p, ResourcePVC, "src-ns", "src", "dst-ns", "dst")
			if (err == nil) != tc.ok {
				t.Fatalf("CheckClone = %v, want ok=%v", err, tc.ok)
			}
		})
	}
	err := CheckClone(mutate(clone, func(p *Payload) { p.Name = "x"; p.Params[ParamTargetName] = "y" }), ResourcePVC, "src-ns", "src", "dst-ns", "dst")
	if err == nil || !strings.Contains(err.Error(), `source name is "x"`) || !strings.Contains(err.Error(), `target name is "y"`) {
		t.Fatalf("mismatch message does not name both fields: %v", err)
	}
}
