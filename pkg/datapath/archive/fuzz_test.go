package archive

import (
	"archive/tar"
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func tarOf(f *testing.F, members ...*tar.Header) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range members {
		if err := tw.WriteHeader(h); err != nil {
			f.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			tw.Write(bytes.Repeat([]byte("x"), int(h.Size)))
		}
	}
	tw.Close()
	return buf.Bytes()
}

// FuzzExtract: any byte stream is extracted or refused without a panic;
// nothing is written outside the directory, no link inside points out of
// it, and no more than the limit is written.
func FuzzExtract(f *testing.F) {
	f.Add(tarOf(f,
		&tar.Header{Name: "d/", Typeflag: tar.TypeDir, Mode: 0o755},
		&tar.Header{Name: "d/a.txt", Typeflag: tar.TypeReg, Mode: 0o644, Size: 5},
		&tar.Header{Name: "d/l", Typeflag: tar.TypeSymlink, Linkname: "a.txt"},
		&tar.Header{Name: "h", Typeflag: tar.TypeLink, Linkname: "d/a.txt"},
	))
	f.Add(tarOf(f, &tar.Header{Name: "../evil", Typeflag: tar.TypeReg, Size: 1}))
	f.Add(tarOf(f, &tar.Header{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "../../etc"}, &tar.Header{Name: "l/passwd", Typeflag: tar.TypeReg, Size: 1}))
	f.Add(tarOf(f, &tar.Header{Name: "big", Typeflag: tar.TypeReg, Size: 2048}))
	f.Add(tarOf(f, &tar.Header{Name: strings.Repeat("long/", 30) + "name", Typeflag: tar.TypeReg, Size: 3})) // a PAX path record
	const limit = 1024
	// Extract syncs every file: on tmpfs that costs nothing, so the
	// fuzzer runs thousands of inputs a second rather than a few.
	base := ""
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		base = "/dev/shm"
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		outer, err := os.MkdirTemp(base, "fuzz-extract-")
		if err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(outer)
		dir := filepath.Join(outer, "root")
		var n int64
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		n, err = Extract(bytes.NewReader(b), dir, limit)
		if n < 0 || n > limit {
			t.Fatalf("wrote %d bytes, limit %d", n, limit)
		}
		if err != nil && errors.Is(err, ErrTooBig) && n > limit {
			t.Fatalf("too big after %d bytes", n)
		}
		entries, _ := os.ReadDir(outer)
		if len(entries) != 1 {
			t.Fatalf("something was written next to the directory: %v", entries)
		}
		var total int64
		seen := map[uint64]bool{} // hard links share their bytes
		filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return nil
			}
			if d.Type()&fs.ModeSymlink != 0 {
				target, _ := os.Readlink(p)
				rel, _ := filepath.Rel(dir, filepath.Join(filepath.Dir(p), target))
				if filepath.IsAbs(target) || rel == ".." || strings.HasPrefix(rel, "../") {
					t.Fatalf("link %s points out of the directory (%s)", p, target)
				}
			}
			if d.Type().IsRegular() {
				if fi, err := d.Info(); err == nil {
					if st, ok := fi.Sys().(*syscall.Stat_t); !ok || !seen[st.Ino] {
						total += fi.Size()
						if ok {
							seen[st.Ino] = true
						}
					}
				}
			}
			if d.Type()&(fs.ModeDevice|fs.ModeNamedPipe|fs.ModeSocket) != 0 {
				t.Fatalf("%s is a %v", p, d.Type())
			}
			return nil
		})
		if total > limit {
			t.Fatalf("%d bytes on disk, limit %d", total, limit)
		}
	})
}
