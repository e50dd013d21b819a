package token

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestPEMRoundTrip(t *testing.T) {
	a, _ := testKeys(t)
	priv, err := DecodePrivateKeyPEM(EncodePrivateKeyPEM(a))
	if err != nil || !priv.Equal(a) {
		t.Fatalf("PKCS#1 private key round trip: %v", err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(a)
	if err != nil {
		t.Fatal(err)
	}
	priv, err = DecodePrivateKeyPEM(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}))
	if err != nil || !priv.Equal(a) {
		t.Fatalf("PKCS#8 private key: %v", err)
	}
	pubPEM, err := EncodePublicKeyPEM(&a.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(pubPEM), "-----BEGIN PUBLIC KEY-----") {
		t.Fatalf("public key PEM type: %q", strings.SplitN(string(pubPEM), "\n", 2)[0])
	}
	pub, err := DecodePublicKeyPEM(pubPEM)
	if err != nil || !pub.Equal(&a.PublicKey) {
		t.Fatalf("public key round trip: %v", err)
	}
	pub, err = DecodePublicKeyPEM(pem.EncodeToMemory(&pem.Block{Type: "RSA PUBLIC KEY", Bytes: x509.MarshalPKCS1PublicKey(&a.PublicKey)}))
	if err != nil || !pub.Equal(&a.PublicKey) {
		t.Fatalf("PKCS#1 public key: %v", err)
	}

	weak, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := DecodePrivateKeyPEM(EncodePrivateKeyPEM(weak)); err == nil || !strings.Contains(err.Error(), "1024 bits") {
		t.Fatalf("1024-bit private key: %v", err)
	}
	weakPub, _ := EncodePublicKeyPEM(&weak.PublicKey)
	if _, err := DecodePublicKeyPEM(weakPub); err == nil {
		t.Fatal("1024-bit public key accepted")
	}
	for _, bad := range [][]byte{nil, []byte("junk"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte{1}})} {
		if _, err := DecodePrivateKeyPEM(bad); err == nil {
			t.Errorf("private key %q accepted", bad)
		}
		if _, err := DecodePublicKeyPEM(bad); err == nil {
			t.Errorf("public key %q accepted", bad)
		}
	}
}

func TestSecretLayoutAndRotation(t *testing.T) {
	a, b := testKeys(t)
	s, err := NewSigningKeySecret("kubefill", DefaultSigningKeySecretName, a)
	if err != nil {
		t.Fatal(err)
	}
	ks, err := KeySetFromSecret(s, true)
	if err != nil {
		t.Fatal(err)
	}
	if !ks.Private.Equal(a) || !ks.Current.Equal(&a.PublicKey) || ks.Previous != nil {
		t.Fatal("fresh secret does not hold exactly key a")
	}
	if got := ks.TrustedKeys(time.Now(), time.Hour); len(got) != 1 {
		t.Fatalf("fresh secret trusts %d keys", len(got))
	}

	rotatedAt := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	r, err := RotateSecret(s, b, rotatedAt)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := s.Data[SecretPreviousPublicKey]; ok {
		t.Fatal("RotateSecret changed its input")
	}
	ks, err = KeySetFromSecret(r, true)
	if err != nil {
		t.Fatal(err)
	}
	if !ks.Private.Equal(b) || !ks.Current.Equal(&b.PublicKey) || !ks.Previous.Equal(&a.PublicKey) || !ks.RotatedAt.Equal(rotatedAt) {
		t.Fatalf("rotated key set: %+v", ks)
	}
	window := 5 * time.Minute
	if got := ks.TrustedKeys(rotatedAt.Add(window-time.Second), window); len(got) != 2 {
		t.Fatalf("within the window %d keys trusted, want 2", len(got))
	}
	if got := ks.TrustedKeys(rotatedAt.Add(window), window); len(got) != 1 || !got[0].Equal(&b.PublicKey) {
		t.Fatalf("after the window %d keys trusted, want only the current", len(got))
	}

	// Public-only reading works without the private key, as the upload proxy does.
	pubOnly := r.DeepCopy()
	delete(pubOnly.Data, SecretPrivateKey)
	if ks, err := KeySetFromSecret(pubOnly, false); err != nil || ks.Private != nil || ks.Previous == nil {
		t.Fatalf("public-only read: %v", err)
	}
	if _, err := KeySetFromSecret(pubOnly, true); err == nil {
		t.Fatal("private read of a secret without id_rsa succeeded")
	}

	// A public key that does not belong to the private key is refused.
	mixed := s.DeepCopy()
	mixed.Data[SecretPublicKey] = r.Data[SecretPublicKey]
	if _, err := KeySetFromSecret(mixed, true); err == nil || !strings.Contains(err.Error(), "does not belong") {
		t.Fatalf("mismatched key pair: %v", err)
	}
	// A previous key without its rotation time is refused rather than trusted forever.
	noStamp := r.DeepCopy()
	delete(noStamp.Annotations, AnnRotatedAt)
	delete(noStamp.Data, SecretRotatedAt)
	if _, err := KeySetFromSecret(noStamp, false); err == nil {
		t.Fatal("previous key without rotation time accepted")
	}
}

