package uploadserver

import (
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"testing"

	"github.com/klauspost/compress/gzip"
)

func newGzip(w io.Writer) io.WriteCloser { return gzip.NewWriter(w) }

// newTLSServer serves h with cfg on loopback and returns its URL.
func newTLSServer(t *testing.T, h http.Handler, cfg *tls.Config) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h, TLSConfig: cfg}
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	t.Cleanup(func() { srv.Close() })
	return "https://" + ln.Addr().String()
}
