package uploadserver

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"

	"github.com/kubefill/kubefill/pkg/contract"
	"github.com/kubefill/kubefill/pkg/datapath"
	"github.com/kubefill/kubefill/pkg/datapath/qcow2"
	"github.com/kubefill/kubefill/pkg/datapath/testimg"
	"github.com/kubefill/kubefill/pkg/importer"
	"github.com/kubefill/kubefill/pkg/pki"
)

const imgSize = 8 << 20

// certSet is a server CA, a serving certificate for 127.0.0.1, the proxy's
// client CA with a client certificate, and a stranger's client certificate.
type certSet struct {
	dir                    string
	serverCA, clientCA     *pki.CA
	proxyClient, stranger  tls.Certificate
	certFile, keyFile, cas string
}

func newPKI(t *testing.T) *certSet {
	t.Helper()
	dir := t.TempDir()
	serverCA, err := pki.NewCA("upload-server-ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	clientCA, err := pki.NewCA("upload-proxy-client-ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	otherCA, err := pki.NewCA("someone-else", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	crt, key, err := serverCA.Issue("cdi-upload-test", []string{"127.0.0.1", "localhost"}, false, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	p := &certSet{dir: dir, serverCA: serverCA, clientCA: clientCA, certFile: filepath.Join(dir, "tls.crt"), keyFile: filepath.Join(dir, "tls.key"), cas: filepath.Join(dir, "client-ca.crt")}
	for f, b := range map[string][]byte{p.certFile: crt, p.keyFile: key, p.cas: clientCA.CertPEM} {
		if err := os.WriteFile(f, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	leaf := func(ca *pki.CA) tls.Certificate {
		c, k, err := ca.Issue("cdi-uploadproxy", nil, true, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		pair, err := tls.X509KeyPair(c, k)
		if err != nil {
			t.Fatal(err)
		}
		return pair
	}
	p.proxyClient, p.stranger = leaf(clientCA), leaf(otherCA)
	return p
}

func (p *certSet) client(cert *tls.Certificate) *http.Client {
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(p.serverCA.CertPEM)
	cfg := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	if cert != nil {
		cfg.Certificates = []tls.Certificate{*cert}
	}
	return &http.Client{Transport: &http.Transport{TLSClientConfig: cfg, DisableKeepAlives: true}, Timeout: 2 * time.Minute}
}

type running struct {
	url      string
	dir      string // the Filesystem volume
	termLog  string
	errc     chan error
	srv      *Server
	pki      *certSet
	proxy    *http.Client
	dataPath string
}

// start runs an upload server on loopback with an 8 MiB Filesystem volume.
func start(t *testing.T, mutate func(*Config)) *running {
	t.Helper()
	p := newPKI(t)
	dir := t.TempDir()
	for _, d := range []string{"data", "scratch"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	addrc := make(chan string, 1)
	cfg := Config{
		Addr: "127.0.0.1:0", CertFile: p.certFile, KeyFile: p.keyFile, ClientCAFile: p.cas,
		Paths: importer.Paths{
			DataPath: filepath.Join(dir, "data", "disk.img"), BlockPath: filepath.Join(dir, "no-block-device"),
			ScratchDir: filepath.Join(dir, "scratch"), TerminationLog: filepath.Join(dir, "termination-log"),
		},
		ImageSize: imgSize, OwnerUID: "uid-1", ClientName: "cdi-uploadproxy",
		OnListen: func(a string) { addrc <- a },
	}
	if mutate != nil {
		mutate(&cfg)
	}
	srv, err := New(cfg, testr.New(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{dir: dir, termLog: cfg.Paths.TerminationLog, errc: make(chan error, 1), srv: srv, pki: p, dataPath: cfg.Paths.DataPath}
	go func() { r.errc <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-r.errc
	})
	select {
	case a := <-addrc:
		r.url = "https://" + a
	case err := <-r.errc:
		t.Fatalf("server stopped: %v", err)
	}
	r.proxy = p.client(&p.proxyClient)
	return r
}

func (r *running) post(t *testing.T, c *http.Client, path string, body io.Reader, size int64, contentType string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, r.url+path, body)
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = size
	req.Header.Set("Content-Type", contentType)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(b))
}

func (r *running) postFile(t *testing.T, path, file string) (int, string) {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, _ := f.Stat()
	return r.post(t, r.proxy, path, f, st.Size(), "application/octet-stream")
}

// waitExit waits for the server to finish and checks its termination message.
func (r *running) waitExit(t *testing.T) {
	t.Helper()
	select {
	case err := <-r.errc:
		if err != nil {
			t.Fatalf("server exited with %v", err)
		}
		r.errc <- nil // for the cleanup
	case <-time.After(time.Minute):
		t.Fatal("server did not exit after a successful upload")
	}
	b, err := os.ReadFile(r.termLog)
	if err != nil {
		t.Fatal(err)
	}
	var msg contract.TerminationMessage
	if err := json.Unmarshal(b, &msg); err != nil || msg.Outcome != contract.OutcomeSucceeded {
		t.Fatalf("termination message %s (%v), want outcome Succeeded", b, err)
	}
}

func images(t *testing.T) (raw, qcow, qcowGz string) {
	t.Helper()
	testimg.RequireQemuImg(t)
	dir := t.TempDir()
	raw = testimg.Raw(t, dir, imgSize)
	qcow = testimg.Convert(t, raw, "raw", filepath.Join(dir, "disk.qcow2"), "qcow2", "-c")
	qcowGz = filepath.Join(dir, "disk.qcow2.gz")
	testimg.QemuImg(t, "info", qcow) // sanity
	data, err := os.ReadFile(qcow)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	zw := newGzip(&buf)
	_, _ = zw.Write(data)
	_ = zw.Close()
	if err := os.WriteFile(qcowGz, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return raw, qcow, qcowGz
}

func TestStatusCodes(t *testing.T) {
	raw, _, _ := images(t)
	r := start(t, nil)
	anon := r.pki.client(nil)

	resp, err := anon.Get(r.url + "/healthz")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("healthz without a client certificate: %v %v", resp, err)
	}
	for _, p := range []string{"/v1beta1/upload-async", "/v1alpha1/upload-async", "/v1beta1/upload-form-async"} {
		req, _ := http.NewRequest(http.MethodHead, r.url+p, nil)
		resp, err := r.proxy.Do(req)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Errorf("HEAD %s: %v %v, want 200", p, resp, err)
		}
	}
	if resp, err := r.proxy.Get(r.url + "/v1beta1/upload"); err != nil || resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET upload: %v %v, want 405", resp, err)
	}
	if code, msg := r.post(t, anon, "/v1beta1/upload", strings.NewReader("x"), 1, ""); code != http.StatusUnauthorized {
		t.Errorf("upload without a client certificate: %d %s, want 401", code, msg)
	}
	// A certificate from another CA fails the handshake.
	// A certificate from another CA is never accepted: Go's client does not
	// even offer it (it is not from a CA the server names), or the handshake fails.
	if resp, err := r.pki.client(&r.pki.stranger).Post(r.url+"/v1beta1/upload", "application/octet-stream", strings.NewReader("x")); err == nil {
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("a client certificate from a foreign CA: %d, want 401 or a failed handshake", resp.StatusCode)
		}
		resp.Body.Close()
	}

	// A slow first upload holds the server; a second one gets 503.
	pr, pw := io.Pipe()
	first := make(chan int, 1)
	go func() {
		code, msg := r.post(t, r.proxy, "/v1beta1/upload", pr, imgSize, "application/octet-stream")
		t.Logf("first upload: %d %s", code, msg)
		first <- code
	}()
	f, _ := os.Open(raw)
	defer f.Close()
	if _, err := io.CopyN(pw, f, 1<<20); err != nil {
		t.Fatal(err)
	}
	// Progress is published while the upload runs.
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := anon.Get(r.url + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		text, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		v, _ := parseMetric(string(text), `kubevirt_cdi_import_progress_total{ownerUID="uid-1"}`)
		if v > 0 && v < 100 {
			t.Logf("progress after 1 of 8 MiB: %.1f%%", v)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no progress in /metrics:\n%s", text)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if code, msg := r.post(t, r.proxy, "/v1beta1/upload", bytes.NewReader(make([]byte, 64<<10)), 64<<10, "application/octet-stream"); code != http.StatusServiceUnavailable {
		t.Errorf("concurrent upload: %d %s, want 503", code, msg)
	}
	// A large concurrent upload that asks first (Expect: 100-continue, as
	// the proxy should) gets its 503 before sending the body.
	expecting := r.pki.client(&r.pki.proxyClient)
	expecting.Transport.(*http.Transport).ExpectContinueTimeout = 5 * time.Second
	req, _ := http.NewRequest(http.MethodPost, r.url+"/v1beta1/upload-async", io.LimitReader(&patterned{}, 1<<30))
	req.ContentLength = 1 << 30
	req.Header.Set("Expect", "100-continue")
	if resp, err := expecting.Do(req); err != nil || resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("concurrent 1 GiB upload with Expect: 100-continue: %v %v, want 503", resp, err)
	} else {
		resp.Body.Close()
	}
	go func() { _, _ = io.Copy(pw, f); pw.Close() }()
	if c := <-first; c != http.StatusOK {
		t.Fatalf("first upload: %d, want 200", c)
	}
	if got, want := testimg.FileSHA256(t, r.dataPath), testimg.FileSHA256(t, raw); got != want {
		t.Errorf("uploaded image sha256 %s, want %s", got, want)
	}
	r.waitExit(t)
	// The server exits after success; a late request finds nobody.
	if resp, err := r.proxy.Get(r.url + "/healthz"); err == nil {
		t.Errorf("server still answers after success: %d", resp.StatusCode)
	}
}

// TestConflictAfterCompletion: once an upload succeeded, the handler refuses more.
func TestConflictAfterCompletion(t *testing.T) {
	raw, _, _ := images(t)
	p := newPKI(t)
	dir := t.TempDir()
	srv, err := New(Config{CertFile: p.certFile, KeyFile: p.keyFile, ClientCAFile: p.cas, ImageSize: imgSize, ClientName: "cdi-uploadproxy",
		Paths: importer.Paths{DataPath: filepath.Join(dir, "disk.img"), BlockPath: filepath.Join(dir, "none")}}, testr.New(t))
	if err != nil {
		t.Fatal(err)
	}
	tlsCfg, err := srv.TLSConfig()
	if err != nil {
		t.Fatal(err)
	}
	ts := newTLSServer(t, srv.Handler(), tlsCfg)
	r := &running{url: ts, proxy: p.client(&p.proxyClient), pki: p}
	if code, msg := r.postFile(t, "/v1beta1/upload", raw); code != http.StatusOK {
		t.Fatalf("upload: %d %s", code, msg)
	}
	if code, msg := r.postFile(t, "/v1beta1/upload", raw); code != http.StatusConflict {
		t.Errorf("upload after completion: %d %s, want 409", code, msg)
	}
}

func TestUploadModes(t *testing.T) {
	raw, qcow, qcowGz := images(t)
	want := testimg.FileSHA256(t, raw)
	cases := []struct {
		name, path, file string
		form             bool
	}{
		{"sync qcow2", "/v1beta1/upload", qcow, false},
		{"async gzipped qcow2", "/v1beta1/upload-async", qcowGz, false},
		{"v1alpha1 raw", "/v1alpha1/upload", raw, false},
		{"form qcow2", "/v1beta1/upload-form", qcow, true},
		{"form async raw", "/v1beta1/upload-form-async", raw, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := start(t, nil)
			var code int
			var msg string
			if c.form {
				code, msg = r.postForm(t, c.path, c.file)
			} else {
				code, msg = r.postFile(t, c.path, c.file)
			}
			if code != http.StatusOK {
				t.Fatalf("%s: %d %s", c.path, code, msg)
			}
			r.waitExit(t) // async: the server exits once the data is durable
			if v := r.srv.progress.Value(); v != 100 {
				t.Errorf("progress %.1f after success, want 100", v)
			}
			if got := testimg.FileSHA256(t, r.dataPath); got != want {
				t.Errorf("image sha256 %s, want %s", got, want)
			}
		})
	}
}

func (r *running) postForm(t *testing.T, path, file string) (int, string) {
	t.Helper()
	pr, pw := io.Pipe()
	mw := multipart.NewWriter(pw)
	go func() {
		_ = mw.WriteField("note", "a field before the file")
		fw, err := mw.CreateFormFile("file", filepath.Base(file))
		if err == nil {
			var f *os.File
			if f, err = os.Open(file); err == nil {
				_, err = io.Copy(fw, f)
				f.Close()
			}
		}
		if err == nil {
			err = mw.Close()
		}
		pw.CloseWithError(err)
	}()
	return r.post(t, r.proxy, path, pr, -1, mw.FormDataContentType())
}

func TestUploadArchive(t *testing.T) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	files := map[string]string{"a.txt": "alpha\n", "dir/b.txt": strings.Repeat("beta ", 1000)}
	_ = tw.WriteHeader(&tar.Header{Name: "dir/", Typeflag: tar.TypeDir, Mode: 0o755})
	for name, body := range files {
		_ = tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg})
		_, _ = tw.Write([]byte(body))
	}
	_ = tw.Close()
	r := start(t, nil)
	if code, msg := r.post(t, r.proxy, "/v1beta1/upload-archive", bytes.NewReader(buf.Bytes()), int64(buf.Len()), "application/octet-stream"); code != http.StatusOK {
		t.Fatalf("archive upload: %d %s", code, msg)
	}
	r.waitExit(t)
	for name, body := range files {
		got, err := os.ReadFile(filepath.Join(r.dir, "data", name))
		if err != nil || string(got) != body {
			t.Errorf("%s: %q %v", name, got, err)
		}
	}
}

