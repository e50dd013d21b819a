package uploadproxy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"time"

	"github.com/go-logr/logr"

	"github.com/kubefill/kubefill/pkg/pki"
	"github.com/kubefill/kubefill/pkg/token"
)

// The upload paths CDI's proxy and upload server serve.
const (
	PathUpload          = "/v1beta1/upload"
	PathUploadAsync     = "/v1beta1/upload-async"
	PathUploadForm      = "/v1beta1/upload-form"
	PathUploadFormAsync = "/v1beta1/upload-form-async"
	PathUploadArchive   = "/v1beta1/upload-archive"
	PathHealthz         = "/healthz"
)

// UploadPaths are every path an upload may be sent to, with the v1alpha1 aliases.
var UploadPaths = func() []string {
	base := []string{PathUpload, PathUploadAsync, PathUploadForm, PathUploadFormAsync, PathUploadArchive}
	out := append([]string{}, base...)
	for _, p := range base {
		out = append(out, strings.Replace(p, "/v1beta1/", "/v1alpha1/", 1))
	}
	return out
}()

// IsAsyncPath says whether a path answers HEAD probes with 200.
func IsAsyncPath(p string) bool {
	return strings.HasSuffix(p, "/upload-async") || strings.HasSuffix(p, "/upload-form-async")
}

// CORS headers sent on every upload path, so that a browser page served from
// elsewhere (a console) can upload with a token.
var corsHeaders = map[string]string{
	"Access-Control-Allow-Origin":  "*",
	"Access-Control-Allow-Methods": "POST, PUT, HEAD, OPTIONS",
	"Access-Control-Allow-Headers": "Authorization, Content-Type, Content-Length, Content-Disposition, X-Requested-With",
	"Access-Control-Max-Age":       "86400",
}

// Options configure a Handler.
type Options struct {
	// Validator checks upload tokens (signature, expiry, issuer).
	Validator token.Validator
	// Resolver finds the upload server of the token's claim.
	Resolver Resolver
	// Transport reaches upload servers, normally NewUpstreamTransport's.
	Transport http.RoundTripper
	Log       logr.Logger
}

type ctxKey struct{}

type upstream struct {
	url        *url.URL
	serverName string
}

// Handler is the upload proxy's HTTP handler.
type Handler struct {
	opts  Options
	mux   *http.ServeMux
	proxy *httputil.ReverseProxy
}

// NewHandler builds the proxy's handler.
func NewHandler(opts Options) (*Handler, error) {
	if opts.Validator == nil || opts.Resolver == nil || opts.Transport == nil {
		return nil, errors.New("upload proxy needs a token validator, a resolver and a transport")
	}
	h := &Handler{opts: opts, mux: http.NewServeMux()}
	h.proxy = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			up := pr.In.Context().Value(ctxKey{}).(upstream)
			pr.SetURL(up.url)
			pr.Out.Header.Del("Authorization")
			pr.SetXForwarded()
		},
		Transport: opts.Transport,
		// Stream the upload server's answer as it comes; the request body is
		// never read by the proxy itself, only copied by the transport.
		FlushInterval: -1,
		ModifyResponse: func(resp *http.Response) error {
			for k := range corsHeaders {
				resp.Header.Del(k)
			}
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			up, _ := r.Context().Value(ctxKey{}).(upstream)
			opts.Log.Error(err, "proxying upload", "upstream", up.url.String(), "path", r.URL.Path)
			writeError(w, http.StatusBadGateway, fmt.Sprintf("forwarding the upload to the upload server failed: %v", err))
		},
	}
	h.mux.HandleFunc(PathHealthz, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write([]byte("ok"))
	})
	for _, p := range UploadPaths {
		h.mux.HandleFunc(p, h.upload)
	}
	return h, nil
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.mux.ServeHTTP(w, r) }

func writeError(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	_, _ = fmt.Fprintln(w, msg)
}

