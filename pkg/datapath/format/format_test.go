package format

import (
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

func at(off int, magic []byte, size int) []byte {
	b := make([]byte, size)
	copy(b[off:], magic)
	return b
}

func TestDetectTable(t *testing.T) {
	qcow2v3 := at(0, []byte("QFI\xfb\x00\x00\x00\x03"), 512)
	qcow1 := at(0, []byte("QFI\xfb\x00\x00\x00\x01"), 512)
	vdi := make([]byte, 512)
	binary.LittleEndian.PutUint32(vdi[0x40:], 0xbeda107f)
	tests := []struct {
		name string
		in   []byte
		want Format
	}{
		{"empty", nil, Raw},
		{"zeros", make([]byte, HeaderSize), Raw},
		{"qcow2 v3", qcow2v3, Qcow2},
		{"qcow2 magic only", []byte("QFI\xfb"), Qcow2},
		{"qcow v1", qcow1, Qcow},
		{"vmdk sparse", at(0, []byte("KDMV"), 512), VMDK},
		{"vmdk esx cowd", at(0, []byte("COWD"), 512), VMDK},
		{"vmdk descriptor", []byte("# Disk DescriptorFile\nversion=1\n"), VMDK},
		{"vdi", vdi, VDI},
		{"vhd dynamic", at(0, []byte("conectix"), 512), VHD},
		{"vhdx", at(0, []byte("vhdxfile"), 512), VHDX},
		{"iso", at(0x8001, []byte("CD001"), HeaderSize), ISO},
		{"iso truncated", at(0x8001, []byte("CD0"), 0x8004), Raw},
		{"gzip", []byte{0x1f, 0x8b, 0x08, 0, 0}, Gzip},
		{"gzip wrong method", []byte{0x1f, 0x8b, 0x07, 0, 0}, Raw},
		{"xz", []byte{0xfd, '7', 'z', 'X', 'Z', 0, 0, 4}, Xz},
		{"zstd", []byte{0x28, 0xb5, 0x2f, 0xfd, 0x24}, Zstd},
		{"bzip2", []byte("BZh91AY&SY"), Bzip2},
		{"bzip2 bad level", []byte("BZhx"), Raw},
		{"tar", at(257, []byte("ustar\x0000"), 1024), Tar},
		{"mbr", at(510, []byte{0x55, 0xaa}, 512), Raw},
		{"text", []byte("hello world"), Raw},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := Detect(tc.in); got != tc.want {
				t.Fatalf("Detect = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestFormatHelpers(t *testing.T) {
	for _, f := range []Format{Gzip, Xz, Zstd, Bzip2} {
		if !f.IsCompression() {
			t.Errorf("%s should be a compression wrapper", f)
		}
		if _, ok := f.QemuFormat(); ok {
			t.Errorf("%s must not be handed to qemu-img", f)
		}
	}
	for f, want := range map[Format]string{Raw: "raw", ISO: "raw", Qcow2: "qcow2", VHD: "vpc", VHDX: "vhdx", VMDK: "vmdk", VDI: "vdi"} {
		got, ok := f.QemuFormat()
		if !ok || got != want || f.IsCompression() {
			t.Errorf("%s: QemuFormat = %q,%v want %q", f, got, ok, want)
		}
	}
}

// TestDetectQemuImages checks Detect against images written by the real
// qemu-img in every output format it can create.
func TestDetectQemuImages(t *testing.T) {
	if _, err := exec.LookPath("qemu-img"); err != nil {
		t.Skip("qemu-img not installed (apt-get install qemu-utils)")
	}
	dir := t.TempDir()
	cases := []struct {
		fmt, opts string
		want      Format
	}{
		{"qcow2", "", Qcow2},
		{"qcow2", "compat=0.10", Qcow2},
		{"vmdk", "", VMDK},
		{"vmdk", "subformat=streamOptimized", VMDK},
		{"vdi", "", VDI},
		{"vpc", "", VHD},
		{"vhdx", "", VHDX},
		{"raw", "", Raw},
	}
	for _, c := range cases {
		p := filepath.Join(dir, c.fmt+c.opts)
		args := []string{"create", "-q", "-f", c.fmt}
		if c.opts != "" {
			args = append(args, "-o", c.opts)
		}
		args = append(args, p, "16M")
		if out, err := exec.Command("qemu-img", args...).CombinedOutput(); err != nil {
			t.Fatalf("qemu-img %v: %v\n%s", args, err, out)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) > HeaderSize {
			b = b[:HeaderSize]
		}
		if got := Detect(b); got != c.want {
			t.Errorf("%s %s: Detect = %q, want %q", c.fmt, c.opts, got, c.want)
		}
	}
}

func FuzzDetect(f *testing.F) {
	f.Add([]byte("QFI\xfb\x00\x00\x00\x03"))
	f.Add([]byte{0x1f, 0x8b, 0x08})
	f.Add([]byte("# Disk DescriptorFile"))
	f.Add(make([]byte, 0x8010))
	f.Fuzz(func(t *testing.T, b []byte) {
		got := Detect(b)
		if got == "" {
			t.Fatal("empty format")
		}
		// Detection depends only on the bytes: the same input gives the same answer.
		if again := Detect(append([]byte(nil), b...)); again != got {
			t.Fatalf("not deterministic: %q then %q", got, again)
		}
	})
}
