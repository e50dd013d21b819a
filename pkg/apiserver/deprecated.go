package apiserver

import (
	"time"

	"github.com/kubefill/kubefill/pkg/pki"
)

// The serving-certificate code moved to pkg/pki; these remain while tests/
// still use them here. They go once nothing does.

// ServingCert is a generated serving certificate and the CA that signed it.
//
// Deprecated: use pki.ServingCert.
type ServingCert = pki.ServingCert

// GenerateServingCert makes a CA and a serving certificate signed by it.
//
// Deprecated: use pki.GenerateServingCert.
func GenerateServingCert(commonName string, hosts []string, validity time.Duration) (*ServingCert, error) {
	return pki.GenerateServingCert(commonName, hosts, validity)
}