// BearerToken extracts the token of an "Authorization: Bearer <token>" header.
func BearerToken(h http.Header) (string, error) {
	v := h.Get("Authorization")
	if v == "" {
		return "", errors.New("missing the Authorization: Bearer <token> header; get a token by creating an UploadTokenRequest (upload.cdi.kubevirt.io/v1beta1) for the PVC")
	}
	scheme, tok, ok := strings.Cut(v, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(tok) == "" {
		return "", errors.New("the Authorization header must be \"Bearer <token>\"")
	}
	return strings.TrimSpace(tok), nil
}

// Authorize validates the request's token and returns the claim it allows an upload into.
func Authorize(v token.Validator, h http.Header) (namespace, name string, err error) {
	raw, err := BearerToken(h)
	if err != nil {
		return "", "", err
	}
	p, err := v.Validate(raw)
	if err != nil {
		return "", "", fmt.Errorf("upload token rejected: %w", err)
	}
	if err := token.CheckUpload(p, p.Namespace, p.Name); err != nil {
		return "", "", fmt.Errorf("upload token rejected: %w", err)
	}
	return p.Namespace, p.Name, nil
}

func (h *Handler) upload(w http.ResponseWriter, r *http.Request) {
	for k, v := range corsHeaders {
		w.Header().Set(k, v)
	}
	switch r.Method {
	case http.MethodOptions:
		w.WriteHeader(http.StatusNoContent)
		return
	case http.MethodHead:
		if IsAsyncPath(r.URL.Path) {
			w.WriteHeader(http.StatusOK)
			return
		}
		writeError(w, http.StatusMethodNotAllowed, fmt.Sprintf("HEAD is answered only on the async upload paths, not %s", r.URL.Path))
		return
	case http.MethodPost, http.MethodPut:
	default:
		w.Header().Set("Allow", "POST, PUT, OPTIONS")
		writeError(w, http.StatusMethodNotAllowed, fmt.Sprintf("method %s is not allowed on %s; upload with POST", r.Method, r.URL.Path))
		return
	}
	log := h.opts.Log.WithValues("path", r.URL.Path, "remote", r.RemoteAddr)
	ns, name, err := Authorize(h.opts.Validator, r.Header)
	if err != nil {
		log.Info("refusing upload", "reason", err.Error())
		writeError(w, http.StatusUnauthorized, err.Error())
		return
	}
	log = log.WithValues("pvc", ns+"/"+name)
	ep, err := h.opts.Resolver.Resolve(r.Context(), ns, name)
	if err != nil {
		code := HTTPStatus(err)
		log.Info("cannot upload", "status", code, "reason", err.Error())
		writeError(w, code, err.Error())
		return
	}
	u, err := url.Parse(ep.URL)
	if err != nil || u.Host == "" {
		writeError(w, http.StatusBadGateway, fmt.Sprintf("upload server address %q is not a URL: %v", ep.URL, err))
		return
	}
	log.Info("proxying upload", "upstream", u.Host, "contentLength", r.ContentLength)
	start := time.Now()
	h.proxy.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), ctxKey{}, upstream{url: u, serverName: ep.ServerName})))
	log.Info("upload request done", "duration", time.Since(start).Round(time.Millisecond))
}

// UpstreamTLS holds the files of the proxy's mTLS identity towards upload servers.
type UpstreamTLS struct {
	// ClientCertFile and ClientKeyFile are the proxy's client certificate,
	// signed by the CA the upload servers trust for clients.
	ClientCertFile, ClientKeyFile string
	// CAFile holds the CA bundle that signs upload servers' serving certificates.
	CAFile string
	// ExtraCAs, if set, returns more trusted CAs (PEM) at each connection:
	// the upload-server signer's bundle read through the API, which holds a
	// rotated signer's CA as soon as the controller publishes it, while the
	// mounted CAFile follows only when kubelet next syncs the volume.
	ExtraCAs func(ctx context.Context) []byte
	// ServerName, if set, is the name checked in every upload server's
	// certificate. Empty: the resolver's Endpoint.ServerName, else the URL's host.
	ServerName string
}

