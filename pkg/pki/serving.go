package pki

import (
	"bytes"
	"crypto/tls"
	"fmt"
	"os"
	"sync"
	"time"
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
	ca, err := NewCA(commonName+"-ca@"+fmt.Sprint(time.Now().Unix()), validity)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, h := range hosts {
		if h != "" {
			names = append(names, h)
		}
	}
	crt, key, err := ca.Issue(commonName, names, false, validity)
	if err != nil {
		return nil, err
	}
	return &ServingCert{CertPEM: crt, KeyPEM: key, CAPEM: ca.CertPEM}, nil
}

// CertReloader serves a certificate from files and picks up new contents
// when they change (a Secret volume update, a cert-manager renewal). A
// half-written or mismatched pair is ignored and the previous one is kept.
type CertReloader struct {
	certFile, keyFile string
	// CheckInterval bounds how often the files are re-read; 1 s if zero.
	CheckInterval time.Duration

	mu      sync.Mutex
	cert    *tls.Certificate
	certPEM []byte
	keyPEM  []byte
	recheck recheck
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
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recheck.due(r.CheckInterval, r.reload, "serving certificate files changed but cannot be loaded; keeping the previous certificate", "reloaded serving certificate", "cert", r.certFile)
	return r.cert, nil
}

// ServingOptions say where a server's certificate comes from.
type ServingOptions struct {
	// CertFile and KeyFile serve a certificate from files, reloaded when they
	// change. If both are empty a certificate is generated for GeneratedHosts.
	CertFile, KeyFile string
	// GeneratedName is the generated certificate's common name.
	GeneratedName  string
	GeneratedHosts []string
	// GeneratedCAFile, if set, receives the CA of a generated certificate.
	GeneratedCAFile string
}

// ServerTLS returns a server TLS configuration (TLS 1.2 or later) serving
// the certificate opts describe. Client certificates are left to the caller.
func ServerTLS(opts ServingOptions) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if opts.CertFile != "" || opts.KeyFile != "" {
		r, err := NewCertReloader(opts.CertFile, opts.KeyFile)
		if err != nil {
			return nil, err
		}
		cfg.GetCertificate = r.GetCertificate
		return cfg, nil
	}
	sc, err := GenerateServingCert(opts.GeneratedName, opts.GeneratedHosts, 365*24*time.Hour)
	if err != nil {
		return nil, err
	}
	pair, err := tls.X509KeyPair(sc.CertPEM, sc.KeyPEM)
	if err != nil {
		return nil, err
	}
	cfg.Certificates = []tls.Certificate{pair}
	if opts.GeneratedCAFile != "" {
		if err := os.WriteFile(opts.GeneratedCAFile, sc.CAPEM, 0o644); err != nil {
			return nil, fmt.Errorf("writing generated CA to %s: %w", opts.GeneratedCAFile, err)
		}
	}
	return cfg, nil
}
