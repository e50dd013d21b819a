package token

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Layout of the signing key Secret. The public key keys match CDI's
// cdi-api-signing-key Secret so that the same mounts work.
const (
	DefaultSigningKeySecretName = "kubefill-api-signing-key"
	SecretPrivateKey            = "id_rsa"
	SecretPublicKey             = "id_rsa.pub"
	SecretPreviousPublicKey     = "id_rsa.pub.previous"
	// SecretRotatedAt holds (RFC 3339) when the current key replaced the
	// previous one, so that a mounted Secret carries it too.
	SecretRotatedAt = "rotated-at"
	// AnnRotatedAt records (RFC 3339) when the current key replaced the previous one.
	AnnRotatedAt = "kubefill.io/signing-key-rotated-at"
	// DefaultKeyBits is the modulus size of generated keys.
	DefaultKeyBits = 2048
)

// GenerateKey makes a new RSA signing key of DefaultKeyBits.
func GenerateKey() (*rsa.PrivateKey, error) {
	k, err := rsa.GenerateKey(rand.Reader, DefaultKeyBits)
	if err != nil {
		return nil, fmt.Errorf("generating a %d-bit RSA key: %w", DefaultKeyBits, err)
	}
	return k, nil
}

// EncodePrivateKeyPEM encodes key as a PKCS#1 "RSA PRIVATE KEY" block.
func EncodePrivateKeyPEM(key *rsa.PrivateKey) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})
}

// EncodePublicKeyPEM encodes key as a PKIX "PUBLIC KEY" block.
func EncodePublicKeyPEM(key *rsa.PublicKey) ([]byte, error) {
	der, err := x509.MarshalPKIXPublicKey(key)
	if err != nil {
		return nil, fmt.Errorf("encoding the public key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), nil
}

// DecodePrivateKeyPEM reads an RSA private key in PKCS#1 or PKCS#8 PEM.
func DecodePrivateKeyPEM(data []byte) (*rsa.PrivateKey, error) {
	block, _ := pem.Decode(data)
	if block == nil {
		return nil, errors.New("no PEM block in private key data")
	}
	var key *rsa.PrivateKey
	switch block.Type {
	case "RSA PRIVATE KEY":
		k, err := x509.ParsePKCS1PrivateKey(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("parsing PKCS#1 private key: %w", err)
		}
		key = k
	case "PRIVATE KEY":
		k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("parsing PKCS#8 private key: %w", err)
		}
		rk, ok := k.(*rsa.PrivateKey)
		if !ok {
			return nil, fmt.Errorf("private key is %T, want RSA", k)
		}
		key = rk
	default:
		return nil, fmt.Errorf("unexpected PEM block %q for a private key", block.Type)
	}
	if key.N.BitLen() < MinKeyBits {
		return nil, fmt.Errorf("private key has %d bits, at least %d are required", key.N.BitLen(), MinKeyBits)
	}
	return key, nil
}

// DecodePublicKeyPEM reads an RSA public key in PKIX or PKCS#1 PEM.
func DecodePublicKeyPEM(data []byte) (*rsa.PublicKey, error) {
	block, _ := pem.Decode(data)
	if block == nil {
		return nil, errors.New("no PEM block in public key data")
	}
	var key *rsa.PublicKey
	switch block.Type {
	case "PUBLIC KEY":
		k, err := x509.ParsePKIXPublicKey(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("parsing PKIX public key: %w", err)
		}
		rk, ok := k.(*rsa.PublicKey)
		if !ok {
			return nil, fmt.Errorf("public key is %T, want RSA", k)
		}
		key = rk
	case "RSA PUBLIC KEY":
		k, err := x509.ParsePKCS1PublicKey(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("parsing PKCS#1 public key: %w", err)
		}
		key = k
	default:
		return nil, fmt.Errorf("unexpected PEM block %q for a public key", block.Type)
	}
	if key.N.BitLen() < MinKeyBits {
		return nil, fmt.Errorf("public key has %d bits, at least %d are required", key.N.BitLen(), MinKeyBits)
	}
	return key, nil
}

// KeySet is what a signing key Secret holds.
type KeySet struct {
	// Private is nil when only the public keys were read.
	Private  *rsa.PrivateKey
	Current  *rsa.PublicKey
	Previous *rsa.PublicKey
	// RotatedAt is when Current replaced Previous; zero if never rotated.
	RotatedAt time.Time
}

// TrustedKeys returns the keys a validator accepts at now: the current key and,
// until window has passed since the rotation, the previous one.
func (ks *KeySet) TrustedKeys(now time.Time, window time.Duration) []*rsa.PublicKey {
	keys := []*rsa.PublicKey{ks.Current}
	if ks.Previous != nil && !ks.RotatedAt.IsZero() && now.Before(ks.RotatedAt.Add(window)) {
		keys = append(keys, ks.Previous)
	}
	return keys
}

// KeySetFromSecret parses a signing key Secret. With wantPrivate false it
// reads the public keys only, which is all a validator needs.
func KeySetFromSecret(s *corev1.Secret, wantPrivate bool) (*KeySet, error) {
	data := s.Data
	if _, ok := data[SecretRotatedAt]; !ok && s.Annotations[AnnRotatedAt] != "" {
		data = maps.Clone(s.Data)
		data[SecretRotatedAt] = []byte(s.Annotations[AnnRotatedAt])
	}
	return KeySetFromData(data, wantPrivate, "secret "+s.Namespace+"/"+s.Name)
}

// KeySetFromDir reads the files of a mounted signing key Secret (id_rsa.pub,
// and id_rsa.pub.previous with rotated-at after a rotation; id_rsa if wantPrivate).
func KeySetFromDir(dir string, wantPrivate bool) (*KeySet, error) {
	data := map[string][]byte{}
	for _, k := range []string{SecretPrivateKey, SecretPublicKey, SecretPreviousPublicKey, SecretRotatedAt} {
		if k == SecretPrivateKey && !wantPrivate {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, k))
		if err == nil {
			data[k] = b
		} else if !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("reading %s: %w", filepath.Join(dir, k), err)
		}
	}
	return KeySetFromData(data, wantPrivate, "directory "+dir)
}

