package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kubefill/kubefill/pkg/cloner"
	"github.com/kubefill/kubefill/pkg/contract"
	"github.com/kubefill/kubefill/pkg/datapath/testimg"
	"github.com/kubefill/kubefill/pkg/pki"
)

// uploadServer is a stand-in for the target's upload server: mutual TLS
// with the client CA, CDI's path and header, and cloner.ReceiveStream.
type uploadServer struct {
	*httptest.Server
	caPEM    []byte
	requests atomic.Int32
	scraped  atomic.Value // the metrics text seen while the clone ran
	errLog   syncBuffer   // the server's log: TLS handshake errors
}

type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func newUploadServer(t *testing.T, clientCA *pki.CA, clientName string, dst cloner.Destination, metricsAddr string) *uploadServer {
	t.Helper()
	serverCA, err := pki.NewCA("upload-server-ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	crt, key, err := serverCA.Issue("cdi-upload-target", []string{"127.0.0.1"}, false, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair(crt, key)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(clientCA.CertPEM)
	u := &uploadServer{caPEM: serverCA.CertPEM}
	u.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.requests.Add(1)
		if r.URL.Path != cloner.UploadPath || r.Method != http.MethodPost || r.ProtoMajor != 1 {
			http.Error(w, "bad request "+r.Method+" "+r.URL.Path+" "+r.Proto, http.StatusBadRequest)
			return
		}
		if len(r.TLS.PeerCertificates) == 0 || r.TLS.PeerCertificates[0].Subject.CommonName != clientName {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		if metricsAddr != "" {
			u.scraped.Store(scrape(metricsAddr))
		}
		if _, err := cloner.ReceiveStream(r.Context(), r.Body, r.Header.Get(cloner.HeaderContentType), dst); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	u.TLS = &tls.Config{
		Certificates: []tls.Certificate{pair},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    pool,
		NextProtos:   []string{"http/1.1"},
	}
	u.Config.ErrorLog = log.New(&u.errLog, "", 0)
	u.StartTLS()
	t.Cleanup(u.Close)
	return u
}

func scrape(addr string) string {
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	resp, err := c.Get("https://" + addr + "/metrics")
	if err != nil {
		return "error: " + err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func readTermination(t *testing.T, p string) contract.TerminationMessage {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	m, ok := contract.DecodeTermination(string(b))
	if !ok {
		t.Fatalf("termination message %q", b)
	}
	return m
}

// The cloner command against a real mutual-TLS server on 127.0.0.1 that
// unpacks with cloner.ReceiveStream: bytes arrive intact, the job comes
// from CDI's environment, progress is served while the clone runs, and a
// client certificate from another CA is refused by the TLS layer.
func TestClonerCommandEndToEnd(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	dstDir := filepath.Join(dir, "dst")
	for _, d := range []string{src, dstDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	img := filepath.Join(src, cloner.ImageName)
	f, err := os.Create(img)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(256 << 20); err != nil {
		t.Fatal(err)
	}
	chunk := []byte(strings.Repeat("host-assisted clone data ", 40000)) // ~1 MiB
	for _, off := range []int64{0, 64 << 20, 255 << 20} {
		if _, err := f.WriteAt(chunk, off); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()

	clientCA, err := pki.NewCA("cdi-uploadserver-client-signer", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	const clientName = "src-ns/src-pvc-tgt-ns/tgt-pvc"
	crt, key, err := clientCA.Issue(clientName, nil, true, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	metrics := freeAddr(t)
	srv := newUploadServer(t, clientCA, clientName, cloner.Destination{Mode: cloner.Filesystem, Path: dstDir}, metrics)

	term := filepath.Join(dir, "termination-log")
	keyFile := filepath.Join(dir, "tls.key")
	if err := os.WriteFile(keyFile, key, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv(cloner.EnvVolumeMode, "filesystem")
	t.Setenv(cloner.EnvMountPoint, src)
	t.Setenv(cloner.EnvUploadURL, srv.URL+cloner.UploadPath)
	t.Setenv(cloner.EnvOwnerUID, "0c6f0d5e-uid")
	t.Setenv(cloner.EnvPreallocation, "false")
	t.Setenv(cloner.EnvServerCACert, string(srv.caPEM))
	t.Setenv(cloner.EnvClientCert, string(crt))
	t.Setenv(cloner.EnvClientKey, keyFile) // a file works too

	cmd := newClonerWorkerCommand()
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	cmd.SetArgs([]string{"--termination-log", term, "--metrics-addr", metrics})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	if got, want := testimg.FileSHA256(t, filepath.Join(dstDir, cloner.ImageName)), testimg.FileSHA256(t, img); got != want {
		t.Errorf("target disk.img sha256 %s, source %s", got, want)
	}
	if m := readTermination(t, term); m.Outcome != contract.OutcomeSucceeded || m.Message == nil || *m.Message != cloner.MessageCloneComplete {
		t.Errorf("termination %+v", m)
	}
	text, _ := srv.scraped.Load().(string)
	if !regexp.MustCompile(contract.CloneProgressMetric + `\{ownerUID="0c6f0d5e-uid"\} \d`).MatchString(text) {
		t.Errorf("metrics while cloning:\n%s", text)
	}

	// A client certificate from another CA: the TLS handshake fails and
	// the handler never runs.
	otherCA, err := pki.NewCA("someone-else", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	badCrt, badKey, err := otherCA.Issue(clientName, nil, true, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	before := srv.requests.Load()
	t.Setenv(cloner.EnvClientCert, string(badCrt))
	t.Setenv(cloner.EnvClientKey, string(badKey))
	cmd = newClonerWorkerCommand()
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	cmd.SetArgs([]string{"--termination-log", term, "--metrics-addr", ""})
	err = cmd.Execute()
	if err == nil {
		t.Fatal("a client certificate from another CA was accepted")
	}
	t.Logf("refused: %v", err)
	var he *cloner.HTTPError
	if errors.As(err, &he) {
		t.Errorf("want a TLS-layer refusal, got an HTTP answer: %v", err)
	}
	// With TLS 1.3 the client learns of the refusal only as a closed
	// connection; the server says why.
	time.Sleep(100 * time.Millisecond)
	if l := srv.errLog.String(); !strings.Contains(l, "TLS handshake error") || !strings.Contains(l, "certificate") {
		t.Errorf("server log: %q", l)
	} else {
		t.Logf("server: %s", strings.TrimSpace(l))
	}
	if srv.requests.Load() != before {
		t.Errorf("the handler ran for a refused client")
	}
	if m := readTermination(t, term); m.Outcome != contract.OutcomeFailed {
		t.Errorf("termination %+v", m)
	}
}