// TestBadUploadsThenRetry: each bad upload gets a 4xx naming the problem,
// leaves no image behind, and the server accepts the next try.
func TestBadUploadsThenRetry(t *testing.T) {
	raw, qcow, _ := images(t)
	dir := t.TempDir()
	big := testimg.Raw(t, dir, 2*imgSize)
	hostile := filepath.Join(dir, "hostile.qcow2")
	testimg.QemuImg(t, "create", "-q", "-f", "qcow2", "-b", "/etc/passwd", "-F", "raw", hostile, strconv.Itoa(imgSize))
	corrupt := filepath.Join(dir, "corrupt.qcow2")
	b, _ := os.ReadFile(qcow)
	copy(b[20:], bytes.Repeat([]byte{0xff}, 40)) // cluster bits, size and L1 pointers garbage
	_ = os.WriteFile(corrupt, b, 0o644)

	sum := sha256.Sum256(mustRead(t, qcow))
	type bad struct {
		name, file string
		code       int
		reason     string
	}
	t.Run("checksum", func(t *testing.T) {
		// The checksum covers the uploaded bytes (here the qcow2 file).
		r := start(t, func(c *Config) { c.Checksum = "sha256:" + hex.EncodeToString(sum[:]) })
		if code, msg := r.postFile(t, "/v1beta1/upload", raw); code != http.StatusBadRequest || !strings.Contains(msg, "checksum") {
			t.Errorf("checksum mismatch: %d %q, want 400 naming the checksum", code, msg)
		}
		if code, msg := r.postFile(t, "/v1beta1/upload", qcow); code != http.StatusOK {
			t.Fatalf("retry with the right image: %d %s", code, msg)
		}
		r.waitExit(t)
		testimg.QemuImg(t, "compare", "-q", "-f", "qcow2", "-F", "raw", qcow, r.dataPath)
	})
	r := start(t, nil)
	for _, c := range []bad{
		{"too big", big, http.StatusRequestEntityTooLarge, "larger than"},
		{"backing file", hostile, http.StatusBadRequest, "backing"},
		{"corrupt qcow2", corrupt, http.StatusBadRequest, "qcow2"},
	} {
		code, msg := r.postFile(t, "/v1beta1/upload", c.file)
		t.Logf("%s: %d %s", c.name, code, msg)
		if code != c.code || !strings.Contains(strings.ToLower(msg), c.reason) {
			t.Errorf("%s: %d %q, want %d mentioning %q", c.name, code, msg, c.code, c.reason)
		}
		if st, err := os.Stat(r.dataPath); err == nil && st.Size() != 0 {
			t.Errorf("%s: a failed upload left a %d-byte image", c.name, st.Size())
		}
	}
	if code, msg := r.postFile(t, "/v1beta1/upload", raw); code != http.StatusOK {
		t.Fatalf("retry: %d %s", code, msg)
	}
	r.waitExit(t)
	if got, want := testimg.FileSHA256(t, r.dataPath), testimg.FileSHA256(t, raw); got != want {
		t.Errorf("image sha256 %s, want %s", got, want)
	}
}

