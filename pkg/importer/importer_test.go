package importer

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kubefill/kubefill/pkg/contract"
	"github.com/kubefill/kubefill/pkg/datapath/testimg"
)

func env(m map[string]string) (func(string) string, []string) {
	var list []string
	for k, v := range m {
		list = append(list, k+"="+v)
	}
	return func(k string) string { return m[k] }, list
}

func TestConfigFromEnv(t *testing.T) {
	tests := []struct {
		name    string
		env     map[string]string
		wantErr string
		check   func(t *testing.T, c *Config)
	}{
		{name: "defaults", env: map[string]string{contract.EnvEndpoint: "http://x/disk.img"}, check: func(t *testing.T, c *Config) {
			if c.Source != contract.SourceHTTP || c.ContentType != "kubevirt" || c.FilesystemOverhead != 0.06 || c.ImageSize != 0 || c.Preallocation {
				t.Fatalf("%+v", c)
			}
		}},
		{name: "full", env: map[string]string{
			contract.EnvSource: "S3", contract.EnvEndpoint: "s3://b/k", contract.EnvContentType: "archive", contract.EnvImageSize: "10Gi",
			contract.EnvFilesystemOverhead: "0.1", contract.EnvPreallocation: "true", contract.EnvInsecureTLS: "true", contract.EnvOwnerUID: "uid",
			contract.EnvChecksum: "sha256:00", contract.EnvExtraHeaderPrefix + "1": "B: 2", contract.EnvExtraHeaderPrefix + "0": "A: 1",
			"HTTPS_PROXY": "http://proxy:3128", contract.EnvNoProxy: ".local",
		}, check: func(t *testing.T, c *Config) {
			if c.Source != contract.SourceS3 || c.ContentType != "archive" || c.ImageSize != 10<<30 || c.FilesystemOverhead != 0.1 ||
				!c.Preallocation || !c.InsecureTLS || c.OwnerUID != "uid" || c.Checksum != "sha256:00" ||
				strings.Join(c.ExtraHeaders, ",") != "A: 1,B: 2" || c.HTTPSProxy != "http://proxy:3128" || c.NoProxy != ".local" {
				t.Fatalf("%+v", c)
			}
		}},
		{name: "blank needs no endpoint", env: map[string]string{contract.EnvSource: "none", contract.EnvImageSize: "1G"}},
		{name: "missing endpoint", env: map[string]string{}, wantErr: contract.EnvEndpoint},
		{name: "bad source", env: map[string]string{contract.EnvSource: "vddk", contract.EnvEndpoint: "x"}, wantErr: "not supported"},
		{name: "bad content type", env: map[string]string{contract.EnvEndpoint: "x", contract.EnvContentType: "iso"}, wantErr: contract.EnvContentType},
		{name: "bad size", env: map[string]string{contract.EnvEndpoint: "x", contract.EnvImageSize: "ten"}, wantErr: contract.EnvImageSize},
		{name: "bad overhead", env: map[string]string{contract.EnvEndpoint: "x", contract.EnvFilesystemOverhead: "1.5"}, wantErr: contract.EnvFilesystemOverhead},
		{name: "bad bool", env: map[string]string{contract.EnvEndpoint: "x", contract.EnvPreallocation: "maybe"}, wantErr: contract.EnvPreallocation},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			get, list := env(tc.env)
			c, err := ConfigFromEnv(get, list)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tc.check != nil {
				tc.check(t, c)
			}
		})
	}
}

func TestUsableSize(t *testing.T) {
	for _, c := range []struct {
		req, avail int64
		ovh        float64
		want       int64
	}{
		{1 << 30, 0, 0.06, 1009316864},
		{1 << 30, 2 << 30, 0.06, 1009316864},
		{1 << 30, 512 << 20, 0, 512 << 20},
		{0, 100 << 20, 0.5, 50 << 20},
		{0, 0, 0.06, 0},
		{1000, 0, 0, 512},
	} {
		if got := UsableSize(c.req, c.avail, c.ovh); got != c.want {
			t.Errorf("UsableSize(%d,%d,%g) = %d, want %d", c.req, c.avail, c.ovh, got, c.want)
		}
	}
}

