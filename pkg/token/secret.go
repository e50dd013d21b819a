package token

import (
	"context"
	"crypto/rsa"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
)

// EnsureSigningKeySecret returns the signing keys from namespace/name, creating
// the Secret with a fresh key if it does not exist. Replicas that start at once
// race on Create: the loser gets AlreadyExists and reads the winner's Secret,
// so all replicas end up with the same key.
func EnsureSigningKeySecret(ctx context.Context, c client.Client, namespace, name string) (*KeySet, error) {
	key := types.NamespacedName{Namespace: namespace, Name: name}
	var s corev1.Secret
	err := c.Get(ctx, key, &s)
	if err == nil {
		return KeySetFromSecret(&s, true)
	}
	if !apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("reading signing key secret %s: %w", key, err)
	}
	pk, err := GenerateKey()
	if err != nil {
		return nil, err
	}
	ns, err := NewSigningKeySecret(namespace, name, pk)
	if err != nil {
		return nil, err
	}
	if err := c.Create(ctx, ns); err != nil {
		if !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("creating signing key secret %s: %w", key, err)
		}
		if err := c.Get(ctx, key, &s); err != nil {
			return nil, fmt.Errorf("re-reading signing key secret %s after losing the create race: %w", key, err)
		}
		return KeySetFromSecret(&s, true)
	}
	logf.FromContext(ctx).Info("created token signing key secret", "secret", key.String(), "kid", KeyID(&pk.PublicKey))
	return KeySetFromSecret(ns, true)
}

// ErrRotationTooSoon is returned when the previous key is still trusted: a
// second rotation then would invalidate tokens signed with it early.
var ErrRotationTooSoon = errors.New("previous signing key is still within its trust window")

// RotateSigningKey replaces the signing key in namespace/name with a new one and
// keeps the old public key as previous. It refuses while the previous key of an
// earlier rotation is still trusted (window after that rotation), unless force.
func RotateSigningKey(ctx context.Context, c client.Client, namespace, name string, window time.Duration, force bool) (*KeySet, error) {
	key := types.NamespacedName{Namespace: namespace, Name: name}
	pk, err := GenerateKey()
	if err != nil {
		return nil, err
	}
	var out *KeySet
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var s corev1.Secret
		if err := c.Get(ctx, key, &s); err != nil {
			return fmt.Errorf("reading signing key secret %s: %w", key, err)
		}
		cur, err := KeySetFromSecret(&s, false)
		if err != nil {
			return err
		}
		now := time.Now()
		if !force && cur.Previous != nil && now.Before(cur.RotatedAt.Add(window)) {
			return fmt.Errorf("%w (rotated at %s, window %s)", ErrRotationTooSoon, cur.RotatedAt.Format(time.RFC3339), window)
		}
		ns, err := RotateSecret(&s, pk, now)
		if err != nil {
			return err
		}
		if err := c.Update(ctx, ns); err != nil {
			return err
		}
		out, err = KeySetFromSecret(ns, true)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("rotating signing key secret %s: %w", key, err)
	}
	return out, nil
}

// RotateIfOlder rotates the key in namespace/name when the current key is at
// least maxAge old (counted from the last rotation, or from the Secret's
// creation). It reports whether it rotated. Replicas may all call it: the
// first rotation wins and the others find the key fresh, or get
// ErrRotationTooSoon inside the window, which is not an error here.
func RotateIfOlder(ctx context.Context, c client.Client, namespace, name string, maxAge, window time.Duration) (bool, error) {
	var s corev1.Secret
	if err := c.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, &s); err != nil {
		return false, fmt.Errorf("reading signing key secret %s/%s: %w", namespace, name, err)
	}
	ks, err := KeySetFromSecret(&s, false)
	if err != nil {
		return false, err
	}
	born := s.CreationTimestamp.Time
	if !ks.RotatedAt.IsZero() {
		born = ks.RotatedAt
	}
	if time.Since(born) < maxAge {
		return false, nil
	}
	rotated, err := RotateSigningKey(ctx, c, namespace, name, window, false)
	if errors.Is(err, ErrRotationTooSoon) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	logf.FromContext(ctx).Info("rotated token signing key", "secret", namespace+"/"+name, "kid", KeyID(rotated.Current), "previousKid", KeyID(rotated.Previous))
	return true, nil
}

// SecretKeySource keeps the signing keys of one Secret in memory and re-reads
// them at most every refresh, so that a rotation done by another replica is
// picked up. It supplies both a Generator's and a Validator's key functions.
type SecretKeySource struct {
	Client    client.Client
	Namespace string
	Name      string
	// Refresh is how old the cached keys may get; 30 s if zero.
	Refresh time.Duration
	// Window is how long after a rotation the previous key stays trusted.
	Window time.Duration
	// PublicOnly reads only the public keys (for validators such as the upload proxy).
	PublicOnly bool

	mu      sync.Mutex
	keys    *KeySet
	fetched time.Time
}

// NewSecretKeySource starts from keys already loaded (e.g. by EnsureSigningKeySecret).
func NewSecretKeySource(c client.Client, namespace, name string, initial *KeySet, window time.Duration) *SecretKeySource {
	return &SecretKeySource{Client: c, Namespace: namespace, Name: name, Window: window, keys: initial, fetched: time.Now()}
}

func (s *SecretKeySource) current() (*KeySet, error) {
	refresh := s.Refresh
	if refresh <= 0 {
		refresh = 30 * time.Second
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.keys != nil && time.Since(s.fetched) < refresh {
		return s.keys, nil
	}
	var sec corev1.Secret
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := s.Client.Get(ctx, types.NamespacedName{Namespace: s.Namespace, Name: s.Name}, &sec)
	if err == nil {
		ks, perr := KeySetFromSecret(&sec, !s.PublicOnly)
		if perr == nil {
			s.keys, s.fetched = ks, time.Now()
			return ks, nil
		}
		err = perr
	}
	if s.keys != nil {
		// Keep serving with the last good keys; a transient API error must not
		// stop uploads. The next call retries.
		logf.Log.WithName("token").Error(err, "refreshing signing keys, using cached keys", "secret", s.Namespace+"/"+s.Name)
		return s.keys, nil
	}
	return nil, fmt.Errorf("loading signing keys from secret %s/%s: %w", s.Namespace, s.Name, err)
}

// PrivateKey is a PrivateKeyFunc.
func (s *SecretKeySource) PrivateKey() (*rsa.PrivateKey, error) {
	ks, err := s.current()
	if err != nil {
		return nil, err
	}
	if ks.Private == nil {
		return nil, fmt.Errorf("secret %s/%s was read without its private key", s.Namespace, s.Name)
	}
	return ks.Private, nil
}

// PublicKeys is a PublicKeysFunc: the current key and, within the window, the previous one.
func (s *SecretKeySource) PublicKeys() ([]*rsa.PublicKey, error) {
	ks, err := s.current()
	if err != nil {
		return nil, err
	}
	return ks.TrustedKeys(time.Now(), s.Window), nil
}