// KeySetFromData parses the key material; where names its origin in errors.
func KeySetFromData(data map[string][]byte, wantPrivate bool, where string) (*KeySet, error) {
	ks := &KeySet{}
	if wantPrivate {
		k, err := DecodePrivateKeyPEM(data[SecretPrivateKey])
		if err != nil {
			return nil, fmt.Errorf("%s key %s: %w", where, SecretPrivateKey, err)
		}
		ks.Private = k
	}
	pub, err := DecodePublicKeyPEM(data[SecretPublicKey])
	if err != nil {
		return nil, fmt.Errorf("%s key %s: %w", where, SecretPublicKey, err)
	}
	ks.Current = pub
	if ks.Private != nil && !ks.Private.PublicKey.Equal(pub) {
		return nil, fmt.Errorf("%s: %s does not belong to %s", where, SecretPublicKey, SecretPrivateKey)
	}
	if prevPEM, ok := data[SecretPreviousPublicKey]; ok && len(prevPEM) > 0 {
		prev, err := DecodePublicKeyPEM(prevPEM)
		if err != nil {
			return nil, fmt.Errorf("%s key %s: %w", where, SecretPreviousPublicKey, err)
		}
		ks.Previous = prev
		// Without a rotation time the previous key would be trusted forever; refuse.
		at, err := time.Parse(time.RFC3339, strings.TrimSpace(string(data[SecretRotatedAt])))
		if err != nil {
			return nil, fmt.Errorf("%s key %s: %w", where, SecretRotatedAt, err)
		}
		ks.RotatedAt = at
	}
	return ks, nil
}

// NewSigningKeySecret builds the Secret that holds key.
func NewSigningKeySecret(namespace, name string, key *rsa.PrivateKey) (*corev1.Secret, error) {
	pub, err := EncodePublicKeyPEM(&key.PublicKey)
	if err != nil {
		return nil, err
	}
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: namespace,
			Name:      name,
			Labels:    map[string]string{"app.kubernetes.io/managed-by": "kubefill-apiserver", "app.kubernetes.io/component": "token-signing-key"},
		},
		Type: corev1.SecretTypeOpaque,
		Data: map[string][]byte{
			SecretPrivateKey: EncodePrivateKeyPEM(key),
			SecretPublicKey:  pub,
		},
	}, nil
}

// RotateSecret returns a copy of s where newKey is current and the old current
// public key is kept as previous, stamped with now.
func RotateSecret(s *corev1.Secret, newKey *rsa.PrivateKey, now time.Time) (*corev1.Secret, error) {
	if _, err := DecodePublicKeyPEM(s.Data[SecretPublicKey]); err != nil {
		return nil, fmt.Errorf("current public key of secret %s/%s: %w", s.Namespace, s.Name, err)
	}
	pub, err := EncodePublicKeyPEM(&newKey.PublicKey)
	if err != nil {
		return nil, err
	}
	out := s.DeepCopy()
	if out.Annotations == nil {
		out.Annotations = map[string]string{}
	}
	out.Data[SecretPreviousPublicKey] = s.Data[SecretPublicKey]
	out.Data[SecretPublicKey] = pub
	out.Data[SecretPrivateKey] = EncodePrivateKeyPEM(newKey)
	stamp := now.UTC().Format(time.RFC3339)
	out.Annotations[AnnRotatedAt] = stamp
	out.Data[SecretRotatedAt] = []byte(stamp)
	return out, nil
}