func TestParseHeaders(t *testing.T) {
	h, err := ParseHeaders([]string{"x-token: abc", "Accept: a", "Accept: b"})
	if err != nil || h.Get("X-Token") != "abc" || len(h.Values("Accept")) != 2 {
		t.Fatalf("%v %v", h, err)
	}
	for _, bad := range []string{"novalue", ": v", "a b: c", "a: b\r\nc: d"} {
		_, err := ParseHeaders([]string{bad})
		if err == nil {
			t.Errorf("%q accepted", bad)
		} else if strings.Contains(err.Error(), "c: d") {
			t.Errorf("error echoes the header value: %v", err)
		}
	}
}

func TestChooseDestination(t *testing.T) {
	p := DefaultPaths()
	if d := ChooseDestination(p, os.ModeDevice, true); !d.Block || d.Path != contract.BlockPath {
		t.Fatal(d)
	}
	if d := ChooseDestination(p, 0, true); d.Block || d.Path != contract.DataPath {
		t.Fatal(d)
	}
	if d := ChooseDestination(p, 0, false); d.Block {
		t.Fatal(d)
	}
}

func TestMetricsOverTLS(t *testing.T) {
	reg := prometheus.NewRegistry()
	p, err := NewProgress(reg, "owner-1")
	if err != nil {
		t.Fatal(err)
	}
	ms, err := StartMetrics("127.0.0.1:0", "", "", reg)
	if err != nil {
		t.Fatal(err)
	}
	defer ms.Close()
	p.Update(425, 1000)
	p.Update(100, 1000)                                                                                        // progress never goes back
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // self-signed, as Prometheus scrapes it
	resp, err := client.Get("https://" + ms.Addr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.TLS == nil {
		t.Fatal("metrics not served over TLS")
	}
	body, _ := io.ReadAll(resp.Body)
	if !strings.Contains(string(body), `kubevirt_cdi_import_progress_total{ownerUID="owner-1"} 42.5`) {
		t.Fatalf("metrics:\n%s", body)
	}
	// Plain HTTP must not get metrics.
	if r, err := http.Get("http://" + ms.Addr() + "/metrics"); err == nil {
		r.Body.Close()
		if r.StatusCode == http.StatusOK {
			t.Fatal("metrics served over plain HTTP")
		}
	}
}

func runJob(t *testing.T, vars map[string]string, p Paths) (contract.TerminationMessage, error) {
	t.Helper()
	get, list := env(vars)
	cfg, err := ConfigFromEnv(get, list)
	if err != nil {
		t.Fatal(err)
	}
	runErr := Run(context.Background(), cfg, p, testr.New(t))
	b, err := os.ReadFile(p.TerminationLog)
	if err != nil {
		t.Fatal(err)
	}
	var m contract.TerminationMessage
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("termination message %q: %v", b, err)
	}
	return m, runErr
}

