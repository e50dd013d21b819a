// Package token issues and checks the signed tokens that authorise an upload
// into a PVC or a clone out of another namespace.
//
// Tokens are compact JWS objects signed with PS256 (RSA-PSS with SHA-256).
// Their payload is wire-compatible with CDI's: the JSON keys are operation,
// name, namespace, resource ({group, version, resource}) and params, next to
// the registered claims iss, iat, nbf and exp.
package token

import (
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Operation says what a token allows.
type Operation string

const (
	// OperationUpload allows an upload into the PVC the token names.
	OperationUpload Operation = "Upload"
	// OperationClone allows a clone out of the source the token names.
	OperationClone Operation = "Clone"
)

// Issuers used by CDI; Kubefill keeps them so that tokens look the same.
const (
	UploadTokenIssuer = "cdi-apiserver"
	CloneTokenIssuer  = "cdi-apiserver"
	// ExtendedCloneTokenIssuer signs the long-lived clone token the
	// DataVolume controller derives from the short one (CDI issue #2777).
	ExtendedCloneTokenIssuer = "cdi-deployment"
)

// Param keys of clone tokens.
const (
	ParamTargetNamespace = "targetNamespace"
	ParamTargetName      = "targetName"
	// ParamUID binds an extended clone token to the DataVolume, then the
	// claim, it was minted for.
	ParamUID = "uid"
)

// Default lifetimes and leeway, as CDI uses them.
const (
	DefaultUploadTokenLifetime = 5 * time.Minute
	DefaultCloneTokenLifetime  = 5 * time.Minute
	DefaultCloneTokenLeeway    = 10 * time.Second
	// DefaultExtendedCloneTokenLifetime is CDI's ten years.
	DefaultExtendedCloneTokenLifetime = 10 * 365 * 24 * time.Hour
)

// MinKeyBits is the smallest RSA modulus accepted for signing or verifying.
const MinKeyBits = 2048

// Payload is the private part of a token.
type Payload struct {
	Operation Operation                   `json:"operation,omitempty"`
	Name      string                      `json:"name,omitempty"`
	Namespace string                      `json:"namespace,omitempty"`
	Resource  metav1.GroupVersionResource `json:"resource,omitempty"`
	Params    map[string]string           `json:"params,omitempty"`
	// Requester is who the clone was authorised for, recorded by the
	// DataVolume webhook, so that the controller can authorise the same
	// user again when the source a DataVolume resolves to changes. A field
	// of Kubefill's: CDI's validators ignore it, and upload tokens omit it.
	Requester *Requester `json:"requester,omitempty"`
}

// Requester is the identity a clone token was issued for, as
// kube-apiserver described it in the AdmissionReview.
type Requester struct {
	Username string              `json:"username"`
	UID      string              `json:"uid,omitempty"`
	Groups   []string            `json:"groups,omitempty"`
	Extra    map[string][]string `json:"extra,omitempty"`
}

// Well-known resources named in tokens.
var (
	ResourcePVC = metav1.GroupVersionResource{Group: "", Version: "v1", Resource: "persistentvolumeclaims"}
	// ResourceVolumeSnapshot is the source resource of a snapshot clone.
	ResourceVolumeSnapshot = metav1.GroupVersionResource{Group: "snapshot.storage.k8s.io", Version: "v1", Resource: "volumesnapshots"}
	// ResourceDataSource names a DataSource whose source was not known when
	// the DataVolume was created (no DataSource yet, or an empty one): the
	// token then authorises cloning from the DataSource's namespace.
	ResourceDataSource = metav1.GroupVersionResource{Group: "cdi.kubevirt.io", Version: "v1beta1", Resource: "datasources"}
)

// Generator signs payloads into tokens.
type Generator interface {
	Generate(*Payload) (string, error)
}

// Validator checks a token's signature and standard claims and returns its payload.
type Validator interface {
	Validate(string) (*Payload, error)
}

// PrivateKeyFunc returns the key to sign with now; it lets a generator follow rotation.
type PrivateKeyFunc func() (*rsa.PrivateKey, error)

// PublicKeysFunc returns the keys a token may be signed with now, current first.
type PublicKeysFunc func() ([]*rsa.PublicKey, error)

type generator struct {
	issuer   string
	key      PrivateKeyFunc
	lifetime time.Duration
	now      func() time.Time
}

// NewGenerator returns a Generator that signs with one fixed key.
func NewGenerator(issuer string, key *rsa.PrivateKey, lifetime time.Duration) Generator {
	return NewDynamicGenerator(issuer, func() (*rsa.PrivateKey, error) { return key, nil }, lifetime)
}

// NewGeneratorAt is NewGenerator with the caller's clock: tests use it to
// issue tokens that are already expired or not yet valid.
func NewGeneratorAt(issuer string, key *rsa.PrivateKey, lifetime time.Duration, now func() time.Time) Generator {
	return &generator{issuer: issuer, key: func() (*rsa.PrivateKey, error) { return key, nil }, lifetime: lifetime, now: now}
}

// NewDynamicGenerator returns a Generator that asks key for the signing key on every token.
func NewDynamicGenerator(issuer string, key PrivateKeyFunc, lifetime time.Duration) Generator {
	return &generator{issuer: issuer, key: key, lifetime: lifetime, now: time.Now}
}

// Generate signs the payload with PS256 and the claims iss, iat, nbf and exp.
func (g *generator) Generate(p *Payload) (string, error) {
	if p == nil {
		return "", errors.New("token payload is nil")
	}
	if g.lifetime <= 0 {
		return "", fmt.Errorf("token lifetime must be positive, got %s", g.lifetime)
	}
	key, err := g.key()
	if err != nil {
		return "", fmt.Errorf("getting the token signing key: %w", err)
	}
	if key == nil {
		return "", errors.New("no token signing key")
	}
	if key.N.BitLen() < MinKeyBits {
		return "", fmt.Errorf("token signing key has %d bits, at least %d are required", key.N.BitLen(), MinKeyBits)
	}
	opts := (&jose.SignerOptions{}).WithType("JWT").WithHeader(jose.HeaderKey("kid"), KeyID(&key.PublicKey))
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.PS256, Key: key}, opts)
	if err != nil {
		return "", fmt.Errorf("creating the PS256 signer: %w", err)
	}
	now := g.now()
	claims := jwt.Claims{
		Issuer:    g.issuer,
		IssuedAt:  jwt.NewNumericDate(now),
		NotBefore: jwt.NewNumericDate(now),
		Expiry:    jwt.NewNumericDate(now.Add(g.lifetime)),
	}
	s, err := jwt.Signed(signer).Claims(p).Claims(claims).Serialize()
	if err != nil {
		return "", fmt.Errorf("signing the token: %w", err)
	}
	return s, nil
}

