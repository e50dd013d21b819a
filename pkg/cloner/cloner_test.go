package cloner

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/klauspost/compress/s2"
	"github.com/klauspost/compress/snappy"

	"github.com/kubefill/kubefill/pkg/datapath/testimg"
)

const (
	MiB = 1 << 20
	GiB = 1 << 30
)

// scattered is a few MiB of data at scattered offsets of a 2 GiB image,
// some of it random, some text, one allocated run of zeros.
var scattered = []region{
	{off: 0, len: 1 * MiB},
	{off: 3*MiB + 4096, len: 512 << 10, text: true},
	{off: 100 * MiB, len: 2 * MiB, zero: true}, // allocated zeros: a hole on the target
	{off: 700*MiB + 123, len: 1*MiB + 77},      // unaligned
	{off: 1 * GiB, len: 256 << 10, text: true},
	{off: 2*GiB - 64<<10, len: 64 << 10}, // the very end
}

// fsSource builds a Filesystem source volume: a sparse disk.img and a few
// other entries (a directory tree, a symlink, a hard link, an empty file,
// and lost+found, which must not travel).
func fsSource(t *testing.T, imgSize int64, regions []region) string {
	t.Helper()
	src := mkdir(t, tempDir(t), "src")
	makeImage(t, filepath.Join(src, ImageName), imgSize, regions)
	mkdir(t, src, "sub", "deeper")
	writeFile(t, filepath.Join(src, "sub", "deeper", "notes.txt"), "hello clone\n", 0o640)
	writeFile(t, filepath.Join(src, "empty"), "", 0o600)
	if err := os.Symlink("sub/deeper/notes.txt", filepath.Join(src, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(filepath.Join(src, "sub", "deeper", "notes.txt"), filepath.Join(src, "hard")); err != nil {
		t.Fatal(err)
	}
	mkdir(t, src, lostFound)
	writeFile(t, filepath.Join(src, lostFound, "#1234"), "orphan", 0o600)
	return src
}

func checkTree(t *testing.T, src, dst string) {
	t.Helper()
	if got, want := contentDigest(t, filepath.Join(dst, ImageName)), contentDigest(t, filepath.Join(src, ImageName)); got != want {
		t.Errorf("disk.img content differs")
	}
	b, err := os.ReadFile(filepath.Join(dst, "sub", "deeper", "notes.txt"))
	if err != nil || string(b) != "hello clone\n" {
		t.Errorf("notes.txt = %q, %v", b, err)
	}
	if fi, err := os.Stat(filepath.Join(dst, "sub", "deeper", "notes.txt")); err != nil || fi.Mode().Perm() != 0o640 {
		t.Errorf("notes.txt mode: %v %v", fi.Mode(), err)
	}
	if l, err := os.Readlink(filepath.Join(dst, "link")); err != nil || l != "sub/deeper/notes.txt" {
		t.Errorf("link = %q, %v", l, err)
	}
	a, _ := os.Stat(filepath.Join(dst, "hard"))
	c, _ := os.Stat(filepath.Join(dst, "sub", "deeper", "notes.txt"))
	if a == nil || c == nil || !os.SameFile(a, c) {
		t.Errorf("hard is not a hard link of notes.txt")
	}
	if fi, err := os.Stat(filepath.Join(dst, "empty")); err != nil || fi.Size() != 0 {
		t.Errorf("empty: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dst, lostFound, "#1234")); err == nil {
		t.Errorf("lost+found travelled")
	}
}

func dataLen(regions []region) (n int64) {
	for _, r := range regions {
		n += r.len
	}
	return n
}

func TestFilesystemRoundTripSparse(t *testing.T) {
	src := fsSource(t, 2*GiB, scattered)
	var reports [][2]int64
	var buf bytes.Buffer
	st, err := WriteStream(context.Background(), &buf, Source{Mode: Filesystem, Path: src}, func(done, total int64) {
		reports = append(reports, [2]int64{done, total})
	})
	if err != nil {
		t.Fatal(err)
	}
	checkProgress(t, reports)
	data := dataLen(scattered)
	t.Logf("stream %d bytes for %d bytes of data in a %d-byte image; stats %+v", buf.Len(), data, int64(2*GiB), st)
	if int64(buf.Len()) > data+MiB {
		t.Errorf("stream is %d bytes, want about the data size %d", buf.Len(), data)
	}
	if st.SparseFiles != 1 || st.Files != 3 || st.Hardlinks != 1 || st.Symlinks != 1 {
		t.Errorf("stats %+v", st)
	}
	if st.Read > data+64<<10 {
		t.Errorf("read %d bytes from the source, want about %d", st.Read, data)
	}

	dst := mkdir(t, filepath.Dir(src), "dst")
	fast := fastEntries.Load()
	n, err := ReceiveStream(context.Background(), &buf, ContentTypeFilesystem, Destination{Mode: Filesystem, Path: dst})
	if err != nil {
		t.Fatal(err)
	}
	if fastEntries.Load() != fast+1 {
		t.Errorf("disk.img did not take the sparse fast path")
	}
	if n < 2*GiB {
		t.Errorf("written %d", n)
	}
	checkTree(t, src, dst)
	sa, da := allocated(t, filepath.Join(src, ImageName)), allocated(t, filepath.Join(dst, ImageName))
	t.Logf("disk.img allocated: source %d, target %d", sa, da)
	// The 2 MiB of allocated zeros become a hole on the target.
	if da > sa || da < data-2*MiB-64<<10 {
		t.Errorf("target allocates %d bytes, source %d (data %d)", da, sa, data)
	}
	if fi, _ := os.Stat(filepath.Join(dst, ImageName)); fi == nil || fi.Size() != 2*GiB {
		t.Errorf("size %v", fi)
	}
}

// untar decompresses a stream into GNU tar with args.
func gnuTar(t *testing.T, stream []byte, args ...string) string {
	t.Helper()
	cmd := exec.Command("tar", args...)
	cmd.Stdin = s2.NewReader(bytes.NewReader(stream))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("tar %v: %v\n%s", args, err, out)
	}
	return string(out)
}

func TestGNUTarReadsTheStream(t *testing.T) {
	if _, err := exec.LookPath("tar"); err != nil {
		t.Skip("no tar")
	}
	src := fsSource(t, 2*GiB, scattered)
	b, _ := stream(t, Source{Mode: Filesystem, Path: src})
	list := gnuTar(t, b, "-tvf", "-")
	t.Logf("tar -tv:\n%s", list)
	for _, want := range []string{"disk.img", "2147483648", "sub/deeper/notes.txt", "link -> sub/deeper/notes.txt", "sub/deeper/notes.txt link to hard"} {
		if !strings.Contains(list, want) {
			t.Errorf("listing lacks %q", want)
		}
	}
	if strings.Contains(list, "GNUSparseFile") || strings.Contains(list, lostFound) {
		t.Errorf("listing shows %q", list)
	}
	dst := mkdir(t, filepath.Dir(src), "gnu")
	gnuTar(t, b, "-xf", "-", "-C", dst)
	checkTree(t, src, dst)
	sa, da := allocated(t, filepath.Join(src, ImageName)), allocated(t, filepath.Join(dst, ImageName))
	t.Logf("GNU tar extraction allocates %d bytes, source %d", da, sa)
	if da > sa+MiB {
		t.Errorf("GNU tar made a dense file: %d bytes allocated, source %d", da, sa)
	}
}

// CDI's cloner runs `tar cv -S` (GNU format, old GNU sparse headers);
// POSIX format gives PAX sparse 1.0. Both must be received.
func TestReceivesGNUTarSparseStreams(t *testing.T) {
	if _, err := exec.LookPath("tar"); err != nil {
		t.Skip("no tar")
	}
	src := fsSource(t, 64*MiB, []region{{off: 0, len: 300 << 10}, {off: 50 * MiB, len: MiB, text: true}, {off: 64*MiB - 4096, len: 4096}})
	if err := os.RemoveAll(filepath.Join(src, lostFound)); err != nil {
		t.Fatal(err)
	}
	for _, format := range []string{"gnu", "posix"} {
		t.Run(format, func(t *testing.T) {
			cmd := exec.Command("tar", "-c", "-S", "--format="+format, "-f", "-", "-C", src, ImageName, "sub", "empty", "link", "hard")
			var raw bytes.Buffer
			cmd.Stdout = &raw
			cmd.Stderr = os.Stderr
			if err := cmd.Run(); err != nil {
				t.Fatal(err)
			}
			var z bytes.Buffer
			zw := snappy.NewBufferedWriter(&z)
			if _, err := zw.Write(raw.Bytes()); err != nil {
				t.Fatal(err)
			}
			if err := zw.Close(); err != nil {
				t.Fatal(err)
			}
			dst := mkdir(t, filepath.Dir(src), "from-"+format)
			fast := fastEntries.Load()
			defer func() {
				// PAX sparse 1.0 (posix) takes the fast path; old GNU sparse
				// goes through archive/tar.
				if got := fastEntries.Load() - fast; (format == "posix") != (got == 1) {
					t.Errorf("%d entries took the fast path", got)
				}
			}()
			if _, err := ReceiveStream(context.Background(), &z, ContentTypeFilesystem, Destination{Mode: Filesystem, Path: dst}); err != nil {
				t.Fatal(err)
			}
			checkTree(t, src, dst)
			if got, want := testimg.FileSHA256(t, filepath.Join(dst, ImageName)), testimg.FileSHA256(t, filepath.Join(src, ImageName)); got != want {
				t.Errorf("sha256 %s, want %s", got, want)
			}
			if da, sa := allocated(t, filepath.Join(dst, ImageName)), allocated(t, filepath.Join(src, ImageName)); da > sa {
				t.Errorf("allocated %d, source %d", da, sa)
			}
		})
	}
}

// junkFile is a file standing in for a device, full of stale data.
func junkFile(t *testing.T, path string, size int64) {
	t.Helper()
	makeImage(t, path, size, []region{{off: 0, len: size}})
}

func TestFilesystemToBlock(t *testing.T) {
	const size = 64 * MiB
	regions := []region{{off: 4096, len: MiB}, {off: 20 * MiB, len: 3 * MiB, zero: true}, {off: 40*MiB + 5, len: 100}}
	src := fsSource(t, size, regions)
	b, _ := stream(t, Source{Mode: Filesystem, Path: src})
	dev := filepath.Join(filepath.Dir(src), "device")
	junkFile(t, dev, size+MiB)
	n, err := ReceiveStream(context.Background(), bytes.NewReader(b), ContentTypeFilesystem, Destination{Mode: Block, Path: dev})
	if err != nil {
		t.Fatal(err)
	}
	if n != size {
		t.Errorf("written %d, want %d", n, size)
	}
	if got, want := testimg.PrefixSHA256(t, dev, size), testimg.FileSHA256(t, filepath.Join(src, ImageName)); got != want {
		t.Errorf("device content differs from disk.img: stale data left")
	}
	if a := allocated(t, dev); a > 3*MiB {
		t.Errorf("device file still allocates %d bytes: zero ranges were not punched", a)
	}

	small := filepath.Join(filepath.Dir(src), "small-device")
	junkFile(t, small, size/2)
	_, err = ReceiveStream(context.Background(), bytes.NewReader(b), ContentTypeFilesystem, Destination{Mode: Block, Path: small})
	if !errors.Is(err, ErrTooBig) || !strings.Contains(err.Error(), "holds only") {
		t.Errorf("too small a device: %v", err)
	}
	t.Logf("refusal: %v", err)

	// A filesystem-clone without disk.img cannot fill a block volume.
	empty := mkdir(t, filepath.Dir(src), "no-image")
	writeFile(t, filepath.Join(empty, "other"), "x", 0o644)
	b2, _ := stream(t, Source{Mode: Filesystem, Path: empty})
	if _, err := ReceiveStream(context.Background(), bytes.NewReader(b2), ContentTypeFilesystem, Destination{Mode: Block, Path: small}); !errors.Is(err, ErrNoImage) {
		t.Errorf("no disk.img: %v", err)
	}
}

func TestBlockToFilesystemAndBlock(t *testing.T) {
	const size = 64 * MiB
	dir := tempDir(t)
	dev := filepath.Join(dir, "source-device")
	regions := []region{{off: 0, len: MiB}, {off: 10 * MiB, len: 2 * MiB, text: true}, {off: 63 * MiB, len: MiB}}
	makeImage(t, dev, size, regions)
	want := testimg.FileSHA256(t, dev)

	b, st := stream(t, Source{Mode: Block, Path: dev})
	t.Logf("block stream: %d bytes for a %d-byte device holding %d bytes of data", len(b), size, dataLen(regions))
	if st.Total != size || st.Read != size {
		t.Errorf("stats %+v", st)
	}
	// Zeros travel compressed: well under the device size.
	if len(b) > int(dataLen(regions))+size/16 {
		t.Errorf("stream %d bytes", len(b))
	}

	fsDst := mkdir(t, dir, "fs")
	if n, err := ReceiveStream(context.Background(), bytes.NewReader(b), ContentTypeBlock, Destination{Mode: Filesystem, Path: fsDst}); err != nil || n != size {
		t.Fatalf("block→fs: %d, %v", n, err)
	}
	img := filepath.Join(fsDst, ImageName)
	if got := testimg.FileSHA256(t, img); got != want {
		t.Errorf("disk.img differs")
	}
	if a := allocated(t, img); a > dataLen(regions)+64<<10 {
		t.Errorf("disk.img allocates %d, data is %d", a, dataLen(regions))
	}

	blk := filepath.Join(dir, "target-device")
	junkFile(t, blk, size)
	if n, err := ReceiveStream(context.Background(), bytes.NewReader(b), ContentTypeBlock, Destination{Mode: Block, Path: blk}); err != nil || n != size {
		t.Fatalf("block→block: %d, %v", n, err)
	}
	if got := testimg.FileSHA256(t, blk); got != want {
		t.Errorf("target device differs: stale data left")
	}

	// Too big: a smaller device, or a capacity below the image size.
	small := filepath.Join(dir, "small")
	junkFile(t, small, size-MiB)
	if _, err := ReceiveStream(context.Background(), bytes.NewReader(b), ContentTypeBlock, Destination{Mode: Block, Path: small}); !errors.Is(err, ErrTooBig) {
		t.Errorf("small device: %v", err)
	}
	fs2 := mkdir(t, dir, "fs2")
	_, err := ReceiveStream(context.Background(), bytes.NewReader(b), ContentTypeBlock, Destination{Mode: Filesystem, Path: fs2, Capacity: size / 2})
	if !errors.Is(err, ErrTooBig) {
		t.Errorf("capacity: %v", err)
	}
	t.Logf("refusal: %v", err)
}

// cutReader returns the first n bytes of b, then err.
type cutReader struct {
	b   []byte
	err error
}

func (c *cutReader) Read(p []byte) (int, error) {
	if len(c.b) == 0 {
		return 0, c.err
	}
	n := copy(p, c.b)
	c.b = c.b[n:]
	return n, nil
}

// chunkEnds returns the offsets at which the snappy frames of b end.
func chunkEnds(b []byte) []int {
	var ends []int
	for i := 0; i+4 <= len(b); {
		n := int(b[i+1]) | int(b[i+2])<<8 | int(b[i+3])<<16
		i += 4 + n
		ends = append(ends, i)
	}
	return ends
}

func TestTruncatedStreamFails(t *testing.T) {
	dir := tempDir(t)
	src := mkdir(t, dir, "src")
	makeImage(t, filepath.Join(src, ImageName), 8*MiB, []region{{off: 0, len: 300 << 10}, {off: 4 * MiB, len: 200 << 10}})
	writeFile(t, filepath.Join(src, "z"), "last file", 0o644)
	fsStream, _ := stream(t, Source{Mode: Filesystem, Path: src})
	blkStream, _ := stream(t, Source{Mode: Block, Path: filepath.Join(src, ImageName)})

	try := func(name string, r io.Reader, ct string) {
		t.Helper()
		dst := Destination{Mode: Filesystem, Path: mkdir(t, dir, "dst-"+strings.ReplaceAll(name, " ", "-"))}
		_, err := ReceiveStream(context.Background(), r, ct, dst)
		if err == nil {
			t.Errorf("%s: accepted", name)
		} else if !errors.Is(err, ErrTruncated) && !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Errorf("%s: %v, want ErrTruncated", name, err)
		}
	}
	// Cut in the middle of a chunk, and (filesystem-clone) at every chunk
	// boundary: the tar must be whole.
	try("fs mid-chunk", bytes.NewReader(fsStream[:len(fsStream)/2+3]), ContentTypeFilesystem)
	try("block mid-chunk", bytes.NewReader(blkStream[:len(blkStream)/2+3]), ContentTypeBlock)
	ends := chunkEnds(fsStream)
	for i, e := range ends[:len(ends)-1] {
		if i%7 == 0 || i >= len(ends)-4 {
			try("fs at chunk "+string(rune('a'+i%26)), bytes.NewReader(fsStream[:e]), ContentTypeFilesystem)
		}
	}
	// A body cut at a chunk boundary, reported by HTTP as unexpected EOF.
	be := chunkEnds(blkStream)
	try("block body cut", &cutReader{b: blkStream[:be[len(be)/2]], err: io.ErrUnexpectedEOF}, ContentTypeBlock)
	// A flipped byte fails the CRC.
	for _, s := range []struct {
		name string
		b    []byte
		ct   string
	}{{"fs crc", fsStream, ContentTypeFilesystem}, {"block crc", blkStream, ContentTypeBlock}} {
		bad := bytes.Clone(s.b)
		bad[len(bad)/3] ^= 0x40
		try(s.name, bytes.NewReader(bad), s.ct)
	}
	// The whole streams are fine.
	for _, s := range []struct {
		b  []byte
		ct string
	}{{fsStream, ContentTypeFilesystem}, {blkStream, ContentTypeBlock}} {
		if _, err := ReceiveStream(context.Background(), bytes.NewReader(s.b), s.ct, Destination{Mode: Filesystem, Path: mkdir(t, dir, "ok-"+s.ct)}); err != nil {
			t.Errorf("%s: %v", s.ct, err)
		}
	}
	if _, err := ReceiveStream(context.Background(), bytes.NewReader(fsStream), "archive", Destination{Mode: Filesystem, Path: dir}); !errors.Is(err, ErrContentType) {
		t.Errorf("content type: %v", err)
	}
}

// hostile builds a snappy-framed tar of hdrs (with content for regular files).
func hostile(t *testing.T, hdrs ...*tar.Header) []byte {
	t.Helper()
	var raw bytes.Buffer
	tw := tar.NewWriter(&raw)
	for _, h := range hdrs {
		if h.Typeflag == tar.TypeReg {
			h.Size = 5
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			tw.Write([]byte("owned"))
		}
	}
	tw.Close()
	var z bytes.Buffer
	zw := s2.NewWriter(&z, s2.WriterSnappyCompat())
	zw.Write(raw.Bytes())
	zw.Close()
	return z.Bytes()
}

func TestHostileEntriesAreRefused(t *testing.T) {
	dir := tempDir(t)
	outside := mkdir(t, dir, "outside")
	reg := func(name string) *tar.Header { return &tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644} }
	cases := map[string][]*tar.Header{
		"dotdot":           {reg("../outside/x")},
		"nested dotdot":    {reg("a/../../outside/x")},
		"absolute":         {reg(outside + "/x")},
		"symlink escapes":  {{Typeflag: tar.TypeSymlink, Name: "l", Linkname: "../outside"}},
		"symlink absolute": {{Typeflag: tar.TypeSymlink, Name: "l", Linkname: outside}},
		"hardlink escapes": {{Typeflag: tar.TypeLink, Name: "h", Linkname: "../outside/secret"}},
		"char device":      {{Typeflag: tar.TypeChar, Name: "null", Devmajor: 1, Devminor: 3}},
		"block device":     {{Typeflag: tar.TypeBlock, Name: "sda", Devmajor: 8}},
		"fifo":             {{Typeflag: tar.TypeFifo, Name: "pipe"}},
	}
	writeFile(t, filepath.Join(outside, "secret"), "secret", 0o600)
	for name, hdrs := range cases {
		t.Run(name, func(t *testing.T) {
			dst := mkdir(t, dir, "dst-"+strings.ReplaceAll(name, " ", "-"))
			_, err := ReceiveStream(context.Background(), bytes.NewReader(hostile(t, hdrs...)), ContentTypeFilesystem, Destination{Mode: Filesystem, Path: dst})
			if !errors.Is(err, ErrUnsafe) {
				t.Errorf("got %v, want ErrUnsafe", err)
			}
		})
	}
	// A symlink planted inside the volume cannot carry a later file out.
	dst := mkdir(t, dir, "dst-planted")
	if err := os.Symlink(outside, filepath.Join(dst, "planted")); err != nil {
		t.Fatal(err)
	}
	_, err := ReceiveStream(context.Background(), bytes.NewReader(hostile(t, reg("planted/x"))), ContentTypeFilesystem, Destination{Mode: Filesystem, Path: dst})
	if err == nil {
		t.Errorf("wrote through a symlink that leaves the volume")
	}
	if _, err := os.Stat(filepath.Join(outside, "x")); err == nil {
		t.Errorf("a file was written outside the volume")
	}
	// An entry replaces a link rather than writing through it.
	dst = mkdir(t, dir, "dst-replace")
	_, err = ReceiveStream(context.Background(), bytes.NewReader(hostile(t,
		&tar.Header{Typeflag: tar.TypeReg, Name: "target", Mode: 0o644},
		&tar.Header{Typeflag: tar.TypeLink, Name: "alias", Linkname: "target"},
		reg("alias"))), ContentTypeFilesystem, Destination{Mode: Filesystem, Path: dst})
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(filepath.Join(dst, "alias")); err != nil || fi.Sys().(*syscall.Stat_t).Nlink != 1 {
		t.Errorf("alias still linked to target: %v", err)
	}
}

