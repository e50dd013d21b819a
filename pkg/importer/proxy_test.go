package importer

import (
	"archive/tar"
	"bytes"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
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
	"github.com/kubefill/kubefill/pkg/datapath/testimg"
)

// interceptedHost is the name the importer asks for; only the proxy knows
// where it is, and answers for it with a certificate of its own CA.
const interceptedHost = "registry.kubefill.test"

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

	proxy := testimg.StartInterceptingProxy(t, "", interceptedHost, backend.Client().Transport, backend.Listener.Addr().String())
	proxyURL, caPEM, tunnels := proxy.URL, proxy.CAPEM, &proxy.Tunnels
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