type validator struct {
	issuer string
	keys   PublicKeysFunc
	leeway time.Duration
	now    func() time.Time
}

// NewValidator returns a Validator that accepts tokens from issuer signed by key.
func NewValidator(issuer string, key *rsa.PublicKey, leeway time.Duration) Validator {
	return NewMultiKeyValidator(issuer, func() ([]*rsa.PublicKey, error) { return []*rsa.PublicKey{key}, nil }, leeway)
}

// NewMultiKeyValidator returns a Validator that accepts a token signed by any
// key that keys returns at the time of validation (the current key and, during
// a rotation, the previous one).
func NewMultiKeyValidator(issuer string, keys PublicKeysFunc, leeway time.Duration) Validator {
	return &validator{issuer: issuer, keys: keys, leeway: leeway, now: time.Now}
}

// Errors returned by Validate, for errors.Is.
var (
	ErrMalformed    = errors.New("token is malformed or not signed with PS256")
	ErrSignature    = errors.New("token signature does not verify with any trusted key")
	ErrClaims       = errors.New("token claims are invalid")
	ErrMissingClaim = errors.New("token lacks a required claim")
)

// Validate accepts only PS256 compact JWS tokens, verifies the signature with
// the trusted keys, and checks iss, exp, nbf and iat with the leeway.
func (v *validator) Validate(s string) (*Payload, error) {
	tok, err := jwt.ParseSigned(s, []jose.SignatureAlgorithm{jose.PS256})
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if len(tok.Headers) != 1 || tok.Headers[0].Algorithm != string(jose.PS256) {
		return nil, fmt.Errorf("%w: unexpected header", ErrMalformed)
	}
	keys, err := v.keys()
	if err != nil {
		return nil, fmt.Errorf("getting the token verification keys: %w", err)
	}
	kid := tok.Headers[0].KeyID
	var (
		claims  jwt.Claims
		payload Payload
		matched bool
	)
	for _, key := range orderByKeyID(keys, kid) {
		if key == nil || key.N.BitLen() < MinKeyBits {
			continue
		}
		claims, payload = jwt.Claims{}, Payload{}
		if err := tok.Claims(key, &claims, &payload); err == nil {
			matched = true
			break
		}
	}
	if !matched {
		return nil, ErrSignature
	}
	if claims.Expiry == nil || claims.NotBefore == nil || claims.IssuedAt == nil {
		return nil, fmt.Errorf("%w: exp, nbf and iat are all required", ErrMissingClaim)
	}
	if v.issuer == "" {
		return nil, errors.New("validator has no issuer configured")
	}
	expected := jwt.Expected{Issuer: v.issuer, Time: v.now()}
	if err := claims.ValidateWithLeeway(expected, v.leeway); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrClaims, err)
	}
	return &payload, nil
}

// orderByKeyID puts the key whose ID matches kid first, so that the common case
// verifies once; the others are still tried because kid is not signed-for trust.
func orderByKeyID(keys []*rsa.PublicKey, kid string) []*rsa.PublicKey {
	if kid == "" || len(keys) < 2 {
		return keys
	}
	out := make([]*rsa.PublicKey, 0, len(keys))
	for _, k := range keys {
		if k != nil && KeyID(k) == kid {
			out = append(out, k)
		}
	}
	for _, k := range keys {
		if k == nil || KeyID(k) != kid {
			out = append(out, k)
		}
	}
	return out
}

// KeyID is a short stable identifier of a public key: the unpadded base64url
// SHA-256 of its modulus and exponent, cut to 16 characters.
func KeyID(key *rsa.PublicKey) string {
	h := sha256.New()
	h.Write(key.N.Bytes())
	fmt.Fprintf(h, ":%d", key.E)
	return base64.RawURLEncoding.EncodeToString(h.Sum(nil))[:16]
}
