package source

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestParseContentRange(t *testing.T) {
	for _, c := range []struct {
		in           string
		start, total int64
		bad          bool
	}{
		{in: "bytes 0-99/1000", start: 0, total: 1000},
		{in: "bytes 500-999/1000", start: 500, total: 1000},
		{in: "bytes 5-9/*", start: 5, total: -1},
		{in: "bytes */1000", bad: true},
		{in: "items 0-1/2", bad: true},
		{in: "bytes x-1/2", bad: true},
		{in: "", bad: true},
	} {
		s, tot, err := parseContentRange(c.in)
		if (err != nil) != c.bad || (!c.bad && (s != c.start || tot != c.total)) {
			t.Errorf("parseContentRange(%q) = %d %d %v", c.in, s, tot, err)
		}
	}
}

func TestNewHTTPValidation(t *testing.T) {
	for _, u := range []string{"ftp://x/y", "://", "file:///etc/passwd"} {
		if _, err := NewHTTP(HTTPConfig{URL: u}); err == nil {
			t.Errorf("%q accepted", u)
		}
	}
	if _, err := NewHTTP(HTTPConfig{URL: "https://x/y", CAPEM: []byte("not pem")}); err == nil {
		t.Error("bad CA accepted")
	}
	// Credentials in the URL move to basic auth and never show in String().
	h, err := NewHTTP(HTTPConfig{URL: "https://user:pw@host/disk.img"})
	if err != nil || strings.Contains(h.String(), "pw") || h.cfg.Username != "user" || h.cfg.Password != "pw" {
		t.Fatalf("%v %s", err, h)
	}
}

func serveFile(t *testing.T, body []byte) http.Handler {
	p := filepath.Join(t.TempDir(), "disk.img")
	if err := os.WriteFile(p, body, 0o600); err != nil {
		t.Fatal(err)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.ServeFile(w, r, p)
	})
}

func TestRedirectAndRanges(t *testing.T) {
	body := []byte(strings.Repeat("0123456789", 10000))
	files := httptest.NewServer(serveFile(t, body))
	defer files.Close()
	redirect := httptest.NewServer(http.RedirectHandler(files.URL+"/disk.img", http.StatusFound))
	defer redirect.Close()
	h, err := NewHTTP(HTTPConfig{URL: redirect.URL + "/x"})
	if err != nil {
		t.Fatal(err)
	}
	rc, err := h.Open(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || string(got) != string(body) || h.Size() != int64(len(body)) || !h.CanRange() {
		t.Fatalf("redirected GET: %v size %d range %v", err, h.Size(), h.CanRange())
	}
	ra := ReaderAt(context.Background(), h)
	buf := make([]byte, 7)
	if _, err := ra.ReadAt(buf, 12345); err != nil || string(buf) != "5678901" {
		t.Fatalf("ReadAt: %q %v", buf, err)
	}
	if n, err := ra.ReadAt(buf, int64(len(body))-3); n != 3 || err != io.EOF {
		t.Fatalf("ReadAt at the end: %d %v", n, err)
	}
}

// The proxy is a loopback server that answers absolute-form requests for a
// host name that does not resolve; no_proxy for that host must bypass it.
func TestProxyAndNoProxy(t *testing.T) {
	body := []byte("through the proxy")
	var proxied int
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Host != "images.invalid" {
			http.Error(w, "unexpected host", http.StatusBadGateway)
			return
		}
		proxied++
		w.Write(body)
	}))
	defer proxy.Close()
	h, err := NewHTTP(HTTPConfig{URL: "http://images.invalid/disk.img", HTTPProxy: proxy.URL, Retries: 1, Backoff: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	rc, err := h.Open(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(rc)
	rc.Close()
	if string(got) != string(body) || proxied != 1 {
		t.Fatalf("via proxy: %q (%d proxied)", got, proxied)
	}
	h, _ = NewHTTP(HTTPConfig{URL: "http://images.invalid/disk.img", HTTPProxy: proxy.URL, NoProxy: "images.invalid", Retries: 1, Backoff: time.Millisecond})
	if _, err := h.Open(context.Background()); err == nil || proxied != 1 {
		t.Fatalf("no_proxy host went through the proxy: %v (%d proxied)", err, proxied)
	}
}

func TestServerErrorsRetriedThenClear(t *testing.T) {
	calls := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls++
		if calls < 3 {
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return
		}
		http.NotFound(w, r)
	}))
	defer srv.Close()
	h, _ := NewHTTP(HTTPConfig{URL: srv.URL + "/disk.img", Retries: 5, Backoff: time.Millisecond})
	_, err := h.Open(context.Background())
	if err == nil || !strings.Contains(err.Error(), "404") || calls != 3 {
		t.Fatalf("err %v after %d calls", err, calls)
	}
}

