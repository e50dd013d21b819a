package testimg

import (
	"bufio"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kubefill/kubefill/pkg/pki"
)

// InterceptingProxy is an HTTP CONNECT proxy that terminates the tunnelled
// TLS itself, as a TLS-inspecting corporate proxy does: it answers for
// host (CONNECT host:443 only) with a certificate signed by a CA of its
// own, and sends each request on to upstreamHost through upstream.
type InterceptingProxy struct {
	// URL is the proxy's http:// URL.
	URL string
	// CAPEM is the proxy's CA, which a client must trust.
	CAPEM []byte
	// Tunnels counts the tunnels it opened.
	Tunnels atomic.Int32
}

// StartInterceptingProxy serves an InterceptingProxy on addr (an IP; empty
// is 127.0.0.1) until the test ends.
func StartInterceptingProxy(t testing.TB, addr, host string, upstream http.RoundTripper, upstreamHost string) *InterceptingProxy {
	t.Helper()
	if addr == "" {
		addr = "127.0.0.1"
	}
	ca, err := pki.NewCA("kubefill-test intercepting proxy CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := ca.Issue(host, []string{host}, false, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	p := &InterceptingProxy{CAPEM: ca.CertPEM}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodConnect || r.Host != host+":443" {
			http.Error(w, "only CONNECT "+host+":443", http.StatusForbidden)
			return
		}
		conn, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		p.Tunnels.Add(1)
		if _, err := io.WriteString(conn, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
			return
		}
		tconn := tls.Server(conn, &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12})
		br := bufio.NewReader(tconn)
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			req.RequestURI, req.URL.Scheme, req.URL.Host = "", "https", upstreamHost
			resp, err := upstream.RoundTrip(req)
			if err != nil {
				return
			}
			err = resp.Write(tconn)
			resp.Body.Close()
			if err != nil {
				return
			}
		}
	}))
	ln, err := net.Listen("tcp", net.JoinHostPort(addr, "0"))
	if err != nil {
		t.Fatalf("intercepting proxy: listen on %s: %v", addr, err)
	}
	srv.Listener.Close()
	srv.Listener = ln
	srv.Start()
	t.Cleanup(srv.Close)
	p.URL = srv.URL
	return p
}
