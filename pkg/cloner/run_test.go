package cloner

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/kubefill/kubefill/pkg/contract"
	"github.com/kubefill/kubefill/pkg/datapath/testimg"
	"github.com/kubefill/kubefill/pkg/pki"
)

// tlsUpload is an mTLS upload server on 127.0.0.1 running handler, and a
// Job that reaches it.
func tlsUpload(t testing.TB, handler http.HandlerFunc) (*httptest.Server, Job) {
	t.Helper()
	serverCA, err := pki.NewCA("server-ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	clientCA, err := pki.NewCA("client-ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	crt, key, err := serverCA.Issue("upload", []string{"127.0.0.1"}, false, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	pair, _ := tls.X509KeyPair(crt, key)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(clientCA.CertPEM)
	srv := httptest.NewUnstartedServer(handler)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{pair}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: pool, NextProtos: []string{"http/1.1"}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	ccrt, ckey, err := clientCA.Issue("clone", nil, true, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return srv, Job{UploadURL: srv.URL, ServerCA: serverCA.CertPEM, ClientCert: ccrt, ClientKey: ckey, OwnerUID: "uid", Log: logr.Discard()}
}

func receiver(dst Destination) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if _, err := ReceiveStream(r.Context(), r.Body, r.Header.Get(HeaderContentType), dst); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
		}
	}
}

func TestRunReportsTheServersAnswer(t *testing.T) {
	dir := tempDir(t)
	dev := filepath.Join(dir, "device")
	makeImage(t, dev, 8*MiB, []region{{off: MiB, len: MiB}})
	small := filepath.Join(dir, "small")
	junkFile(t, small, 4*MiB)
	_, job := tlsUpload(t, receiver(Destination{Mode: Block, Path: small}))
	job.Source = Source{Mode: Block, Path: dev}
	job.TerminationLog = filepath.Join(dir, "term")
	err := Run(context.Background(), job)
	if err == nil || !strings.Contains(err.Error(), "400") || !strings.Contains(err.Error(), "holds only") {
		t.Fatalf("Run: %v", err)
	}
	b, _ := os.ReadFile(job.TerminationLog)
	m, ok := contract.DecodeTermination(string(b))
	if !ok || m.Outcome != contract.OutcomeFailed || m.Permanent == nil || !*m.Permanent {
		t.Errorf("termination %s", b)
	}

	big := filepath.Join(dir, "big")
	junkFile(t, big, 8*MiB)
	_, job2 := tlsUpload(t, receiver(Destination{Mode: Block, Path: big}))
	job2.Source, job2.TerminationLog = job.Source, job.TerminationLog
	if err := Run(context.Background(), job2); err != nil {
		t.Fatal(err)
	}
	if testimg.FileSHA256(t, big) != testimg.FileSHA256(t, dev) {
		t.Errorf("target differs")
	}
	b, _ = os.ReadFile(job.TerminationLog)
	if m, ok := contract.DecodeTermination(string(b)); !ok || m.Outcome != contract.OutcomeSucceeded || *m.Message != MessageCloneComplete {
		t.Errorf("termination %s", b)
	}
}

// A source that fails mid-stream aborts the request: the server sees a
// cut body and fails, never a clean end.
func TestSourceFailureAbortsTheRequest(t *testing.T) {
	dir := tempDir(t)
	dst := mkdir(t, dir, "dst")
	got := make(chan error, 1)
	_, job := tlsUpload(t, func(w http.ResponseWriter, r *http.Request) {
		_, err := ReceiveStream(r.Context(), r.Body, r.Header.Get(HeaderContentType), Destination{Mode: Filesystem, Path: dst})
		got <- err
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
		}
	})
	src := mkdir(t, dir, "src")
	img := filepath.Join(src, ImageName)
	makeImage(t, img, 64*MiB, []region{{off: 0, len: 8 * MiB}})
	job.Source = Source{Mode: Filesystem, Path: src}
	client, target, err := uploadClient(job)
	if err != nil {
		t.Fatal(err)
	}
	// The source shrinks while it is read (a volume that was not really
	// quiesced): the read fails after a few MiB were sent.
	shrunk := false
	_, err = upload(context.Background(), client, target, job, func(done, total int64) {
		if done >= 2*MiB && !shrunk {
			shrunk = true
			if err := os.Truncate(img, 3*MiB); err != nil {
				t.Error(err)
			}
		}
	})
	if err == nil || !strings.Contains(err.Error(), "reading the clone source") || !strings.Contains(err.Error(), "shrank") {
		t.Errorf("upload: %v", err)
	}
	if err := <-got; err == nil {
		t.Errorf("the server accepted a stream whose source failed")
	} else {
		t.Logf("server: %v", err)
	}
}

// BenchmarkCloneTLS is the whole worker path: Run posts over mutual TLS on
// loopback to a server running ReceiveStream (both in this process, as the
// cloner and upload pods would share a 2-core node), against
// cp --sparse=always + sync.
func BenchmarkCloneTLS(b *testing.B) {
	dir := tempDir(b)
	src := benchImage(b, dir, 2*GiB)
	var dst string
	_, job := tlsUpload(b, func(w http.ResponseWriter, r *http.Request) {
		receiver(Destination{Mode: Filesystem, Path: dst})(w, r)
	})
	job.Source = Source{Mode: Filesystem, Path: src}
	var clone, cp time.Duration
	for i := 0; i < b.N; i++ {
		dst = mkdir(b, dir, "dst"+strconv.Itoa(i))
		start := time.Now()
		if err := Run(context.Background(), job); err != nil {
			b.Fatal(err)
		}
		clone += time.Since(start)
		cpDst := filepath.Join(dir, "cp"+strconv.Itoa(i))
		start = time.Now()
		timeCmd(b, "cp", "--sparse=always", filepath.Join(src, ImageName), cpDst)
		timeCmd(b, "sync", cpDst)
		cp += time.Since(start)
		os.RemoveAll(dst)
		os.Remove(cpDst)
	}
	b.ReportMetric(clone.Seconds()/float64(b.N), "clone-s")
	b.ReportMetric(cp.Seconds()/float64(b.N), "cp+sync-s")
	b.ReportMetric(cp.Seconds()/clone.Seconds(), "throughput-vs-cp+sync")
	b.ReportMetric(float64(peakRSS())/MiB, "peak-RSS-MiB")
}

