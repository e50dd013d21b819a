package format

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

func TestMinDecompressedSizeTable(t *testing.T) {
	for _, c := range []struct {
		name       string
		f          Format
		head, tail []byte
		want       int64
		ok         bool
	}{
		{"gzip isize", Gzip, nil, []byte{1, 2, 0, 0, 0, 0x01}, 1 << 24, true},
		{"gzip no tail", Gzip, nil, nil, 0, false},
		{"zstd single segment 1 byte", Zstd, []byte{0x28, 0xb5, 0x2f, 0xfd, 0x20, 200}, nil, 200, true},
		{"zstd 2 byte fcs", Zstd, []byte{0x28, 0xb5, 0x2f, 0xfd, 0x40, 0x58, 0x00, 0x01}, nil, 256 + 256, true},
		{"zstd 8 byte fcs", Zstd, []byte{0x28, 0xb5, 0x2f, 0xfd, 0xc0, 0x58, 0, 0, 0, 0x80, 0, 0, 0, 0}, nil, 1 << 31, true},
		{"zstd no fcs", Zstd, []byte{0x28, 0xb5, 0x2f, 0xfd, 0x00, 0x58}, nil, 0, false},
		{"zstd truncated", Zstd, []byte{0x28, 0xb5, 0x2f, 0xfd, 0xc0}, nil, 0, false},
		{"xz garbage tail", Xz, nil, []byte("not an xz footer at all"), 0, false},
		{"raw", Raw, []byte{1}, []byte{2}, 0, false},
	} {
		got, ok := MinDecompressedSize(c.f, c.head, c.tail)
		if got != c.want || ok != c.ok {
			t.Errorf("%s: got %d %v, want %d %v", c.name, got, ok, c.want, c.ok)
		}
	}
}

// The real tools' output reports the real size.
func TestMinDecompressedSizeTools(t *testing.T) {
	dir := t.TempDir()
	raw := filepath.Join(dir, "d")
	data := make([]byte, 3<<20+12345)
	for i := range data {
		data[i] = byte(i * 7 % 251)
	}
	if err := os.WriteFile(raw, data, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		f    Format
		tool []string
		ext  string
	}{
		{Gzip, []string{"gzip", "-k", "-1"}, ".gz"},
		{Xz, []string{"xz", "-k", "-0", "-T1"}, ".xz"},
		{Xz, []string{"xz", "-k", "-0", "-T2", "--block-size=1MiB", "-S", ".mxz"}, ".mxz"},
		{Zstd, []string{"zstd", "-q", "-k", "-1"}, ".zst"},
	} {
		if _, err := exec.LookPath(c.tool[0]); err != nil {
			t.Skipf("%s not installed", c.tool[0])
		}
		if out, err := exec.Command(c.tool[0], append(c.tool[1:], raw)...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v %s", c.tool, err, out)
		}
		b, err := os.ReadFile(raw + c.ext)
		if err != nil {
			t.Fatal(err)
		}
		tail := b[max(0, len(b)-TailSize):]
		head := b[:min(len(b), HeaderSize)]
		if Detect(head) != c.f {
			t.Fatalf("%s detected as %s", c.ext, Detect(head))
		}
		got, ok := MinDecompressedSize(c.f, head, tail)
		if !ok || got != int64(len(data)) {
			t.Fatalf("%s: got %d %v, want %d", c.ext, got, ok, len(data))
		}
	}
}

func FuzzMinDecompressedSize(f *testing.F) {
	f.Add([]byte{0x28, 0xb5, 0x2f, 0xfd, 0xc0, 0x58, 0, 0, 0, 0x80, 0, 0, 0, 0}, []byte("\x00\x01\x02\x03\x00\x00\x00\x00\x01\x00YZ"))
	f.Fuzz(func(t *testing.T, head, tail []byte) {
		for _, fm := range []Format{Gzip, Xz, Zstd} {
			if n, ok := MinDecompressedSize(fm, head, tail); ok && n < 0 {
				t.Fatalf("%s: negative size %d", fm, n)
			}
		}
	})
}
