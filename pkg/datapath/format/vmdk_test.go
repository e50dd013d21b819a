package format

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// qemuImage makes an image with qemu-img in a temp dir of the test and
// returns its path (and the dir, for images made of several files).
func qemuImage(t *testing.T, fmt, size string, opts ...string) string {
	t.Helper()
	if _, err := exec.LookPath("qemu-img"); err != nil {
		t.Skip("qemu-img not installed (hack/deps.sh installs qemu-utils)")
	}
	p := filepath.Join(t.TempDir(), "disk."+fmt)
	args := []string{"create", "-q", "-f", fmt}
	for _, o := range opts {
		args = append(args, "-o", o)
	}
	if out, err := exec.Command("qemu-img", append(args, p, size)...).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img %v: %v: %s", args, err, out)
	}
	return p
}

func openImage(t *testing.T, p string) *os.File {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func TestVMDKVirtualSizeOfQemuImages(t *testing.T) {
	for _, c := range []struct {
		size string
		opts []string
		want int64
	}{
		{"1G", nil, 1 << 30}, // monolithicSparse: KDMV with an embedded descriptor
		{"3G", []string{"subformat=streamOptimized"}, 3 << 30},
		{"5G", []string{"subformat=twoGbMaxExtentSparse"}, 5 << 30}, // descriptor with 3 extents
		{"1500M", []string{"subformat=monolithicFlat"}, 1500 << 20},
		{"100M", []string{"adapter_type=lsilogic", "hwversion=6"}, 100 << 20},
		{"2047M", []string{"subformat=monolithicSparse", "zeroed_grain=on"}, 2047 << 20},
	} {
		t.Run(c.size+strings.Join(c.opts, ","), func(t *testing.T) {
			f := openImage(t, qemuImage(t, "vmdk", c.size, c.opts...))
			head := make([]byte, HeaderSize)
			n, _ := f.ReadAt(head, 0)
			if got := Detect(head[:n]); got != VMDK {
				t.Fatalf("Detect = %s", got)
			}
			got, err := VirtualSize(VMDK, f)
			if err != nil || got != c.want {
				t.Fatalf("VirtualSize = %d, %v; want %d", got, err, c.want)
			}
			// The first 64 KiB (what the importer has before anything is
			// spooled) are enough for every vmdk layout.
			if got, err := VirtualSize(VMDK, bytes.NewReader(head[:n])); err != nil || got != c.want {
				t.Fatalf("from the head only: %d, %v", got, err)
			}
		})
	}
}

func TestParseVMDKDescriptor(t *testing.T) {
	const base = "# Disk DescriptorFile\nversion=1\ncreateType=\"monolithicFlat\"\n"
	for _, c := range []struct {
		name, text string
		want       int64 // -1: ErrNoVirtualSize
		extents    int
	}{
		{"flat", base + "RW 2048 FLAT \"disk-flat.vmdk\" 0\n", 2048 * 512, 1},
		{"several", base + "RW 100 SPARSE \"a.vmdk\"\nRDONLY 50 FLAT \"b\" 7\nNOACCESS 10 ZERO\n", 160 * 512, 3},
		{"crlf and tabs", base + "RW\t8 \t VMFS \"x.vmdk\"\r\n", 8 * 512, 1},
		{"nul padding ends it", base + "RW 8 FLAT \"x\"\n\x00RW 99 FLAT \"y\"\n", 8 * 512, 1},
		{"ddb lines ignored", base + "RW 8 FLAT \"x\"\nddb.geometry.heads = \"16\"\n", 8 * 512, 1},
		{"no extent", base, -1, 0},
		{"unknown type", base + "RW 8 TAPE \"x\"\n", -1, 0},
		{"negative size", base + "RW -8 FLAT \"x\"\n", -1, 0},
		{"not a number", base + "RW 0x10 FLAT \"x\"\n", -1, 0},
		{"overflowing size", base + "RW 99999999999999999999 FLAT \"x\"\n", -1, 0},
		{"sum beyond 1 EiB", base + strings.Repeat("RW 2251799813685248 FLAT \"x\"\n", 2), -1, 0},
		{"unclosed file name", base + "RW 8 FLAT \"x\n", -1, 0},
		{"flat without file", base + "RW 8 FLAT\n", -1, 0},
		{"too many extents", base + strings.Repeat("RW 1 ZERO\n", maxVMDKExtents+1), -1, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			d, err := ParseVMDKDescriptor([]byte(c.text))
			if c.want < 0 {
				if !errors.Is(err, ErrNoVirtualSize) {
					t.Fatalf("got %+v, %v; want ErrNoVirtualSize", d, err)
				}
				return
			}
			if err != nil || d.VirtualSize() != c.want || len(d.Extents) != c.extents || d.CreateType != "monolithicFlat" {
				t.Fatalf("got %+v, %v; want %d bytes in %d extents", d, err, c.want, c.extents)
			}
		})
	}
}

