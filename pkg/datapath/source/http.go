package source

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/net/http/httpproxy"
)

// HTTPConfig configures an HTTP(S) source.
type HTTPConfig struct {
	URL string
	// CAPEM holds extra trusted CA certificates (PEM), added to the system pool.
	CAPEM []byte
	// InsecureSkipVerify disables TLS verification (CDI's INSECURE_TLS).
	InsecureSkipVerify bool
	// Username and Password enable basic auth. They are never logged.
	Username, Password string
	// Header holds extra request headers (extraHeaders and secretExtraHeaders).
	Header http.Header
	// Proxy settings; empty means no proxy. NoProxy is a comma list.
	HTTPProxy, HTTPSProxy, NoProxy string
	// ProxyCAPEM holds CA certificates for a TLS proxy.
	ProxyCAPEM []byte
	// Retries is how many times a failed or dropped request is retried
	// (default 8); Backoff is the first pause, doubled up to MaxBackoff.
	Retries             int
	Backoff, MaxBackoff time.Duration
	// Timeout bounds connection setup and waiting for response headers.
	Timeout time.Duration
	// IdleTimeout closes a connection on which no body bytes arrived for
	// that long; the download then resumes with a Range request. Default 60s.
	IdleTimeout time.Duration
}

// HTTP is an HTTP(S) source that resumes dropped downloads with Range
// requests and retries with exponential backoff.
type HTTP struct {
	cfg       HTTPConfig
	url       *url.URL
	client    *http.Client
	size      int64
	canRange  bool
	validator string // ETag or Last-Modified for If-Range
}

// NewHTTP validates cfg and builds the client.
func NewHTTP(cfg HTTPConfig) (*HTTP, error) {
	u, err := url.Parse(cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("invalid endpoint URL: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("invalid endpoint URL %q: scheme must be http or https", u.Redacted())
	}
	if u.User != nil && cfg.Username == "" {
		cfg.Username = u.User.Username()
		cfg.Password, _ = u.User.Password()
		u.User = nil
	}
	if cfg.Retries == 0 {
		cfg.Retries = 8
	}
	if cfg.Backoff == 0 {
		cfg.Backoff = 500 * time.Millisecond
	}
	if cfg.MaxBackoff == 0 {
		cfg.MaxBackoff = 30 * time.Second
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 60 * time.Second
	}
	if cfg.IdleTimeout == 0 {
		cfg.IdleTimeout = 60 * time.Second
	}
	tlsCfg := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: cfg.InsecureSkipVerify} //nolint:gosec // explicit user opt-in
	pool, err := x509.SystemCertPool()
	if err != nil || pool == nil {
		pool = x509.NewCertPool()
	}
	if len(cfg.CAPEM) > 0 && !pool.AppendCertsFromPEM(cfg.CAPEM) {
		return nil, errors.New("the custom CA bundle contains no valid PEM certificate")
	}
	if len(cfg.ProxyCAPEM) > 0 && !pool.AppendCertsFromPEM(cfg.ProxyCAPEM) {
		return nil, errors.New("the proxy CA bundle contains no valid PEM certificate")
	}
	tlsCfg.RootCAs = pool
	tr := &http.Transport{
		TLSClientConfig:       tlsCfg,
		TLSHandshakeTimeout:   cfg.Timeout,
		ResponseHeaderTimeout: cfg.Timeout,
		MaxIdleConnsPerHost:   4,
		IdleConnTimeout:       90 * time.Second,
		DisableCompression:    true, // we want the object's bytes, not a transfer encoding
		ReadBufferSize:        256 << 10,
	}
	if cfg.HTTPProxy != "" || cfg.HTTPSProxy != "" {
		pf := (&httpproxy.Config{HTTPProxy: cfg.HTTPProxy, HTTPSProxy: cfg.HTTPSProxy, NoProxy: cfg.NoProxy}).ProxyFunc()
		tr.Proxy = func(r *http.Request) (*url.URL, error) { return pf(r.URL) }
	}
	return &HTTP{cfg: cfg, url: u, client: &http.Client{Transport: tr}, size: -1}, nil
}

// LoadPEMDir concatenates every regular file in dir (Kubernetes ConfigMap
// and Secret mounts: dot-entries are skipped, symlinks followed).
func LoadPEMDir(dir string) ([]byte, error) {
	if dir == "" {
		return nil, nil
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("reading certificate directory: %w", err)
	}
	var out []byte
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			continue
		}
		p := filepath.Join(dir, e.Name())
		st, err := os.Stat(p)
		if err != nil || !st.Mode().IsRegular() || st.Size() > 4<<20 {
			continue
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("reading certificate %s: %w", p, err)
		}
		out = append(append(out, b...), '\n')
	}
	return out, nil
}

// String implements Source.
func (h *HTTP) String() string { return h.url.Redacted() }

// Size implements Source.
func (h *HTTP) Size() int64 { return h.size }

