package datapath

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/pem"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"

	"github.com/kubefill/kubefill/pkg/datapath/source"
	"github.com/kubefill/kubefill/pkg/datapath/testimg"
)

func TestParseS3URL(t *testing.T) {
	for _, c := range []struct {
		in              string
		ep, bucket, key string
		secure, bad     bool
	}{
		{in: "s3://b/dir/k.img", ep: "s3.amazonaws.com", bucket: "b", key: "dir/k.img", secure: true},
		{in: "http://127.0.0.1:9000/b/k", ep: "127.0.0.1:9000", bucket: "b", key: "k"},
		{in: "https://minio.example/b/k.qcow2", ep: "minio.example", bucket: "b", key: "k.qcow2", secure: true},
		{in: "s3://b", bad: true},
		{in: "http://host/b/", bad: true},
		{in: "ftp://host/b/k", bad: true},
	} {
		ep, sec, b, k, err := source.ParseS3URL(c.in)
		if (err != nil) != c.bad || ep != c.ep || sec != c.secure || b != c.bucket || k != c.key {
			t.Errorf("ParseS3URL(%q) = %q %v %q %q %v", c.in, ep, sec, b, k, err)
		}
	}
}

func TestS3Source(t *testing.T) {
	f := setup(t)
	backend := s3mem.New()
	if err := backend.CreateBucket("images"); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"disk-zlib.qcow2", "disk.raw.gz"} {
		b, err := os.ReadFile(filepath.Join(f.dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := backend.PutObject("images", "vm/"+name, map[string]string{"Last-Modified": time.Now().UTC().Format(http.TimeFormat)}, bytes.NewReader(b), int64(len(b)), nil); err != nil {
			t.Fatal(err)
		}
	}
	srv := httptest.NewTLSServer(gofakes3.New(backend).Server())
	defer srv.Close()
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	for _, c := range []struct{ name, method string }{{"disk-zlib.qcow2", "qcow2-stream"}, {"disk.raw.gz", "stream"}} {
		src, err := source.NewS3(source.S3Config{URL: srv.URL + "/images/vm/" + c.name, AccessKey: "AKID", SecretKey: "secret", CAPEM: ca, Region: "us-east-1"})
		if err != nil {
			t.Fatal(err)
		}
		out := outPath(t)
		res, err := Import(context.Background(), src, Options{Path: out})
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if res.Method != c.method || testimg.FileSHA256(t, out) != f.rawSHA {
			t.Fatalf("%s: method %s, sha mismatch", c.name, res.Method)
		}
	}
	src, _ := source.NewS3(source.S3Config{URL: srv.URL + "/images/missing", AccessKey: "a", SecretKey: "b", CAPEM: ca, Region: "us-east-1", MaxRetries: 1})
	if _, err := Import(context.Background(), src, Options{Path: outPath(t)}); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Fatalf("missing object: %v", err)
	}
}

