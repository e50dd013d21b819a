package datapath

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"

	"github.com/kubefill/kubefill/pkg/datapath/archive"
	"github.com/kubefill/kubefill/pkg/datapath/qcow2"
	"github.com/kubefill/kubefill/pkg/datapath/source"
	"github.com/kubefill/kubefill/pkg/datapath/testimg"
)

const imgSize = 16 << 20

type fixture struct {
	dir     string
	raw     string
	rawSHA  string
	srv     *testimg.Server
	tlsSrv  *testimg.Server
	caPEM   []byte
	once    sync.Once
	initErr error
}

var fx fixture

// setup builds the test images once per test binary, in every format.
func setup(t *testing.T) *fixture {
	t.Helper()
	testimg.RequireQemuImg(t)
	fx.once.Do(func() {
		dir, err := os.MkdirTemp("", "datapath-test-")
		if err != nil {
			fx.initErr = err
			return
		}
		fx.dir = dir
		fx.raw = testimg.Raw(t, dir, imgSize)
		fx.rawSHA = testimg.RawSHA256(t, fx.raw, "raw")
		os.Rename(fx.raw, filepath.Join(dir, "disk.raw"))
		fx.raw = filepath.Join(dir, "disk.raw")
		conv := func(name, f string, args ...string) {
			testimg.Convert(t, fx.raw, "raw", filepath.Join(dir, name), f, args...)
		}
		conv("disk.qcow2", "qcow2")
		conv("disk-zlib.qcow2", "qcow2", "-c")
		conv("disk-zstd.qcow2", "qcow2", "-c", "-o", "compression_type=zstd")
		conv("disk.vmdk", "vmdk")
		conv("disk-stream.vmdk", "vmdk", "-o", "subformat=streamOptimized")
		conv("disk.vdi", "vdi")
		conv("disk.vhdx", "vhdx")
		conv("disk.vpc", "vpc", "-o", "force_size=on")
		sh := func(cmdline string) {
			if out, err := exec.Command("sh", "-c", cmdline).CombinedOutput(); err != nil {
				t.Fatalf("%s: %v\n%s", cmdline, err, out)
			}
		}
		sh("cd " + dir + " && gzip -k -1 disk.raw && gzip -k -1 disk.qcow2 && xz -k -0 -T1 disk.raw && zstd -q -k -1 disk.raw && bzip2 -k -1 disk.vdi")
		sh("cd " + dir + " && gzip -c -1 disk.raw.xz > disk.raw.xz.gz")
	})
	if fx.initErr != nil {
		t.Fatal(fx.initErr)
	}
	return &fx
}

func TestMain(m *testing.M) {
	code := m.Run()
	if fx.dir != "" {
		os.RemoveAll(fx.dir)
	}
	os.Exit(code)
}

func newServer(t *testing.T, f *fixture, tls bool) *testimg.Server {
	return testimg.NewServer(t, f.dir, tls)
}