// TestRetryWait: quick retries for the first 2 s (the upload server
// usually listens within a second or two of the source pod's start), then
// growing to at most every 2 s.
func TestRetryWait(t *testing.T) {
	for n, want := range map[int]time.Duration{1: 50 * time.Millisecond, 2: 50 * time.Millisecond, 40: 50 * time.Millisecond, 41: 75 * time.Millisecond, 42: 112500 * time.Microsecond, 49: 1922167968 * time.Nanosecond, 50: 2 * time.Second, 400: 2 * time.Second} {
		if got := retryWait(n); got != want {
			t.Errorf("retryWait(%d) = %v, want %v", n, got, want)
		}
	}
	var total time.Duration
	for n := 1; n <= 40; n++ {
		total += retryWait(n)
	}
	if total != 2*time.Second {
		t.Errorf("the first 40 retries take %v, want 2s", total)
	}
}

// TestDialTimeout: short dial timeouts for the first attempts that time
// out (an unanswered SYN would otherwise wait for TCP's one-second
// retransmit), then a second more each time, up to 30 s.
func TestDialTimeout(t *testing.T) {
	for n, want := range map[int]time.Duration{0: 250 * time.Millisecond, 1: 250 * time.Millisecond, 8: 250 * time.Millisecond, 9: time.Second, 10: 2 * time.Second, 37: 29 * time.Second, 38: 30 * time.Second, 100: 30 * time.Second} {
		if got := dialTimeout(n); got != want {
			t.Errorf("dialTimeout(%d) = %v, want %v", n, got, want)
		}
	}
}

// closedAddr is a loopback address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// TestUploadAddressFile: while the Service's address refuses, the upload
// pod's own address, once the address file names it, is dialled; a stale
// one (a replaced pod's) does not keep the stream from the Service's.
func TestUploadAddressFile(t *testing.T) {
	dir := tempDir(t)
	src := mkdir(t, dir, "src")
	writeFile(t, filepath.Join(src, "hello.txt"), "hello", 0o644)
	t.Run("the pod's address, once known", func(t *testing.T) {
		dst := mkdir(t, dir, "dst1")
		srv, job := tlsUpload(t, receiver(Destination{Mode: Filesystem, Path: dst}))
		job.Source = Source{Mode: Filesystem, Path: src}
		job.UploadURL = "https://" + closedAddr(t) // the Service, not routed yet
		job.AddressFile = filepath.Join(dir, "address1")
		writeFile(t, job.AddressFile, "", 0o644) // not known yet
		go func() {
			time.Sleep(300 * time.Millisecond)
			_ = os.WriteFile(job.AddressFile, []byte(srv.Listener.Addr().String()+"\n"), 0o644)
		}()
		job.RetryWindow = 10 * time.Second
		if err := Run(context.Background(), job); err != nil {
			t.Fatal(err)
		}
		if b, err := os.ReadFile(filepath.Join(dst, "hello.txt")); err != nil || string(b) != "hello" {
			t.Fatalf("hello.txt: %q %v", b, err)
		}
	})
	t.Run("a stale address", func(t *testing.T) {
		dst := mkdir(t, dir, "dst2")
		_, job := tlsUpload(t, receiver(Destination{Mode: Filesystem, Path: dst}))
		job.Source = Source{Mode: Filesystem, Path: src}
		job.AddressFile = filepath.Join(dir, "address2")
		writeFile(t, job.AddressFile, closedAddr(t), 0o644)
		job.RetryWindow = 10 * time.Second
		if err := Run(context.Background(), job); err != nil {
			t.Fatal(err)
		}
		if b, err := os.ReadFile(filepath.Join(dst, "hello.txt")); err != nil || string(b) != "hello" {
			t.Fatalf("hello.txt: %q %v", b, err)
		}
	})
}

func TestDirectTarget(t *testing.T) {
	dir := tempDir(t)
	n := 0
	file := func(content string) string {
		n++
		p := filepath.Join(dir, "address"+strconv.Itoa(n))
		writeFile(t, p, content, 0o644)
		return p
	}
	const svc = "https://10.96.0.7:443/v1beta1/upload"
	for _, tc := range []struct{ file, want string }{
		{"", ""},
		{filepath.Join(dir, "missing"), ""},
		{file(""), ""},
		{file("10.244.1.9:8443\n"), "https://10.244.1.9:8443/v1beta1/upload"},
		{file("[fd00::9]:8443"), "https://[fd00::9]:8443/v1beta1/upload"},
		{file("not an address"), ""},
		{file("example.com:8443"), ""},
	} {
		if got := directTarget(svc, tc.file); got != tc.want {
			t.Errorf("directTarget(%q) = %q, want %q", tc.file, got, tc.want)
		}
	}
}
