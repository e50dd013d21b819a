package cloner

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"math/rand/v2"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kubefill/kubefill/pkg/datapath/sink"
)

// region is data written into a test image.
type region struct {
	off, len int64
	zero     bool // allocated zeros (written explicitly)
	text     bool // compressible text rather than random bytes
}

// makeImage creates a sparse file of size bytes with data in regions.
func makeImage(t testing.TB, path string, size int64, regions []region) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewChaCha8([32]byte{1, 2, 3}))
	buf := make([]byte, 1<<20)
	for _, r := range regions {
		for off := r.off; off < r.off+r.len; {
			n := min(int64(len(buf)), r.off+r.len-off)
			b := buf[:n]
			switch {
			case r.zero:
				clear(b)
			case r.text:
				fillText(rng, b)
			default:
				for i := 0; i+8 <= len(b); i += 8 {
					binary.LittleEndian.PutUint64(b[i:], rng.Uint64())
				}
			}
			if _, err := f.WriteAt(b, off); err != nil {
				t.Fatal(err)
			}
			off += n
		}
	}
}

var words = []string{"kubefill ", "clone ", "volume ", "sparse ", "extent ", "snappy ", "tar ", "disk\n", "image ", "data "}

func fillText(rng *rand.Rand, b []byte) {
	for i := 0; i < len(b); {
		i += copy(b[i:], words[rng.IntN(len(words))])
	}
}

// allocated is a file's allocated bytes (st_blocks).
func allocated(t testing.TB, path string) int64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

// contentDigest is a digest of a file's content that does not read its
// holes: SHA-256 over the size and, for every 4 KiB block that is not all
// zeros, its offset and bytes. Two files have the same digest exactly
// when they hold the same bytes (holes and allocated zeros alike read as
// zeros), so it stands in for a whole-file SHA-256 on big sparse files.
func contentDigest(t testing.TB, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	var hdr [8]byte
	binary.LittleEndian.PutUint64(hdr[:], uint64(fi.Size()))
	h.Write(hdr[:])
	ext, err := dataExtents(f, fi.Size())
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1<<20)
	next := int64(0) // blocks before next are done
	for _, e := range ext {
		start := max(e.off&^(zeroBlock-1), next)
		end := min((e.end()+zeroBlock-1)&^(zeroBlock-1), fi.Size())
		for off := start; off < end; {
			n := int(min(int64(len(buf)), end-off))
			if _, err := f.ReadAt(buf[:n], off); err != nil {
				t.Fatal(err)
			}
			for i := 0; i < n; i += zeroBlock {
				b := buf[i:min(n, i+zeroBlock)]
				if !sink.IsZero(b) {
					binary.LittleEndian.PutUint64(hdr[:], uint64(off+int64(i)))
					h.Write(hdr[:])
					h.Write(b)
				}
			}
			off += int64(n)
		}
		next = max(next, end)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// stream runs WriteStream into memory.
func stream(t testing.TB, src Source) ([]byte, Stats) {
	t.Helper()
	var buf bytes.Buffer
	st, err := WriteStream(context.Background(), &buf, src, nil)
	if err != nil {
		t.Fatalf("WriteStream: %v", err)
	}
	return buf.Bytes(), st
}

func mkdir(t testing.TB, parts ...string) string {
	t.Helper()
	p := filepath.Join(parts...)
	if err := os.MkdirAll(p, 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func writeFile(t testing.TB, path, content string, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}

// tempDir is a test directory on a file system with SEEK_DATA and
// punch-hole (t.TempDir() may be tmpfs, which has both too).
func tempDir(t testing.TB) string {
	t.Helper()
	d := t.TempDir()
	var s unix.Statfs_t
	if err := unix.Statfs(d, &s); err != nil {
		t.Fatal(err)
	}
	if int64(s.Bavail)*s.Bsize < 1<<30 {
		t.Skipf("less than 1 GiB free in %s", d)
	}
	return d
}
