package uploadproxy

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kubefill/kubefill/pkg/pki"
)

// testCA is a throw-away certificate authority for loopback TLS tests.
type testCA struct {
	ca  *pki.CA
	pem []byte
}

func newTestCA(t *testing.T, cn string) *testCA {
	t.Helper()
	ca, err := pki.NewCA(cn, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{ca: ca, pem: ca.CertPEM}
}

func (ca *testCA) pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AppendCertsFromPEM(ca.pem)
	return p
}

// issue returns a leaf key pair as PEM, for server or client use.
func (ca *testCA) issue(t *testing.T, cn string, hosts []string, client bool) (certPEM, keyPEM []byte) {
	t.Helper()
	certPEM, keyPEM, err := ca.ca.Issue(cn, hosts, client, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return certPEM, keyPEM
}

func (ca *testCA) tlsCert(t *testing.T, cn string, hosts []string, client bool) tls.Certificate {
	t.Helper()
	c, k := ca.issue(t, cn, hosts, client)
	pair, err := tls.X509KeyPair(c, k)
	if err != nil {
		t.Fatal(err)
	}
	return pair
}

func writeTestFile(t *testing.T, dir, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
