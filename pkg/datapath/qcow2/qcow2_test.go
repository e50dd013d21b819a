package qcow2

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kubefill/kubefill/pkg/datapath/sink"
	"github.com/kubefill/kubefill/pkg/datapath/testimg"
)

func header(t testing.TB, version uint32, mutate func(b []byte)) []byte {
	t.Helper()
	b := make([]byte, HeaderLen)
	copy(b, "QFI\xfb")
	be := binary.BigEndian
	be.PutUint32(b[4:], version)
	be.PutUint32(b[20:], 16)      // 64 KiB clusters
	be.PutUint64(b[24:], 1<<30)   // 1 GiB
	be.PutUint32(b[36:], 2)       // L1 entries
	be.PutUint64(b[40:], 3*65536) // L1 offset
	if version == 3 {
		be.PutUint32(b[100:], 112)
	}
	if mutate != nil {
		mutate(b)
	}
	return b
}

func TestParseHeaderTable(t *testing.T) {
	be := binary.BigEndian
	tests := []struct {
		name    string
		b       []byte
		wantErr string
		unsafe  bool
	}{
		{name: "v3 ok", b: header(t, 3, nil)},
		{name: "v2 ok", b: header(t, 2, nil)[:72]},
		{name: "truncated", b: header(t, 3, nil)[:40], wantErr: "truncated"},
		{name: "v3 truncated", b: header(t, 3, nil)[:80], wantErr: "truncated"},
		{name: "bad magic", b: header(t, 3, func(b []byte) { b[0] = 'X' }), wantErr: "bad magic"},
		{name: "version 4", b: header(t, 4, nil), wantErr: "version 4"},
		{name: "backing offset", b: header(t, 3, func(b []byte) { be.PutUint64(b[8:], 0x200) }), wantErr: "backing file", unsafe: true},
		{name: "backing size", b: header(t, 3, func(b []byte) { be.PutUint32(b[16:], 9) }), wantErr: "backing file", unsafe: true},
		{name: "encrypted", b: header(t, 3, func(b []byte) { be.PutUint32(b[32:], 2) }), wantErr: "encrypted", unsafe: true},
		{name: "corrupt bit", b: header(t, 3, func(b []byte) { be.PutUint64(b[72:], 2) }), wantErr: "marked corrupt", unsafe: true},
		{name: "external data", b: header(t, 3, func(b []byte) { be.PutUint64(b[72:], 4) }), wantErr: "external data file", unsafe: true},
		{name: "extended l2", b: header(t, 3, func(b []byte) { be.PutUint64(b[72:], 16) }), wantErr: "extended L2", unsafe: true},
		{name: "unknown feature", b: header(t, 3, func(b []byte) { be.PutUint64(b[72:], 1<<40) }), wantErr: "unknown incompatible", unsafe: true},
		{name: "dirty is fine", b: header(t, 3, func(b []byte) { be.PutUint64(b[72:], 1) })},
		{name: "zstd", b: header(t, 3, func(b []byte) { be.PutUint64(b[72:], 8); b[104] = 1 })},
		{name: "zstd without bit", b: header(t, 3, func(b []byte) { b[104] = 1 }), wantErr: "compression type"},
		{name: "unknown compression", b: header(t, 3, func(b []byte) { be.PutUint64(b[72:], 8); b[104] = 7 }), wantErr: "compression type 7"},
		{name: "cluster bits small", b: header(t, 3, func(b []byte) { be.PutUint32(b[20:], 8) }), wantErr: "cluster bits"},
		{name: "cluster bits large", b: header(t, 3, func(b []byte) { be.PutUint32(b[20:], 22) }), wantErr: "cluster bits"},
		{name: "l1 too small", b: header(t, 3, func(b []byte) { be.PutUint32(b[36:], 1) }), wantErr: "L1 table has 1 entries"},
		{name: "l1 unaligned", b: header(t, 3, func(b []byte) { be.PutUint64(b[40:], 1000) }), wantErr: "not cluster aligned"},
		{name: "l1 huge", b: header(t, 3, func(b []byte) { be.PutUint32(b[36:], 1<<30) }), wantErr: "too large"},
		{name: "size huge", b: header(t, 3, func(b []byte) { be.PutUint64(b[24:], 1<<62) }), wantErr: "exceeds"},
		{name: "header length short", b: header(t, 3, func(b []byte) { be.PutUint32(b[100:], 90) }), wantErr: "header length"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h, err := ParseHeader(tc.b)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				if h.ClusterSize() != 65536 || h.Size != 1<<30 {
					t.Fatalf("bad header %+v", h)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error %v, want it to contain %q", err, tc.wantErr)
			}
			if errors.Is(err, ErrUnsafe) != tc.unsafe {
				t.Fatalf("errors.Is(ErrUnsafe) = %v, want %v", !tc.unsafe, tc.unsafe)
			}
		})
	}
}