// CanRange implements Ranger.
func (h *HTTP) CanRange() bool { return h.canRange }

// Open implements Source: a GET of the whole object that resumes with Range
// requests when the connection drops.
func (h *HTTP) Open(ctx context.Context) (io.ReadCloser, error) {
	r := &resumable{h: h, ctx: ctx, end: -1}
	if err := r.connect(true); err != nil {
		return nil, err
	}
	return r, nil
}

// OpenRange implements Ranger.
func (h *HTTP) OpenRange(ctx context.Context, off, n int64) (io.ReadCloser, error) {
	if n <= 0 {
		return io.NopCloser(strings.NewReader("")), nil
	}
	r := &resumable{h: h, ctx: ctx, pos: off, end: off + n}
	if err := r.connect(false); err != nil {
		return nil, err
	}
	return r, nil
}

func (h *HTTP) newRequest(ctx context.Context) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, h.url.String(), nil)
	if err != nil {
		return nil, err
	}
	for k, vs := range h.cfg.Header {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	if h.cfg.Username != "" || h.cfg.Password != "" {
		req.SetBasicAuth(h.cfg.Username, h.cfg.Password)
	}
	req.Header.Set("Accept-Encoding", "identity")
	return req, nil
}

// StatusError is a failure that retrying the same request cannot fix
// now: an HTTP 4xx, or a server that breaks the Range protocol.
type StatusError struct {
	Code int // HTTP status, 0 for protocol violations
	Msg  string
}

func (e *StatusError) Error() string { return e.Msg }

// Permanent reports whether a later retry of the whole import is pointless
// (client errors such as 401, 403, 404, 416), as opposed to a server that
// may behave differently later.
func (e *StatusError) Permanent() bool {
	return e.Code >= 400 && e.Code < 500 && e.Code != http.StatusRequestTimeout && e.Code != http.StatusTooManyRequests
}

func describeStatus(u string, code int) error {
	msg := fmt.Sprintf("GET %s: HTTP %d %s", u, code, http.StatusText(code))
	switch code {
	case http.StatusUnauthorized, http.StatusForbidden:
		msg += " (check the credentials in the secret)"
	case http.StatusNotFound:
		msg += " (check the URL)"
	}
	return &StatusError{Code: code, Msg: msg}
}

// resumable reads [pos, end) (end -1 = to the object's end).
type resumable struct {
	h        *HTTP
	ctx      context.Context
	body     io.ReadCloser
	pos, end int64
	failures int
	lastErr  error
	idle     *time.Timer
	reading  atomic.Pointer[io.ReadCloser] // body being read, for the idle timer
	stalled  atomic.Bool
}

func (r *resumable) backoff() error {
	d := r.h.cfg.Backoff << min(r.failures-1, 20)
	d = min(d, r.h.cfg.MaxBackoff)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-r.ctx.Done():
		return r.ctx.Err()
	}
}

// connect issues the request for the remaining bytes, retrying transient
// failures with backoff.
func (r *resumable) connect(first bool) error {
	for {
		err := r.try(first)
		if err == nil {
			return nil
		}
		var se *StatusError
		if errors.As(err, &se) || r.ctx.Err() != nil {
			return err
		}
		r.failures++
		if r.failures > r.h.cfg.Retries {
			return fmt.Errorf("giving up after %d retries: %w", r.h.cfg.Retries, err)
		}
		if berr := r.backoff(); berr != nil {
			return berr
		}
	}
}

func (r *resumable) try(first bool) error {
	req, err := r.h.newRequest(r.ctx)
	if err != nil {
		return err
	}
	ranged := !first || r.pos > 0
	if ranged {
		if r.end > 0 {
			req.Header.Set("Range", fmt.Sprintf("bytes=%d-%d", r.pos, r.end-1))
		} else {
			req.Header.Set("Range", fmt.Sprintf("bytes=%d-", r.pos))
		}
		if r.h.validator != "" {
			req.Header.Set("If-Range", r.h.validator)
		}
	}
	resp, err := r.h.client.Do(req)
	if err != nil {
		return fmt.Errorf("GET %s: %w", r.h, err)
	}
	switch {
	case !ranged && resp.StatusCode == http.StatusOK:
		r.h.size = resp.ContentLength
		r.h.canRange = resp.Header.Get("Accept-Ranges") == "bytes" && resp.ContentLength >= 0
		if et := resp.Header.Get("ETag"); et != "" && !strings.HasPrefix(et, "W/") {
			r.h.validator = et
		} else if lm := resp.Header.Get("Last-Modified"); lm != "" {
			r.h.validator = lm
		}
		if r.h.size >= 0 {
			r.end = r.h.size
		}
	case ranged && resp.StatusCode == http.StatusPartialContent:
		start, total, perr := parseContentRange(resp.Header.Get("Content-Range"))
		if perr != nil || start != r.pos {
			resp.Body.Close()
			return &StatusError{Msg: fmt.Sprintf("GET %s: server answered the Range request for byte %d with %q", r.h, r.pos, resp.Header.Get("Content-Range"))}
		}
		if r.h.size >= 0 && total >= 0 && total != r.h.size {
			resp.Body.Close()
			return &StatusError{Msg: fmt.Sprintf("GET %s: object size changed from %d to %d bytes during the download", r.h, r.h.size, total)}
		}
		if r.h.size < 0 && total >= 0 {
			r.h.size = total
		}
		if r.end < 0 {
			r.end = r.h.size
		}
	case ranged && resp.StatusCode == http.StatusOK:
		resp.Body.Close()
		return &StatusError{Msg: fmt.Sprintf("GET %s: server ignored the Range request for byte %d or the object changed; cannot resume", r.h, r.pos)}
	case resp.StatusCode == http.StatusRequestedRangeNotSatisfiable:
		resp.Body.Close()
		return &StatusError{Code: resp.StatusCode, Msg: fmt.Sprintf("GET %s: server has no bytes at offset %d although it announced %d bytes (it lied about the Content-Length or the object shrank)", r.h, r.pos, r.h.size)}
	case resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusRequestTimeout:
		resp.Body.Close()
		return fmt.Errorf("GET %s: HTTP %d", r.h, resp.StatusCode)
	default:
		resp.Body.Close()
		return describeStatus(r.h.String(), resp.StatusCode)
	}
	r.body = resp.Body
	return nil
}