func mustRead(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestKilledConnection: a client that dies halfway leaves the server ready,
// and the retry succeeds.
func TestKilledConnection(t *testing.T) {
	_, qcow, _ := images(t)
	for _, path := range []string{"/v1beta1/upload", "/v1beta1/upload-async"} {
		t.Run(path, func(t *testing.T) {
			r := start(t, nil)
			data := mustRead(t, qcow)
			roots := x509.NewCertPool()
			roots.AppendCertsFromPEM(r.pki.serverCA.CertPEM)
			conn, err := tls.Dial("tcp", strings.TrimPrefix(r.url, "https://"), &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{r.pki.proxyClient}})
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n", path, len(data))
			if _, err := conn.Write(data[:len(data)/2]); err != nil {
				t.Fatal(err)
			}
			conn.Close()
			// The server notices the dead connection, then takes the retry.
			deadline := time.Now().Add(30 * time.Second)
			for {
				code, msg := r.postFile(t, path, qcow)
				if code == http.StatusOK {
					break
				}
				if code != http.StatusServiceUnavailable || time.Now().After(deadline) {
					t.Fatalf("retry: %d %s", code, msg)
				}
				time.Sleep(100 * time.Millisecond)
			}
			r.waitExit(t)
			testimg.QemuImg(t, "compare", "-q", "-f", "qcow2", "-F", "raw", qcow, r.dataPath)
		})
	}
}

