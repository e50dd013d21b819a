package uploadproxy

import (
	"context"
	"crypto/rsa"
	"crypto/tls"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"github.com/go-logr/logr"

	"github.com/kubefill/kubefill/pkg/token"
)

const (
	testNS    = "vms"
	testPVC   = "disk"
	testPrime = "prime-1234"
)

// uploadServer stands in for the upload pod: mTLS, counts what it receives.
type uploadServer struct {
	*httptest.Server
	requests  atomic.Int64
	received  atomic.Int64
	mu        sync.Mutex
	lastPath  string
	lastAuth  string
	lastCT    string
	lastProto string
}

func (u *uploadServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	u.requests.Add(1)
	u.mu.Lock()
	u.lastPath, u.lastAuth, u.lastCT, u.lastProto = r.URL.Path, r.Header.Get("Authorization"), r.Header.Get("Content-Type"), r.Proto
	u.mu.Unlock()
	buf := make([]byte, 64<<10)
	var n int64
	for {
		m, err := r.Body.Read(buf)
		n += int64(m)
		u.received.Add(int64(m))
		if err == io.EOF {
			break
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
	}
	// An upload server that sets its own CORS header must not produce a duplicate.
	w.Header().Set("Access-Control-Allow-Origin", "https://upstream.example")
	fmt.Fprintf(w, "received %d bytes", n)
}

// staticResolver is a Resolver over a fixed table, recording what it was asked.
type staticResolver struct {
	mu      sync.Mutex
	targets map[string]Endpoint
	errs    map[string]error
	asked   []string
}

func (s *staticResolver) Resolve(_ context.Context, ns, name string) (Endpoint, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	key := ns + "/" + name
	s.asked = append(s.asked, key)
	if err := s.errs[key]; err != nil {
		return Endpoint{}, err
	}
	ep, ok := s.targets[key]
	if !ok {
		return Endpoint{}, statusErrorf(http.StatusNotFound, "PersistentVolumeClaim %s not found", key)
	}
	return ep, nil
}

type rig struct {
	upstream *uploadServer
	resolver *staticResolver
	proxy    *proxyServer
	key      *rsa.PrivateKey
	gen      token.Generator
	clientCA *testCA
	serverCA *testCA
}

func newRig(t *testing.T) *rig {
	t.Helper()
	r := &rig{serverCA: newTestCA(t, "upload-server-ca"), clientCA: newTestCA(t, "upload-client-ca")}
	r.upstream = r.startUploadServer(t, false)

	r.resolver = &staticResolver{targets: map[string]Endpoint{
		testNS + "/" + testPVC: {URL: r.upstream.URL, ServerName: ServiceHost(testNS, testPrime)},
	}, errs: map[string]error{}}
	tr := r.transport(t, r.clientCA)
	var err error
	r.key, err = token.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	r.gen = token.NewGenerator(token.UploadTokenIssuer, r.key, time.Minute)
	h, err := NewHandler(Options{
		Validator: token.NewValidator(token.UploadTokenIssuer, &r.key.PublicKey, 5*time.Second),
		Resolver:  r.resolver,
		Transport: tr,
		Log:       logr.Discard(),
	})
	if err != nil {
		t.Fatal(err)
	}
	r.proxy = serveProxy(t, h)
	return r
}

// proxyServer is the proxy served as run.go serves it (NewServer, Serve),
// so that tests see its real protocol and timeout settings.
type proxyServer struct {
	URL    string
	client *http.Client
}

// Client is a client of the proxy set up like kubefill upload's: Go's
// default transport, which offers HTTP/2.
func (p *proxyServer) Client() *http.Client { return p.client }

func serveProxy(t *testing.T, h http.Handler) *proxyServer {
	t.Helper()
	ca := newTestCA(t, "upload-proxy-ca")
	srv := NewServer(h, &tls.Config{Certificates: []tls.Certificate{ca.tlsCert(t, "kubefill-uploadproxy", []string{"127.0.0.1"}, false)}})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- Serve(ctx, srv, ln, 5*time.Second) }()
	c := &http.Client{Transport: defaultishTransport(&tls.Config{RootCAs: ca.pool()})}
	t.Cleanup(func() {
		c.CloseIdleConnections()
		cancel()
		if err := <-errc; err != nil {
			t.Errorf("serving the proxy: %v", err)
		}
	})
	return &proxyServer{URL: "https://" + ln.Addr().String(), client: c}
}

// defaultishTransport is Go's default transport with cfg, as kubefill upload
// and most Go clients build theirs.
func defaultishTransport(cfg *tls.Config) *http.Transport {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = cfg
	return tr
}

