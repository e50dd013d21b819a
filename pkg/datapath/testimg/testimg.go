// Package testimg builds small disk images with the real qemu-img for tests.
package testimg

import (
	"crypto/sha256"
	"encoding/hex"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// RequireQemuImg skips the test when qemu-img is missing.
func RequireQemuImg(t testing.TB) {
	t.Helper()
	if _, err := exec.LookPath("qemu-img"); err != nil {
		t.Skip("qemu-img not installed (apt-get install qemu-utils)")
	}
}

// QemuImg runs qemu-img and fails the test on error.
func QemuImg(t testing.TB, args ...string) {
	t.Helper()
	out, err := exec.Command("qemu-img", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("qemu-img %v: %v\n%s", args, err, out)
	}
}

// Raw writes a raw image of size bytes (a multiple of 64 KiB) whose 64 KiB
// blocks are, in turn, random, text, zero, zero: compressible and
// incompressible data with holes. Seeded, so reproducible.
func Raw(t testing.TB, dir string, size int64) string {
	t.Helper()
	p := filepath.Join(dir, "source.raw")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rng := rand.New(rand.NewPCG(1, 2))
	blk := make([]byte, 64<<10)
	text := []byte("kubefill streams disk images into volumes. ")
	for off := int64(0); off < size; off += int64(len(blk)) {
		switch (off / int64(len(blk))) % 4 {
		case 0:
			for i := range blk {
				blk[i] = byte(rng.Uint32())
			}
		case 1:
			for i := range blk {
				blk[i] = text[i%len(text)]
			}
		default:
			continue
		}
		if _, err := f.WriteAt(blk, off); err != nil {
			t.Fatal(err)
		}
	}
	// Make the tail non-zero so the size is exact without truncation tricks.
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("END"), size-3); err != nil {
		t.Fatal(err)
	}
	return p
}

// Convert converts src (format fmtIn) to dst with format fmtOut and extra args.
func Convert(t testing.TB, src, fmtIn, dst, fmtOut string, extra ...string) string {
	t.Helper()
	args := append([]string{"convert", "-q", "-f", fmtIn, "-O", fmtOut}, extra...)
	QemuImg(t, append(args, src, dst)...)
	return dst
}

// RawSHA256 is the sha256 of `qemu-img convert -O raw` of src, the reference.
func RawSHA256(t testing.TB, src, fmtIn string) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "reference.raw")
	Convert(t, src, fmtIn, dst, "raw")
	return FileSHA256(t, dst)
}

// FileSHA256 hashes a file.
func FileSHA256(t testing.TB, p string) string {
	t.Helper()
	return PrefixSHA256(t, p, 0)
}

// PrefixSHA256 hashes the first n bytes of a file (all of it if n <= 0): a
// device's first n bytes, say, against an image of n bytes.
func PrefixSHA256(t testing.TB, p string, n int64) string {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var r io.Reader = f
	if n > 0 {
		r = io.LimitReader(f, n)
	}
	h := sha256.New()
	if _, err := io.Copy(h, r); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}
