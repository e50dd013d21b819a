package token

import (
	"crypto/rsa"
	"sync"
	"time"

	logf "sigs.k8s.io/controller-runtime/pkg/log"
)

// DirKeySource supplies validator keys from a mounted signing key Secret
// (the upload proxy's and the controller's view), re-reading the directory at
// most every Refresh so that a rotation reaches them with the volume update.
type DirKeySource struct {
	Dir string
	// Window is how long after a rotation the previous key stays trusted.
	Window time.Duration
	// Refresh bounds how often the files are re-read; 10 s if zero.
	Refresh time.Duration

	mu      sync.Mutex
	keys    *KeySet
	fetched time.Time
}

// PublicKeys is a PublicKeysFunc.
func (d *DirKeySource) PublicKeys() ([]*rsa.PublicKey, error) {
	refresh := d.Refresh
	if refresh <= 0 {
		refresh = 10 * time.Second
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.keys == nil || time.Since(d.fetched) >= refresh {
		ks, err := KeySetFromDir(d.Dir, false)
		switch {
		case err == nil:
			d.keys, d.fetched = ks, time.Now()
		case d.keys == nil:
			return nil, err
		default:
			// Mid-update of the volume: keep the last good keys, retry next time.
			logf.Log.WithName("token").Error(err, "re-reading signing keys, using cached keys", "dir", d.Dir)
		}
	}
	return d.keys.TrustedKeys(time.Now(), d.Window), nil
}