// NewUpstreamTransport returns a transport that presents the client
// certificate and verifies upload servers against the CA bundle. The key
// pair is re-read on each new connection, so rotated files take effect.
func NewUpstreamTransport(c UpstreamTLS) (*http.Transport, error) {
	// Re-read per connection: the bundle gains a rotated signer's CA.
	cas, err := pki.NewPoolReloader(c.CAFile)
	if err != nil {
		return nil, fmt.Errorf("the upload server CA bundle: %w", err)
	}
	if _, err := tls.LoadX509KeyPair(c.ClientCertFile, c.ClientKeyFile); err != nil {
		return nil, fmt.Errorf("loading the proxy's client certificate: %w", err)
	}
	base := &tls.Config{
		MinVersion: tls.VersionTLS12,
		// HTTP/1.1 only, for NewServer's reason; the transport would not
		// speak HTTP/2 over its own dialer anyway.
		NextProtos: []string{"http/1.1"},
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			pair, err := tls.LoadX509KeyPair(c.ClientCertFile, c.ClientKeyFile)
			if err != nil {
				return nil, fmt.Errorf("loading the proxy's client certificate: %w", err)
			}
			return &pair, nil
		},
	}
	dialer := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	return &http.Transport{
		DialTLSContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			host, _, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, err
			}
			cfg := base.Clone()
			cfg.RootCAs = cas.Pool()
			if c.ExtraCAs != nil {
				if extra := c.ExtraCAs(ctx); len(extra) > 0 {
					cfg.RootCAs = cfg.RootCAs.Clone()
					cfg.RootCAs.AppendCertsFromPEM(extra)
				}
			}
			up, _ := ctx.Value(ctxKey{}).(upstream)
			switch {
			case c.ServerName != "":
				cfg.ServerName = c.ServerName
			case up.serverName != "":
				cfg.ServerName = up.serverName
			default:
				cfg.ServerName = host
			}
			tcp, err := dialer.DialContext(ctx, network, addr)
			if err != nil {
				return nil, fmt.Errorf("connecting to upload server %s: %w", addr, err)
			}
			raw := &batchConn{Conn: tcp}
			conn := tls.Client(raw, cfg)
			if err := conn.HandshakeContext(ctx); err != nil {
				_ = tcp.Close()
				return nil, fmt.Errorf("TLS to upload server %s (verifying name %q): %w", addr, cfg.ServerName, err)
			}
			return &upstreamConn{Conn: conn, raw: raw}, nil
		},
		TLSHandshakeTimeout: 15 * time.Second,
		// One connection per upload: a pooled connection would keep the
		// name verified for a pod whose IP was since given to another pod.
		DisableKeepAlives:     true,
		ExpectContinueTimeout: time.Second,
		// The synchronous path answers only when the image is converted, which
		// can take many minutes: no response header timeout.
		ResponseHeaderTimeout: 0,
	}, nil
}

// NewServer wraps h in an http.Server tuned for long uploads: a bound on
// headers only, no read or write deadline on the body, and HTTP/1.1 only.
// Clients that offer HTTP/2 (Go's default transport, browsers) would
// otherwise get it, and Go's HTTP/2 server grants an upload a flow control
// window of 1 MiB: at most 1 MiB per round trip (20 MiB/s at 50 ms), where
// HTTP/1.1 gets TCP's window, which grows to several MiB. On loopback the
// two measured the same.
func NewServer(h http.Handler, tlsCfg *tls.Config) *http.Server {
	var protos http.Protocols
	protos.SetHTTP1(true)
	return &http.Server{
		Handler:           h,
		TLSConfig:         tlsCfg,
		Protocols:         &protos,
		ReadHeaderTimeout: 30 * time.Second,
		IdleTimeout:       5 * time.Minute,
		MaxHeaderBytes:    64 << 10,
	}
}

// Serve serves srv on ln with TLS until ctx ends, then shuts down, letting
// running uploads finish for up to grace.
func Serve(ctx context.Context, srv *http.Server, ln net.Listener, grace time.Duration) error {
	errc := make(chan error, 1)
	go func() { errc <- srv.ServeTLS(ln, "", "") }()
	select {
	case err := <-errc:
		return fmt.Errorf("upload proxy server: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("shutting down the upload proxy: %w", err)
	}
	return nil
}