// TestRSSFlat: a 1 GiB upload streams through; the process's resident
// memory does not grow with it.
func TestRSSFlat(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	const size = 1 << 30
	r := start(t, func(c *Config) { c.ImageSize = size })
	base := rss(t)
	stop := make(chan struct{})
	peak := make(chan int64, 1)
	go func() {
		m := base
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				peak <- m
				return
			case <-tick.C:
				m = max(m, rss(t))
			}
		}
	}()
	startT := time.Now()
	code, msg := r.post(t, r.proxy, "/v1beta1/upload", io.LimitReader(&patterned{}, size), size, "application/octet-stream")
	elapsed := time.Since(startT)
	close(stop)
	p := <-peak
	if code != http.StatusOK {
		t.Fatalf("upload: %d %s", code, msg)
	}
	r.waitExit(t)
	t.Logf("1 GiB upload in %v (%.0f MiB/s); RSS baseline %d MiB, peak %d MiB (+%d MiB)", elapsed.Round(time.Millisecond),
		float64(size)/(1<<20)/elapsed.Seconds(), base>>20, p>>20, (p-base)>>20)
	if p-base > 64<<20 {
		t.Errorf("RSS grew by %d MiB during a 1 GiB upload; the body must be streamed", (p-base)>>20)
	}
	st, err := os.Stat(r.dataPath)
	if err != nil || st.Size() != size {
		t.Errorf("image size %v %v, want %d", st, err, size)
	}
}

