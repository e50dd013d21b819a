package uploadcli

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	uploadv1 "github.com/kubefill/kubefill-api/upload/v1beta1"
)

// fakeProxy is a loopback TLS server standing in for the upload proxy. Its
// answers follow a script; it records every request it sees.
type fakeProxy struct {
	*httptest.Server
	mu       sync.Mutex
	headOK   bool
	script   []int // status of successive POSTs; 200 once exhausted
	posts    []post
	wantBody []byte
}

type post struct {
	path, auth, contentType, expect string
	contentLength                   int64
	read                            int
	bodyOK                          bool
}

func newFakeProxy(t *testing.T, headOK bool, body []byte, script ...int) *fakeProxy {
	f := &fakeProxy{headOK: headOK, script: script, wantBody: body}
	f.Server = httptest.NewTLSServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.Close)
	return f
}

func (f *fakeProxy) serve(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r.Method == http.MethodHead {
		if f.headOK && r.URL.Path == "/v1beta1/upload-async" {
			w.WriteHeader(http.StatusOK)
		} else {
			w.WriteHeader(http.StatusNotFound)
		}
		return
	}
	p := post{path: r.URL.Path, auth: r.Header.Get("Authorization"), contentType: r.Header.Get("Content-Type"), expect: r.Header.Get("Expect"), contentLength: r.ContentLength}
	code := http.StatusOK
	if len(f.script) > 0 {
		code, f.script = f.script[0], f.script[1:]
	}
	if code != http.StatusOK {
		// Refuse before reading: with Expect: 100-continue the client sends nothing.
		f.posts = append(f.posts, p)
		http.Error(w, fmt.Sprintf("scripted %d", code), code)
		return
	}
	b, _ := io.ReadAll(r.Body)
	p.read, p.bodyOK = len(b), bytes.Equal(b, f.wantBody)
	f.posts = append(f.posts, p)
	fmt.Fprint(w, "upload complete")
}

type recordingProgress struct {
	starts []int64
	n      int64
	oks    []bool
}

func (p *recordingProgress) Start(total int64) { p.starts = append(p.starts, total); p.n = 0 }
func (p *recordingProgress) Wrap(r io.Reader) io.Reader {
	return readFunc(func(b []byte) (int, error) { n, err := r.Read(b); p.n += int64(n); return n, err })
}
func (p *recordingProgress) Finish(ok bool) { p.oks = append(p.oks, ok) }

type readFunc func([]byte) (int, error)

func (f readFunc) Read(b []byte) (int, error) { return f(b) }

func testFile(t *testing.T, size int) (string, []byte) {
	t.Helper()
	b := make([]byte, size)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "disk.img")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p, b
}

// caFile writes the test server's certificate as a CA bundle.
func caFile(t *testing.T, s *httptest.Server) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: s.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

type tokens struct {
	mu sync.Mutex
	n  int
}

func (tk *tokens) next(context.Context) (string, error) {
	tk.mu.Lock()
	defer tk.mu.Unlock()
	tk.n++
	return fmt.Sprintf("token-%d", tk.n), nil
}

func TestUploadSendsTheFile(t *testing.T) {
	file, body := testFile(t, 3<<20+17)
	for _, tc := range []struct {
		name     string
		headOK   bool
		wantPath string
	}{{"async probe answered", true, "/v1beta1/upload-async"}, {"sync fallback", false, "/v1beta1/upload"}} {
		t.Run(tc.name, func(t *testing.T) {
			fp := newFakeProxy(t, tc.headOK, body)
			hc, err := NewHTTPClient(false, caFile(t, fp.Server))
			if err != nil {
				t.Fatal(err)
			}
			prog := &recordingProgress{}
			tk := &tokens{}
			u := &Uploader{Client: hc, ProxyURL: fp.URL, Token: tk.next, Progress: prog}
			path := UploadPath(false, u.ProbeAsync(context.Background()))
			if path != tc.wantPath {
				t.Fatalf("path %s, want %s", path, tc.wantPath)
			}
			got, err := u.Upload(context.Background(), path, file)
			if err != nil || got != "upload complete" {
				t.Fatalf("Upload = %q, %v", got, err)
			}
			p := fp.posts[0]
			if len(fp.posts) != 1 || p.path != tc.wantPath || p.auth != "Bearer token-1" || p.contentType != "application/octet-stream" ||
				p.contentLength != int64(len(body)) || !p.bodyOK || p.expect != "100-continue" {
				t.Errorf("proxy saw %+v", fp.posts)
			}
			if len(prog.starts) != 1 || prog.starts[0] != int64(len(body)) || prog.n != int64(len(body)) || !prog.oks[0] {
				t.Errorf("progress saw starts %v, %d bytes, finishes %v", prog.starts, prog.n, prog.oks)
			}
		})
	}
}

