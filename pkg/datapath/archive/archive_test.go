package archive

import (
	"archive/tar"
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCheckName(t *testing.T) {
	for _, c := range []struct {
		in, want string
		bad      bool
	}{
		{"a/b.txt", "a/b.txt", false},
		{"./a//b", "a/b", false},
		{"./", ".", false},
		{"/etc/passwd", "", true},
		{"../x", "", true},
		{"a/../../x", "", true},
		{"a/..", "", true},
		{"", "", true},
	} {
		got, err := CheckName(c.in)
		if (err != nil) != c.bad || got != c.want {
			t.Errorf("CheckName(%q) = %q, %v", c.in, got, err)
		}
	}
}

func TestCheckLink(t *testing.T) {
	for _, c := range []struct {
		name, target string
		bad          bool
	}{
		{"a/l", "b", false},
		{"a/l", "../b", false},
		{"a/l", "../../b", true},
		{"l", "/etc/passwd", true},
		{"l", "..", true},
		{"l", "", true},
	} {
		if err := CheckLink(c.name, c.target); (err != nil) != c.bad {
			t.Errorf("CheckLink(%q,%q) = %v", c.name, c.target, err)
		}
	}
}

type member struct {
	h    tar.Header
	body string
}

func mkTar(t *testing.T, ms ...member) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, m := range ms {
		h := m.h
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(m.body))
		}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if m.body != "" {
			if _, err := tw.Write([]byte(m.body)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestExtractGood(t *testing.T) {
	dir := t.TempDir()
	data := mkTar(t,
		member{h: tar.Header{Name: "d/", Typeflag: tar.TypeDir, Mode: 0o755}},
		member{h: tar.Header{Name: "d/file.txt", Typeflag: tar.TypeReg}, body: "hello"},
		member{h: tar.Header{Name: "d/link", Typeflag: tar.TypeSymlink, Linkname: "file.txt"}},
		member{h: tar.Header{Name: "hard", Typeflag: tar.TypeLink, Linkname: "d/file.txt"}},
	)
	n, err := Extract(bytes.NewReader(data), dir, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if n != 5 {
		t.Fatalf("wrote %d bytes", n)
	}
	for _, p := range []string{"d/file.txt", "d/link", "hard"} {
		b, err := os.ReadFile(filepath.Join(dir, p))
		if err != nil || string(b) != "hello" {
			t.Fatalf("%s: %q %v", p, b, err)
		}
	}
}

func TestExtractHostile(t *testing.T) {
	for _, c := range []struct {
		name string
		ms   []member
		want error
	}{
		{"dotdot", []member{{h: tar.Header{Name: "../evil", Typeflag: tar.TypeReg}, body: "x"}}, ErrUnsafe},
		{"absolute", []member{{h: tar.Header{Name: "/tmp/evil", Typeflag: tar.TypeReg}, body: "x"}}, ErrUnsafe},
		{"escaping symlink", []member{{h: tar.Header{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "../../etc"}}}, ErrUnsafe},
		{"absolute symlink", []member{{h: tar.Header{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "/etc"}}}, ErrUnsafe},
		{"hardlink out", []member{{h: tar.Header{Name: "h", Typeflag: tar.TypeLink, Linkname: "../x"}}}, ErrUnsafe},
		{"char device", []member{{h: tar.Header{Name: "null", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3}}}, ErrUnsafe},
		{"block device", []member{{h: tar.Header{Name: "sda", Typeflag: tar.TypeBlock, Devmajor: 8}}}, ErrUnsafe},
		{"fifo", []member{{h: tar.Header{Name: "f", Typeflag: tar.TypeFifo}}}, ErrUnsafe},
		{"too big", []member{{h: tar.Header{Name: "big", Typeflag: tar.TypeReg}, body: strings.Repeat("x", 2000)}}, ErrTooBig},
	} {
		t.Run(c.name, func(t *testing.T) {
			parent := t.TempDir()
			dir := filepath.Join(parent, "vol")
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			_, err := Extract(bytes.NewReader(mkTar(t, c.ms...)), dir, 1000)
			if !errors.Is(err, c.want) {
				t.Fatalf("err %v, want %v", err, c.want)
			}
			if _, err := os.Lstat(filepath.Join(parent, "evil")); err == nil {
				t.Fatal("file written outside the volume")
			}
		})
	}
}

// A symlink that is itself inside the root but is later used as a path
// prefix must not let a file escape: os.Root refuses to follow it out.
func TestExtractSymlinkPrefixCannotEscape(t *testing.T) {
	parent := t.TempDir()
	dir := filepath.Join(parent, "vol")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// Pre-existing escaping link in the volume (e.g. from an earlier run).
	if err := os.Symlink(parent, filepath.Join(dir, "up")); err != nil {
		t.Fatal(err)
	}
	_, err := Extract(bytes.NewReader(mkTar(t, member{h: tar.Header{Name: "up/evil", Typeflag: tar.TypeReg}, body: "x"})), dir, 0)
	if err == nil {
		t.Fatal("extraction through an escaping symlink succeeded")
	}
	if _, err := os.Lstat(filepath.Join(parent, "evil")); err == nil {
		t.Fatal("file written outside the volume")
	}
}
