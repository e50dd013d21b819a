package apiserver

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"sync"
	"time"

	logf "sigs.k8s.io/controller-runtime/pkg/log"
)

// ServingCert is a generated serving certificate and the CA that signed it.
type ServingCert struct {
	CertPEM []byte
	KeyPEM  []byte
	CAPEM   []byte
}

// GenerateServingCert makes a CA and a serving certificate signed by it,
// valid for hosts (DNS names or IP addresses) for validity.
func GenerateServingCert(commonName string, hosts []string, validity time.Duration) (*ServingCert, error) {
	now := time.Now().Add(-time.Minute)
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating CA key: %w", err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          randomSerial(),
		Subject:               pkix.Name{CommonName: commonName + "-ca@" + fmt.Sprint(now.Unix())},
		NotBefore:             now,
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("signing CA certificate: %w", err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating serving key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: randomSerial(),
		Subject:      pkix.Name{CommonName: commonName},
		NotBefore:    now,
		NotAfter:     now.Add(validity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("signing serving certificate: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	return &ServingCert{
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
		CAPEM:   pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
	}, nil
}

func randomSerial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(fmt.Sprintf("crypto/rand failed: %v", err))
	}
	return n
}

// CertReloader serves a certificate from files and picks up new contents
// when they change (a Secret volume update, a cert-manager renewal). A
// half-written or mismatched pair is ignored and the previous one is kept.
type CertReloader struct {
	certFile, keyFile string
	// CheckInterval bounds how often the files are re-read; 1 s if zero.
	CheckInterval time.Duration

	mu        sync.Mutex
	cert      *tls.Certificate
	certPEM   []byte
	keyPEM    []byte
	lastCheck time.Time
}

// NewCertReloader loads certFile and keyFile; it fails if they do not form a pair now.
func NewCertReloader(certFile, keyFile string) (*CertReloader, error) {
	r := &CertReloader{certFile: certFile, keyFile: keyFile}
	if _, err := r.reload(); err != nil {
		return nil, err
	}
	return r, nil
}

func (r *CertReloader) reload() (bool, error) {
	certPEM, err := os.ReadFile(r.certFile)
	if err != nil {
		return false, fmt.Errorf("reading serving certificate: %w", err)
	}
	keyPEM, err := os.ReadFile(r.keyFile)
	if err != nil {
		return false, fmt.Errorf("reading serving key: %w", err)
	}
	if r.cert != nil && bytes.Equal(certPEM, r.certPEM) && bytes.Equal(keyPEM, r.keyPEM) {
		return false, nil
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return false, fmt.Errorf("loading serving certificate %s and key %s: %w", r.certFile, r.keyFile, err)
	}
	r.cert, r.certPEM, r.keyPEM = &pair, certPEM, keyPEM
	return true, nil
}

// GetCertificate is a tls.Config.GetCertificate callback.
func (r *CertReloader) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	interval := r.CheckInterval
	if interval <= 0 {
		interval = time.Second
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if time.Since(r.lastCheck) >= interval {
		r.lastCheck = time.Now()
		changed, err := r.reload()
		switch {
		case err != nil:
			logf.Log.WithName("apiserver").Error(err, "serving certificate files changed but cannot be loaded; keeping the previous certificate")
		case changed:
			logf.Log.WithName("apiserver").Info("reloaded serving certificate", "cert", r.certFile)
		}
	}
	return r.cert, nil
}
