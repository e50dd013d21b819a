package source

import (
	"archive/tar"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path"
	"runtime"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
	"golang.org/x/net/http/httpproxy"

	"github.com/kubefill/kubefill/pkg/contract"
)

// RegistryConfig configures a container-image source. As in CDI, the disk
// is the first regular file under the image's disk/ directory (the top
// layer wins).
type RegistryConfig struct {
	// URL is docker://registry/repo[:tag|@digest] or oci-archive:///path.tar.
	URL                string
	Username, Password string
	CAPEM              []byte
	InsecureSkipVerify bool
	// Proxy settings; empty leaves the environment's. NoProxy is a comma list.
	HTTPProxy, HTTPSProxy, NoProxy string
	// ProxyCAPEM holds the CA certificates of a TLS-intercepting proxy.
	ProxyCAPEM []byte
	// Architecture selects the platform from a multi-arch index (default:
	// this binary's GOARCH); OS is always linux.
	Architecture string
}

// ErrNoDisk means the image has no file under disk/.
var ErrNoDisk = errors.New("the image has no disk file under disk/")

// Registry streams the disk file out of an OCI/Docker image.
type Registry struct {
	cfg  RegistryConfig
	size int64
	// env is the image's configured environment, read when it is opened.
	env []string
}

// Labels are the labels the image asks its claim to carry (ImageEnvLabels
// of its environment), known once Open has read the image.
func (r *Registry) Labels() map[string]string { return ImageEnvLabels(r.env) }

// NewRegistry validates cfg.
func NewRegistry(cfg RegistryConfig) (*Registry, error) {
	if !strings.HasPrefix(cfg.URL, "docker://") && !strings.HasPrefix(cfg.URL, "oci-archive://") {
		return nil, fmt.Errorf("invalid registry URL %q: use docker:// or oci-archive://", cfg.URL)
	}
	if cfg.Architecture == "" {
		cfg.Architecture = runtime.GOARCH
	}
	return &Registry{cfg: cfg, size: -1}, nil
}

// String implements Source.
func (r *Registry) String() string { return r.cfg.URL }

// Size implements Source.
func (r *Registry) Size() int64 { return r.size }

type layerOpener func() (rc io.ReadCloser, err error)

// Open implements Source: it returns a stream of the disk file.
func (r *Registry) Open(ctx context.Context) (io.ReadCloser, error) {
	var layers []layerOpener
	var err error
	if ref, ok := strings.CutPrefix(r.cfg.URL, "docker://"); ok {
		layers, err = r.remoteLayers(ctx, ref)
	} else {
		layers, err = ociArchiveLayers(strings.TrimPrefix(r.cfg.URL, "oci-archive://"), r.cfg.Architecture)
	}
	if err != nil {
		return nil, err
	}
	for i := len(layers) - 1; i >= 0; i-- {
		rc, err := layers[i]()
		if err != nil {
			return nil, fmt.Errorf("%s: opening layer %d: %w", r, i, err)
		}
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				rc.Close()
				return nil, fmt.Errorf("%s: reading layer %d: %w", r, i, err)
			}
			n := strings.TrimPrefix(path.Clean("/"+h.Name), "/")
			if h.Typeflag == tar.TypeReg && strings.HasPrefix(n, "disk/") {
				r.size = h.Size
				return &readCloser{Reader: tr, c: rc}, nil
			}
		}
		rc.Close()
	}
	return nil, fmt.Errorf("%s: %w", r, ErrNoDisk)
}

type readCloser struct {
	io.Reader
	c io.Closer
}

func (r *readCloser) Close() error { return r.c.Close() }