func TestUploadRefreshesTokenAndRetries(t *testing.T) {
	file, body := testFile(t, 1<<20)
	fp := newFakeProxy(t, true, body, http.StatusUnauthorized, http.StatusServiceUnavailable, http.StatusBadGateway)
	hc, _ := NewHTTPClient(true, "")
	tk := &tokens{}
	var logs []string
	u := &Uploader{Client: hc, ProxyURL: fp.URL, Token: tk.next, Retry: 3, Backoff: 10 * time.Millisecond, Log: func(f string, a ...any) { logs = append(logs, fmt.Sprintf(f, a...)) }}
	if _, err := u.Upload(context.Background(), "/v1beta1/upload-async", file); err != nil {
		t.Fatalf("Upload: %v (log %q)", err, logs)
	}
	if len(fp.posts) != 4 {
		t.Fatalf("%d POSTs, want 4: %+v", len(fp.posts), fp.posts)
	}
	if fp.posts[0].auth != "Bearer token-1" || fp.posts[1].auth != "Bearer token-2" || fp.posts[3].auth != "Bearer token-2" || !fp.posts[3].bodyOK {
		t.Errorf("tokens and body: %+v", fp.posts)
	}
	for i, p := range fp.posts[:3] {
		if p.read != 0 {
			t.Errorf("refused POST %d read %d body bytes", i, p.read)
		}
	}
	t.Logf("log: %q", logs)

	// Out of retries: the last answer is the error, with the proxy's reason.
	fp2 := newFakeProxy(t, true, body, http.StatusServiceUnavailable, http.StatusServiceUnavailable)
	u.ProxyURL, u.Retry = fp2.URL, 1
	if _, err := u.Upload(context.Background(), "/v1beta1/upload", file); err == nil || !strings.Contains(err.Error(), "503") || !strings.Contains(err.Error(), "scripted 503") {
		t.Errorf("after retries: %v", err)
	}
	// 409 (already uploaded) and 400 are final.
	for _, code := range []int{http.StatusConflict, http.StatusBadRequest} {
		fp3 := newFakeProxy(t, true, body, code)
		u.ProxyURL, u.Retry = fp3.URL, 5
		if _, err := u.Upload(context.Background(), "/v1beta1/upload", file); err == nil || len(fp3.posts) != 1 {
			t.Errorf("%d: err %v after %d POSTs, want an error after 1", code, err, len(fp3.posts))
		}
	}
}

func TestProxyCertificateChecks(t *testing.T) {
	file, body := testFile(t, 4096)
	fp := newFakeProxy(t, true, body)
	strict, _ := NewHTTPClient(false, "")
	u := &Uploader{Client: strict, ProxyURL: fp.URL, Token: (&tokens{}).next}
	if _, err := u.Upload(context.Background(), "/v1beta1/upload", file); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("unknown proxy CA accepted: %v", err)
	}
	if _, err := NewHTTPClient(false, file); err == nil || !strings.Contains(err.Error(), "no PEM certificate") {
		t.Errorf("--ca-cert without PEM: %v", err)
	}
}

// TestUploadsGoAsHTTP1: the client does not negotiate HTTP/2 with a proxy
// that offers it.
func TestUploadsGoAsHTTP1(t *testing.T) {
	file, body := testFile(t, 4096)
	var mu sync.Mutex
	var proto string
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		proto = r.Proto
		mu.Unlock()
		_, _ = io.Copy(io.Discard, r.Body)
		fmt.Fprint(w, "ok")
	}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()
	// The server does speak HTTP/2 to a client that offers it.
	resp, err := srv.Client().Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.ProtoMajor != 2 {
		t.Fatalf("test server spoke %s, want HTTP/2", resp.Proto)
	}
	hc, err := NewHTTPClient(false, caFile(t, srv))
	if err != nil {
		t.Fatal(err)
	}
	u := &Uploader{Client: hc, ProxyURL: srv.URL, Token: (&tokens{}).next}
	if _, err := u.Upload(context.Background(), "/v1beta1/upload", file); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if proto != "HTTP/1.1" {
		t.Errorf("the upload of %d bytes went as %s, want HTTP/1.1", len(body), proto)
	}
}

func TestRequestToken(t *testing.T) {
	var got uploadv1.UploadTokenRequest
	var path, method string
	api := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		path, method = r.URL.Path, r.Method
		if err := json.NewDecoder(r.Body).Decode(&got); err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		out := got
		out.Name = out.GenerateName + "x7k2p"
		out.Status.Token = "signed.token.value"
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(out)
	}))
	defer api.Close()
	cfg := &rest.Config{Host: api.URL, TLSClientConfig: rest.TLSClientConfig{CAData: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: api.Certificate().Raw})}}
	tok, err := RequestToken(context.Background(), cfg, "vms", "disk")
	if err != nil || tok != "signed.token.value" {
		t.Fatalf("RequestToken = %q, %v", tok, err)
	}
	if method != http.MethodPost || path != "/apis/upload.cdi.kubevirt.io/v1beta1/namespaces/vms/uploadtokenrequests" ||
		got.GenerateName != TokenGenerateName || got.Spec.PvcName != "disk" || got.Kind != "UploadTokenRequest" || got.APIVersion != "upload.cdi.kubevirt.io/v1beta1" {
		t.Errorf("sent %s %s %+v", method, path, got)
	}

	denied := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusForbidden)
		fmt.Fprint(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"user \"bob\" cannot create uploadtokenrequests","reason":"Forbidden","code":403}`)
	}))
	defer denied.Close()
	cfg.Host, cfg.TLSClientConfig.CAData = denied.URL, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: denied.Certificate().Raw})
	if _, err := RequestToken(context.Background(), cfg, "vms", "disk"); err == nil || !strings.Contains(err.Error(), "cannot create uploadtokenrequests") {
		t.Errorf("denied: %v", err)
	}
}

func TestBarDrawsBytesRateAndETA(t *testing.T) {
	var out bytes.Buffer
	b := &Bar{W: &out}
	b.Start(8 << 20)
	r := b.Wrap(io.LimitReader(zeroReader{}, 8<<20))
	buf := make([]byte, 1<<20)
	for {
		if _, err := r.Read(buf); err != nil {
			break
		}
		time.Sleep(30 * time.Millisecond)
	}
	b.Finish(true)
	s := out.String()
	t.Logf("%q", s)
	if !strings.Contains(s, "uploading") || !strings.Contains(s, "8.0 MiB") || !strings.Contains(s, "100%") || !strings.Contains(s, "/s") {
		t.Errorf("progress output lacks description, total, percentage or rate: %q", s)
	}
}

type zeroReader struct{}

func (zeroReader) Read(b []byte) (int, error) { clear(b); return len(b), nil }