func FuzzParseHeader(f *testing.F) {
	seed := make([]byte, HeaderLen)
	copy(seed, "QFI\xfb\x00\x00\x00\x03")
	f.Add(seed)
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := ParseHeader(b)
		if err != nil {
			return
		}
		// Whatever is accepted must be self-consistent.
		if h.ClusterBits < minClusterBits || h.ClusterBits > maxClusterBits || h.Size > MaxVirtualSize {
			t.Fatalf("accepted invalid header %+v", h)
		}
		if be := binary.BigEndian; be.Uint64(b[8:]) != 0 || be.Uint32(b[16:]) != 0 {
			t.Fatal("accepted a backing file")
		}
	})
}

func fileFetcher(f *os.File, requests *atomic.Int64) Fetcher {
	return func(_ context.Context, off, n int64) (io.ReadCloser, error) {
		requests.Add(1)
		return io.NopCloser(io.NewSectionReader(f, off, n)), nil
	}
}

// importLocal runs the whole plan against a local file, as the HTTP path does.
func importLocal(t *testing.T, img string, opt ExecOptions) (string, *Plan, int64, error) {
	t.Helper()
	f, err := os.Open(img)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, _ := f.Stat()
	hb := make([]byte, HeaderLen)
	if _, err := f.ReadAt(hb, 0); err != nil {
		t.Fatal(err)
	}
	h, err := ParseHeader(hb)
	if err != nil {
		return "", nil, 0, err
	}
	p, err := BuildPlan(context.Background(), f, h, st.Size())
	if err != nil {
		return "", nil, 0, err
	}
	out := filepath.Join(t.TempDir(), "disk.img")
	tg, err := sink.Open(out, sink.Options{Limit: int64(h.Size)})
	if err != nil {
		t.Fatal(err)
	}
	defer tg.Close()
	var reqs atomic.Int64
	if err := Execute(context.Background(), p, fileFetcher(f, &reqs), tg, opt); err != nil {
		return "", p, reqs.Load(), err
	}
	if err := tg.Resize(int64(h.Size)); err != nil {
		t.Fatal(err)
	}
	return testimg.FileSHA256(t, out), p, reqs.Load(), nil
}

