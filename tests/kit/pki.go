package kit

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"testing"
	"time"

	"github.com/kubefill/kubefill/pkg/pki"
)

// CA is the tests' certificate authority: a pki.CA that also issues what
// pki does not, certificates naming organisations (Kubernetes groups) and
// certificates for both server and client use.
type CA struct {
	*pki.CA
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

// NewCA creates a CA valid for validity.
func NewCA(commonName string, validity time.Duration) (*CA, error) {
	ca, err := pki.NewCA(commonName, validity)
	if err != nil {
		return nil, err
	}
	cb, _ := pem.Decode(ca.CertPEM)
	kb, _ := pem.Decode(ca.KeyPEM)
	if cb == nil || kb == nil {
		return nil, errors.New("pki.NewCA returned no PEM")
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, err
	}
	key, err := x509.ParseECPrivateKey(kb.Bytes)
	if err != nil {
		return nil, err
	}
	return &CA{CA: ca, cert: cert, key: key}, nil
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

// Issue signs a leaf certificate and returns it and its key as PEM. A plain
// server or client certificate comes from pki's own Issue.
func (ca *CA) Issue(l Leaf) (certPEM, keyPEM []byte, err error) {
	validity := l.Validity
	if validity == 0 {
		validity = 365 * 24 * time.Hour
	}
	if len(l.Organization) == 0 && l.Server != l.Client {
		return ca.CA.Issue(l.CommonName, l.Hosts, l.Client, validity)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generating key for %s: %w", l.CommonName, err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: l.CommonName, Organization: l.Organization},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(validity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
	}
	if l.Server {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
	}
	if l.Client {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageClientAuth)
	}
	for _, h := range l.Hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, nil, fmt.Errorf("signing certificate for %s: %w", l.CommonName, err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), nil
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
