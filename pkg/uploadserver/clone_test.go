package uploadserver

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"

	"github.com/kubefill/kubefill/pkg/cloner"
	"github.com/kubefill/kubefill/pkg/contract"
	"github.com/kubefill/kubefill/pkg/datapath/testimg"
	"github.com/kubefill/kubefill/pkg/importer"
)

// cloneName is the client name the controller gives a clone's upload
// server and the source pod's certificate: <srcNs>/<srcName>-<tgtNs>/<tgtName>.
const cloneName = "src-ns/src-disk-tgt-ns/tgt-disk"

// cloneImgSize is the logical size of the test disk images.
const cloneImgSize = 64 << 20

func (p *certSet) issueClient(t *testing.T, cn string) (certPEM, keyPEM []byte, pair tls.Certificate) {
	t.Helper()
	c, k, err := p.clientCA.Issue(cn, nil, true, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	pair, err = tls.X509KeyPair(c, k)
	if err != nil {
		t.Fatal(err)
	}
	return c, k, pair
}

// cloneTarget is an upload server that is a clone's target, with the
// source pod's client.
type cloneTarget struct {
	*running
	client             *http.Client
	certPEM, keyPEM    []byte
	blockPath, dataDir string
}

// startClone runs a clone target on loopback. With block, its volume is a
// regular file of blockSize bytes full of stale data, standing in for the
// device; else the Filesystem volume's directory.
func startClone(t *testing.T, block bool, blockSize int64, mutate func(*Config)) *cloneTarget {
	t.Helper()
	var blockPath string
	name := cloneName
	r := start(t, func(c *Config) {
		c.ClientName = cloneName
		c.ImageSize = 0
		if block {
			blockPath = filepath.Join(filepath.Dir(c.Paths.TerminationLog), "cdi-block-volume")
			junk := bytes.Repeat([]byte("stale device data "), int(blockSize/18)+1)[:blockSize]
			if err := os.WriteFile(blockPath, junk, 0o600); err != nil {
				t.Fatal(err)
			}
			c.Paths.BlockPath, c.blockFile = blockPath, true
		}
		if mutate != nil {
			mutate(c)
		}
		name = c.ClientName
	})
	crt, key, pair := r.pki.issueClient(t, name)
	return &cloneTarget{running: r, client: r.pki.client(&pair), certPEM: crt, keyPEM: key, blockPath: blockPath, dataDir: filepath.Dir(r.dataPath)}
}

// postClone sends src's clone stream, produced as it is sent (chunked, as
// the source pod sends it), with the given x-cdi-content-type. It returns
// the status and body, or 0 and the error when no answer came.
func postClone(t *testing.T, c *http.Client, url string, src cloner.Source, contentType string, w func(io.Writer) io.Writer) (int, string) {
	t.Helper()
	pr, pw := io.Pipe()
	go func() {
		var out io.Writer = pw
		if w != nil {
			out = w(pw)
		}
		_, err := cloner.WriteStream(context.Background(), out, src, nil)
		pw.CloseWithError(err)
	}()
	defer pr.Close()
	req, err := http.NewRequest(http.MethodPost, url, pr)
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = -1
	if contentType != "" {
		req.Header.Set(cloner.HeaderContentType, contentType)
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := c.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(b))
}

// streamBytes is src's whole clone stream.
func streamBytes(t *testing.T, src cloner.Source) []byte {
	t.Helper()
	var buf bytes.Buffer
	if _, err := cloner.WriteStream(context.Background(), &buf, src, nil); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// sparseImage writes a cloneImgSize sparse file at path: random data at
// 0, text at 20 MiB, allocated zeros at 40 MiB (which become a hole on the
// target), random data in the last 512 KiB. It returns the bytes of data
// that are not zero.
func sparseImage(t *testing.T, path string) int64 {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(cloneImgSize); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewChaCha8([32]byte{7}))
	random := func(n int) []byte {
		b := make([]byte, n)
		for i := 0; i+8 <= n; i += 8 {
			binary.LittleEndian.PutUint64(b[i:], rng.Uint64())
		}
		return b
	}
	text := bytes.Repeat([]byte("kubefill clone sparse extent "), (2<<20)/29+1)[:2<<20]
	for _, w := range []struct {
		off  int64
		data []byte
	}{
		{0, random(1 << 20)},
		{20 << 20, text},
		{40 << 20, make([]byte, 1<<20)},
		{cloneImgSize - 512<<10, random(512 << 10)},
	} {
		if _, err := f.WriteAt(w.data, w.off); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	return 1<<20 + 2<<20 + 512<<10
}

func allocatedBytes(t *testing.T, path string) int64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

// fsSource is a Filesystem source volume holding a sparse disk.img, and
// the image's data bytes.
func fsSource(t *testing.T) (string, int64) {
	t.Helper()
	dir := t.TempDir()
	return dir, sparseImage(t, filepath.Join(dir, cloner.ImageName))
}

// termination reads the server's termination message after it exited.
func (r *running) termination(t *testing.T) contract.TerminationMessage {
	t.Helper()
	var m contract.TerminationMessage
	if err := json.Unmarshal(mustRead(t, r.termLog), &m); err != nil {
		t.Fatal(err)
	}
	return m
}

func checkCloneComplete(t *testing.T, r *running, prealloc bool) {
	t.Helper()
	r.waitExit(t)
	m := r.termination(t)
	want := "Clone Complete"
	if prealloc {
		want += ", Preallocation applied"
	}
	if m.Message == nil || *m.Message != want || m.PreallocationApplied == nil || *m.PreallocationApplied != prealloc {
		t.Errorf("termination message %s, want %q with preallocationApplied %v", mustRead(t, r.termLog), want, prealloc)
	}
	if v := r.srv.progress.Value(); v != 100 {
		t.Errorf("progress %.2f%% after the clone, want 100", v)
	}
}

// TestCloneFilesystemToFilesystem: a filesystem-clone of a volume with a
// sparse disk.img (and a small tree) arrives byte for byte, as sparse as
// the source, lost+found left behind; the server exits with "Clone Complete".
func TestCloneFilesystemToFilesystem(t *testing.T) {
	src, data := fsSource(t)
	if err := os.MkdirAll(filepath.Join(src, "notes"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "notes", "readme.txt"), []byte("cloned with the image\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(src, "lost+found"), 0o700); err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(src, cloner.ImageName)
	ct := startClone(t, false, 0, nil)
	start := time.Now()
	code, msg := postClone(t, ct.client, ct.url+cloner.UploadPath, cloner.Source{Mode: cloner.Filesystem, Path: src}, cloner.ContentTypeFilesystem, nil)
	if code != http.StatusOK {
		t.Fatalf("clone: %d %s", code, msg)
	}
	took := time.Since(start)
	checkCloneComplete(t, ct.running, false)
	got := filepath.Join(ct.dataDir, cloner.ImageName)
	if a, b := testimg.FileSHA256(t, got), testimg.FileSHA256(t, img); a != b {
		t.Fatalf("disk.img sha256 %s, want the source's %s", a, b)
	}
	srcAlloc, dstAlloc := allocatedBytes(t, img), allocatedBytes(t, got)
	t.Logf("64 MiB sparse disk.img cloned in %v: source allocates %d KiB (%d KiB of it data), target %d KiB", took.Round(time.Millisecond), srcAlloc>>10, data>>10, dstAlloc>>10)
	if dstAlloc > srcAlloc+64<<10 || dstAlloc < data-64<<10 {
		t.Errorf("the target allocates %d bytes, want about the source's %d (its data: %d)", dstAlloc, srcAlloc, data)
	}
	if b, err := os.ReadFile(filepath.Join(ct.dataDir, "notes", "readme.txt")); err != nil || string(b) != "cloned with the image\n" {
		t.Errorf("notes/readme.txt: %q %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(ct.dataDir, "lost+found")); err == nil {
		t.Error("lost+found travelled")
	}
}

// TestCloneBlockToFilesystem: a blockdevice-clone (from a regular file
// standing in for the source device) becomes disk.img, its zeros holes;
// sent by the real source-pod client, cloner.Run.
func TestCloneBlockToFilesystem(t *testing.T) {
	dir := t.TempDir()
	dev := filepath.Join(dir, "source-device")
	data := sparseImage(t, dev)
	ct := startClone(t, false, 0, nil)
	termLog := filepath.Join(dir, "source-termination-log")
	err := cloner.Run(context.Background(), cloner.Job{
		Source: cloner.Source{Mode: cloner.Block, Path: dev}, UploadURL: ct.url,
		ServerCA: ct.pki.serverCA.CertPEM, ClientCert: ct.certPEM, ClientKey: ct.keyPEM,
		TerminationLog: termLog, Log: testr.New(t),
	})
	if err != nil {
		t.Fatalf("cloner.Run: %v", err)
	}
	checkCloneComplete(t, ct.running, false)
	got := filepath.Join(ct.dataDir, cloner.ImageName)
	if a, b := testimg.FileSHA256(t, got), testimg.FileSHA256(t, dev); a != b {
		t.Fatalf("disk.img sha256 %s, want the device's %s", a, b)
	}
	if alloc := allocatedBytes(t, got); alloc > data+64<<10 {
		t.Errorf("disk.img allocates %d bytes, want about its %d bytes of data", alloc, data)
	} else {
		t.Logf("disk.img allocates %d KiB for %d KiB of data", alloc>>10, data>>10)
	}
	if b := mustRead(t, termLog); !bytes.Contains(b, []byte("Clone Complete")) {
		t.Errorf("source termination message %s", b)
	}
}

// TestCloneFilesystemToBlock: the disk.img of a filesystem-clone goes to
// the device (a file full of stale data standing in for one): the device
// reads back as the image, its zero ranges punched.
func TestCloneFilesystemToBlock(t *testing.T) {
	src, data := fsSource(t)
	ct := startClone(t, true, cloneImgSize, nil)
	code, msg := postClone(t, ct.client, ct.url+cloner.UploadPath, cloner.Source{Mode: cloner.Filesystem, Path: src}, cloner.ContentTypeFilesystem, nil)
	if code != http.StatusOK {
		t.Fatalf("clone: %d %s", code, msg)
	}
	checkCloneComplete(t, ct.running, false)
	if a, b := testimg.FileSHA256(t, ct.blockPath), testimg.FileSHA256(t, filepath.Join(src, cloner.ImageName)); a != b {
		t.Fatalf("device sha256 %s, want the source disk.img's %s", a, b)
	}
	if _, err := os.Stat(filepath.Join(ct.dataDir, cloner.ImageName)); err == nil {
		t.Error("a Block target got a disk.img in the data directory too")
	}
	t.Logf("device allocates %d KiB for %d KiB of data", allocatedBytes(t, ct.blockPath)>>10, data>>10)
}

// TestCloneBlockToBlock: raw device to device, stale data overwritten.
func TestCloneBlockToBlock(t *testing.T) {
	dev := filepath.Join(t.TempDir(), "source-device")
	sparseImage(t, dev)
	ct := startClone(t, true, cloneImgSize, nil)
	code, msg := postClone(t, ct.client, ct.url+"/v1alpha1/upload", cloner.Source{Mode: cloner.Block, Path: dev}, cloner.ContentTypeBlock, nil)
	if code != http.StatusOK {
		t.Fatalf("clone: %d %s", code, msg)
	}
	checkCloneComplete(t, ct.running, false)
	if a, b := testimg.FileSHA256(t, ct.blockPath), testimg.FileSHA256(t, dev); a != b {
		t.Fatalf("device sha256 %s, want the source's %s", a, b)
	}
}

// TestClonePreallocation: with --preallocation the image is fully
// allocated and the message says so.
func TestClonePreallocation(t *testing.T) {
	src, _ := fsSource(t)
	ct := startClone(t, false, 0, func(c *Config) { c.Preallocation = true })
	code, msg := postClone(t, ct.client, ct.url+cloner.UploadPath, cloner.Source{Mode: cloner.Filesystem, Path: src, Dense: true}, cloner.ContentTypeFilesystem, nil)
	if code != http.StatusOK {
		t.Fatalf("clone: %d %s", code, msg)
	}
	checkCloneComplete(t, ct.running, true)
	got := filepath.Join(ct.dataDir, cloner.ImageName)
	if a, b := testimg.FileSHA256(t, got), testimg.FileSHA256(t, filepath.Join(src, cloner.ImageName)); a != b {
		t.Fatalf("disk.img sha256 %s, want %s", a, b)
	}
	if alloc := allocatedBytes(t, got); alloc < cloneImgSize {
		t.Errorf("preallocated disk.img allocates %d of its %d bytes", alloc, cloneImgSize)
	}
}

// TestCloneRefusals: another client name (even one differing after a "/")
// gets 401, async and the other paths 400, an unknown content type 400, a
// clone into an upload pod that is not a clone target 403; none of them
// touches the volume, and the real clone then succeeds.
func TestCloneRefusals(t *testing.T) {
	src, _ := fsSource(t)
	fsSrc := cloner.Source{Mode: cloner.Filesystem, Path: src}
	ct := startClone(t, false, 0, nil)
	for _, name := range []string{"src-ns/src-disk-tgt-ns/other-disk", "other-ns/src-disk-tgt-ns/tgt-disk", "kubefill-uploadproxy"} {
		_, _, pair := ct.pki.issueClient(t, name)
		code, msg := postClone(t, ct.pki.client(&pair), ct.url+cloner.UploadPath, fsSrc, cloner.ContentTypeFilesystem, nil)
		t.Logf("client %q: %d %s", name, code, msg)
		if code != http.StatusUnauthorized || !strings.Contains(msg, name) || !strings.Contains(msg, cloneName) {
			t.Errorf("clone from client %q: %d %q, want 401 naming both clients", name, code, msg)
		}
	}
	if code, msg := postClone(t, ct.pki.client(nil), ct.url+cloner.UploadPath, fsSrc, cloner.ContentTypeFilesystem, nil); code != http.StatusUnauthorized {
		t.Errorf("clone without a client certificate: %d %s, want 401", code, msg)
	}
	for _, c := range []struct {
		path, contentType string
		code              int
		reason            string
	}{
		{"/v1beta1/upload-async", cloner.ContentTypeFilesystem, http.StatusBadRequest, "async clone not supported"},
		{"/v1beta1/upload-async", cloner.ContentTypeBlock, http.StatusBadRequest, "async clone not supported"},
		{"/v1alpha1/upload-async", cloner.ContentTypeBlock, http.StatusBadRequest, "async clone not supported"},
		{"/v1beta1/upload-form-async", cloner.ContentTypeBlock, http.StatusBadRequest, "async clone not supported"},
		{"/v1beta1/upload-archive", cloner.ContentTypeFilesystem, http.StatusBadRequest, "/v1beta1/upload"},
		{"/v1beta1/upload-form", cloner.ContentTypeFilesystem, http.StatusBadRequest, "/v1beta1/upload"},
		{cloner.UploadPath, "tarball-clone", http.StatusBadRequest, "unknown x-cdi-content-type"},
	} {
		code, msg := postClone(t, ct.client, ct.url+c.path, fsSrc, c.contentType, nil)
		if code != c.code || msg != c.reason && !strings.Contains(msg, c.reason) {
			t.Errorf("%s %s: %d %q, want %d %q", c.path, c.contentType, code, msg, c.code, c.reason)
		}
	}
	if entries, _ := os.ReadDir(ct.dataDir); len(entries) != 0 {
		t.Errorf("refused clones left %d entries in the volume", len(entries))
	}
	code, msg := postClone(t, ct.client, ct.url+cloner.UploadPath, fsSrc, cloner.ContentTypeFilesystem, nil)
	if code != http.StatusOK {
		t.Fatalf("the real clone: %d %s", code, msg)
	}
	checkCloneComplete(t, ct.running, false)

	// An ordinary upload pod (its client is the upload proxy) takes no
	// clone stream, even from its own client.
	up := start(t, func(c *Config) { c.ClientName = "kubefill-uploadproxy" })
	_, _, proxy := up.pki.issueClient(t, "kubefill-uploadproxy")
	if code, msg := postClone(t, up.pki.client(&proxy), up.url+cloner.UploadPath, fsSrc, cloner.ContentTypeFilesystem, nil); code != http.StatusForbidden || !strings.Contains(msg, "not the target of a clone") {
		t.Errorf("a clone into an upload pod: %d %q, want 403", code, msg)
	}
}

// TestCloneLongClientName: the longest names Kubernetes allows (63-byte
// namespaces, 253-byte claim names) make a common name far past X.509's
// 64-character bound; it still works end to end, as in CDI.
func TestCloneLongClientName(t *testing.T) {
	ns, claim := strings.Repeat("n", 63), strings.Repeat("c", 253)
	name := ns + "/" + claim + "-" + ns + "/" + claim
	src, _ := fsSource(t)
	ct := startClone(t, false, 0, func(c *Config) { c.ClientName = name })
	code, msg := postClone(t, ct.client, ct.url+cloner.UploadPath, cloner.Source{Mode: cloner.Filesystem, Path: src}, cloner.ContentTypeFilesystem, nil)
	if code != http.StatusOK {
		t.Fatalf("clone with a %d-byte client name: %d %s", len(name), code, msg)
	}
	checkCloneComplete(t, ct.running, false)
}

// cutWriter passes the stream on until at bytes, then waits for release
// and either fails (cut) or goes on.
type cutWriter struct {
	w       io.Writer
	at, n   int64
	reached chan struct{}
	release chan bool // true: cut the stream here
	once    sync.Once
	cut     bool
}

var errCut = errors.New("the test cut the stream")

func (c *cutWriter) Write(p []byte) (int, error) {
	if c.cut {
		return 0, errCut
	}
	if c.n+int64(len(p)) > c.at {
		c.once.Do(func() {
			close(c.reached)
			c.cut = <-c.release
		})
		if c.cut {
			return 0, errCut
		}
	}
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// TestCloneTruncatedThenRetry: a stream cut halfway (the source pod died),
// one that ends cleanly halfway, and a corrupt one fail without a termination message, progress back to
// 0 and the server up; a retry then succeeds. While the chunked stream
// runs, the server shows 0%: it cannot know the share.
func TestCloneTruncatedThenRetry(t *testing.T) {
	for _, block := range []bool{false, true} {
		name := map[bool]string{false: "filesystem-clone", true: "blockdevice-clone"}[block]
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			src := cloner.Source{Mode: cloner.Filesystem, Path: dir}
			if block {
				src = cloner.Source{Mode: cloner.Block, Path: filepath.Join(dir, "device")}
				sparseImage(t, src.Path)
			} else {
				sparseImage(t, filepath.Join(dir, cloner.ImageName))
			}
			want := testimg.FileSHA256(t, map[bool]string{false: filepath.Join(dir, cloner.ImageName), true: src.Path}[block])
			whole := streamBytes(t, src)
			ct := startClone(t, false, 0, nil)
			url := ct.url + cloner.UploadPath

			cw := &cutWriter{at: int64(len(whole) / 2), reached: make(chan struct{}), release: make(chan bool)}
			answer := make(chan string, 1)
			go func() {
				code, msg := postClone(t, ct.client, url, src, src.ContentType(), func(w io.Writer) io.Writer { cw.w = w; return cw })
				answer <- fmt.Sprintf("%d %s", code, msg)
			}()
			<-cw.reached
			time.Sleep(200 * time.Millisecond) // the server reads what was sent
			if v := ct.progressNow(t); v != 0 {
				t.Errorf("progress %.2f%% halfway through a chunked clone stream, want 0", v)
			}
			cw.release <- true
			t.Logf("the cut stream: %s", <-answer)
			waitIdle(t, ct.running)

			// A stream that ends cleanly (right length, final chunk) but
			// halfway through.
			half := whole[:len(whole)/2+1]
			code, msg := ct.postStream(t, ct.client, cloner.UploadPath, bytes.NewReader(half), int64(len(half)), src.ContentType())
			t.Logf("half a stream, ended cleanly: %d %s", code, msg)
			if code != http.StatusInternalServerError || !strings.Contains(msg, "truncated or corrupt") {
				t.Errorf("half a stream: %d %q, want 500 saying it is truncated or corrupt", code, msg)
			}
			waitIdle(t, ct.running)

			// A corrupt stream: one byte flipped in the middle.
			bad := bytes.Clone(whole)
			bad[len(bad)/2] ^= 0x55
			code, msg = ct.postStream(t, ct.client, cloner.UploadPath, bytes.NewReader(bad), int64(len(bad)), src.ContentType())
			t.Logf("the corrupt stream: %d %s", code, msg)
			if code != http.StatusInternalServerError || !strings.Contains(msg, "truncated or corrupt") {
				t.Errorf("corrupt stream: %d %q, want 500 saying it is truncated or corrupt", code, msg)
			}
			waitIdle(t, ct.running)

			// The retry, with its length known: progress follows the body
			// and stays below 100 until the server answers.
			pr, pw := io.Pipe()
			done := make(chan string, 1)
			go func() {
				code, msg := ct.postStream(t, ct.client, cloner.UploadPath, pr, int64(len(whole)), src.ContentType())
				done <- fmt.Sprintf("%d %s", code, msg)
			}()
			if _, err := pw.Write(whole[:len(whole)/2]); err != nil {
				t.Fatal(err)
			}
			v := ct.waitProgress(t, 25, 50)
			t.Logf("progress with half the stream sent: %.2f%%", v)
			if _, err := pw.Write(whole[len(whole)/2:]); err != nil {
				t.Fatal(err)
			}
			pw.Close()
			if res := <-done; !strings.HasPrefix(res, "200 ") {
				t.Fatalf("the retry: %s", res)
			}
			checkCloneComplete(t, ct.running, false)
			if got := testimg.FileSHA256(t, filepath.Join(ct.dataDir, cloner.ImageName)); got != want {
				t.Errorf("disk.img sha256 %s after the retry, want %s", got, want)
			}
		})
	}
}

// postStream posts body, of size bytes (-1: chunked), as a clone stream
// of cloneType.
func (r *running) postStream(t *testing.T, c *http.Client, path string, body io.Reader, size int64, cloneType string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, r.url+path, body)
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = size
	req.Header.Set(cloner.HeaderContentType, cloneType)
	resp, err := c.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(b))
}

// waitIdle checks a failed clone left the server up, without a
// termination message, progress 0, and ready for another try.
func waitIdle(t *testing.T, r *running) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		r.srv.mu.Lock()
		st := r.srv.state
		r.srv.mu.Unlock()
		if st == stateIdle {
			break
		}
		if st == stateDone || time.Now().After(deadline) {
			t.Fatalf("server state %d after a failed clone, want idle", st)
		}
		time.Sleep(20 * time.Millisecond)
	}
	select {
	case err := <-r.errc:
		t.Fatalf("the server exited (%v) after a failed clone", err)
	default:
	}
	if _, err := os.Stat(r.termLog); err == nil {
		t.Errorf("a failed clone wrote the termination message %s", mustRead(t, r.termLog))
	}
	if v := r.progressNow(t); v != 0 {
		t.Errorf("progress %.2f%% after a failed clone, want 0", v)
	}
}

