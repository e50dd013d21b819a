package workermetrics

import (
	"crypto/tls"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kubefill/kubefill/pkg/pki"
)

func TestProgressAndServer(t *testing.T) {
	reg := prometheus.NewRegistry()
	p, err := NewProgress(reg, "kubevirt_cdi_test_progress_total", "test", "uid-1")
	if err != nil {
		t.Fatal(err)
	}
	p.Update(1, 0) // unknown total: ignored
	p.Update(425, 1000)
	p.Update(100, 1000) // never goes back
	if v := p.Value(); v != 42.5 {
		t.Fatalf("value %v", v)
	}
	p.Set(250)
	if v := p.Value(); v != 100 {
		t.Fatalf("value %v, want capped at 100", v)
	}
	p.Reset()
	if v := p.Value(); v != 0 {
		t.Fatalf("value after reset %v", v)
	}
	p.Set(7)

	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // self-signed, as Prometheus scrapes it
	get := func(url string) (int, string) {
		t.Helper()
		resp, err := client.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	tlsOpts := pki.ServingOptions{GeneratedName: "test", GeneratedHosts: []string{"localhost", "127.0.0.1"}}
	for _, path := range []string{"", "/metrics"} {
		s, err := Start("127.0.0.1:0", reg, ServerOptions{Path: path, TLS: tlsOpts})
		if err != nil {
			t.Fatal(err)
		}
		code, body := get("https://" + s.Addr() + "/metrics")
		if code != http.StatusOK || !strings.Contains(body, `kubevirt_cdi_test_progress_total{ownerUID="uid-1"} 7`) {
			t.Fatalf("path %q: %d\n%s", path, code, body)
		}
		code, _ = get("https://" + s.Addr() + "/other")
		if want := map[bool]int{true: http.StatusOK, false: http.StatusNotFound}[path == ""]; code != want {
			t.Fatalf("path %q: /other answered %d, want %d", path, code, want)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
}