func parseContentRange(s string) (start, total int64, err error) {
	// bytes START-END/TOTAL
	s, ok := strings.CutPrefix(s, "bytes ")
	if !ok {
		return 0, 0, fmt.Errorf("bad Content-Range %q", s)
	}
	rng, tot, ok := strings.Cut(s, "/")
	if !ok {
		return 0, 0, fmt.Errorf("bad Content-Range %q", s)
	}
	a, _, ok := strings.Cut(rng, "-")
	if !ok {
		return 0, 0, fmt.Errorf("bad Content-Range %q", s)
	}
	if start, err = strconv.ParseInt(a, 10, 64); err != nil {
		return 0, 0, err
	}
	total = -1
	if tot != "*" {
		if total, err = strconv.ParseInt(tot, 10, 64); err != nil {
			return 0, 0, err
		}
	}
	return start, total, nil
}

// Read implements io.Reader, resuming after dropped connections.
func (r *resumable) Read(p []byte) (int, error) {
	for {
		if r.end >= 0 && r.pos >= r.end {
			return 0, io.EOF
		}
		if r.end >= 0 && int64(len(p)) > r.end-r.pos {
			p = p[:r.end-r.pos]
		}
		if r.body == nil {
			if err := r.connect(false); err != nil {
				return 0, fmt.Errorf("resuming at byte %d after %v: %w", r.pos, r.lastErr, err)
			}
		}
		n, err := r.readBody(p)
		r.pos += int64(n)
		if n > 0 {
			r.failures = 0
		}
		if err == nil {
			return n, nil
		}
		if err == io.EOF && (r.end < 0 || r.pos >= r.end) {
			return n, io.EOF
		}
		// The body ended early or failed.
		r.body.Close()
		r.body = nil
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		r.lastErr = err
		if cerr := r.ctx.Err(); cerr != nil {
			return n, cerr
		}
		if !r.h.canRange {
			return n, fmt.Errorf("download of %s broke at byte %d of %d and the server does not support Range requests, so it cannot resume: %w", r.h, r.pos, r.end, err)
		}
		r.failures++
		if r.failures > r.h.cfg.Retries {
			return n, fmt.Errorf("download of %s broke at byte %d of %d; giving up after %d retries: %w", r.h, r.pos, r.end, r.h.cfg.Retries, err)
		}
		if n > 0 {
			return n, nil
		}
		if berr := r.backoff(); berr != nil {
			return 0, berr
		}
	}
}

// readBody reads from the current body; a read that sees no data for
// IdleTimeout closes the body, which fails the read so Read resumes.
func (r *resumable) readBody(p []byte) (int, error) {
	body := r.body
	r.reading.Store(&body)
	if r.idle == nil {
		r.idle = time.AfterFunc(r.h.cfg.IdleTimeout, func() {
			if b := r.reading.Load(); b != nil && *b != nil {
				r.stalled.Store(true)
				(*b).Close()
			}
		})
	} else {
		r.idle.Reset(r.h.cfg.IdleTimeout)
	}
	n, err := r.body.Read(p)
	r.idle.Stop()
	r.reading.Store(nil)
	if r.stalled.Swap(false) {
		return n, fmt.Errorf("no data for %s: %w", r.h.cfg.IdleTimeout, io.ErrUnexpectedEOF)
	}
	return n, err
}

// Close implements io.Closer.
func (r *resumable) Close() error {
	if r.idle != nil {
		r.idle.Stop()
	}
	if r.body != nil {
		return r.body.Close()
	}
	return nil
}