// patterned is mostly zero (written as holes) with a marker every MiB, so
// the upload is real data without filling the disk.
type patterned struct{ off int64 }

func (p *patterned) Read(b []byte) (int, error) {
	clear(b)
	for i := range b {
		if (p.off+int64(i))%(1<<20) == 0 {
			b[i] = 0x5a
		}
	}
	p.off += int64(len(b))
	return len(b), nil
}

func rss(t *testing.T) int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "VmRSS:") {
			f := strings.Fields(l)
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

func TestStatusFor(t *testing.T) {
	cases := []struct {
		err  error
		code int
	}{
		{fmt.Errorf("x: %w", datapath.ErrTooBig), http.StatusRequestEntityTooLarge},
		{fmt.Errorf("x: %w", datapath.ErrChecksum), http.StatusBadRequest},
		{fmt.Errorf("x: %w", qcow2.ErrUnsafe), http.StatusBadRequest},
		{fmt.Errorf("x: %w", datapath.ErrUnsupported), http.StatusBadRequest},
		{fmt.Errorf("reading: %w", io.ErrUnexpectedEOF), http.StatusBadRequest},
		{fmt.Errorf("x: %w", datapath.ErrScratchRequired), http.StatusInternalServerError},
		{errors.New("disk on fire"), http.StatusInternalServerError},
	}
	for _, c := range cases {
		if got := StatusFor(c.err); got != c.code {
			t.Errorf("StatusFor(%v) = %d, want %d", c.err, got, c.code)
		}
	}
}

func parseMetric(text, series string) (float64, bool) {
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, series+" ") {
			v, err := strconv.ParseFloat(strings.TrimSpace(strings.TrimPrefix(l, series)), 64)
			return v, err == nil
		}
	}
	return 0, false
}

