package sink

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

func allocated(t *testing.T, p string) int64 {
	st, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return st.Sys().(*syscall.Stat_t).Blocks * 512
}

func TestSparseWritesAndLimit(t *testing.T) {
	p := filepath.Join(t.TempDir(), "disk.img")
	tg, err := Open(p, Options{Limit: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer tg.Close()
	data := make([]byte, 4<<20)
	copy(data[1<<20:], bytes.Repeat([]byte{7}, 5000)) // one non-zero run not block aligned
	data[3<<20+10] = 1
	if _, err := tg.WriteAt(data, 4096*3); err != nil {
		t.Fatal(err)
	}
	if tg.Written() > 4*BlockSize {
		t.Fatalf("wrote %d bytes for ~3 blocks of data", tg.Written())
	}
	if _, err := tg.WriteAt([]byte{1}, 8<<20); !errors.Is(err, ErrTooBig) {
		t.Fatalf("write past the limit: %v", err)
	}
	if err := tg.Resize(1 << 20); !errors.Is(err, ErrTooBig) {
		t.Fatalf("resize below data: %v", err)
	}
	if err := tg.Resize(8 << 20); err != nil {
		t.Fatal(err)
	}
	if err := tg.Sync(); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(p)
	want := make([]byte, 8<<20)
	copy(want[4096*3:], data)
	if !bytes.Equal(got, want) {
		t.Fatal("content differs")
	}
	if a := allocated(t, p); a > 64<<10 {
		t.Fatalf("%d bytes allocated for 3 data blocks", a)
	}
}

// Block mode over a dirty "device" (a pre-filled file stands in for one):
// skipped zero blocks must still read back as zeros.
func TestBlockModeZeroesSkippedBlocks(t *testing.T) {
	p := filepath.Join(t.TempDir(), "dev")
	if err := os.WriteFile(p, bytes.Repeat([]byte{0xee}, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	tg, err := Open(p, Options{Block: true})
	if err != nil {
		t.Fatal(err)
	}
	if tg.Limit() != 1<<20 {
		t.Fatalf("limit %d", tg.Limit())
	}
	img := make([]byte, 1<<20)
	img[100] = 5
	if _, err := tg.Writer().ReadFrom(bytes.NewReader(img)); err != nil {
		t.Fatal(err)
	}
	if _, err := tg.WriteAt([]byte{1}, 1<<20); !errors.Is(err, ErrTooBig) {
		t.Fatalf("write past the device: %v", err)
	}
	if err := tg.Sync(); err != nil {
		t.Fatal(err)
	}
	tg.Close()
	got, _ := os.ReadFile(p)
	if !bytes.Equal(got, img) {
		t.Fatal("stale device bytes survived in skipped blocks")
	}
}

func TestPreallocateAndFillZeros(t *testing.T) {
	p := filepath.Join(t.TempDir(), "disk.img")
	tg, err := Open(p, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer tg.Close()
	if err := tg.Resize(4 << 20); err != nil {
		t.Fatal(err)
	}
	if err := tg.Preallocate(4 << 20); err != nil {
		t.Fatal(err)
	}
	if a := allocated(t, p); a < 4<<20 {
		t.Fatalf("preallocated %d bytes", a)
	}
	if err := tg.FillZeros(0, 3<<20); err != nil {
		t.Fatal(err)
	}
}

// cutShort yields its data, then fails the way an HTTP body cut short does.
type cutShort struct{ data []byte }

func (c *cutShort) Read(p []byte) (int, error) {
	if len(c.data) == 0 {
		return 0, io.ErrUnexpectedEOF
	}
	n := copy(p, c.data)
	c.data = c.data[n:]
	return n, nil
}

// A source that fails with io.ErrUnexpectedEOF is a failed copy, not a short
// image taken for a whole one; a source that ends with io.EOF mid-buffer is
// a whole image.
func TestReadFromTellsCutShortFromEnd(t *testing.T) {
	data := bytes.Repeat([]byte{9}, 3<<20+123)
	for _, tc := range []struct {
		name    string
		r       io.Reader
		wantErr bool
	}{
		{"cut short", &cutShort{data: data}, true},
		{"ends", bytes.NewReader(data), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tg, err := Open(filepath.Join(t.TempDir(), "disk.img"), Options{Limit: 8 << 20})
			if err != nil {
				t.Fatal(err)
			}
			defer tg.Close()
			n, err := tg.Writer().ReadFrom(tc.r)
			if tc.wantErr != (err != nil) || (tc.wantErr && !errors.Is(err, io.ErrUnexpectedEOF)) {
				t.Fatalf("ReadFrom = %d, %v; want an error: %v", n, err, tc.wantErr)
			}
			if !tc.wantErr && n != int64(len(data)) {
				t.Fatalf("copied %d of %d bytes", n, len(data))
			}
		})
	}
}