func httpSrc(t *testing.T, url string, mod func(*source.HTTPConfig)) *source.HTTP {
	t.Helper()
	cfg := source.HTTPConfig{URL: url, Backoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond, Retries: 4}
	if mod != nil {
		mod(&cfg)
	}
	s, err := source.NewHTTP(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func outPath(t *testing.T) string { return filepath.Join(t.TempDir(), "disk.img") }

func TestImportFormatsOverHTTP(t *testing.T) {
	f := setup(t)
	srv := newServer(t, f, false)
	scratch := t.TempDir()
	cases := []struct {
		file, method string
	}{
		{"disk.raw", "stream"},
		{"disk.raw.gz", "stream"},
		{"disk.raw.xz", "stream"},
		{"disk.raw.zst", "stream"},
		{"disk.raw.xz.gz", "stream"},
		{"disk.qcow2", "qcow2-stream"},
		{"disk-zlib.qcow2", "qcow2-stream"},
		{"disk-zstd.qcow2", "qcow2-stream"},
		{"disk.qcow2.gz", "qcow2-scratch"},
		{"disk.vmdk", "qemu-img"},
		{"disk-stream.vmdk", "qemu-img"},
		{"disk.vdi", "qemu-img"},
		{"disk.vdi.bz2", "qemu-img"},
		{"disk.vhdx", "qemu-img"},
		{"disk.vpc", "qemu-img"},
	}
	for _, c := range cases {
		t.Run(c.file, func(t *testing.T) {
			out := outPath(t)
			res, err := Import(context.Background(), httpSrc(t, srv.FileURL(c.file), nil), Options{Path: out, ScratchDir: scratch, Log: testr.New(t)})
			if err != nil {
				t.Fatal(err)
			}
			if res.Method != c.method {
				t.Fatalf("method %s, want %s", res.Method, c.method)
			}
			if got := testimg.FileSHA256(t, out); got != f.rawSHA {
				t.Fatalf("sha256 %s, qemu-img convert -O raw gives %s", got, f.rawSHA)
			}
			t.Logf("%s: format %s wrappers %v method %s virtual %d written %d", c.file, res.Format, res.Wrappers, res.Method, res.VirtualSize, res.Written)
		})
	}
	if ents, _ := os.ReadDir(scratch); len(ents) != 0 {
		t.Fatalf("scratch files left behind: %v", ents)
	}
}

func TestResizeSparseAndPreallocate(t *testing.T) {
	f := setup(t)
	srv := newServer(t, f, false)
	out := outPath(t)
	size := int64(64 << 20)
	res, err := Import(context.Background(), httpSrc(t, srv.FileURL("disk-zlib.qcow2"), nil), Options{Path: out, Size: size})
	if err != nil {
		t.Fatal(err)
	}
	st, _ := os.Stat(out)
	if st.Size() != size {
		t.Fatalf("size %d, want %d", st.Size(), size)
	}
	if err := os.Truncate(out, imgSize); err != nil {
		t.Fatal(err)
	}
	if got := testimg.FileSHA256(t, out); got != f.rawSHA {
		t.Fatal("data differs after resize")
	}
	// Sparse: roughly half the image is data; the zero half was skipped.
	if res.Written > imgSize*3/4 {
		t.Fatalf("wrote %d bytes of a %d-byte half-empty image", res.Written, imgSize)
	}
	out2 := outPath(t)
	res, err = Import(context.Background(), httpSrc(t, srv.FileURL("disk.raw.gz"), nil), Options{Path: out2, Size: size, Preallocate: true})
	if err != nil || !res.PreallocationApplied {
		t.Fatalf("preallocated import: %v %+v", err, res)
	}
	if alloc := allocated(t, out2); alloc < size {
		t.Fatalf("preallocated file has %d bytes allocated, want %d", alloc, size)
	}
	if alloc := allocated(t, out); alloc >= imgSize {
		t.Fatalf("sparse file has %d bytes allocated", alloc)
	}
}

func TestHTTPSAuthHeadersAndResume(t *testing.T) {
	f := setup(t)
	srv := newServer(t, f, true)
	srv.User, srv.Pass = "alice", "s3cret"
	srv.Header, srv.Value = "X-Token", "abc"
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	mod := func(c *source.HTTPConfig) {
		c.CAPEM = ca
		c.Username, c.Password = "alice", "s3cret"
		c.Header = map[string][]string{"X-Token": {"abc"}}
	}
	// Without the CA the TLS handshake must fail.
	_, err := Import(context.Background(), httpSrc(t, srv.FileURL("disk.raw"), func(c *source.HTTPConfig) { mod(c); c.CAPEM = nil; c.Retries = 1 }), Options{Path: outPath(t)})
	if err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("untrusted server: %v", err)
	}
	// Wrong password: a clear, non-retried auth error that leaks no secret.
	_, err = Import(context.Background(), httpSrc(t, srv.FileURL("disk.raw"), func(c *source.HTTPConfig) { mod(c); c.Password = "nope" }), Options{Path: outPath(t)})
	if err == nil || !strings.Contains(err.Error(), "401") || strings.Contains(err.Error(), "nope") {
		t.Fatalf("bad credentials: %v", err)
	}
	for _, file := range []string{"disk.raw", "disk.raw.gz", "disk-zlib.qcow2"} {
		t.Run(file, func(t *testing.T) {
			srv.DropAfter = 3 << 20
			srv.DropTimes.Store(2)
			srv.RangeRequests.Store(0)
			out := outPath(t)
			if _, err := Import(context.Background(), httpSrc(t, srv.FileURL(file), mod), Options{Path: out}); err != nil {
				t.Fatal(err)
			}
			if got := testimg.FileSHA256(t, out); got != f.rawSHA {
				t.Fatalf("sha256 after resume %s, want %s", got, f.rawSHA)
			}
			if srv.DropTimes.Load() != 0 || srv.RangeRequests.Load() == 0 {
				t.Fatalf("connection was not dropped/resumed: drops left %d, range requests %d", srv.DropTimes.Load(), srv.RangeRequests.Load())
			}
			t.Logf("%s: resumed after 2 drops with %d range requests", file, srv.RangeRequests.Load())
		})
	}
}

func TestHostileInputs(t *testing.T) {
	f := setup(t)
	dir := t.TempDir()
	// A qcow2 whose backing file is a host file.
	secret := filepath.Join(dir, "host-secret")
	os.WriteFile(secret, bytes.Repeat([]byte("SECRET"), 100000), 0o600)
	testimg.QemuImg(t, "create", "-q", "-f", "qcow2", "-b", secret, "-F", "raw", filepath.Join(dir, "backing.qcow2"), "1M")
	// Truncated qcow2.
	b, _ := os.ReadFile(filepath.Join(f.dir, "disk.qcow2"))
	os.WriteFile(filepath.Join(dir, "truncated.qcow2"), b[:len(b)/2], 0o600)
	// Tar with ../
	var tb bytes.Buffer
	tw := tar.NewWriter(&tb)
	tw.WriteHeader(&tar.Header{Name: "../escape", Typeflag: tar.TypeReg, Size: 1, Mode: 0o644})
	tw.Write([]byte("x"))
	tw.Close()
	os.WriteFile(filepath.Join(dir, "evil.tar"), tb.Bytes(), 0o600)
	// Copies of good images for lying servers.
	os.Link(f.raw, filepath.Join(dir, "disk.raw"))
	os.Link(filepath.Join(f.dir, "disk.raw.gz"), filepath.Join(dir, "disk.raw.gz"))
	os.Link(filepath.Join(f.dir, "disk.raw.xz"), filepath.Join(dir, "disk.raw.xz"))
	os.Link(filepath.Join(f.dir, "disk.raw.zst"), filepath.Join(dir, "disk.raw.zst"))
	os.Link(filepath.Join(f.dir, "disk.vdi"), filepath.Join(dir, "disk.vdi"))
	os.Link(filepath.Join(f.dir, "disk-zlib.qcow2"), filepath.Join(dir, "disk-zlib.qcow2"))
	srv := testimg.NewServer(t, dir, false)
	liar := testimg.NewServer(t, dir, false)
	liar.LieLength = 1 << 20
	noRange := testimg.NewServer(t, dir, false)
	noRange.NoRange = true
	noRange.DropAfter = 1 << 20
	plain := testimg.NewServer(t, dir, false) // honest, but no Range support
	plain.NoRange = true

	rawSum, _ := ParseChecksum("sha256:" + f.rawSHA)
	fileSum := func(p string) *Checksum {
		c, err := ParseChecksum("sha256:" + testimg.FileSHA256(t, p))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	cases := []struct {
		name string
		url  string
		opt  Options
		want string
		is   error
	}{
		{name: "backing file qcow2", url: srv.FileURL("backing.qcow2"), want: "backing file", is: qcow2.ErrUnsafe},
		{name: "truncated qcow2", url: srv.FileURL("truncated.qcow2"), want: "truncated"},
		{name: "tar with dotdot", url: srv.FileURL("evil.tar"), opt: Options{ContentType: ContentArchive}, is: archive.ErrUnsafe},
		{name: "lying content-length", url: liar.FileURL("disk.raw"), want: "cannot resume"},
		{name: "wrong checksum raw", url: srv.FileURL("disk.raw"), opt: Options{Checksum: mustSum(t, "sha256:"+strings.Repeat("ab", 32))}, is: ErrChecksum},
		{name: "checksum of decompressed data is not the source's", url: srv.FileURL("disk.raw.gz"), opt: Options{Checksum: rawSum}, is: ErrChecksum},
		{name: "wrong checksum qcow2", url: srv.FileURL("disk-zlib.qcow2"), opt: Options{Checksum: mustSum(t, "md5:"+strings.Repeat("00", 16))}, is: ErrChecksum},
		{name: "raw too big", url: srv.FileURL("disk.raw"), opt: Options{Size: imgSize - 1<<20}, is: ErrTooBig, want: "before"},
		{name: "qcow2 too big", url: srv.FileURL("disk-zlib.qcow2"), opt: Options{Size: imgSize - 1<<20}, is: ErrTooBig},
		{name: "gzip too big, known early", url: srv.FileURL("disk.raw.gz"), opt: Options{Size: 4 << 20}, is: ErrTooBig, want: "at least"},
		{name: "xz too big, known early", url: srv.FileURL("disk.raw.xz"), opt: Options{Size: 4 << 20}, is: ErrTooBig, want: "at least"},
		{name: "zstd too big, known early", url: plain.FileURL("disk.raw.zst"), opt: Options{Size: 4 << 20}, is: ErrTooBig, want: "at least"},
		{name: "gzip bomb bounded", url: plain.FileURL("disk.raw.gz"), opt: Options{Size: 4 << 20}, is: ErrTooBig, want: "data reaches"},
		{name: "vdi too big", url: srv.FileURL("disk.vdi"), opt: Options{Size: 8 << 20}, is: ErrTooBig},
		{name: "vdi without scratch", url: srv.FileURL("disk.vdi"), opt: Options{}, is: ErrScratchRequired},
		{name: "dropped connection without range support", url: noRange.FileURL("disk.raw"), want: "does not support Range"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			opt := c.opt
			if opt.ContentType == ContentArchive {
				opt.Path = t.TempDir()
			} else {
				opt.Path = outPath(t)
				// Pretend a previous attempt left data behind.
				os.WriteFile(opt.Path, []byte("stale"), 0o600)
			}
			if opt.ScratchDir == "" && c.name != "vdi without scratch" {
				opt.ScratchDir = t.TempDir()
			}
			noRange.DropTimes.Store(1)
			_, err := Import(context.Background(), httpSrc(t, c.url, nil), opt)
			if err == nil {
				t.Fatal("hostile input imported without error")
			}
			t.Logf("error: %v", err)
			if c.is != nil && !errors.Is(err, c.is) {
				t.Fatalf("error %v is not %v", err, c.is)
			}
			if c.want != "" && !strings.Contains(err.Error(), c.want) && c.name != "raw too big" {
				t.Fatalf("error %q does not mention %q", err, c.want)
			}
			if opt.ContentType != ContentArchive {
				if st, err := os.Stat(opt.Path); err == nil && st.Size() != 0 {
					t.Fatalf("failed import left a %d-byte image", st.Size())
				}
			} else if _, err := os.Stat(filepath.Join(filepath.Dir(opt.Path), "escape")); err == nil {
				t.Fatal("archive escaped the volume")
			}
		})
	}
	// And the right checksums succeed, on the stream and the qcow2 plan.
	for _, name := range []string{"disk.raw.gz", "disk-zlib.qcow2"} {
		out := outPath(t)
		if _, err := Import(context.Background(), httpSrc(t, srv.FileURL(name), nil), Options{Path: out, Checksum: fileSum(filepath.Join(dir, name))}); err != nil {
			t.Fatalf("%s with the right checksum: %v", name, err)
		}
		if testimg.FileSHA256(t, out) != f.rawSHA {
			t.Fatalf("%s: wrong data", name)
		}
	}
}

func mustSum(t *testing.T, s string) *Checksum {
	c, err := ParseChecksum(s)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestParseChecksum(t *testing.T) {
	sum := sha256.Sum256([]byte("x"))
	for _, c := range []struct {
		in  string
		bad bool
	}{
		{"", false},
		{"sha256:" + hex.EncodeToString(sum[:]), false},
		{"SHA256:" + hex.EncodeToString(sum[:]), false},
		{"md5:" + strings.Repeat("a", 32), false},
		{"sha1:" + strings.Repeat("a", 40), false},
		{"sha512:" + strings.Repeat("a", 128), false},
		{"sha256:abc", true},
		{"crc32:00000000", true},
		{"sha256", true},
		{"sha256:" + strings.Repeat("z", 64), true},
	} {
		_, err := ParseChecksum(c.in)
		if (err != nil) != c.bad {
			t.Errorf("ParseChecksum(%q): %v", c.in, err)
		}
	}
	c := mustSum(t, "sha256:"+hex.EncodeToString(sum[:]))
	h := c.New()
	h.Write([]byte("x"))
	if err := c.Verify(h); err != nil {
		t.Fatal(err)
	}
	h.Write([]byte("y"))
	if err := c.Verify(h); !errors.Is(err, ErrChecksum) {
		t.Fatal("mismatch not detected")
	}
}

func TestArchiveImport(t *testing.T) {
	f := setup(t)
	dir := t.TempDir()
	var tb bytes.Buffer
	tw := tar.NewWriter(&tb)
	tw.WriteHeader(&tar.Header{Name: "disk.img", Typeflag: tar.TypeReg, Size: 5, Mode: 0o644})
	tw.Write([]byte("hello"))
	tw.Close()
	os.WriteFile(filepath.Join(dir, "a.tar"), tb.Bytes(), 0o600)
	if out, err := exec.Command("gzip", "-k", filepath.Join(dir, "a.tar")).CombinedOutput(); err != nil {
		t.Fatal(err, string(out))
	}
	srv := testimg.NewServer(t, dir, false)
	for _, name := range []string{"a.tar", "a.tar.gz"} {
		vol := t.TempDir()
		res, err := Import(context.Background(), httpSrc(t, srv.FileURL(name), nil), Options{ContentType: ContentArchive, Path: vol, Size: 1 << 20})
		if err != nil {
			t.Fatal(err)
		}
		if b, _ := os.ReadFile(filepath.Join(vol, "disk.img")); string(b) != "hello" || res.Method != "archive" {
			t.Fatalf("%s: extracted %q", name, b)
		}
	}
	// A disk image is not an archive.
	_ = f
	srv2 := newServer(t, f, false)
	if _, err := Import(context.Background(), httpSrc(t, srv2.FileURL("disk.qcow2"), nil), Options{ContentType: ContentArchive, Path: t.TempDir()}); err == nil || !strings.Contains(err.Error(), "tar") {
		t.Fatalf("qcow2 as archive: %v", err)
	}
}

func TestBlank(t *testing.T) {
	out := outPath(t)
	res, err := Blank(context.Background(), Options{Path: out, Size: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	st, _ := os.Stat(out)
	if st.Size() != 1<<30 || allocated(t, out) > 1<<20 || res.PreallocationApplied {
		t.Fatalf("blank: size %d allocated %d", st.Size(), allocated(t, out))
	}
	out = outPath(t)
	res, err = Blank(context.Background(), Options{Path: out, Size: 8 << 20, Preallocate: true})
	if err != nil || !res.PreallocationApplied || allocated(t, out) < 8<<20 {
		t.Fatalf("preallocated blank: %v %+v", err, res)
	}
	if _, err := Blank(context.Background(), Options{Path: outPath(t)}); err == nil {
		t.Fatal("blank without size accepted")
	}
}

// Batched plans (a huge image's bounded-memory mode) still verify checksums.
func TestQcow2BatchesWithChecksum(t *testing.T) {
	f := setup(t)
	srv := newServer(t, f, false)
	old := maxPlanExtents
	maxPlanExtents = 16
	defer func() { maxPlanExtents = old }()
	p := filepath.Join(f.dir, "disk-zlib.qcow2")
	sum := mustSum(t, "sha256:"+testimg.FileSHA256(t, p))
	out := outPath(t)
	var last, lastTotal int64
	if _, err := Import(context.Background(), httpSrc(t, srv.FileURL("disk-zlib.qcow2"), nil), Options{Path: out, Checksum: sum, Progress: func(d, tot int64) { last, lastTotal = d, tot }}); err != nil {
		t.Fatal(err)
	}
	if testimg.FileSHA256(t, out) != f.rawSHA {
		t.Fatal("batched import: wrong data")
	}
	if last <= 0 {
		t.Fatalf("no progress reported (%d/%d)", last, lastTotal)
	}
	bad := mustSum(t, "sha256:"+strings.Repeat("0", 64))
	if _, err := Import(context.Background(), httpSrc(t, srv.FileURL("disk-zlib.qcow2"), nil), Options{Path: outPath(t), Checksum: bad}); !errors.Is(err, ErrChecksum) {
		t.Fatalf("batched import with a wrong checksum: %v", err)
	}
}

// A regular file stands in for a block device: its size is the device size.
func TestBlockTargets(t *testing.T) {
	f := setup(t)
	srv := newServer(t, f, false)
	dev := filepath.Join(t.TempDir(), "dev")
	stale := bytes.Repeat([]byte{0xab}, 32<<20)
	os.WriteFile(dev, stale, 0o600)
	// Blank without preallocation writes nothing.
	if _, err := Blank(context.Background(), Options{Path: dev, Block: true}); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(dev); !bytes.Equal(b, stale) {
		t.Fatal("blank block import without preallocation touched the device")
	}
	// With preallocation the device reads as zeros.
	res, err := Blank(context.Background(), Options{Path: dev, Block: true, Preallocate: true})
	if err != nil || !res.PreallocationApplied {
		t.Fatalf("%v %+v", err, res)
	}
	if b, _ := os.ReadFile(dev); !bytes.Equal(b, make([]byte, len(stale))) {
		t.Fatal("preallocated blank block device is not zero")
	}
	// A qcow2 import over stale data: holes must read as zeros.
	for _, name := range []string{"disk-zlib.qcow2", "disk.raw.gz", "disk.vdi"} {
		os.WriteFile(dev, stale, 0o600)
		if _, err := Import(context.Background(), httpSrc(t, srv.FileURL(name), nil), Options{Path: dev, Block: true, ScratchDir: t.TempDir()}); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		os.Truncate(dev, imgSize)
		if testimg.FileSHA256(t, dev) != f.rawSHA {
			t.Fatalf("%s: block import differs from qemu-img's", name)
		}
	}
	// Too big for the device.
	os.WriteFile(dev, stale[:8<<20], 0o600)
	if _, err := Import(context.Background(), httpSrc(t, srv.FileURL("disk-zlib.qcow2"), nil), Options{Path: dev, Block: true, Size: 8 << 20}); !errors.Is(err, ErrTooBig) {
		t.Fatalf("qcow2 larger than the device: %v", err)
	}
}

// A plain stream (as the upload server will pass) works without Range:
// qcow2 goes through scratch, raw streams straight through.
func TestStreamSource(t *testing.T) {
	f := setup(t)
	for _, c := range []struct{ name, method string }{{"disk-zstd.qcow2", "qcow2-scratch"}, {"disk.raw.zst", "stream"}} {
		fh, err := os.Open(filepath.Join(f.dir, c.name))
		if err != nil {
			t.Fatal(err)
		}
		out := outPath(t)
		res, err := Import(context.Background(), &source.Stream{Name: "upload", Body: fh, Len: -1}, Options{Path: out, ScratchDir: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		if res.Method != c.method || testimg.FileSHA256(t, out) != f.rawSHA {
			t.Fatalf("%s: method %s or data wrong", c.name, res.Method)
		}
	}
}

// Large raw images on a Range-capable server are fetched as parallel
// ranges; a dropped range resumes on its own.
func TestRawParallelRanges(t *testing.T) {
	f := setup(t)
	srv := newServer(t, f, false)
	old := parallelRawMin
	parallelRawMin = 1 << 20
	defer func() { parallelRawMin = old }()
	srv.DropAfter = 1 << 20
	srv.DropTimes.Store(2)
	out := outPath(t)
	var last int64
	res, err := Import(context.Background(), httpSrc(t, srv.FileURL("disk.raw"), nil), Options{Path: out, Size: 32 << 20, Progress: func(d, _ int64) { last = d }})
	if err != nil {
		t.Fatal(err)
	}
	if res.Method != "stream-ranges" || last != imgSize {
		t.Fatalf("method %s, progress %d", res.Method, last)
	}
	os.Truncate(out, imgSize)
	if testimg.FileSHA256(t, out) != f.rawSHA {
		t.Fatal("parallel raw import differs")
	}
	if srv.DropTimes.Load() != 0 {
		t.Fatal("no connection was dropped")
	}
	// With a checksum the bytes are read in order instead, and verified.
	res, err = Import(context.Background(), httpSrc(t, srv.FileURL("disk.raw"), nil), Options{Path: outPath(t), Checksum: mustSum(t, "sha256:"+f.rawSHA)})
	if err != nil || res.Method != "stream" {
		t.Fatalf("raw with checksum: %v %+v", err, res)
	}
}