// A file with more extents than a sparse map may hold is sent with small
// holes filled in, and still round-trips.
func TestManyExtents(t *testing.T) {
	defer func(n int) { maxMapBytes = n }(maxMapBytes)
	maxMapBytes = 16 << 10
	dir := tempDir(t)
	src := mkdir(t, dir, "src")
	var regions []region
	for off := int64(0); off < 3000*8192; off += 8192 {
		regions = append(regions, region{off: off, len: 4096})
	}
	regions = append(regions, region{off: 40 * MiB, len: 4096})
	makeImage(t, filepath.Join(src, ImageName), 64*MiB, regions)
	f, err := os.Open(filepath.Join(src, ImageName))
	if err != nil {
		t.Fatal(err)
	}
	ext, err := dataExtents(f, 64*MiB)
	f.Close()
	if err != nil || sparseMapLen(ext) > maxMapBytes || len(ext) < 2 {
		t.Fatalf("%d extents, map %d bytes, %v", len(ext), sparseMapLen(ext), err)
	}
	t.Logf("3001 extents sent as %d", len(ext))
	b, st := stream(t, Source{Mode: Filesystem, Path: src})
	if st.SparseFiles != 1 {
		t.Errorf("stats %+v", st)
	}
	dst := mkdir(t, dir, "dst")
	if _, err := ReceiveStream(context.Background(), bytes.NewReader(b), ContentTypeFilesystem, Destination{Mode: Filesystem, Path: dst}); err != nil {
		t.Fatal(err)
	}
	if contentDigest(t, filepath.Join(dst, ImageName)) != contentDigest(t, filepath.Join(src, ImageName)) {
		t.Errorf("content differs")
	}
	// Extent-tree blocks count too, hence the slack.
	if da, sa := allocated(t, filepath.Join(dst, ImageName)), allocated(t, filepath.Join(src, ImageName)); da > sa+sa/50 {
		t.Errorf("allocated %d, source %d", da, sa)
	}
}