// A server that stops sending mid-body (without closing) is detected by
// the idle timeout and the download resumes with a Range request.
func TestStalledDownloadResumes(t *testing.T) {
	body := []byte(strings.Repeat("abcdefghij", 100000))
	p := filepath.Join(t.TempDir(), "disk.img")
	os.WriteFile(p, body, 0o600)
	var first atomic.Bool
	first.Store(true)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Range") == "" && first.Swap(false) {
			w.Header().Set("Accept-Ranges", "bytes")
			w.Header().Set("Content-Length", strconv.Itoa(len(body)))
			w.Write(body[:300000])
			w.(http.Flusher).Flush()
			<-r.Context().Done() // stall until the client gives up
			return
		}
		http.ServeFile(w, r, p)
	}))
	defer srv.Close()
	h, err := NewHTTP(HTTPConfig{URL: srv.URL + "/disk.img", IdleTimeout: 200 * time.Millisecond, Backoff: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	rc, err := h.Open(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	got, err := io.ReadAll(rc)
	if err != nil || string(got) != string(body) {
		t.Fatalf("read %d bytes, err %v", len(got), err)
	}
}

// Cancelling the context stops a download at once, however it is stuck:
// a Read blocked on a body that sends nothing (long before the idle
// timeout would fire), or a retry loop waiting out its backoff. Nothing is
// retried after the cancel.
func TestCancelStopsPromptly(t *testing.T) {
	const bound = 5 * time.Second // generous: the point is "not the idle timeout or backoff"
	t.Run("blocked read", func(t *testing.T) {
		var requests atomic.Int32
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			requests.Add(1)
			w.Header().Set("Accept-Ranges", "bytes")
			w.Header().Set("Content-Length", "1000000")
			w.Write(make([]byte, 1000))
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		}))
		defer srv.Close()
		h, err := NewHTTP(HTTPConfig{URL: srv.URL + "/disk.img", IdleTimeout: time.Hour, Backoff: time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		rc, err := h.Open(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer rc.Close()
		if _, err := io.ReadFull(rc, make([]byte, 1000)); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			_, err := rc.Read(make([]byte, 1000)) // blocks: the server sends nothing more
			done <- err
		}()
		time.Sleep(100 * time.Millisecond)
		cancel()
		select {
		case err := <-done:
			if !errors.Is(err, context.Canceled) {
				t.Errorf("Read returned %v, want a context error", err)
			}
		case <-time.After(bound):
			t.Fatalf("Read still blocked %s after the cancel", bound)
		}
		if n := requests.Load(); n != 1 {
			t.Errorf("%d requests: the download was resumed after the cancel", n)
		}
	})
	t.Run("backoff", func(t *testing.T) {
		var requests atomic.Int32
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			requests.Add(1)
			http.Error(w, "busy", http.StatusServiceUnavailable)
		}))
		defer srv.Close()
		h, err := NewHTTP(HTTPConfig{URL: srv.URL + "/disk.img", Retries: 100, Backoff: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(100*time.Millisecond, cancel)
		done := make(chan error, 1)
		go func() {
			_, err := h.Open(ctx)
			done <- err
		}()
		select {
		case err := <-done:
			if !errors.Is(err, context.Canceled) {
				t.Errorf("Open returned %v, want a context error", err)
			}
		case <-time.After(bound):
			t.Fatalf("Open still backing off %s after the cancel", bound)
		}
		if n := requests.Load(); n != 1 {
			t.Errorf("%d requests, want 1", n)
		}
	})
}