func TestRunEndToEnd(t *testing.T) {
	testimg.RequireQemuImg(t)
	dir := t.TempDir()
	raw := testimg.Raw(t, dir, 8<<20)
	want := testimg.RawSHA256(t, raw, "raw")
	testimg.Convert(t, raw, "raw", filepath.Join(dir, "disk.qcow2"), "qcow2", "-c")
	testimg.Convert(t, raw, "raw", filepath.Join(dir, "disk.vmdk"), "vmdk")
	srv := testimg.NewServer(t, dir, false)
	srv.Header, srv.Value = "X-Secret", "hunter2"
	hdrDir := t.TempDir()
	os.WriteFile(filepath.Join(hdrDir, "secretHeader"), []byte("X-Secret: hunter2\n"), 0o600)

	paths := func() Paths {
		vol := t.TempDir()
		return Paths{DataPath: filepath.Join(vol, "disk.img"), BlockPath: filepath.Join(vol, "no-block"), ScratchDir: filepath.Join(vol, "no-scratch"), TerminationLog: filepath.Join(vol, "termination-log")}
	}

	// qcow2 over HTTP with a secret header, resized to 64Mi minus overhead.
	p := paths()
	m, err := runJob(t, map[string]string{contract.EnvEndpoint: srv.FileURL("disk.qcow2"), contract.EnvImageSize: "64Mi", contract.EnvSecretExtraHeadersDir: hdrDir, contract.EnvOwnerUID: "u1"}, p)
	if err != nil || m.Outcome != contract.OutcomeSucceeded || *m.Message != contract.MessageImportComplete || m.PreallocationApplied == nil || *m.PreallocationApplied {
		t.Fatalf("qcow2 import: %v %+v", err, m)
	}
	st, _ := os.Stat(p.DataPath)
	if st.Size() != UsableSize(64<<20, 0, 0.06) {
		t.Fatalf("image size %d", st.Size())
	}
	os.Truncate(p.DataPath, 8<<20)
	if testimg.FileSHA256(t, p.DataPath) != want {
		t.Fatal("data mismatch")
	}

	// vmdk without a scratch volume: scratchSpaceRequired, failure.
	p = paths()
	m, err = runJob(t, map[string]string{contract.EnvEndpoint: srv.FileURL("disk.vmdk"), contract.EnvImageSize: "64Mi", contract.EnvSecretExtraHeadersDir: hdrDir}, p)
	if err == nil || m.Outcome != contract.OutcomeFailed || m.ScratchSpaceRequired == nil || !*m.ScratchSpaceRequired || m.Permanent != nil {
		t.Fatalf("vmdk without scratch: %v %+v", err, m)
	}
	// ... and with one it works.
	os.Mkdir(p.ScratchDir, 0o755)
	m, err = runJob(t, map[string]string{contract.EnvEndpoint: srv.FileURL("disk.vmdk"), contract.EnvImageSize: "64Mi", contract.EnvSecretExtraHeadersDir: hdrDir, contract.EnvPreallocation: "true"}, p)
	if err != nil || m.Outcome != contract.OutcomeSucceeded || !*m.PreallocationApplied {
		t.Fatalf("vmdk with scratch: %v %+v", err, m)
	}

	// Too big: fails early with a clear message and no success marker.
	p = paths()
	m, err = runJob(t, map[string]string{contract.EnvEndpoint: srv.FileURL("disk.qcow2"), contract.EnvImageSize: "4Mi", contract.EnvSecretExtraHeadersDir: hdrDir}, p)
	if err == nil || m.Outcome != contract.OutcomeFailed || !strings.Contains(*m.Message, "larger than the target") || m.Permanent == nil || !*m.Permanent {
		t.Fatalf("too big: %v %+v", err, m)
	}
	// Without the secret header the server refuses; the secret is not in the message.
	p = paths()
	m, err = runJob(t, map[string]string{contract.EnvEndpoint: srv.FileURL("disk.qcow2"), contract.EnvImageSize: "64Mi", contract.EnvSecretExtraHeadersDir: t.TempDir(), contract.EnvAccessKeyID: "user", contract.EnvSecretKey: "pa55word"}, p)
	if err == nil || m.Outcome != contract.OutcomeFailed || !strings.Contains(*m.Message, "403") || strings.Contains(*m.Message, "pa55word") || m.Permanent == nil || !*m.Permanent {
		t.Fatalf("forbidden: %v %+v", err, m)
	}

	// Blank.
	p = paths()
	m, err = runJob(t, map[string]string{contract.EnvSource: contract.SourceNone, contract.EnvImageSize: "1Gi"}, p)
	if err != nil || m.Outcome != contract.OutcomeSucceeded {
		t.Fatalf("blank: %v %+v", err, m)
	}
	if st, _ := os.Stat(p.DataPath); st.Size() != UsableSize(1<<30, 0, 0.06) {
		t.Fatalf("blank size %d", st.Size())
	}
}