func TestKeyIDStable(t *testing.T) {
	a, b := testKeys(t)
	if KeyID(&a.PublicKey) != KeyID(&a.PublicKey) || KeyID(&a.PublicKey) == KeyID(&b.PublicKey) {
		t.Fatal("KeyID is not a stable per-key identifier")
	}
	if len(KeyID(&a.PublicKey)) != 16 {
		t.Fatalf("KeyID length %d", len(KeyID(&a.PublicKey)))
	}
}

func TestKeySetFromMountedSecretDir(t *testing.T) {
	a, b := testKeys(t)
	s, err := NewSigningKeySecret("ns", "n", a)
	if err != nil {
		t.Fatal(err)
	}
	rotatedAt := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	r, err := RotateSecret(s, b, rotatedAt)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	// A Secret volume holds one file per data key, without the annotations.
	for k, v := range r.Data {
		if err := os.WriteFile(filepath.Join(dir, k), v, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ks, err := KeySetFromDir(dir, false)
	if err != nil {
		t.Fatal(err)
	}
	if ks.Private != nil || !ks.Current.Equal(&b.PublicKey) || !ks.Previous.Equal(&a.PublicKey) || !ks.RotatedAt.Equal(rotatedAt) {
		t.Fatalf("key set from dir: %+v", ks)
	}
	if ks, err := KeySetFromDir(dir, true); err != nil || !ks.Private.Equal(b) {
		t.Fatalf("private key from dir: %v", err)
	}
	if err := os.Remove(filepath.Join(dir, SecretRotatedAt)); err != nil {
		t.Fatal(err)
	}
	if _, err := KeySetFromDir(dir, false); err == nil {
		t.Fatal("previous key without rotated-at accepted")
	}
	if _, err := KeySetFromDir(t.TempDir(), false); err == nil {
		t.Fatal("empty directory accepted")
	}
}

func TestDirKeySourceFollowsRotation(t *testing.T) {
	a, b := testKeys(t)
	s, err := NewSigningKeySecret("ns", "n", a)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write := func(data map[string][]byte) {
		for k, v := range data {
			if err := os.WriteFile(filepath.Join(dir, k), v, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	write(s.Data)
	src := &DirKeySource{Dir: dir, Window: time.Hour, Refresh: time.Nanosecond}
	v := NewMultiKeyValidator(UploadTokenIssuer, src.PublicKeys, 0)
	oldTok, err := NewGenerator(UploadTokenIssuer, a, time.Minute).Generate(NewUploadPayload("ns", "p"))
	if err != nil {
		t.Fatal(err)
	}
	newTok, err := NewGenerator(UploadTokenIssuer, b, time.Minute).Generate(NewUploadPayload("ns", "p"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.Validate(oldTok); err != nil {
		t.Fatalf("before rotation: %v", err)
	}
	if _, err := v.Validate(newTok); err == nil {
		t.Fatal("token of a key not yet in the Secret accepted")
	}
	r, err := RotateSecret(s, b, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	write(r.Data)
	for name, tok := range map[string]string{"old": oldTok, "new": newTok} {
		if _, err := v.Validate(tok); err != nil {
			t.Fatalf("%s token after rotation: %v", name, err)
		}
	}
	// A broken file mid-update keeps the last good keys.
	if err := os.WriteFile(filepath.Join(dir, SecretPublicKey), []byte("partial"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := v.Validate(newTok); err != nil {
		t.Fatalf("during a partial update: %v", err)
	}
}