// TestCloneTooBig: a stream larger than the Block volume is refused with
// 413 and a message saying so, FS→Block (by the tar header) and
// Block→Block (as the bytes arrive); the server stays up.
func TestCloneTooBig(t *testing.T) {
	src, _ := fsSource(t)
	dev := filepath.Join(t.TempDir(), "source-device")
	sparseImage(t, dev)
	for _, c := range []struct {
		name string
		src  cloner.Source
	}{
		{"filesystem-clone", cloner.Source{Mode: cloner.Filesystem, Path: src}},
		{"blockdevice-clone", cloner.Source{Mode: cloner.Block, Path: dev}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ct := startClone(t, true, 8<<20, nil)
			code, msg := postClone(t, ct.client, ct.url+cloner.UploadPath, c.src, c.src.ContentType(), nil)
			t.Logf("%d %s", code, msg)
			if code != http.StatusRequestEntityTooLarge || !strings.Contains(msg, "larger than the destination") {
				t.Errorf("a 64 MiB clone into an 8 MiB device: %d %q, want 413 saying it is larger", code, msg)
			}
			waitIdle(t, ct.running)
		})
	}
}

// TestReceivedNeverFull: a body read to its end shows 99.99%, not 100%,
// until the server has the data on disk.
func TestReceivedNeverFull(t *testing.T) {
	r := start(t, nil)
	r.srv.received(10, 10)
	if v := r.srv.progress.Value(); v != maxBeforeDone {
		t.Errorf("progress %.4f%% with the whole body read, want %.2f", v, maxBeforeDone)
	}
	r.srv.received(5, -1)
	if v := r.srv.progress.Value(); v != maxBeforeDone {
		t.Errorf("progress %.4f%% after an unknown length, want unchanged", v)
	}
}

// A node may present a Block volume as a regular file at the device path
// (the local test node does): with no Filesystem volume mounted, that file
// is the Block target; next to a mounted data directory it is not.
func TestCloneDestinationBlockVolumeAsFile(t *testing.T) {
	dir := t.TempDir()
	block := filepath.Join(dir, "cdi-block-volume")
	if err := os.WriteFile(block, make([]byte, 4096), 0o644); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, "data")
	s := &Server{cfg: Config{Paths: importer.Paths{BlockPath: block, DataPath: filepath.Join(data, "disk.img")}}}
	dst, err := s.cloneDestination()
	if err != nil || dst.Mode != cloner.Block || dst.Path != block {
		t.Fatalf("without a data directory: %+v, %v; want the Block file", dst, err)
	}
	if err := os.Mkdir(data, 0o755); err != nil {
		t.Fatal(err)
	}
	dst, err = s.cloneDestination()
	if err != nil || dst.Mode != cloner.Filesystem || dst.Path != data {
		t.Fatalf("with a data directory: %+v, %v; want the Filesystem directory", dst, err)
	}
}