// The progress metric rises while an import runs and is served over TLS.
func TestRunServesProgress(t *testing.T) {
	testimg.RequireQemuImg(t)
	dir := t.TempDir()
	raw := testimg.Raw(t, dir, 8<<20)
	testimg.Convert(t, raw, "raw", filepath.Join(dir, "disk.qcow2"), "qcow2")
	srv := testimg.NewServer(t, dir, false)
	srv.Delay = 40 * time.Millisecond // ~6 MB of data in ~1 s
	vol := t.TempDir()
	p := Paths{DataPath: filepath.Join(vol, "disk.img"), BlockPath: filepath.Join(vol, "none"), ScratchDir: filepath.Join(vol, "none"),
		TerminationLog: filepath.Join(vol, "termination-log"), MetricsAddr: "127.0.0.1:0"}
	seen := make(chan []float64, 1)
	p.OnMetrics = func(addr string) {
		go func() {
			client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // self-signed
			var vals []float64
			for range 100 {
				resp, err := client.Get("https://" + addr + "/metrics")
				if err != nil {
					break // the importer finished and closed the server
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				for _, l := range strings.Split(string(b), "\n") {
					if v, ok := strings.CutPrefix(l, `kubevirt_cdi_import_progress_total{ownerUID="owner-7"} `); ok {
						f, _ := strconv.ParseFloat(v, 64)
						vals = append(vals, f)
					}
				}
				time.Sleep(50 * time.Millisecond)
			}
			seen <- vals
		}()
	}
	m, err := runJob(t, map[string]string{contract.EnvEndpoint: srv.FileURL("disk.qcow2"), contract.EnvImageSize: "64Mi", contract.EnvOwnerUID: "owner-7"}, p)
	if err != nil || m.Outcome != contract.OutcomeSucceeded {
		t.Fatalf("%v %+v", err, m)
	}
	vals := <-seen
	mid := 0
	for i, v := range vals {
		if i > 0 && v < vals[i-1] {
			t.Fatalf("progress went down: %v", vals)
		}
		if v > 0 && v < 100 {
			mid++
		}
	}
	if mid == 0 {
		t.Fatalf("no intermediate progress seen: %v", vals)
	}
	t.Logf("progress samples: %v", vals)
}

// SIGTERM mid-import (the pod being deleted) stops the importer within a
// few seconds even while a read from the source is blocked: it returns a
// context error, writes a Failed termination message that says it was
// interrupted (never the success marker, never permanent), truncates the
// half-written image and does not retry the download.
func TestRunStopsOnSIGTERM(t *testing.T) {
	const total, sent = 64 << 20, 4 << 20
	data := make([]byte, sent)
	for i := range data {
		data[i] = byte(i*7 + 1) // no all-zero blocks: every byte is written
	}
	var requests atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		w.Header().Set("Content-Length", strconv.Itoa(total))
		w.Write(data)
		w.(http.Flusher).Flush()
		<-r.Context().Done() // the rest never comes: the importer's read blocks
	}))
	defer srv.Close()
	vol := t.TempDir()
	p := Paths{DataPath: filepath.Join(vol, "disk.img"), BlockPath: filepath.Join(vol, "none"), ScratchDir: filepath.Join(vol, "none"),
		TerminationLog: filepath.Join(vol, "termination-log")}
	get, list := env(map[string]string{contract.EnvEndpoint: srv.URL + "/disk.img", contract.EnvImageSize: "128Mi"})
	cfg, err := ConfigFromEnv(get, list)
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := SignalContext(context.Background())
	defer stop()
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg, p, testr.New(t)) }()

	// Wait until part of the image is on disk, so there is something to discard.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if st, err := os.Stat(p.DataPath); err == nil && st.Size() > 0 {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("import ended before the signal: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("no data written")
		}
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	var runErr error
	select {
	case runErr = <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the importer did not stop within 5s of SIGTERM")
	}
	t.Logf("stopped %s after SIGTERM: %v", time.Since(start).Round(time.Millisecond), runErr)
	if !errors.Is(runErr, context.Canceled) {
		t.Errorf("error %v is not a context error", runErr)
	}
	b, err := os.ReadFile(p.TerminationLog)
	if err != nil {
		t.Fatal(err)
	}
	var m contract.TerminationMessage
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("termination message %q: %v", b, err)
	}
	if m.Outcome != contract.OutcomeFailed || m.Message == nil || !strings.Contains(*m.Message, "interrupted") ||
		!strings.Contains(*m.Message, "terminated") || m.Permanent != nil || m.ScratchSpaceRequired != nil {
		t.Errorf("termination message %s", b)
	}
	if st, err := os.Stat(p.DataPath); err != nil || st.Size() != 0 {
		t.Errorf("the half-written image was not truncated: %v %v", st.Size(), err)
	}
	if n := requests.Load(); n != 1 {
		t.Errorf("%d requests: the download was retried after the signal", n)
	}
}
