// Package pki is Kubefill's one place for certificates: CAs kept as PEM,
// issuing serving and client certificates, serving certificates generated
// at start, reloading certificate files that change, and TLS configurations.
// The API server, the upload proxy, the upload server, the populators and
// the tests all use it.
package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"time"
)

// CA is a certificate authority kept as PEM: the upload-server CA that signs
// each upload pod's serving certificate, or a client CA in tests.
type CA struct {
	CertPEM, KeyPEM []byte
	cert            *x509.Certificate
	key             *ecdsa.PrivateKey
}

// NewCA creates a self-signed CA valid for validity.
func NewCA(commonName string, validity time.Duration) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating CA key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: commonName},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("signing CA certificate: %w", err)
	}
	return caFrom(der, key)
}

// LoadCA reads a CA back from its PEM certificate and key.
func LoadCA(certPEM, keyPEM []byte) (*CA, error) {
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return nil, errors.New("CA certificate or key is not PEM")
	}
	key, err := x509.ParseECPrivateKey(kb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parsing CA key: %w", err)
	}
	return caFrom(cb.Bytes, key)
}

func caFrom(der []byte, key *ecdsa.PrivateKey) (*CA, error) {
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parsing CA certificate: %w", err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	return &CA{
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}),
		cert:    cert, key: key,
	}, nil
}

// Expires is when the CA certificate stops being valid.
func (ca *CA) Expires() time.Time { return ca.cert.NotAfter }

// Issue signs a leaf certificate. Hosts that parse as IP addresses become IP
// SANs, the rest DNS SANs. client selects client-auth usage instead of
// server-auth. It returns the certificate and key as PEM.
func (ca *CA) Issue(commonName string, hosts []string, client bool, validity time.Duration) (certPEM, keyPEM []byte, err error) {
	usage := x509.ExtKeyUsageServerAuth
	if client {
		usage = x509.ExtKeyUsageClientAuth
	}
	return ca.IssueWith(LeafOptions{CommonName: commonName, Hosts: hosts, Usages: []x509.ExtKeyUsage{usage}, Validity: validity})
}

// LeafOptions say what certificate IssueWith makes.
type LeafOptions struct {
	CommonName string
	// Organizations become the subject's O: a client certificate's
	// Kubernetes groups (system:masters, say).
	Organizations []string
	// Hosts that parse as IP addresses become IP SANs, the rest DNS SANs.
	Hosts []string
	// Usages are the extended key usages, for example both server and
	// client auth; none leaves the certificate unrestricted.
	Usages []x509.ExtKeyUsage
	// Validity is how long from now the certificate is valid (it is
	// back-dated by an hour for clock skew).
	Validity time.Duration
}

// IssueWith signs the leaf certificate o describes and returns it and its
// key as PEM.
func (ca *CA) IssueWith(o LeafOptions) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generating key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: o.CommonName, Organization: o.Organizations},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(o.Validity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  o.Usages,
	}
	for _, h := range o.Hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, nil, fmt.Errorf("signing certificate for %s: %w", o.CommonName, err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
	return n
}
