package pki

import (
	"bytes"
	"crypto/x509"
	"fmt"
	"os"
	"sync"
	"time"
)

// PoolReloader is a CA bundle file (a mounted bundle ConfigMap or Secret
// key) as a certificate pool, re-read when it changes, so that a rotated
// CA is trusted without a restart. A bundle that stops parsing keeps the
// previous pool.
type PoolReloader struct {
	file string
	// CheckInterval bounds how often the file is re-read; 1 s if zero.
	CheckInterval time.Duration

	mu      sync.Mutex
	pem     []byte
	pool    *x509.CertPool
	recheck recheck
}

// NewPoolReloader loads file; it fails if it holds no PEM certificate now.
func NewPoolReloader(file string) (*PoolReloader, error) {
	r := &PoolReloader{file: file}
	if _, err := r.reload(); err != nil {
		return nil, err
	}
	r.recheck.last = time.Now()
	return r, nil
}

func (r *PoolReloader) reload() (bool, error) {
	b, err := os.ReadFile(r.file)
	if err != nil {
		return false, fmt.Errorf("reading CA bundle: %w", err)
	}
	if r.pool != nil && bytes.Equal(b, r.pem) {
		return false, nil
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return false, fmt.Errorf("no PEM certificate in the CA bundle %s", r.file)
	}
	r.pem, r.pool = b, pool
	return true, nil
}

// Pool is the bundle's current pool.
func (r *PoolReloader) Pool() *x509.CertPool {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recheck.due(r.CheckInterval, r.reload, "CA bundle changed but cannot be loaded; keeping the previous one", "reloaded CA bundle", "file", r.file)
	return r.pool
}