// The sparse headers stay readable past the ustar limits (8 GiB data area,
// 21-bit uids, long names).
func TestSparseHeaderBeyondUstar(t *testing.T) {
	name := strings.Repeat("long-directory-name/", 8) + "disk.img"
	ext := []extent{{0, 9 << 30}, {1 << 40, 4096}}
	m := sparseMap(ext)
	hdrs, err := sparseHeaders(name, 1<<40+4096, int64(len(m))+dataBytes(ext), entryMeta{mode: 0o644, uid: 1 << 30, gid: 107, mtime: 1 << 40})
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(io.MultiReader(bytes.NewReader(hdrs), bytes.NewReader(m)))
	h, err := tr.Next()
	if err != nil {
		t.Fatal(err)
	}
	if h.Name != name || h.Size != 1<<40+4096 || h.Uid != 1<<30 || h.Gid != 107 || h.ModTime.Unix() != 1<<40 {
		t.Errorf("header %+v", h)
	}
}

// checkProgress: one total, done never going back, 100% only at the end.
func checkProgress(t *testing.T, reports [][2]int64) {
	t.Helper()
	if len(reports) < 2 {
		t.Fatalf("progress reported %d times", len(reports))
	}
	last := reports[len(reports)-1]
	if last[0] != last[1] || last[1] == 0 {
		t.Errorf("last progress %v, want done == total", last)
	}
	for i, r := range reports[:len(reports)-1] {
		if r[1] != last[1] || r[0] >= r[1] || (i > 0 && r[0] < reports[i-1][0]) {
			t.Errorf("progress report %d of %d: %v (total %d)", i, len(reports), r, last[1])
			return
		}
	}
	t.Logf("%d progress reports, total %d", len(reports), last[1])
}