func TestPlanMatchesQemuImg(t *testing.T) {
	testimg.RequireQemuImg(t)
	dir := t.TempDir()
	raw := testimg.Raw(t, dir, 24<<20)
	want := testimg.RawSHA256(t, raw, "raw")
	cases := []struct {
		name string
		args []string
	}{
		{"plain", nil},
		{"zlib", []string{"-c"}},
		{"zstd", []string{"-c", "-o", "compression_type=zstd"}},
		{"v2 small clusters", []string{"-o", "compat=0.10,cluster_size=4096"}},
		{"zlib 512b clusters", []string{"-c", "-o", "cluster_size=512"}},
		{"2M clusters", []string{"-o", "cluster_size=2M"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			img := testimg.Convert(t, raw, "raw", filepath.Join(dir, strings.ReplaceAll(c.name, " ", "_")+".qcow2"), "qcow2", c.args...)
			got, p, reqs, err := importLocal(t, img, ExecOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if got != want {
				t.Fatalf("sha256 %s, qemu-img says %s", got, want)
			}
			t.Logf("%s: %d extents, %d stored bytes, %d guest bytes, %d fetches", c.name, len(p.Extents), p.StoredBytes, p.GuestBytes, reqs)
			// Whole-file mode (used with checksums) must give the same bytes in one pass.
			var seen countWriter
			got2, _, reqs2, err := importLocal(t, img, ExecOptions{WholeFile: &seen})
			if err != nil || got2 != want || reqs2 != 1 {
				t.Fatalf("whole-file mode: sha %s err %v requests %d", got2, err, reqs2)
			}
			if st, _ := os.Stat(img); int64(seen) != st.Size() {
				t.Fatalf("whole-file mode saw %d bytes of %d", seen, st.Size())
			}
		})
	}
}

type countWriter int64

func (c *countWriter) Write(p []byte) (int, error) { *c += countWriter(len(p)); return len(p), nil }

func TestTruncatedImageFails(t *testing.T) {
	testimg.RequireQemuImg(t)
	dir := t.TempDir()
	raw := testimg.Raw(t, dir, 8<<20)
	for _, args := range [][]string{nil, {"-c"}} {
		img := testimg.Convert(t, raw, "raw", filepath.Join(dir, "t.qcow2"), "qcow2", args...)
		st, _ := os.Stat(img)
		if err := os.Truncate(img, st.Size()/2); err != nil {
			t.Fatal(err)
		}
		_, _, _, err := importLocal(t, img, ExecOptions{})
		if err == nil {
			t.Fatalf("truncated image %v imported without error", args)
		}
		t.Logf("truncated %v: %v", args, err)
		if !strings.Contains(err.Error(), "truncated") && !strings.Contains(err.Error(), "past the end") && !strings.Contains(err.Error(), "ended early") {
			t.Fatalf("error does not explain truncation: %v", err)
		}
	}
}

func TestBackingFileRefused(t *testing.T) {
	testimg.RequireQemuImg(t)
	dir := t.TempDir()
	base := filepath.Join(dir, "base.qcow2")
	testimg.QemuImg(t, "create", "-q", "-f", "qcow2", base, "16M")
	overlay := filepath.Join(dir, "overlay.qcow2")
	testimg.QemuImg(t, "create", "-q", "-f", "qcow2", "-b", "/etc/passwd", "-F", "raw", overlay, "16M")
	_, _, _, err := importLocal(t, overlay, ExecOptions{})
	if !errors.Is(err, ErrUnsafe) || !strings.Contains(err.Error(), "backing file") {
		t.Fatalf("backing-file overlay: got %v", err)
	}
}

// Two guest clusters sharing one host cluster (as after deduplication or
// a hand-made image) exercise the out-of-order path: the second reference
// lies behind the sequential read position and is fetched separately.
func TestSharedClusters(t *testing.T) {
	testimg.RequireQemuImg(t)
	dir := t.TempDir()
	raw := testimg.Raw(t, dir, 4<<20)
	img := testimg.Convert(t, raw, "raw", filepath.Join(dir, "shared.qcow2"), "qcow2")
	f, err := os.OpenFile(img, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	hb := make([]byte, HeaderLen)
	f.ReadAt(hb, 0)
	h, err := ParseHeader(hb)
	if err != nil {
		t.Fatal(err)
	}
	l1 := make([]byte, 8)
	f.ReadAt(l1, int64(h.L1TableOffset))
	l2off := int64(binary.BigEndian.Uint64(l1) & l1OffsetMask)
	l2 := make([]byte, 8*64)
	f.ReadAt(l2, l2off)
	// Guest clusters 2 and 3 (zero in the source) now point at the host
	// clusters of guest 0 and 60.
	copy(l2[2*8:3*8], l2[0:8])
	copy(l2[3*8:4*8], l2[60*8:61*8])
	if _, err := f.WriteAt(l2[:4*8], l2off); err != nil {
		t.Fatal(err)
	}
	f.Close()
	want := testimg.RawSHA256(t, img, "qcow2")
	got, p, reqs, err := importLocal(t, img, ExecOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Fatalf("sha256 %s, qemu-img says %s", got, want)
	}
	if reqs < 2 {
		t.Fatalf("expected a separate fetch for the shared cluster, got %d fetches", reqs)
	}
	t.Logf("%d extents, %d fetches", len(p.Extents), reqs)
}

// WalkPlans in small batches (bounded memory) gives the same image.
func TestWalkPlansBatches(t *testing.T) {
	testimg.RequireQemuImg(t)
	dir := t.TempDir()
	raw := testimg.Raw(t, dir, 8<<20)
	want := testimg.RawSHA256(t, raw, "raw")
	img := testimg.Convert(t, raw, "raw", filepath.Join(dir, "small.qcow2"), "qcow2", "-c", "-o", "cluster_size=4096")
	f, _ := os.Open(img)
	defer f.Close()
	st, _ := f.Stat()
	hb := make([]byte, HeaderLen)
	f.ReadAt(hb, 0)
	h, err := ParseHeader(hb)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out.img")
	tg, err := sink.Open(out, sink.Options{Limit: int64(h.Size)})
	if err != nil {
		t.Fatal(err)
	}
	defer tg.Close()
	var reqs atomic.Int64
	batches, maxLen := 0, 0
	err = WalkPlans(context.Background(), f, h, st.Size(), 100, func(p *Plan) error {
		batches++
		maxLen = max(maxLen, len(p.Extents))
		return Execute(context.Background(), p, fileFetcher(f, &reqs), tg, ExecOptions{})
	})
	if err != nil {
		t.Fatal(err)
	}
	tg.Resize(int64(h.Size))
	if got := testimg.FileSHA256(t, out); got != want {
		t.Fatalf("batched plan: sha %s want %s", got, want)
	}
	// 4 KiB clusters: one L2 table holds 512 entries, so a batch is at most 100+512.
	if batches < 3 || maxLen > 100+512 {
		t.Fatalf("%d batches, largest %d extents", batches, maxLen)
	}
	t.Logf("%d batches, largest %d extents, %d fetches", batches, maxLen, reqs.Load())
}

// FuzzImage feeds arbitrary bytes through the whole reader: header, plan
// and execution into a bounded sink. It must fail cleanly, never panic,
// hang or write past the virtual size.
func FuzzImage(f *testing.F) {
	seed := header(f, 3, func(b []byte) {
		binary.BigEndian.PutUint32(b[20:], 9)      // 512-byte clusters
		binary.BigEndian.PutUint64(b[24:], 64<<10) // 64 KiB virtual
		binary.BigEndian.PutUint32(b[36:], 1)      // one L1 entry
		binary.BigEndian.PutUint64(b[40:], 512)    // L1 at 512
	})
	img := make([]byte, 4096)
	copy(img, seed)
	binary.BigEndian.PutUint64(img[512:], 1024|1<<63)  // L2 at 1024
	binary.BigEndian.PutUint64(img[1024:], 2048|1<<63) // cluster 0 at 2048
	binary.BigEndian.PutUint64(img[1032:], 1<<62|3000) // a compressed cluster
	f.Add(img)
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) < HeaderLen {
			return
		}
		h, err := ParseHeader(b)
		if err != nil || h.Size > 1<<20 {
			return
		}
		p, err := BuildPlan(context.Background(), bytesReaderAt(b), h, int64(len(b)))
		if err != nil {
			return
		}
		tg, err := sink.Open(filepath.Join(dir, "out"), sink.Options{Limit: int64(h.Size)})
		if err != nil {
			t.Fatal(err)
		}
		defer tg.Close()
		fetch := func(_ context.Context, off, n int64) (io.ReadCloser, error) {
			return io.NopCloser(io.NewSectionReader(bytesReaderAt(b), off, n)), nil
		}
		watchdog := time.AfterFunc(10*time.Second, func() {
			buf := make([]byte, 1<<20)
			n := runtime.Stack(buf, true)
			panic("Execute hung:\n" + string(buf[:n]))
		})
		_ = Execute(context.Background(), p, fetch, tg, ExecOptions{Workers: 1})
		watchdog.Stop()
		if tg.End() > int64(h.Size) {
			t.Fatalf("wrote up to %d past virtual size %d", tg.End(), h.Size)
		}
	})
}

type bytesReaderAt []byte

func (b bytesReaderAt) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, errors.New("negative offset")
	}
	if off >= int64(len(b)) {
		return 0, io.EOF
	}
	n := copy(p, b[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// A virtual size that is not a multiple of the cluster size: the last
// (compressed or not) cluster is partial.
func TestPartialLastCluster(t *testing.T) {
	testimg.RequireQemuImg(t)
	dir := t.TempDir()
	raw := testimg.Raw(t, dir, 4<<20+3*512)
	want := testimg.RawSHA256(t, raw, "raw")
	for i, args := range [][]string{nil, {"-c"}, {"-c", "-o", "compression_type=zstd"}} {
		img := testimg.Convert(t, raw, "raw", filepath.Join(dir, fmt.Sprintf("p%d.qcow2", i)), "qcow2", args...)
		got, _, _, err := importLocal(t, img, ExecOptions{})
		if err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		if got != want {
			t.Fatalf("%v: sha256 %s want %s", args, got, want)
		}
	}
}
