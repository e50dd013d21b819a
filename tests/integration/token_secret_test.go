package integration

import (
	"context"
	"crypto/rsa"
	"errors"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kubefill/kubefill/pkg/token"
)

// Replicas starting at once must agree on one signing key: the Create race
// has one winner and the others re-read its Secret.
func TestTokenSigningKeySecretCreateRace(t *testing.T) {
	ns := newNamespace(t)
	ctx := context.Background()
	const replicas = 6
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		kids = map[string]int{}
		errs []error
	)
	start := make(chan struct{})
	for range replicas {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			ks, err := token.EnsureSigningKeySecret(ctx, k8sClient, ns, token.DefaultSigningKeySecretName)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			kids[token.KeyID(&ks.Private.PublicKey)]++
		}()
	}
	began := time.Now()
	close(start)
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("EnsureSigningKeySecret errors: %v", errs)
	}
	if len(kids) != 1 {
		t.Fatalf("replicas ended with %d different keys: %v", len(kids), kids)
	}
	var s corev1.Secret
	if err := k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: token.DefaultSigningKeySecretName}, &s); err != nil {
		t.Fatal(err)
	}
	stored, err := token.KeySetFromSecret(&s, true)
	if err != nil {
		t.Fatal(err)
	}
	for kid := range kids {
		if kid != token.KeyID(stored.Current) {
			t.Fatalf("replicas use key %s, the Secret holds %s", kid, token.KeyID(stored.Current))
		}
	}
	t.Logf("%d concurrent replicas agreed on key %s in %s", replicas, token.KeyID(stored.Current), time.Since(began).Round(time.Millisecond))
}

// After a rotation, tokens signed with the old key stay valid for the window
// (a validator following the Secret accepts them) and new tokens use the new key.
func TestTokenSigningKeyRotation(t *testing.T) {
	ns := newNamespace(t)
	ctx := context.Background()
	name := token.DefaultSigningKeySecretName
	first, err := token.EnsureSigningKeySecret(ctx, k8sClient, ns, name)
	if err != nil {
		t.Fatal(err)
	}
	window := 5*time.Minute + 10*time.Second
	signer := token.NewSecretKeySource(k8sClient, ns, name, first, window)
	signer.Refresh = time.Millisecond
	verifier := &token.SecretKeySource{Client: k8sClient, Namespace: ns, Name: name, Window: window, PublicOnly: true, Refresh: time.Millisecond}
	gen := token.NewDynamicGenerator(token.UploadTokenIssuer, signer.PrivateKey, 5*time.Minute)
	val := token.NewMultiKeyValidator(token.UploadTokenIssuer, verifier.PublicKeys, 10*time.Second)

	before, err := gen.Generate(token.NewUploadPayload(ns, "disk"))
	if err != nil {
		t.Fatal(err)
	}
	rotated, err := token.RotateSigningKey(ctx, k8sClient, ns, name, window, false)
	if err != nil {
		t.Fatalf("rotation: %v", err)
	}
	if rotated.Previous == nil || !rotated.Previous.Equal(first.Current) || rotated.Current.Equal(first.Current) {
		t.Fatal("rotation did not move the old key to previous")
	}
	time.Sleep(5 * time.Millisecond)
	after, err := gen.Generate(token.NewUploadPayload(ns, "disk"))
	if err != nil {
		t.Fatal(err)
	}
	for label, tok := range map[string]string{"before rotation": before, "after rotation": after} {
		if _, err := val.Validate(tok); err != nil {
			t.Fatalf("token %s rejected: %v", label, err)
		}
	}
	// The new token is signed by the new key only.
	if _, err := token.NewValidator(token.UploadTokenIssuer, rotated.Current, 0).Validate(after); err != nil {
		t.Fatalf("token after rotation not signed by the new key: %v", err)
	}
	if _, err := token.NewValidator(token.UploadTokenIssuer, first.Current, 0).Validate(after); err == nil {
		t.Fatal("token after rotation still signed by the old key")
	}
	// A second rotation inside the window would drop the previous key early.
	if _, err := token.RotateSigningKey(ctx, k8sClient, ns, name, window, false); !errors.Is(err, token.ErrRotationTooSoon) {
		t.Fatalf("second rotation within the window: %v", err)
	}
	// Once the window is over, only the current key is trusted.
	keys, err := verifier.PublicKeys()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 2 {
		t.Fatalf("within the window %d keys are trusted, want 2", len(keys))
	}
	late := rotated.TrustedKeys(rotated.RotatedAt.Add(window), window)
	if len(late) != 1 || !late[0].Equal(rotated.Current) {
		t.Fatalf("after the window %d keys trusted", len(late))
	}
	lateVal := token.NewMultiKeyValidator(token.UploadTokenIssuer, func() ([]*rsa.PublicKey, error) { return late, nil }, 10*time.Second)
	if _, err := lateVal.Validate(before); !errors.Is(err, token.ErrSignature) {
		t.Fatalf("old token after the window: %v", err)
	}
}

// Periodic rotation from several replicas at once rotates exactly once per
// window: the guard against dropping a still-trusted key serialises them.
func TestTokenSigningKeyRotateIfOlderFromReplicas(t *testing.T) {
	ns := newNamespace(t)
	ctx := context.Background()
	name := token.DefaultSigningKeySecretName
	first, err := token.EnsureSigningKeySecret(ctx, k8sClient, ns, name)
	if err != nil {
		t.Fatal(err)
	}
	window := 5*time.Minute + 10*time.Second
	if rotated, err := token.RotateIfOlder(ctx, k8sClient, ns, name, time.Hour, window); err != nil || rotated {
		t.Fatalf("a fresh key was rotated: %v %v", rotated, err)
	}
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		rotated int
		errs    []error
	)
	start := make(chan struct{})
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			ok, err := token.RotateIfOlder(ctx, k8sClient, ns, name, time.Nanosecond, window)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
			}
			if ok {
				rotated++
			}
		}()
	}
	close(start)
	wg.Wait()
	if len(errs) > 0 || rotated != 1 {
		t.Fatalf("4 replicas: %d rotations, errors %v; want exactly 1", rotated, errs)
	}
	var s corev1.Secret
	if err := k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &s); err != nil {
		t.Fatal(err)
	}
	ks, err := token.KeySetFromSecret(&s, true)
	if err != nil {
		t.Fatal(err)
	}
	if !ks.Previous.Equal(first.Current) || ks.Current.Equal(first.Current) {
		t.Fatal("the Secret does not hold the old key as previous and a new current key")
	}
	t.Logf("4 concurrent replicas: 1 rotation, kid %s -> %s", token.KeyID(first.Current), token.KeyID(ks.Current))
}