// PREALLOCATION: the source sends files whole (plain entries, holes as
// zeros, compressed) and the target keeps everything allocated.
func TestPreallocatedClone(t *testing.T) {
	src := fsSource(t, 32*MiB, []region{{off: MiB, len: MiB}})
	b, st := stream(t, Source{Mode: Filesystem, Path: src, Dense: true})
	if st.SparseFiles != 0 || st.Total < 32*MiB || int64(len(b)) > 4*MiB {
		t.Errorf("dense stream %d bytes, stats %+v", len(b), st)
	}
	dst := mkdir(t, filepath.Dir(src), "dst")
	if _, err := ReceiveStream(context.Background(), bytes.NewReader(b), ContentTypeFilesystem, Destination{Mode: Filesystem, Path: dst, Preallocate: true}); err != nil {
		t.Fatal(err)
	}
	checkTree(t, src, dst)
	if a := allocated(t, filepath.Join(dst, ImageName)); a < 32*MiB {
		t.Errorf("preallocated disk.img allocates only %d bytes", a)
	}
	dev := filepath.Join(filepath.Dir(src), "device")
	junkFile(t, dev, 32*MiB)
	if _, err := ReceiveStream(context.Background(), bytes.NewReader(b), ContentTypeFilesystem, Destination{Mode: Block, Path: dev, Preallocate: true}); err != nil {
		t.Fatal(err)
	}
	if testimg.FileSHA256(t, dev) != testimg.FileSHA256(t, filepath.Join(src, ImageName)) {
		t.Errorf("device differs")
	}
	if a := allocated(t, dev); a < 32*MiB {
		t.Errorf("preallocated device file allocates only %d bytes", a)
	}
}

// With the fast path out of reach (headers too big to capture), a sparse
// entry goes through archive/tar and arrives the same.
func TestSparseEntryWithoutFastPath(t *testing.T) {
	defer func(n int) { maxCapture = n }(maxCapture)
	maxCapture = 0
	src := fsSource(t, 64*MiB, []region{{off: 4096, len: MiB}, {off: 33 * MiB, len: 12345, text: true}})
	b, _ := stream(t, Source{Mode: Filesystem, Path: src})
	dst := mkdir(t, filepath.Dir(src), "dst")
	fast := fastEntries.Load()
	if _, err := ReceiveStream(context.Background(), bytes.NewReader(b), ContentTypeFilesystem, Destination{Mode: Filesystem, Path: dst}); err != nil {
		t.Fatal(err)
	}
	if fastEntries.Load() != fast {
		t.Errorf("the fast path was taken")
	}
	checkTree(t, src, dst)
	if da, sa := allocated(t, filepath.Join(dst, ImageName)), allocated(t, filepath.Join(src, ImageName)); da > sa {
		t.Errorf("allocated %d, source %d", da, sa)
	}
}
