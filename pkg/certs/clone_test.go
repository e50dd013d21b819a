package certs

import (
	"crypto/x509"
	"strings"
	"testing"
	"time"
)

func TestDecideCloneClient(t *testing.T) {
	cloneCA, cloneCert := mustCA(t, "clone", 48*time.Hour)
	oldCA, oldCert := mustCA(t, "clone-old", 48*time.Hour)
	proxyCA, _ := mustCA(t, "proxy-client", 48*time.Hour)
	const cn = "src/golden-src/tmp-pvc-u1"
	issue := func(ca interface {
		Issue(string, []string, bool, time.Duration) ([]byte, []byte, error)
	}, name string, client bool, validity time.Duration) *x509.Certificate {
		t.Helper()
		crt, _, err := ca.Issue(name, nil, client, validity)
		if err != nil {
			t.Fatal(err)
		}
		c, err := parseCert(crt)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	good := issue(cloneCA, cn, true, CloneClientValidity)
	fromOld := issue(oldCA, cn, true, CloneClientValidity)
	now := time.Now()
	tests := []struct {
		name    string
		now     time.Time
		cert    *x509.Certificate
		cn      string
		trusted []*x509.Certificate
		renew   bool
		reason  string
	}{
		{"missing", now, nil, cn, []*x509.Certificate{cloneCert}, true, "missing"},
		{"fresh", now, good, cn, []*x509.Certificate{cloneCert}, false, ""},
		{"another clone's name", now, good, "src/golden-src/tmp-pvc-u2", []*x509.Certificate{cloneCert}, true, "is not the clone's"},
		{"the proxy's name, from the clone signer", now, issue(cloneCA, UploadServerClientName, true, time.Hour), cn, []*x509.Certificate{cloneCert}, true, "is not the clone's"},
		{"a serving certificate", now, issue(cloneCA, cn, false, time.Hour), cn, []*x509.Certificate{cloneCert}, true, "no client certificate"},
		{"from the proxy's signer (before the clone signer)", now, issue(proxyCA, cn, true, 30*24*time.Hour), cn, []*x509.Certificate{cloneCert}, true, "no CA of the clone client signer's bundle"},
		{"from a rotated clone signer still in the bundle", now, fromOld, cn, []*x509.Certificate{cloneCert, oldCert}, false, ""},
		{"from a rotated clone signer gone from the bundle", now, fromOld, cn, []*x509.Certificate{cloneCert}, true, "no CA of the clone client signer's bundle"},
		{"an hour before due", good.NotAfter.Add(-CloneClientRenewBefore - time.Hour), good, cn, []*x509.Certificate{cloneCert}, false, ""},
		{"due", good.NotAfter.Add(-CloneClientRenewBefore + time.Second), good, cn, []*x509.Certificate{cloneCert}, true, "due for refresh"},
		{"expired", good.NotAfter.Add(time.Second), good, cn, []*x509.Certificate{cloneCert}, true, "expired"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := DecideCloneClient(tt.now, tt.cert, tt.cn, tt.trusted)
			if d.Renew != tt.renew || !strings.Contains(d.Reason, tt.reason) {
				t.Errorf("DecideCloneClient = %+v, want renew %v with a reason containing %q", d, tt.renew, tt.reason)
			}
			if !d.Renew && !d.RefreshAt.Equal(tt.cert.NotAfter.Add(-CloneClientRenewBefore)) {
				t.Errorf("RefreshAt %s, want %s", d.RefreshAt, tt.cert.NotAfter.Add(-CloneClientRenewBefore))
			}
		})
	}
}

func TestIssueCloneClient(t *testing.T) {
	ca, caCert := mustCA(t, "clone", 48*time.Hour)
	now := time.Now()
	crt, key, err := IssueCloneClient(&Signer{CA: ca, Cert: caCert}, "a/b-a/tmp-pvc-u", now)
	if err != nil {
		t.Fatal(err)
	}
	c := ParseLeaf(crt, key)
	if c == nil {
		t.Fatal("not a pair")
	}
	if c.Subject.CommonName != "a/b-a/tmp-pvc-u" || len(c.ExtKeyUsage) != 1 || c.ExtKeyUsage[0] != x509.ExtKeyUsageClientAuth || len(c.DNSNames) != 0 {
		t.Errorf("certificate CN %q usages %v names %v", c.Subject.CommonName, c.ExtKeyUsage, c.DNSNames)
	}
	if left := c.NotAfter.Sub(now); left > CloneClientValidity+time.Minute || left < CloneClientValidity-time.Minute {
		t.Errorf("valid for %s, want %s", left, CloneClientValidity)
	}
	if d := DecideCloneClient(now, c, "a/b-a/tmp-pvc-u", []*x509.Certificate{caCert}); d.Renew {
		t.Errorf("a fresh certificate is due: %s", d.Reason)
	}
	// A signer near its end cuts the certificate to its own expiry.
	shortCA, shortCert := mustCA(t, "clone-short", 2*time.Hour)
	crt, key, err = IssueCloneClient(&Signer{CA: shortCA, Cert: shortCert}, "x", now)
	if err != nil {
		t.Fatal(err)
	}
	if c := ParseLeaf(crt, key); c == nil || c.NotAfter.After(shortCert.NotAfter) {
		t.Errorf("a certificate outlives its signer (%v)", c)
	}
	if ParseLeaf(crt, []byte("junk")) != nil {
		t.Error("ParseLeaf accepted a certificate without its key")
	}
}
