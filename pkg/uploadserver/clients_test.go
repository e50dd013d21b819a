package uploadserver

import (
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"

	"github.com/kubefill/kubefill/pkg/cloner"
	"github.com/kubefill/kubefill/pkg/pki"
)

// The two kinds of upload server and the two client signers, as the
// controller pairs them: an ordinary upload server trusts the upload
// proxy's client signer and requires the proxy's name; a clone's upload
// server trusts the clone client signer and requires the clone's name.

const proxyName = "cdi-uploadproxy"

// forcedClient presents cert whatever CAs the server names (Go's client
// would otherwise offer no certificate the server cannot verify), so the
// server's own verification is what refuses it.
func forcedClient(p *certSet, cert tls.Certificate) *http.Client {
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(p.serverCA.CertPEM)
	cfg := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert, nil }}
	return &http.Client{Transport: &http.Transport{TLSClientConfig: cfg, DisableKeepAlives: true}, Timeout: time.Minute}
}

func leafOf(t *testing.T, ca *pki.CA, cn string) tls.Certificate {
	t.Helper()
	c, k, err := ca.Issue(cn, nil, true, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair(c, k)
	if err != nil {
		t.Fatal(err)
	}
	return pair
}

// refused posts to the server as client and wants a failed handshake or
// status code with a message containing reason.
func refused(t *testing.T, what string, c *http.Client, url string, clone bool, code int, reason string) {
	t.Helper()
	var got int
	var msg string
	if clone {
		src, _ := fsSource(t)
		got, msg = postClone(t, c, url+cloner.UploadPath, cloner.Source{Mode: cloner.Filesystem, Path: src}, cloner.ContentTypeFilesystem, nil)
	} else {
		resp, err := c.Post(url+"/v1beta1/upload", "application/octet-stream", strings.NewReader("not an image"))
		if err == nil {
			b := make([]byte, 512)
			n, _ := resp.Body.Read(b)
			resp.Body.Close()
			got, msg = resp.StatusCode, string(b[:n])
		} else {
			msg = err.Error()
		}
	}
	t.Logf("%s: %d %s", what, got, msg)
	if got == 0 {
		return // the handshake failed: refused
	}
	if got != code || !strings.Contains(msg, reason) {
		t.Errorf("%s: %d %q, want a failed handshake or %d %q", what, got, msg, code, reason)
	}
}

// TestUploadServerRefusesCloneClients: an ordinary upload server (the
// proxy's client signer, the proxy's name) refuses every certificate of the
// clone signer, even one naming the proxy, and a certificate of the
// proxy's signer with any other name, a clone's included.
func TestUploadServerRefusesCloneClients(t *testing.T) {
	up := start(t, func(c *Config) { c.ClientName = proxyName })
	cloneCA, err := pki.NewCA("kubefill-clone-client-signer", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		what  string
		cert  tls.Certificate
		clone bool
		code  int
		why   string
	}{
		{"a clone certificate naming the proxy", leafOf(t, cloneCA, proxyName), false, http.StatusUnauthorized, "upload proxy's CA is required"},
		{"a clone certificate with a clone's name, streaming a clone", leafOf(t, cloneCA, cloneName), true, http.StatusUnauthorized, "upload proxy's CA is required"},
		{"a proxy-signer certificate with another name", leafOf(t, up.pki.clientCA, "someone"), false, http.StatusUnauthorized, "is not the upload proxy's"},
		{"a proxy-signer certificate with a clone's name", leafOf(t, up.pki.clientCA, cloneName), true, http.StatusUnauthorized, "is not the upload proxy's"},
	} {
		refused(t, c.what+" (offered)", up.pki.client(&c.cert), up.url, c.clone, c.code, c.why)
		refused(t, c.what+" (forced)", forcedClient(up.pki, c.cert), up.url, c.clone, c.code, c.why)
	}
	// The proxy's own certificate uploads (11 raw bytes).
	if code, msg := up.post(t, up.proxy, "/v1beta1/upload", strings.NewReader("a raw image"), 11, "application/octet-stream"); code != http.StatusOK {
		t.Errorf("the proxy's certificate: %d %s, want 200", code, msg)
	}
}

// TestCloneServerRefusesOtherClients: a clone's upload server (the clone
// signer, the clone's name) refuses the upload proxy's certificate, a
// certificate of the proxy's signer with the clone's very name (what
// Kubefill issued before the clone signer existed), another clone's
// certificate, and an ordinary upload from its own clone's certificate;
// then takes its clone's stream.
func TestCloneServerRefusesOtherClients(t *testing.T) {
	cloneCA, err := pki.NewCA("kubefill-clone-client-signer", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cas := filepath.Join(t.TempDir(), "client-ca.crt")
	if err := os.WriteFile(cas, cloneCA.CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	ct := start(t, func(c *Config) { c.ClientName, c.ClientCAFile, c.ImageSize = cloneName, cas, 0 })
	for _, c := range []struct {
		what  string
		cert  tls.Certificate
		clone bool
		code  int
		why   string
	}{
		{"the upload proxy's certificate", ct.pki.proxyClient, false, http.StatusUnauthorized, "clone client signer is required"},
		{"a proxy-signer certificate with the clone's name", leafOf(t, ct.pki.clientCA, cloneName), true, http.StatusUnauthorized, "clone client signer is required"},
		{"another clone's certificate", leafOf(t, cloneCA, "src-ns/src-disk-tgt-ns/other-disk"), true, http.StatusUnauthorized, "is not this clone's"},
		{"a clone certificate naming the proxy", leafOf(t, cloneCA, proxyName), false, http.StatusUnauthorized, "is not this clone's"},
		{"the clone's certificate, uploading", leafOf(t, cloneCA, cloneName), false, http.StatusForbidden, "takes only that clone's stream"},
	} {
		refused(t, c.what+" (offered)", ct.pki.client(&c.cert), ct.url, c.clone, c.code, c.why)
		refused(t, c.what+" (forced)", forcedClient(ct.pki, c.cert), ct.url, c.clone, c.code, c.why)
	}
	mine := leafOf(t, cloneCA, cloneName)
	src, _ := fsSource(t)
	if code, msg := postClone(t, ct.pki.client(&mine), ct.url+cloner.UploadPath, cloner.Source{Mode: cloner.Filesystem, Path: src}, cloner.ContentTypeFilesystem, nil); code != http.StatusOK {
		t.Fatalf("the clone's own stream: %d %s", code, msg)
	}
	checkCloneComplete(t, ct, false)
}

// TestNewRequiresClientName: a server that would take any certificate of
// its CA is never built.
func TestNewRequiresClientName(t *testing.T) {
	p := newPKI(t)
	_, err := New(Config{CertFile: p.certFile, KeyFile: p.keyFile, ClientCAFile: p.cas}, testr.New(t))
	if err == nil || !strings.Contains(err.Error(), "--client-name") {
		t.Errorf("New without a client name: %v, want an error naming --client-name", err)
	}
}
