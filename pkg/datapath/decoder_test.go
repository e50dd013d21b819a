package datapath

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"io"
	"os/exec"
	"strings"
	"testing"

	"github.com/go-logr/logr/testr"

	"github.com/kubefill/kubefill/pkg/datapath/format"
	"github.com/kubefill/kubefill/pkg/datapath/source"
)

func TestCheckDecoderMemory(t *testing.T) {
	xzHead := func(d byte) []byte {
		b := []byte("\xfd7zXZ\x00\x00\x04\xe6\xd6\xb4F\x02\x00!\x01\x16\x00\x00\x00\x00\x00\x00\x00")
		b[16] = d
		binary.LittleEndian.PutUint32(b[20:], crc32.ChecksumIEEE(b[12:20]))
		return b
	}
	zstdHead := func(wd byte) []byte { return []byte{0x28, 0xb5, 0x2f, 0xfd, 0x04, wd, 0, 0} }
	for _, c := range []struct {
		name  string
		f     format.Format
		head  []byte
		limit int64
		want  string // "" = accepted
	}{
		{"xz -9 under 512 MiB", format.Xz, xzHead(26), 512 << 20, ""},
		{"xz 1.5 GiB under 512 MiB", format.Xz, xzHead(37), 512 << 20,
			"the xz stream needs a 1.5 GiB dictionary; the importer has a 512.0 MiB memory limit; recompress with a smaller dictionary (xz -6 or less"},
		{"xz 1.5 GiB under 4 GiB", format.Xz, xzHead(37), 4 << 30, ""},
		{"xz 1.5 GiB, no known limit", format.Xz, xzHead(37), 0, "no known memory limit and allows its decoder 1.0 GiB"},
		{"xz 768 MiB under 512 MiB", format.Xz, xzHead(35), 512 << 20, "needs a 768.0 MiB dictionary"},
		{"zstd 2 MiB under 64 MiB", format.Zstd, zstdHead(11 << 3), 64 << 20, ""},
		{"zstd --long=31 under 1 GiB", format.Zstd, zstdHead(21 << 3), 1 << 30,
			"the zstd stream needs a 2.0 GiB window; the importer has a 1.0 GiB memory limit; recompress with a smaller window (zstd without --long"},
		{"unreadable header", format.Xz, []byte("\xfd7zXZ\x00"), 1 << 20, ""},
	} {
		err := CheckDecoderMemory(c.f, c.head, c.limit)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: %v", c.name, err)
		case c.want != "" && (!errors.Is(err, ErrDecoderMemory) || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "podResourceRequirements in CDIConfig")):
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}
	if DecoderBudget(0) != 1<<30 || DecoderBudget(512<<20) != 512<<20-decoderReserve || DecoderBudget(1<<20) != minDecoderBudget {
		t.Error("DecoderBudget")
	}
}

func run(t *testing.T, name string, in []byte, args ...string) []byte {
	t.Helper()
	if _, err := exec.LookPath(name); err != nil {
		t.Skipf("%s not installed", name)
	}
	cmd := exec.Command(name, args...)
	cmd.Stdin = bytes.NewReader(in)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return out
}

// Real compressed images whose header asks for more memory than the worker
// has are refused with the advice, before the decoder allocates anything;
// the same images with a modest header import.
func TestImportRefusesHostileDecoderMemory(t *testing.T) {
	data := bytes.Repeat([]byte("a disk image "), 200000)
	xzFile := run(t, "xz", data, "-0", "-T1", "-c")
	hostileXz := append([]byte(nil), xzFile...)
	size := (int(hostileXz[12]) + 1) * 4
	hostileXz[16] = 37 // LZMA2 dictionary 1.5 GiB
	binary.LittleEndian.PutUint32(hostileXz[12+size-4:], crc32.ChecksumIEEE(hostileXz[12:12+size-4]))
	zstFile := run(t, "zstd", data, "-q", "-c")
	hostileZst := append([]byte(nil), zstFile...)
	hostileZst[5] = 21 << 3 // Window_Size 2 GiB
	// A good first frame and a hostile second one: the decoder itself
	// meets the window, and says the same.
	secondFrame := append(append([]byte(nil), zstFile...), hostileZst...)
	for _, c := range []struct {
		name string
		b    []byte
		want string
	}{
		{"xz", xzFile, ""},
		{"xz with a 1.5 GiB dictionary", hostileXz, "the xz stream needs a 1.5 GiB dictionary; the importer has a 512.0 MiB memory limit"},
		{"zstd", zstFile, ""},
		{"zstd with a 2 GiB window", hostileZst, "the zstd stream needs a 2.0 GiB window; the importer has a 512.0 MiB memory limit"},
		{"zstd whose second frame has a 2 GiB window", secondFrame, "a zstd frame needs a window larger than 416.0 MiB; the importer has a 512.0 MiB memory limit"},
	} {
		t.Run(c.name, func(t *testing.T) {
			src := &source.Stream{Body: io.NopCloser(bytes.NewReader(c.b)), Name: "upload", Len: -1}
			res, err := Import(context.Background(), src, Options{Path: outPath(t), Size: 64 << 20, MemoryLimit: 512 << 20, Log: testr.New(t)})
			if c.want == "" {
				if err != nil || res.VirtualSize != int64(len(data)) {
					t.Fatalf("%+v %v", res, err)
				}
				return
			}
			if !errors.Is(err, ErrDecoderMemory) || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "podResourceRequirements") {
				t.Fatalf("err %v, want %q", err, c.want)
			}
			t.Log(err)
		})
	}
}
