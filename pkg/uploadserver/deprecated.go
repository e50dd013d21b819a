package uploadserver

import (
	"time"

	"github.com/kubefill/kubefill/pkg/pki"
)

// The upload-server CA moved to pkg/pki; these remain while pkg/populators
// and tests/ still use them here. They go once nothing does.

// CA is a certificate authority kept as PEM.
//
// Deprecated: use pki.CA.
type CA = pki.CA

// NewCA creates a self-signed CA valid for validity.
//
// Deprecated: use pki.NewCA.
func NewCA(commonName string, validity time.Duration) (*CA, error) {
	return pki.NewCA(commonName, validity)
}

// LoadCA reads a CA back from its PEM certificate and key.
//
// Deprecated: use pki.LoadCA.
func LoadCA(certPEM, keyPEM []byte) (*CA, error) { return pki.LoadCA(certPEM, keyPEM) }
