// Package registry serves a real OCI registry (go-containerregistry's
// registry package, in memory) for the tests, and pushes containerdisk-style
// images to it: the disk under disk/ in a layer, as KubeVirt's containerdisks
// and CDI's registry imports lay it out.
package registry

import (
	"archive/tar"
	"bytes"
	"crypto/tls"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/kubefill/kubefill/tests/kit"
)

// Server is a running registry.
type Server struct {
	// Host is host:port, what docker:// URLs name.
	Host string
	// CAPEM is the CA of its serving certificate (TLS servers only).
	CAPEM  []byte
	srv    *httptest.Server
	client *http.Client
	// down answers 503 to every request while set (SetUnavailable).
	down atomic.Bool
	// refused counts the requests answered 503.
	refused atomic.Int32
}

// SetUnavailable makes the registry answer 503 Service Unavailable to every
// request while down is true, as a registry under maintenance does.
func (s *Server) SetUnavailable(down bool) { s.down.Store(down) }

// Refused is how many requests the registry answered 503.
func (s *Server) Refused() int32 { return s.refused.Load() }

// Options say where and how the registry listens.
type Options struct {
	// Address is the IP to listen on; empty is 127.0.0.1.
	Address string
	// TLS serves HTTPS with a certificate for Address from a test CA.
	TLS bool
	// Username and Password, when set, are required (basic auth).
	Username, Password string
}

// Start serves a registry until the test ends.
func Start(t testing.TB, o Options) *Server {
	t.Helper()
	addr := o.Address
	if addr == "" {
		addr = "127.0.0.1"
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(addr, "0"))
	if err != nil {
		t.Fatalf("registry: listen on %s: %v", addr, err)
	}
	var h http.Handler = ggcrregistry.New(ggcrregistry.Logger(log.New(io.Discard, "", 0)))
	if o.Username != "" || o.Password != "" {
		inner := h
		h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if u, p, ok := r.BasicAuth(); !ok || u != o.Username || p != o.Password {
				w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
				w.WriteHeader(http.StatusUnauthorized)
				return
			}
			inner.ServeHTTP(w, r)
		})
	}
	s := &Server{Host: ln.Addr().String()}
	serve := h
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.down.Load() {
			s.refused.Add(1)
			http.Error(w, "registry under maintenance", http.StatusServiceUnavailable)
			return
		}
		serve.ServeHTTP(w, r)
	}))
	srv.Listener.Close()
	srv.Listener = ln
	srv.Config.ReadHeaderTimeout = 10 * time.Second
	s.srv = srv
	if o.TLS {
		ca := kit.TestCA(t, "kubefill-test-registry-ca")
		certPEM, keyPEM, err := ca.Issue(kit.Leaf{CommonName: addr, Hosts: []string{addr}, Server: true})
		if err != nil {
			t.Fatal(err)
		}
		pair, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			t.Fatal(err)
		}
		srv.TLS = &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}
		srv.StartTLS()
		s.CAPEM = ca.CertPEM
	} else {
		srv.Start()
	}
	s.client = srv.Client()
	t.Cleanup(srv.Close)
	return s
}

// URL is the docker:// URL of repo:tag on this registry.
func (s *Server) URL(repoTag string) string { return "docker://" + s.Host + "/" + repoTag }

func (s *Server) ref(t testing.TB, repoTag string) name.Reference {
	t.Helper()
	ref, err := name.ParseReference(s.Host+"/"+repoTag, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	return ref
}

func (s *Server) options(o Options) []remote.Option {
	opts := []remote.Option{remote.WithTransport(s.client.Transport)}
	if o.Username != "" {
		opts = append(opts, remote.WithAuth(&authn.Basic{Username: o.Username, Password: o.Password}))
	}
	return opts
}

// DiskImage is a containerdisk-style image: one layer holding the disk at
// disk/<file>, owned by uid 107 as KubeVirt's containerdisks are.
func DiskImage(t testing.TB, file string, disk []byte) v1.Image {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range []*tar.Header{
		{Name: "disk/", Typeflag: tar.TypeDir, Mode: 0o555, Uid: 107, Gid: 107},
		{Name: "disk/" + file, Typeflag: tar.TypeReg, Mode: 0o444, Size: int64(len(disk)), Uid: 107, Gid: 107},
	} {
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := tw.Write(disk); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	data := buf.Bytes()
	base, err := mutate.ConfigFile(empty.Image, &v1.ConfigFile{Architecture: "amd64", OS: "linux", RootFS: v1.RootFS{Type: "layers"}})
	if err != nil {
		t.Fatal(err)
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(base, layer)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// PushDisk pushes a containerdisk holding disk (as disk/disk.img) under
// repoTag and returns the manifest's digest ("sha256:...").
func (s *Server) PushDisk(t testing.TB, repoTag string, disk []byte, auth ...Options) string {
	t.Helper()
	return s.Push(t, repoTag, DiskImage(t, "disk.img", disk), auth...)
}

// Push pushes img under repoTag and returns its digest.
func (s *Server) Push(t testing.TB, repoTag string, img v1.Image, auth ...Options) string {
	t.Helper()
	var o Options
	if len(auth) > 0 {
		o = auth[0]
	}
	if err := remote.Write(s.ref(t, repoTag), img, s.options(o)...); err != nil {
		t.Fatalf("registry: push %s: %v", repoTag, err)
	}
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d.String()
}

// PushIndex pushes a multi-architecture index of imgs (keyed by
// architecture) under repoTag and returns the index's digest.
func (s *Server) PushIndex(t testing.TB, repoTag string, imgs map[string]v1.Image) string {
	t.Helper()
	var adds []mutate.IndexAddendum
	for arch, img := range imgs {
		adds = append(adds, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: arch}}})
	}
	idx := mutate.IndexMediaType(mutate.AppendManifests(empty.Index, adds...), types.OCIImageIndex)
	if err := remote.WriteIndex(s.ref(t, repoTag), idx, s.options(Options{})...); err != nil {
		t.Fatalf("registry: push index %s: %v", repoTag, err)
	}
	d, err := idx.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d.String()
}