// sparseHeader builds a KDMV header of capacity sectors with the
// descriptor desc embedded at sector 1.
func sparseHeader(capacity uint64, desc string) []byte {
	b := make([]byte, 512+((len(desc)+511)&^511))
	copy(b, magicVMDK)
	binary.LittleEndian.PutUint32(b[4:], 1)
	binary.LittleEndian.PutUint64(b[12:], capacity)
	binary.LittleEndian.PutUint64(b[20:], 128)
	if desc != "" {
		binary.LittleEndian.PutUint64(b[28:], 1)
		binary.LittleEndian.PutUint64(b[36:], uint64((len(desc)+511)/512))
		copy(b[512:], desc)
	}
	return b
}

func TestVMDKSparseHeaderBounds(t *testing.T) {
	desc := "# Disk DescriptorFile\nRW 2048 SPARSE \"d.vmdk\"\n"
	cow := make([]byte, 512)
	copy(cow, magicCOWD)
	binary.LittleEndian.PutUint32(cow[12:], 4096)
	hugeDesc := sparseHeader(2048, "")
	binary.LittleEndian.PutUint64(hugeDesc[28:], 1)
	binary.LittleEndian.PutUint64(hugeDesc[36:], 1<<40) // a terabyte of descriptor: refused, not allocated
	for _, c := range []struct {
		name string
		b    []byte
		want int64
	}{
		{"capacity only", sparseHeader(2048, ""), 2048 * 512},
		{"descriptor agrees", sparseHeader(2048, desc), 2048 * 512},
		{"descriptor says less: the lower bound", sparseHeader(4096, desc), 2048 * 512},
		{"descriptor unreadable: capacity", sparseHeader(2048, "garbage"), 2048 * 512},
		{"COWD", cow, 4096 * 512},
		{"zero capacity", sparseHeader(0, ""), -1},
		{"capacity beyond 1 EiB", sparseHeader(1<<62, ""), -1},
		{"huge descriptor", hugeDesc, -1},
		{"short", []byte("KDMV\x01\x00"), -1},
		{"not vmdk", []byte("QFI\xfb\x00\x00\x00\x03 and more bytes to read"), -1},
	} {
		got, err := VMDKVirtualSize(bytes.NewReader(c.b))
		if c.want < 0 {
			if !errors.Is(err, ErrNoVirtualSize) {
				t.Errorf("%s: got %d, %v; want ErrNoVirtualSize", c.name, got, err)
			}
		} else if err != nil || got != c.want {
			t.Errorf("%s: got %d, %v; want %d", c.name, got, err, c.want)
		}
	}
}

// FuzzVMDK: the descriptor parser and the header reader never panic,
// never allocate in proportion to what the input claims, and never report
// a negative or unbounded size.
func FuzzVMDK(f *testing.F) {
	f.Add([]byte("# Disk DescriptorFile\nversion=1\ncreateType=\"monolithicFlat\"\nRW 2048 FLAT \"disk-flat.vmdk\" 0\nNOACCESS 10 ZERO\n"))
	f.Add(sparseHeader(2097152, "# Disk DescriptorFile\nversion=1\nCID=40eb806b\nparentCID=ffffffff\ncreateType=\"monolithicSparse\"\n# Extent description\nRW 2097152 SPARSE \"a.vmdk\"\n"))
	f.Add([]byte("COWD\x01\x00\x00\x00\x03\x00\x00\x00\x00\x10\x00\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if d, err := ParseVMDKDescriptor(b); err == nil {
			if n := d.VirtualSize(); n < 0 || n > maxVirtualSize || len(d.Extents) == 0 || len(d.Extents) > maxVMDKExtents {
				t.Fatalf("descriptor: size %d, %d extents", n, len(d.Extents))
			}
		} else if !errors.Is(err, ErrNoVirtualSize) {
			t.Fatalf("descriptor error %v does not wrap ErrNoVirtualSize", err)
		}
		n, err := VMDKVirtualSize(bytes.NewReader(b))
		if err == nil && (n <= 0 || n > maxVirtualSize) {
			t.Fatalf("size %d", n)
		}
		if err != nil && !errors.Is(err, ErrNoVirtualSize) {
			t.Fatalf("error %v does not wrap ErrNoVirtualSize", err)
		}
	})
}
