package uploadcli

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"
)

// TokenFunc returns a fresh upload token; the uploader calls it again when
// the proxy answers 401 (the token expired while waiting).
type TokenFunc func(ctx context.Context) (string, error)

// Progress receives the bytes of one attempt as they are sent.
type Progress interface {
	// Start begins an attempt of total bytes.
	Start(total int64)
	// Wrap returns a reader that reports what is read through it.
	Wrap(r io.Reader) io.Reader
	// Finish ends an attempt; ok says whether the upload server accepted it.
	Finish(ok bool)
}

// Uploader sends one file to the upload proxy.
type Uploader struct {
	Client   *http.Client
	ProxyURL string
	Token    TokenFunc
	// Retry is how many more attempts follow a failed one (network errors,
	// 502, 503 and 401 with a fresh token).
	Retry int
	// Backoff is the pause before a retry; 2 s if zero.
	Backoff  time.Duration
	Progress Progress
	// Log receives one line per event (probe result, retries); nil discards.
	Log func(format string, args ...any)
}

// NewHTTPClient is the client for the proxy: the CA bundle from caFile, or
// no verification with insecure. No overall timeout: uploads take long.
// HTTP/1.1 only: over HTTP/2 an upload moves at most the server's flow
// control window (1 MiB for a Go server) per round trip.
func NewHTTPClient(insecure bool, caFile string) (*http.Client, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	switch {
	case insecure:
		cfg.InsecureSkipVerify = true //nolint:gosec // the user asked for --insecure
	case caFile != "":
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("reading --ca-cert: %w", err)
		}
		pool, err := x509.SystemCertPool()
		if err != nil || pool == nil {
			pool = x509.NewCertPool()
		}
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--ca-cert %s holds no PEM certificate", caFile)
		}
		cfg.RootCAs = pool
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = cfg
	tr.ResponseHeaderTimeout = 0
	var protos http.Protocols
	protos.SetHTTP1(true)
	tr.Protocols = &protos
	return &http.Client{Transport: tr}, nil
}

// StatusError is a non-2xx answer of the proxy.
type StatusError struct {
	Code int
	Body string
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("upload proxy answered %d %s: %s", e.Code, http.StatusText(e.Code), e.Body)
}

func retryable(err error) bool {
	var se *StatusError
	if errors.As(err, &se) {
		return se.Code == http.StatusUnauthorized || se.Code == http.StatusBadGateway || se.Code == http.StatusServiceUnavailable || se.Code == http.StatusGatewayTimeout
	}
	return !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded)
}

func (u *Uploader) logf(format string, args ...any) {
	if u.Log != nil {
		u.Log(format, args...)
	}
}

// ProbeAsync asks the proxy whether it serves the async path (HEAD 200).
func (u *Uploader) ProbeAsync(ctx context.Context) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodHead, u.ProxyURL+"/v1beta1/upload-async", nil)
	if err != nil {
		return false
	}
	resp, err := u.Client.Do(req)
	if err != nil {
		u.logf("probing %s/v1beta1/upload-async: %v; using the synchronous path", u.ProxyURL, err)
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// Upload sends file to path, fetching a token first and again after a 401,
// retrying transient failures; it returns the proxy's final answer body.
func (u *Uploader) Upload(ctx context.Context, path, file string) (string, error) {
	backoff := u.Backoff
	if backoff <= 0 {
		backoff = 2 * time.Second
	}
	tok, err := u.Token(ctx)
	if err != nil {
		return "", fmt.Errorf("getting an upload token: %w", err)
	}
	for attempt := 0; ; attempt++ {
		body, err := u.once(ctx, path, file, tok)
		if err == nil {
			return body, nil
		}
		if attempt >= u.Retry || !retryable(err) {
			return "", err
		}
		var se *StatusError
		if errors.As(err, &se) && se.Code == http.StatusUnauthorized {
			u.logf("the proxy refused the token (%s); requesting a new one", strings.TrimSpace(se.Body))
			if tok, err = u.Token(ctx); err != nil {
				return "", fmt.Errorf("refreshing the upload token: %w", err)
			}
		} else {
			u.logf("attempt %d of %d failed: %v; retrying in %s", attempt+1, u.Retry+1, err, backoff)
			select {
			case <-ctx.Done():
				return "", ctx.Err()
			case <-time.After(backoff):
			}
		}
	}
}

func (u *Uploader) once(ctx context.Context, path, file, tok string) (string, error) {
	f, err := os.Open(file)
	if err != nil {
		return "", fmt.Errorf("opening %s: %w", file, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", fmt.Errorf("reading %s: %w", file, err)
	}
	var body io.Reader = f
	if u.Progress != nil {
		u.Progress.Start(fi.Size())
		body = u.Progress.Wrap(f)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.ProxyURL+path, body)
	if err != nil {
		return "", err
	}
	// Keep the body from being sniffed as *os.File: Content-Length is set here.
	req.ContentLength = fi.Size()
	req.Header.Set("Content-Type", "application/octet-stream")
	req.Header.Set("Authorization", "Bearer "+tok)
	// A refusal (401 for an expired token, 409, 503) comes before any byte is sent.
	req.Header.Set("Expect", "100-continue")
	resp, err := u.Client.Do(req)
	if err != nil {
		if u.Progress != nil {
			u.Progress.Finish(false)
		}
		return "", fmt.Errorf("sending %s to %s: %w", file, u.ProxyURL+path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	ok := resp.StatusCode/100 == 2
	if u.Progress != nil {
		u.Progress.Finish(ok)
	}
	if !ok {
		return "", &StatusError{Code: resp.StatusCode, Body: strings.TrimSpace(string(b))}
	}
	return strings.TrimSpace(string(b)), nil
}
