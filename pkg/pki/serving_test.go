package pki

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestCertReloaderKeepsOldPairOnBadFiles(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	write := func(sc *ServingCert) {
		if err := os.WriteFile(certFile, sc.CertPEM, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(keyFile, sc.KeyPEM, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	one, err := GenerateServingCert("a", []string{"127.0.0.1", "svc.ns.svc"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	two, _ := GenerateServingCert("b", []string{"127.0.0.1"}, time.Hour)
	write(one)
	r, err := NewCertReloader(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	r.CheckInterval = time.Nanosecond
	leafCN := func() string {
		c, err := r.GetCertificate(nil)
		if err != nil {
			t.Fatal(err)
		}
		leaf, _ := x509.ParseCertificate(c.Certificate[0])
		return leaf.Subject.CommonName
	}
	if leafCN() != "a" {
		t.Fatal("initial certificate")
	}
	// Half-way through an update: new certificate, old key. Keep serving "a".
	if err := os.WriteFile(certFile, two.CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if leafCN() != "a" {
		t.Fatal("mismatched pair was loaded")
	}
	write(two)
	if leafCN() != "b" {
		t.Fatal("complete new pair not loaded")
	}
	leaf, _ := x509.ParseCertificate(mustPEM(t, one.CertPEM))
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(one.CAPEM)
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: "svc.ns.svc"}); err != nil {
		t.Fatalf("generated certificate does not verify against its CA: %v", err)
	}
	if _, err := NewCertReloader(certFile, filepath.Join(dir, "missing.key")); err == nil {
		t.Fatal("missing key accepted at start")
	}
}

func mustPEM(t *testing.T, data []byte) []byte {
	t.Helper()
	b, _ := pem.Decode(data)
	if b == nil {
		t.Fatal("no PEM")
	}
	return b.Bytes
}

// TestServerTLS: a generated certificate verifies against the CA written to
// GeneratedCAFile for every generated host; certificate files are served
// through a reloader; neither asks for client certificates.
func TestServerTLS(t *testing.T) {
	dir := t.TempDir()
	caFile := filepath.Join(dir, "ca.crt")
	cfg, err := ServerTLS(ServingOptions{GeneratedName: "kubefill-test", GeneratedHosts: []string{"svc.ns.svc", "127.0.0.1", ""}, GeneratedCAFile: caFile})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.MinVersion != tls.VersionTLS12 || cfg.ClientAuth != tls.NoClientCert || len(cfg.Certificates) != 1 || cfg.GetCertificate != nil {
		t.Fatalf("generated config: min %x clientAuth %v, %d certificates", cfg.MinVersion, cfg.ClientAuth, len(cfg.Certificates))
	}
	caPEM, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		t.Fatal("GeneratedCAFile holds no certificate")
	}
	leaf, err := x509.ParseCertificate(cfg.Certificates[0].Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	if leaf.Subject.CommonName != "kubefill-test" || len(leaf.DNSNames) != 1 || len(leaf.IPAddresses) != 1 || !leaf.IPAddresses[0].Equal(net.ParseIP("127.0.0.1")) {
		t.Errorf("leaf %q DNS %v IP %v", leaf.Subject.CommonName, leaf.DNSNames, leaf.IPAddresses)
	}
	for _, host := range []string{"svc.ns.svc", "127.0.0.1"} {
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: host}); err != nil {
			t.Errorf("%s: %v", host, err)
		}
	}

	sc, err := GenerateServingCert("from-files", []string{"127.0.0.1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if err := os.WriteFile(certFile, sc.CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, sc.KeyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err = ServerTLS(ServingOptions{CertFile: certFile, KeyFile: keyFile, GeneratedCAFile: filepath.Join(dir, "unused.crt")})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.GetCertificate == nil || len(cfg.Certificates) != 0 || cfg.ClientAuth != tls.NoClientCert {
		t.Fatal("certificate files are not served through a reloader")
	}
	c, err := cfg.GetCertificate(nil)
	if err != nil {
		t.Fatal(err)
	}
	if l, _ := x509.ParseCertificate(c.Certificate[0]); l.Subject.CommonName != "from-files" {
		t.Errorf("served %q", l.Subject.CommonName)
	}
	if _, err := os.Stat(filepath.Join(dir, "unused.crt")); !os.IsNotExist(err) {
		t.Error("a CA file was written for certificate files")
	}
	if _, err := ServerTLS(ServingOptions{CertFile: certFile}); err == nil {
		t.Error("a certificate file without its key was accepted")
	}
}
