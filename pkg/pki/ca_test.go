package pki

import (
	"crypto/x509"
	"encoding/pem"
	"testing"
	"time"
)

// TestCARoundTrip: a CA kept as PEM (as in its Secret) loads back and still
// signs certificates that verify against the original.
func TestCARoundTrip(t *testing.T) {
	ca, err := NewCA("test-ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	loaded, err := LoadCA(ca.CertPEM, ca.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	if !loaded.Expires().Equal(ca.Expires()) {
		t.Errorf("loaded CA expires %v, want %v", loaded.Expires(), ca.Expires())
	}
	crt, _, err := loaded.Issue("cdi-upload-prime-1.ns.svc", []string{"cdi-upload-prime-1.ns.svc", "10.0.0.7"}, false, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	leaf, roots := parseLeaf(t, crt, ca)
	for _, name := range []string{"cdi-upload-prime-1.ns.svc", "10.0.0.7"} {
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: name, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err == nil {
		t.Error("a serving certificate verified as a client certificate")
	}
	if _, err := LoadCA([]byte("junk"), ca.KeyPEM); err == nil {
		t.Error("LoadCA accepted a certificate that is not PEM")
	}
}

// TestIssueWith: organisations (Kubernetes groups) and both usages at once.
func TestIssueWith(t *testing.T) {
	ca, err := NewCA("test-ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	crt, _, err := ca.IssueWith(LeafOptions{
		CommonName: "admin", Organizations: []string{"system:masters"}, Hosts: []string{"localhost", "127.0.0.1"},
		Usages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, Validity: time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	leaf, roots := parseLeaf(t, crt, ca)
	if leaf.Subject.CommonName != "admin" || len(leaf.Subject.Organization) != 1 || leaf.Subject.Organization[0] != "system:masters" {
		t.Fatalf("subject %v", leaf.Subject)
	}
	for _, u := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: "127.0.0.1", KeyUsages: []x509.ExtKeyUsage{u}}); err != nil {
			t.Errorf("usage %v: %v", u, err)
		}
	}
}

// parseLeaf parses a PEM certificate and returns it with a pool holding ca.
func parseLeaf(t *testing.T, certPEM []byte, ca *CA) (*x509.Certificate, *x509.CertPool) {
	t.Helper()
	blk, _ := pem.Decode(certPEM)
	if blk == nil {
		t.Fatal("certificate is not PEM")
	}
	leaf, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.CertPEM)
	return leaf, roots
}
