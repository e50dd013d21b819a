package kit

import (
	"crypto/tls"
	"crypto/x509"
	"testing"
	"time"

	"github.com/kubefill/kubefill/pkg/pki"
)

// CA is the tests' certificate authority: a pki.CA issuing from a Leaf,
// which also names organisations (Kubernetes groups) and both server and
// client use.
type CA struct {
	*pki.CA
}

// NewCA creates a CA valid for validity.
func NewCA(commonName string, validity time.Duration) (*CA, error) {
	ca, err := pki.NewCA(commonName, validity)
	if err != nil {
		return nil, err
	}
	return &CA{CA: ca}, nil
}

// TestCA is NewCA for a test, valid for a day.
func TestCA(t testing.TB, commonName string) *CA {
	t.Helper()
	ca, err := NewCA(commonName, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// Leaf says what certificate Issue makes.
type Leaf struct {
	CommonName string
	// Organization names the user's groups in a client certificate.
	Organization []string
	// Hosts become IP SANs when they parse as IP addresses, else DNS SANs.
	Hosts          []string
	Server, Client bool
	// Validity defaults to a year.
	Validity time.Duration
}

// Issue signs a leaf certificate and returns it and its key as PEM.
func (ca *CA) Issue(l Leaf) (certPEM, keyPEM []byte, err error) {
	o := pki.LeafOptions{CommonName: l.CommonName, Organizations: l.Organization, Hosts: l.Hosts, Validity: l.Validity}
	if o.Validity == 0 {
		o.Validity = 365 * 24 * time.Hour
	}
	if l.Server {
		o.Usages = append(o.Usages, x509.ExtKeyUsageServerAuth)
	}
	if l.Client {
		o.Usages = append(o.Usages, x509.ExtKeyUsageClientAuth)
	}
	return ca.IssueWith(o)
}

// ClientCert issues a client certificate for cn in groups orgs and returns
// it as a tls.Certificate and as PEM.
func (ca *CA) ClientCert(t testing.TB, cn string, orgs ...string) (pair tls.Certificate, certPEM, keyPEM []byte) {
	t.Helper()
	certPEM, keyPEM, err := ca.Issue(Leaf{CommonName: cn, Organization: orgs, Client: true, Validity: 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	pair, err = tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return pair, certPEM, keyPEM
}