// startUploadServer starts an upload server with the rig's certificates,
// offering HTTP/2 too if http2.
func (r *rig) startUploadServer(t *testing.T, http2 bool) *uploadServer {
	u := &uploadServer{}
	u.Server = httptest.NewUnstartedServer(u)
	u.EnableHTTP2 = http2
	u.TLS = &tls.Config{
		Certificates: []tls.Certificate{r.serverCA.tlsCert(t, "cdi-upload-"+testPrime, []string{ServiceHost(testNS, testPrime)}, false)},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    r.clientCA.pool(),
	}
	u.StartTLS()
	t.Cleanup(u.Close)
	return u
}

// transport builds the proxy's upstream transport with a client certificate from ca.
func (r *rig) transport(t *testing.T, ca *testCA) *http.Transport {
	dir := t.TempDir()
	c, k := ca.issue(t, "kubefill-uploadproxy", nil, true)
	tr, err := NewUpstreamTransport(UpstreamTLS{
		ClientCertFile: writeTestFile(t, dir, "tls.crt", c),
		ClientKeyFile:  writeTestFile(t, dir, "tls.key", k),
		CAFile:         writeTestFile(t, dir, "ca.crt", r.serverCA.pem),
	})
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

func (r *rig) token(t *testing.T, p *token.Payload) string {
	t.Helper()
	s, err := r.gen.Generate(p)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// signRaw signs payload and claims as given, to build tokens the generator refuses to make.
func signRaw(t *testing.T, key *rsa.PrivateKey, p *token.Payload, c jwt.Claims) string {
	t.Helper()
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.PS256, Key: key}, (&jose.SignerOptions{}).WithType("JWT"))
	if err != nil {
		t.Fatal(err)
	}
	s, err := jwt.Signed(signer).Claims(p).Claims(c).Serialize()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func (r *rig) do(t *testing.T, method, path, auth string, body io.Reader, hdr map[string]string) (int, string, http.Header) {
	t.Helper()
	req, err := http.NewRequest(method, r.proxy.URL+path, body)
	if err != nil {
		t.Fatal(err)
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := r.proxy.Client().Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header
}

func TestTokenChecks(t *testing.T) {
	r := newRig(t)
	other, err := token.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	valid := token.NewUploadPayload(testNS, testPVC)
	tests := []struct {
		name     string
		auth     string
		wantCode int
		wantBody string
	}{
		{"no header", "", 401, "missing the Authorization: Bearer"},
		{"basic auth", "Basic dXNlcjpwYXNz", 401, "must be \"Bearer <token>\""},
		{"garbage", "Bearer not-a-token", 401, "malformed"},
		{"forged: signed by another key", "Bearer " + generate(t, token.NewGenerator(token.UploadTokenIssuer, other, time.Minute), valid), 401, "signature"},
		{"tampered payload", "Bearer " + tamper(t, r.token(t, valid)), 401, "signature"},
		{"expired", "Bearer " + signRaw(t, r.key, valid, jwt.Claims{Issuer: token.UploadTokenIssuer, IssuedAt: jwt.NewNumericDate(now.Add(-10 * time.Minute)), NotBefore: jwt.NewNumericDate(now.Add(-10 * time.Minute)), Expiry: jwt.NewNumericDate(now.Add(-5 * time.Minute))}), 401, "expired"},
		{"not yet valid", "Bearer " + signRaw(t, r.key, valid, jwt.Claims{Issuer: token.UploadTokenIssuer, IssuedAt: jwt.NewNumericDate(now), NotBefore: jwt.NewNumericDate(now.Add(5 * time.Minute)), Expiry: jwt.NewNumericDate(now.Add(10 * time.Minute))}), 401, "not valid yet"},
		{"no exp", "Bearer " + signRaw(t, r.key, valid, jwt.Claims{Issuer: token.UploadTokenIssuer, IssuedAt: jwt.NewNumericDate(now), NotBefore: jwt.NewNumericDate(now)}), 401, "exp, nbf and iat"},
		{"wrong issuer", "Bearer " + signRaw(t, r.key, valid, jwt.Claims{Issuer: "someone", IssuedAt: jwt.NewNumericDate(now), NotBefore: jwt.NewNumericDate(now), Expiry: jwt.NewNumericDate(now.Add(time.Minute))}), 401, "issuer"},
		{"clone token", "Bearer " + r.token(t, token.NewClonePayload(token.ResourcePVC, testNS, testPVC, testNS, "target")), 401, "operation is \"Clone\""},
		{"snapshot resource", "Bearer " + r.token(t, &token.Payload{Operation: token.OperationUpload, Namespace: testNS, Name: testPVC, Resource: token.ResourceVolumeSnapshot}), 401, "resource is"},
		{"no claim name", "Bearer " + r.token(t, &token.Payload{Operation: token.OperationUpload, Namespace: testNS, Resource: token.ResourcePVC}), 401, "name is"},
		{"valid", "Bearer " + r.token(t, valid), 200, "received 5 bytes"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := r.upstream.requests.Load()
			code, body, _ := r.do(t, http.MethodPost, PathUpload, tc.auth, strings.NewReader("hello"), nil)
			if code != tc.wantCode || !strings.Contains(body, tc.wantBody) {
				t.Fatalf("got %d %q, want %d containing %q", code, body, tc.wantCode, tc.wantBody)
			}
			reached := r.upstream.requests.Load() - before
			if tc.wantCode == 401 && reached != 0 {
				t.Errorf("a refused upload reached the upload server")
			}
			if tc.wantCode == 200 && reached != 1 {
				t.Errorf("upload server saw %d requests, want 1", reached)
			}
			t.Logf("%d %s", code, strings.TrimSpace(body))
		})
	}
	r.upstream.mu.Lock()
	defer r.upstream.mu.Unlock()
	if r.upstream.lastAuth != "" {
		t.Errorf("the token was forwarded to the upload server: %q", r.upstream.lastAuth)
	}
}

func generate(t *testing.T, g token.Generator, p *token.Payload) string {
	t.Helper()
	s, err := g.Generate(p)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// tamper rewrites the payload of a signed token to name another claim, keeping the signature.
func tamper(t *testing.T, tok string) string {
	t.Helper()
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		t.Fatalf("token has %d parts", len(parts))
	}
	raw, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	changed := strings.Replace(string(raw), `"name":"`+testPVC+`"`, `"name":"victim"`, 1)
	if changed == string(raw) {
		t.Fatalf("payload %s does not name %s", raw, testPVC)
	}
	parts[1] = base64.RawURLEncoding.EncodeToString([]byte(changed))
	return strings.Join(parts, ".")
}

func TestTokenPicksTheClaim(t *testing.T) {
	r := newRig(t)
	r.resolver.errs[testNS+"/done"] = statusErrorf(http.StatusConflict, "PersistentVolumeClaim vms/done has already received its upload")
	for _, tc := range []struct {
		pvc      string
		wantCode int
		wantBody string
	}{
		{testPVC, 200, "received 4 bytes"},
		{"other", 404, "vms/other not found"},
		{"done", 409, "already received its upload"},
	} {
		r.resolver.asked = nil
		code, body, _ := r.do(t, http.MethodPost, PathUploadAsync, "Bearer "+r.token(t, token.NewUploadPayload(testNS, tc.pvc)), strings.NewReader("data"), nil)
		if code != tc.wantCode || !strings.Contains(body, tc.wantBody) {
			t.Errorf("token for %s: got %d %q, want %d containing %q", tc.pvc, code, body, tc.wantCode, tc.wantBody)
		}
		if len(r.resolver.asked) != 1 || r.resolver.asked[0] != testNS+"/"+tc.pvc {
			t.Errorf("token for %s resolved %v", tc.pvc, r.resolver.asked)
		}
	}
}

func TestEveryUploadPathIsForwarded(t *testing.T) {
	r := newRig(t)
	tok := "Bearer " + r.token(t, token.NewUploadPayload(testNS, testPVC))
	for _, p := range UploadPaths {
		code, body, _ := r.do(t, http.MethodPost, p+"?x=1", tok, strings.NewReader("abc"), map[string]string{"Content-Type": "application/octet-stream"})
		if code != 200 || body != "received 3 bytes" {
			t.Errorf("POST %s: %d %q", p, code, body)
		}
		r.upstream.mu.Lock()
		if r.upstream.lastPath != p || r.upstream.lastCT != "application/octet-stream" {
			t.Errorf("POST %s arrived as %s with Content-Type %q", p, r.upstream.lastPath, r.upstream.lastCT)
		}
		r.upstream.mu.Unlock()
	}
	if code, _, _ := r.do(t, http.MethodGet, PathUpload, tok, nil, nil); code != http.StatusMethodNotAllowed {
		t.Errorf("GET %s: %d, want 405", PathUpload, code)
	}
	if code, _, _ := r.do(t, http.MethodPost, "/v1beta1/elsewhere", tok, strings.NewReader("x"), nil); code != http.StatusNotFound {
		t.Errorf("POST to an unknown path: %d, want 404", code)
	}
}

func TestProbesAndCORS(t *testing.T) {
	r := newRig(t)
	before := r.upstream.requests.Load()
	for _, p := range []string{PathUploadAsync, "/v1alpha1/upload-async", PathUploadFormAsync} {
		if code, _, _ := r.do(t, http.MethodHead, p, "", nil, nil); code != 200 {
			t.Errorf("HEAD %s: %d, want 200", p, code)
		}
	}
	if code, _, _ := r.do(t, http.MethodHead, PathUpload, "", nil, nil); code != http.StatusMethodNotAllowed {
		t.Errorf("HEAD %s: %d, want 405", PathUpload, code)
	}
	if code, body, _ := r.do(t, http.MethodGet, PathHealthz, "", nil, nil); code != 200 || body != "ok" {
		t.Errorf("GET /healthz: %d %q", code, body)
	}
	// A browser's preflight carries no token.
	code, _, h := r.do(t, http.MethodOptions, PathUploadFormAsync, "", nil, map[string]string{
		"Origin": "https://console.example", "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization,content-type",
	})
	if code != http.StatusNoContent {
		t.Errorf("preflight: %d, want 204", code)
	}
	if h.Get("Access-Control-Allow-Origin") != "*" || !strings.Contains(h.Get("Access-Control-Allow-Methods"), "POST") ||
		!strings.Contains(h.Get("Access-Control-Allow-Headers"), "Authorization") {
		t.Errorf("preflight CORS headers: %v", h)
	}
	if n := r.upstream.requests.Load() - before; n != 0 {
		t.Errorf("probes and preflight reached the upload server %d times", n)
	}
	// The actual upload answers with one Allow-Origin, the proxy's, even if the upload server sets its own.
	_, _, h = r.do(t, http.MethodPost, PathUploadFormAsync, "Bearer "+r.token(t, token.NewUploadPayload(testNS, testPVC)), strings.NewReader("x"), map[string]string{"Origin": "https://console.example"})
	if got := h.Values("Access-Control-Allow-Origin"); len(got) != 1 || got[0] != "*" {
		t.Errorf("Access-Control-Allow-Origin on a proxied upload: %q", got)
	}
	// Refusals carry CORS headers too, so that the browser can show the reason.
	_, _, h = r.do(t, http.MethodPost, PathUpload, "", strings.NewReader("x"), map[string]string{"Origin": "https://console.example"})
	if h.Get("Access-Control-Allow-Origin") != "*" {
		t.Errorf("a 401 lacks CORS headers: %v", h)
	}
}

func TestUpstreamMutualTLS(t *testing.T) {
	r := newRig(t)
	tok := "Bearer " + r.token(t, token.NewUploadPayload(testNS, testPVC))

	// The proxy verifies the upload server's certificate for the Service's name.
	r.resolver.targets[testNS+"/"+testPVC] = Endpoint{URL: r.upstream.URL, ServerName: ServiceHost(testNS, "some-other-prime")}
	code, body, _ := r.do(t, http.MethodPost, PathUpload, tok, strings.NewReader("x"), nil)
	if code != http.StatusBadGateway || !strings.Contains(body, "cdi-upload-some-other-prime.vms.svc") {
		t.Errorf("upload server with a certificate for another name: %d %q", code, body)
	}

	// The upload server refuses a proxy whose client certificate it does not trust.
	r.resolver.targets[testNS+"/"+testPVC] = Endpoint{URL: r.upstream.URL, ServerName: ServiceHost(testNS, testPrime)}
	stranger := newTestCA(t, "stranger")
	h, err := NewHandler(Options{
		Validator: token.NewValidator(token.UploadTokenIssuer, &r.key.PublicKey, 0),
		Resolver:  r.resolver, Transport: r.transport(t, stranger), Log: logr.Discard(),
	})
	if err != nil {
		t.Fatal(err)
	}
	bad := httptest.NewTLSServer(h)
	defer bad.Close()
	req, _ := http.NewRequest(http.MethodPost, bad.URL+PathUpload, strings.NewReader("x"))
	req.Header.Set("Authorization", tok)
	resp, err := bad.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadGateway {
		t.Errorf("proxy with an untrusted client certificate: %d %q, want 502", resp.StatusCode, b)
	}
	t.Logf("untrusted client certificate: %d %s", resp.StatusCode, strings.TrimSpace(string(b)))
}

// TestUploadsGoAsHTTP1: a client that offers HTTP/2 (Go's default
// transport, as kubefill upload's) gets HTTP/1.1 from the proxy, and the
// proxy uses HTTP/1.1 to an upload server that offers HTTP/2: HTTP/2's
// flow control window bounds an upload to 1 MiB per round trip.
func TestUploadsGoAsHTTP1(t *testing.T) {
	r := newRig(t)
	up := r.startUploadServer(t, true)
	r.resolver.targets[testNS+"/"+testPVC] = Endpoint{URL: up.URL, ServerName: ServiceHost(testNS, testPrime)}

	// The checks below mean something: both ends do speak HTTP/2 to a peer that offers it.
	direct := &http.Client{Transport: defaultishTransport(&tls.Config{
		RootCAs: r.serverCA.pool(), ServerName: ServiceHost(testNS, testPrime),
		Certificates: []tls.Certificate{r.clientCA.tlsCert(t, "direct", nil, true)},
	})}
	resp, err := direct.Post(up.URL+PathUpload, "application/octet-stream", strings.NewReader("abc"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.ProtoMajor != 2 {
		t.Fatalf("the test's client and upload server spoke %s to each other, want HTTP/2", resp.Proto)
	}

	req, _ := http.NewRequest(http.MethodPost, r.proxy.URL+PathUpload, strings.NewReader("abc"))
	req.Header.Set("Authorization", "Bearer "+r.token(t, token.NewUploadPayload(testNS, testPVC)))
	resp, err = r.proxy.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != "received 3 bytes" {
		t.Fatalf("upload through the proxy: %d %q", resp.StatusCode, b)
	}
	if resp.Proto != "HTTP/1.1" {
		t.Errorf("the proxy answered a client offering HTTP/2 with %s, want HTTP/1.1", resp.Proto)
	}
	up.mu.Lock()
	defer up.mu.Unlock()
	if up.lastProto != "HTTP/1.1" {
		t.Errorf("the proxy sent the upload to the upload server with %s, want HTTP/1.1", up.lastProto)
	}
}

// TestStreamsWithoutBuffering sends a body the proxy could not hold: the first
// MiB must reach the upload server before the client sends the second, and the
// heap stays small while 256 MiB go through.
func TestStreamsWithoutBuffering(t *testing.T) {
	r := newRig(t)
	const chunk = 1 << 20
	total := int64(256 << 20)
	if testing.Short() {
		total = 32 << 20
	}
	pr, pw := io.Pipe()
	req, _ := http.NewRequest(http.MethodPost, r.proxy.URL+PathUploadAsync, pr)
	req.ContentLength = total
	req.Header.Set("Authorization", "Bearer "+r.token(t, token.NewUploadPayload(testNS, testPVC)))
	req.Header.Set("Content-Type", "application/octet-stream")

	runtime.GC()
	var base runtime.MemStats
	runtime.ReadMemStats(&base)
	var peak atomic.Uint64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		var ms runtime.MemStats
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			runtime.ReadMemStats(&ms)
			if ms.HeapInuse > peak.Load() {
				peak.Store(ms.HeapInuse)
			}
		}
	}()

	type result struct {
		code int
		body string
		err  error
	}
	done := make(chan result, 1)
	go func() {
		resp, err := r.proxy.Client().Do(req)
		if err != nil {
			done <- result{err: err}
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		done <- result{code: resp.StatusCode, body: string(b)}
	}()

	buf := make([]byte, chunk)
	for i := range buf {
		buf[i] = byte(i * 7)
	}
	start := time.Now()
	if _, err := pw.Write(buf); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for r.upstream.received.Load() < chunk {
		if time.Now().After(deadline) {
			t.Fatalf("the upload server got %d bytes of the first MiB while the client held back the rest: the proxy buffers", r.upstream.received.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
	firstMiB := time.Since(start)
	for sent := int64(chunk); sent < total; sent += chunk {
		if _, err := pw.Write(buf); err != nil {
			t.Fatalf("writing at %d: %v", sent, err)
		}
	}
	pw.Close()
	res := <-done
	elapsed := time.Since(start)
	close(stop)
	<-sampled
	if res.err != nil {
		t.Fatal(res.err)
	}
	if want := fmt.Sprintf("received %d bytes", total); res.code != 200 || res.body != want {
		t.Fatalf("got %d %q, want 200 %q", res.code, res.body, want)
	}
	growth := int64(peak.Load()) - int64(base.HeapInuse)
	t.Logf("%d MiB through client→proxy→upload server over TLS in %s (%.0f MiB/s); first MiB arrived after %s; heap in use %d MiB at start, peak growth %.1f MiB",
		total>>20, elapsed.Round(time.Millisecond), float64(total>>20)/elapsed.Seconds(), firstMiB.Round(time.Millisecond), base.HeapInuse>>20, float64(growth)/(1<<20))
	if growth > 32<<20 {
		t.Errorf("heap grew by %d MiB while streaming %d MiB: the body is being held in memory", growth>>20, total>>20)
	}
}