func (r *Registry) remoteLayers(ctx context.Context, ref string) ([]layerOpener, error) {
	var nopts []name.Option
	if r.cfg.InsecureSkipVerify {
		nopts = append(nopts, name.Insecure)
	}
	parsed, err := name.ParseReference(ref, nopts...)
	if err != nil {
		return nil, fmt.Errorf("invalid image reference %q: %w", ref, err)
	}
	pool, err := x509.SystemCertPool()
	if err != nil || pool == nil {
		pool = x509.NewCertPool()
	}
	if len(r.cfg.CAPEM) > 0 && !pool.AppendCertsFromPEM(r.cfg.CAPEM) {
		return nil, errors.New("the custom CA bundle contains no valid PEM certificate")
	}
	if len(r.cfg.ProxyCAPEM) > 0 && !pool.AppendCertsFromPEM(r.cfg.ProxyCAPEM) {
		return nil, errors.New("the proxy CA bundle contains no valid PEM certificate")
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool, InsecureSkipVerify: r.cfg.InsecureSkipVerify} //nolint:gosec // explicit opt-in
	if r.cfg.HTTPProxy != "" || r.cfg.HTTPSProxy != "" {
		pf := (&httpproxy.Config{HTTPProxy: r.cfg.HTTPProxy, HTTPSProxy: r.cfg.HTTPSProxy, NoProxy: r.cfg.NoProxy}).ProxyFunc()
		tr.Proxy = func(req *http.Request) (*url.URL, error) { return pf(req.URL) }
	}
	auth := authn.Anonymous
	if r.cfg.Username != "" || r.cfg.Password != "" {
		auth = &authn.Basic{Username: r.cfg.Username, Password: r.cfg.Password}
	}
	img, err := remote.Image(parsed, remote.WithContext(ctx), remote.WithTransport(tr), remote.WithAuth(auth),
		remote.WithPlatform(v1.Platform{OS: "linux", Architecture: r.cfg.Architecture}))
	if err != nil {
		var te *transport.Error
		if errors.As(err, &te) && te.StatusCode >= 400 && te.StatusCode < 500 {
			return nil, &StatusError{Code: te.StatusCode, Msg: fmt.Sprintf("%s %s: %v", contract.ImagePullFailureText, parsed, err)}
		}
		if strings.Contains(err.Error(), "no child with platform") {
			return nil, &StatusError{Code: http.StatusNotFound, Msg: fmt.Sprintf("%s %s: %v", contract.ImagePullFailureText, parsed, err)}
		}
		return nil, fmt.Errorf("%s %s: %w", contract.ImagePullFailureText, parsed, err)
	}
	if cf, err := img.ConfigFile(); err == nil && cf != nil {
		r.env = cf.Config.Env
	}
	ls, err := img.Layers()
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", contract.ImagePullFailureText, parsed, err)
	}
	out := make([]layerOpener, len(ls))
	for i, l := range ls {
		out[i] = l.Uncompressed
	}
	return out, nil
}

// ociArchiveLayers reads an OCI image layout packed in a tar file without
// unpacking it: blobs are read in place with section readers.
func ociArchiveLayers(p, arch string) ([]layerOpener, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, fmt.Errorf("opening OCI archive: %w", err)
	}
	defer f.Close()
	type span struct{ off, size int64 }
	entries := map[string]span{}
	cr := &countingReader{r: f}
	tr := tar.NewReader(cr)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("reading OCI archive: %w", err)
		}
		if h.Typeflag == tar.TypeReg {
			entries[strings.TrimPrefix(path.Clean("/"+h.Name), "/")] = span{cr.n, h.Size}
		}
	}
	read := func(n string, limit int64) ([]byte, error) {
		s, ok := entries[n]
		if !ok {
			return nil, fmt.Errorf("OCI archive has no %s", n)
		}
		if s.size > limit {
			return nil, fmt.Errorf("OCI archive entry %s is too large", n)
		}
		b := make([]byte, s.size)
		_, err := f.ReadAt(b, s.off)
		return b, err
	}
	blob := func(d string) string { return "blobs/" + strings.Replace(d, ":", "/", 1) }
	type desc struct {
		MediaType string       `json:"mediaType"`
		Digest    string       `json:"digest"`
		Platform  *v1.Platform `json:"platform"`
	}
	var doc struct {
		MediaType string `json:"mediaType"`
		Manifests []desc `json:"manifests"`
		Layers    []desc `json:"layers"`
	}
	b, err := read("index.json", 4<<20)
	if err != nil {
		return nil, err
	}
	for depth := 0; ; depth++ {
		doc.Manifests, doc.Layers = nil, nil
		if err := json.Unmarshal(b, &doc); err != nil {
			return nil, fmt.Errorf("parsing OCI archive: %w", err)
		}
		if doc.Layers != nil || depth > 4 {
			break
		}
		var pick *desc
		for i := range doc.Manifests {
			m := &doc.Manifests[i]
			if m.Platform == nil || (m.Platform.Architecture == arch && (m.Platform.OS == "" || m.Platform.OS == "linux")) {
				pick = m
				break
			}
		}
		if pick == nil {
			return nil, fmt.Errorf("OCI archive has no image for linux/%s", arch)
		}
		if b, err = read(blob(pick.Digest), 4<<20); err != nil {
			return nil, err
		}
	}
	var out []layerOpener
	for _, l := range doc.Layers {
		s, ok := entries[blob(l.Digest)]
		if !ok {
			return nil, fmt.Errorf("OCI archive lacks layer %s", l.Digest)
		}
		mt := l.MediaType
		out = append(out, func() (io.ReadCloser, error) {
			lf, err := os.Open(p)
			if err != nil {
				return nil, err
			}
			sr := io.NewSectionReader(lf, s.off, s.size)
			switch {
			case strings.HasSuffix(mt, "gzip"):
				z, err := gzip.NewReader(sr)
				if err != nil {
					lf.Close()
					return nil, err
				}
				return &readCloser{Reader: z, c: lf}, nil
			case strings.HasSuffix(mt, "zstd"):
				z, err := zstd.NewReader(sr, zstd.WithDecoderConcurrency(1))
				if err != nil {
					lf.Close()
					return nil, err
				}
				return &readCloser{Reader: z, c: lf}, nil
			}
			return &readCloser{Reader: sr, c: lf}, nil
		})
	}
	return out, nil
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}