// diskImage builds a container image whose layer holds disk/<name>.
func diskImage(t *testing.T, p, name string) v1.Image {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: "disk/", Typeflag: tar.TypeDir, Mode: 0o755})
	tw.WriteHeader(&tar.Header{Name: "disk/" + name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(b))})
	tw.Write(b)
	tw.Close()
	data := buf.Bytes()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return nopCloser{bytes.NewReader(data)}, nil })
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		t.Fatal(err)
	}
	img, err = mutate.ConfigFile(img, &v1.ConfigFile{OS: "linux", Architecture: "amd64"})
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func TestRegistrySource(t *testing.T) {
	f := setup(t)
	reg := httptest.NewTLSServer(basicAuth("puller", "pw", registry.New()))
	defer reg.Close()
	u, _ := url.Parse(reg.URL)
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: reg.Certificate().Raw})
	ref, err := name.ParseReference(u.Host + "/vm/disk:v1")
	if err != nil {
		t.Fatal(err)
	}
	img := diskImage(t, filepath.Join(f.dir, "disk-zlib.qcow2"), "disk.qcow2")
	if err := remote.Write(ref, img, remote.WithTransport(reg.Client().Transport), remote.WithAuth(&authn.Basic{Username: "puller", Password: "pw"})); err != nil {
		t.Fatal(err)
	}
	src, err := source.NewRegistry(source.RegistryConfig{URL: "docker://" + ref.String(), Username: "puller", Password: "pw", CAPEM: ca, Architecture: "amd64"})
	if err != nil {
		t.Fatal(err)
	}
	out := outPath(t)
	scratch := t.TempDir()
	res, err := Import(context.Background(), src, Options{Path: out, ScratchDir: scratch})
	if err != nil {
		t.Fatal(err)
	}
	if testimg.FileSHA256(t, out) != f.rawSHA {
		t.Fatal("registry import: sha mismatch")
	}
	t.Logf("registry: format %s method %s", res.Format, res.Method)
	// Wrong password and a missing platform fail clearly.
	bad, _ := source.NewRegistry(source.RegistryConfig{URL: "docker://" + ref.String(), Username: "puller", Password: "no", CAPEM: ca, Architecture: "amd64"})
	if _, err := Import(context.Background(), bad, Options{Path: outPath(t), ScratchDir: scratch}); err == nil || !strings.Contains(err.Error(), "failed to pull image") {
		t.Fatalf("bad registry password: %v", err)
	}

	// The same image as an oci-archive.
	lp := filepath.Join(t.TempDir(), "layout")
	l, err := layout.Write(lp, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.AppendImage(img, layout.WithPlatform(v1.Platform{OS: "linux", Architecture: "amd64"})); err != nil {
		t.Fatal(err)
	}
	archivePath := filepath.Join(t.TempDir(), "image.tar")
	tarDir(t, lp, archivePath)
	src2, _ := source.NewRegistry(source.RegistryConfig{URL: "oci-archive://" + archivePath, Architecture: "amd64"})
	out2 := outPath(t)
	if _, err := Import(context.Background(), src2, Options{Path: out2, ScratchDir: scratch}); err != nil {
		t.Fatal(err)
	}
	if testimg.FileSHA256(t, out2) != f.rawSHA {
		t.Fatal("oci-archive import: sha mismatch")
	}
	src3, _ := source.NewRegistry(source.RegistryConfig{URL: "oci-archive://" + archivePath, Architecture: "s390x"})
	if _, err := Import(context.Background(), src3, Options{Path: outPath(t), ScratchDir: scratch}); err == nil || !strings.Contains(err.Error(), "s390x") {
		t.Fatalf("missing platform: %v", err)
	}
	// An image without disk/ is refused.
	empty1, _ := mutate.ConfigFile(empty.Image, &v1.ConfigFile{OS: "linux", Architecture: "amd64"})
	ref2, _ := name.ParseReference(u.Host + "/vm/nodisk:v1")
	if err := remote.Write(ref2, empty1, remote.WithTransport(reg.Client().Transport), remote.WithAuth(&authn.Basic{Username: "puller", Password: "pw"})); err != nil {
		t.Fatal(err)
	}
	src4, _ := source.NewRegistry(source.RegistryConfig{URL: "docker://" + ref2.String(), Username: "puller", Password: "pw", CAPEM: ca, Architecture: "amd64"})
	if _, err := Import(context.Background(), src4, Options{Path: outPath(t)}); !errors.Is(err, source.ErrNoDisk) {
		t.Fatalf("image without disk: %v", err)
	}
}

func basicAuth(user, pass string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, p, ok := r.BasicAuth(); !ok || u != user || p != pass {
			w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
}

func tarDir(t *testing.T, dir, out string) {
	t.Helper()
	f, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	if err := tw.AddFS(os.DirFS(dir)); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
}

// A multi-arch index: the importer takes the disk of the requested platform.
func TestRegistryPlatformSelection(t *testing.T) {
	f := setup(t)
	reg := httptest.NewServer(registry.New())
	defer reg.Close()
	u, _ := url.Parse(reg.URL)
	arm := filepath.Join(t.TempDir(), "arm.raw")
	os.WriteFile(arm, bytes.Repeat([]byte("arm64 disk "), 10000), 0o600)
	amdImg := diskImage(t, filepath.Join(f.dir, "disk.raw.gz"), "disk.img.gz")
	armImg := diskImage(t, arm, "disk.img")
	idx := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: amdImg, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}}},
		mutate.IndexAddendum{Add: armImg, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm64"}}},
	)
	ref, _ := name.ParseReference(u.Host+"/vm/multi:v1", name.Insecure)
	if err := remote.WriteIndex(ref, idx); err != nil {
		t.Fatal(err)
	}
	for arch, want := range map[string]string{"amd64": f.rawSHA, "arm64": testimg.FileSHA256(t, arm)} {
		src, err := source.NewRegistry(source.RegistryConfig{URL: "docker://" + ref.String(), Architecture: arch, InsecureSkipVerify: true})
		if err != nil {
			t.Fatal(err)
		}
		out := outPath(t)
		if _, err := Import(context.Background(), src, Options{Path: out}); err != nil {
			t.Fatalf("%s: %v", arch, err)
		}
		if got := testimg.FileSHA256(t, out); got != want {
			t.Fatalf("%s: got the wrong platform's disk", arch)
		}
	}
	src, _ := source.NewRegistry(source.RegistryConfig{URL: "docker://" + ref.String(), Architecture: "riscv64", InsecureSkipVerify: true})
	if _, err := Import(context.Background(), src, Options{Path: outPath(t)}); err == nil || !strings.Contains(err.Error(), "failed to pull image") {
		t.Fatalf("missing platform: %v", err)
	}
}
