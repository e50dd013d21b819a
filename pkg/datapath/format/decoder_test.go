package format

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"os/exec"
	"testing"
)

// compress runs a real compressor over data read from a pipe (so that it
// does not know the size, as with a stream).
func compress(t *testing.T, data []byte, name string, args ...string) []byte {
	t.Helper()
	if _, err := exec.LookPath(name); err != nil {
		t.Skipf("%s not installed", name)
	}
	cmd := exec.Command(name, args...)
	cmd.Stdin = bytes.NewReader(data)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %v: %v", name, args, err)
	}
	return out
}

// SetXzDictSize rewrites the LZMA2 dictionary byte of the first block of a
// single-filter xz stream and its block header CRC, as a hostile or exotic
// compressor would have written it.
func setXzDict(t *testing.T, b []byte, d byte) []byte {
	t.Helper()
	b = append([]byte(nil), b...)
	size := (int(b[12]) + 1) * 4
	h := b[12 : 12+size]
	if h[1] != 0 || h[2] != 0x21 || h[3] != 1 {
		t.Fatalf("unexpected block header % x", h)
	}
	h[4] = d
	binary.LittleEndian.PutUint32(h[size-4:], crc32.ChecksumIEEE(h[:size-4]))
	return b
}

func TestDecoderMemory(t *testing.T) {
	data := bytes.Repeat([]byte("kubefill "), 100000)
	xz0 := compress(t, data, "xz", "-0", "-T1", "-c")
	zst := compress(t, data, "zstd", "-q", "-c")
	zstLong := compress(t, data, "zstd", "-q", "-c", "--long=27")
	zstBig := append([]byte(nil), zst...)
	zstBig[5] = 21 << 3 // Window_Descriptor: 2^31
	zstMant := append([]byte(nil), zst...)
	zstMant[5] = 20<<3 | 4 // 2^30 + 4/8 of it
	badCRC := setXzDict(t, xz0, 37)
	badCRC[16] ^= 1
	for _, c := range []struct {
		name string
		f    Format
		b    []byte
		want int64 // -1: not known
	}{
		{"xz -0", Xz, xz0, 256 << 10},
		{"xz -6", Xz, compress(t, data, "xz", "-6", "-T1", "-c"), 8 << 20},
		{"xz -9", Xz, compress(t, data, "xz", "-9", "-T1", "-c"), 64 << 20},
		{"xz dict 1.5 GiB", Xz, setXzDict(t, xz0, 37), 1536 << 20},
		{"xz dict 4 GiB", Xz, setXzDict(t, xz0, 40), 1<<32 - 1},
		{"xz dict byte beyond 40", Xz, setXzDict(t, xz0, 41), -1},
		{"xz block header CRC wrong", Xz, badCRC, -1},
		{"xz empty stream", Xz, compress(t, nil, "xz", "-c"), -1},
		{"xz short", Xz, xz0[:14], -1},
		{"zstd default (level 3: 2^21)", Zstd, zst, 2 << 20},
		{"zstd --long=27", Zstd, zstLong, 128 << 20},
		{"zstd window 2 GiB", Zstd, zstBig, 2 << 30},
		{"zstd window mantissa", Zstd, zstMant, 1<<30 + 1<<29},
		{"zstd single segment", Zstd, []byte{0x28, 0xb5, 0x2f, 0xfd, 0x20, 0x40, 0, 0}, 0x40},
		{"gzip says nothing", Gzip, []byte{0x1f, 0x8b, 8, 0}, -1},
	} {
		got, ok := DecoderMemory(c.f, c.b)
		if c.want < 0 {
			if ok {
				t.Errorf("%s: %d, want not known", c.name, got)
			}
		} else if !ok || got != c.want {
			t.Errorf("%s: %d %v, want %d", c.name, got, ok, c.want)
		}
	}
}

func FuzzDecoderMemory(f *testing.F) {
	f.Add([]byte("\xfd7zXZ\x00\x00\x04\xe6\xd6\xb4F\x02\x00!\x01\x16\x00\x00\x00t/\xe5\xa3"))
	f.Add([]byte{0x28, 0xb5, 0x2f, 0xfd, 0x04, 0xa8, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, fm := range []Format{Xz, Zstd} {
			if n, ok := DecoderMemory(fm, b); ok && n < 0 {
				t.Fatalf("%s: %d", fm, n)
			}
		}
	})
}