// TestAsyncBadImage: an async upload of a hostile image is refused with a
// 400 when the header gives it away; when the failure comes after the 200,
// the server exits with the reason in its termination message, so the
// claim shows it and a new upload server takes the next try.
func TestAsyncBadImage(t *testing.T) {
	testimg.RequireQemuImg(t)
	dir := t.TempDir()
	hostile := filepath.Join(dir, "hostile.qcow2")
	testimg.QemuImg(t, "create", "-q", "-f", "qcow2", "-b", "/etc/passwd", "-F", "raw", hostile, strconv.Itoa(imgSize))

	r := start(t, nil)
	if code, msg := r.postFile(t, "/v1beta1/upload-async", hostile); code != http.StatusBadRequest || !strings.Contains(msg, "backing") {
		t.Errorf("async hostile image: %d %q, want 400 naming the backing file", code, msg)
	}

	old := asyncGrace
	asyncGrace = 0
	t.Cleanup(func() { asyncGrace = old })
	r = start(t, nil)
	code, msg := r.postFile(t, "/v1beta1/upload-async", hostile)
	if code != http.StatusOK && code != http.StatusBadRequest {
		t.Fatalf("async hostile image without grace: %d %s", code, msg)
	}
	if code == http.StatusBadRequest {
		t.Skip("the processing failed before the body's end was seen; nothing to check")
	}
	select {
	case err := <-r.errc:
		r.errc <- err
		if err == nil || !strings.Contains(err.Error(), "backing") {
			t.Fatalf("server exited with %v, want the backing-file refusal", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("server did not exit after an async upload failed")
	}
	var m contract.TerminationMessage
	if err := json.Unmarshal(mustRead(t, r.termLog), &m); err != nil || m.Outcome != contract.OutcomeFailed || m.Message == nil ||
		!strings.Contains(*m.Message, "backing") || (m.Permanent != nil && *m.Permanent) {
		t.Errorf("termination message %s (%v): want a retryable failure naming the backing file", mustRead(t, r.termLog), err)
	}
}
