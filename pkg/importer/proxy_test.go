package importer

import (
	"archive/tar"
	"bufio"
	"bytes"
	"crypto/tls"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/kubefill/kubefill/pkg/contract"
	"github.com/kubefill/kubefill/pkg/pki"
)

// interceptedHost is the name the importer asks for; only the proxy knows
// where it is, and answers for it with a certificate of its own CA.
const interceptedHost = "registry.kubefill.test"

// interceptingProxy is an HTTP CONNECT proxy that terminates the tunnelled
// TLS itself, with a certificate for the requested host signed by its own
// CA, and forwards each request to backend over TLS: what a
// TLS-inspecting corporate proxy does. It counts the tunnels it opened.
func interceptingProxy(t *testing.T, backend *httptest.Server) (proxyURL string, caPEM []byte, tunnels *atomic.Int32) {
	t.Helper()
	ca, err := pki.NewCA("intercepting proxy CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := ca.Issue(interceptedHost, []string{interceptedHost}, false, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	upstream := backend.Client().Transport
	backendHost := backend.Listener.Addr().String()
	tunnels = &atomic.Int32{}
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodConnect || r.Host != interceptedHost+":443" {
			http.Error(w, "only CONNECT "+interceptedHost+":443", http.StatusForbidden)
			return
		}
		conn, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		tunnels.Add(1)
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
			req.RequestURI, req.URL.Scheme, req.URL.Host = "", "https", backendHost
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
	t.Cleanup(proxy.Close)
	return proxy.URL, ca.CertPEM, tunnels
}

// An import through a TLS-intercepting proxy succeeds when the importer is
// given the proxy's CA in IMPORTER_PROXY_CERT_DIR (where the importer pod
// mounts CDIConfig's trustedCAProxy), from a registry and over HTTPS alike,
// and fails on the certificate without it.
func TestRunTrustsTheProxyCA(t *testing.T) {
	disk := bytes.Repeat([]byte("a raw disk through the proxy "), 1<<12)
	mux := http.NewServeMux()
	mux.Handle("/v2/", registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	mux.HandleFunc("/disk.img", func(w http.ResponseWriter, r *http.Request) {
		http.ServeContent(w, r, "disk.img", time.Time{}, bytes.NewReader(disk))
	})
	backend := httptest.NewTLSServer(mux)
	t.Cleanup(backend.Close)

	// The image, pushed to the backend directly.
	img, err := mutate.AppendLayers(empty.Image, static.NewLayer(tarOf(t, "disk/disk.img", disk), types.DockerLayer))
	if err != nil {
		t.Fatal(err)
	}
	direct, err := name.ParseReference(backend.Listener.Addr().String() + "/vm/disk:v1")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(direct, img, remote.WithTransport(backend.Client().Transport)); err != nil {
		t.Fatal(err)
	}

	proxyURL, caPEM, tunnels := interceptingProxy(t, backend)
	caDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(caDir, "ca.crt"), caPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if u, _ := url.Parse(proxyURL); u.Hostname() != "127.0.0.1" {
		t.Fatalf("proxy at %s", proxyURL)
	}
	paths := func() Paths {
		vol := t.TempDir()
		return Paths{DataPath: filepath.Join(vol, "disk.img"), BlockPath: filepath.Join(vol, "no-block"), ScratchDir: filepath.Join(vol, "no-scratch"), TerminationLog: filepath.Join(vol, "termination-log")}
	}
	for _, c := range []struct {
		source, endpoint string
		// The HTTP source retries a refused certificate for a minute and
		// a half before it gives up, so only the registry's is tried.
		tryWithout bool
	}{
		{contract.SourceRegistry, "docker://" + interceptedHost + "/vm/disk:v1", true},
		{contract.SourceHTTP, "https://" + interceptedHost + "/disk.img", false},
	} {
		t.Run(c.source, func(t *testing.T) {
			vars := map[string]string{contract.EnvSource: c.source, contract.EnvEndpoint: c.endpoint, contract.EnvImageSize: "1Mi",
				contract.EnvHTTPSProxy: proxyURL, contract.EnvNoProxy: "localhost"}

			if c.tryWithout {
				before := tunnels.Load()
				m, err := runJob(t, vars, paths())
				if err == nil || m.Outcome != contract.OutcomeFailed || !strings.Contains(*m.Message, "certificate") {
					t.Fatalf("without the proxy's CA: %v %+v, want a certificate failure", err, m)
				}
				if tunnels.Load() == before {
					t.Fatal("the importer did not go through the proxy")
				}
			}

			vars[contract.EnvProxyCertDir] = caDir
			p := paths()
			before := tunnels.Load()
			m, err := runJob(t, vars, p)
			if err != nil || m.Outcome != contract.OutcomeSucceeded {
				t.Fatalf("with the proxy's CA: %v %+v", err, m)
			}
			if tunnels.Load() == before {
				t.Fatal("the importer did not go through the proxy")
			}
			got, err := os.ReadFile(p.DataPath)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) < len(disk) || !bytes.Equal(got[:len(disk)], disk) || len(bytes.Trim(got[len(disk):], "\x00")) != 0 {
				t.Fatalf("imported %d bytes, not the disk (%d bytes, zero-padded)", len(got), len(disk))
			}
		})
	}
}

// tarOf is a tar stream holding one regular file.
func tarOf(t *testing.T, name string, data []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)), Typeflag: tar.TypeReg}); err != nil {
		t.Fatal(err)
	}
	if _, err := tw.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}
