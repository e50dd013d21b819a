package format

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"io"
	"os"
	"testing"
)

func TestVHDXVirtualSizeOfQemuImages(t *testing.T) {
	for _, c := range []struct {
		size string
		opts []string
		want int64
	}{
		{"1G", nil, 1 << 30},
		{"10G", []string{"block_size=8M"}, 10 << 30},
		{"1000M", []string{"log_size=4M"}, 1000 << 20},
		{"33M", []string{"subformat=fixed"}, 33 << 20},
		{"7T", nil, 7 << 40},
	} {
		t.Run(c.size, func(t *testing.T) {
			p := qemuImage(t, "vhdx", c.size, c.opts...)
			f := openImage(t, p)
			head := make([]byte, HeaderSize)
			n, _ := f.ReadAt(head, 0)
			if got := Detect(head[:n]); got != VHDX {
				t.Fatalf("Detect = %s", got)
			}
			got, err := VirtualSize(VHDX, f)
			if err != nil || got != c.want {
				t.Fatalf("VirtualSize = %d, %v; want %d", got, err, c.want)
			}
			// A prefix that ends before the metadata region says nothing.
			if got, err := VirtualSize(VHDX, io.NewSectionReader(f, 0, 1<<20)); !errors.Is(err, ErrNoVirtualSize) {
				t.Fatalf("1 MiB prefix: %d, %v", got, err)
			}
		})
	}
}

// corrupt returns a copy of the image with one byte flipped at off.
func corrupt(t *testing.T, p string, offs ...int64) *bytes.Reader {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	for _, off := range offs {
		b[off] ^= 0xff
	}
	return bytes.NewReader(b)
}

func TestVHDXChecksumsAndCopies(t *testing.T) {
	p := qemuImage(t, "vhdx", "2G")
	// A damaged first region table: the second copy is used.
	if got, err := VHDXVirtualSize(corrupt(t, p, vhdxRegion1+100)); err != nil || got != 2<<30 {
		t.Fatalf("first region table damaged: %d, %v", got, err)
	}
	// Both damaged: no answer (qemu-img gets to say what is wrong).
	if _, err := VHDXVirtualSize(corrupt(t, p, vhdxRegion1+100, vhdxRegion2+100)); !errors.Is(err, ErrNoVirtualSize) {
		t.Fatalf("both region tables damaged: %v", err)
	}
	// Both headers damaged.
	if _, err := VHDXVirtualSize(corrupt(t, p, vhdxHeader1+100, vhdxHeader2+100)); !errors.Is(err, ErrNoVirtualSize) {
		t.Fatalf("both headers damaged: %v", err)
	}
}

// vhdxImage builds a small VHDX in memory: the identifier, two headers,
// the region table region (checksummed after it is placed) and the
// metadata region at 1 MiB.
type vhdxImage struct {
	headerSeq [2]uint64
	logGUID   bool
	region    []byte // up to 64 KiB, its checksum is set
	meta      []byte
}

func (v vhdxImage) bytes() []byte {
	b := make([]byte, 1<<20+len(v.meta))
	copy(b, magicVHDX)
	for i, off := range []int{vhdxHeader1, vhdxHeader2} {
		h := b[off : off+vhdxHeaderLen]
		copy(h, "head")
		binary.LittleEndian.PutUint64(h[8:], v.headerSeq[i])
		if v.logGUID {
			h[48] = 1
		}
		binary.LittleEndian.PutUint16(h[66:], 1)
		binary.LittleEndian.PutUint32(h[4:], crc32.Checksum(h, crc32c))
	}
	for _, off := range []int{vhdxRegion1, vhdxRegion2} {
		t := b[off : off+vhdxRegionLen]
		copy(t, v.region)
		copy(t, "regi")
		binary.LittleEndian.PutUint32(t[4:], 0)
		binary.LittleEndian.PutUint32(t[4:], crc32.Checksum(t, crc32c))
	}
	copy(b[1<<20:], v.meta)
	return b
}

func regionTable(metaOff uint64, metaLen uint32) []byte {
	t := make([]byte, 16+32)
	copy(t, "regi")
	binary.LittleEndian.PutUint32(t[8:], 1)
	copy(t[16:], vhdxMetadataRegion[:])
	binary.LittleEndian.PutUint64(t[32:], metaOff)
	binary.LittleEndian.PutUint32(t[40:], metaLen)
	binary.LittleEndian.PutUint32(t[44:], 1)
	return t
}

func metadataTable(itemOff, itemLen uint32, size uint64) []byte {
	m := make([]byte, 64<<10+8)
	copy(m, "metadata")
	binary.LittleEndian.PutUint16(m[10:], 1)
	copy(m[32:], vhdxVirtualDiskSize[:])
	binary.LittleEndian.PutUint32(m[48:], itemOff)
	binary.LittleEndian.PutUint32(m[52:], itemLen)
	binary.LittleEndian.PutUint32(m[56:], 6)
	if int(itemOff)+8 <= len(m) {
		binary.LittleEndian.PutUint64(m[itemOff:], size)
	}
	return m
}

func TestVHDXHostileTables(t *testing.T) {
	good := vhdxImage{region: regionTable(1<<20, 1<<20), meta: metadataTable(64<<10, 8, 5<<30)}
	manyEntries := metadataTable(64<<10, 8, 5<<30)
	binary.LittleEndian.PutUint16(manyEntries[10:], 0xffff)
	manyRegions := regionTable(1<<20, 1<<20)
	binary.LittleEndian.PutUint32(manyRegions[8:], 0xffffffff)
	for _, c := range []struct {
		name string
		img  vhdxImage
		want int64
	}{
		{"good", good, 5 << 30},
		{"newer second header", vhdxImage{headerSeq: [2]uint64{1, 2}, region: good.region, meta: good.meta}, 5 << 30},
		{"log to replay", vhdxImage{logGUID: true, region: good.region, meta: good.meta}, -1},
		{"region table entry count beyond 2047", vhdxImage{region: manyRegions, meta: good.meta}, -1},
		{"metadata entry count beyond 2047", vhdxImage{region: good.region, meta: manyEntries}, -1},
		{"metadata region not aligned", vhdxImage{region: regionTable(1<<20+512, 1<<20), meta: good.meta}, -1},
		{"metadata region inside the header section", vhdxImage{region: regionTable(0, 1<<20), meta: good.meta}, -1},
		{"metadata region at 2^63", vhdxImage{region: regionTable(1<<63, 1<<20), meta: good.meta}, -1},
		{"metadata region too short", vhdxImage{region: regionTable(1<<20, 100), meta: good.meta}, -1},
		{"item inside the table", vhdxImage{region: good.region, meta: metadataTable(100, 8, 5<<30)}, -1},
		{"item beyond the region", vhdxImage{region: regionTable(1<<20, 64<<10), meta: good.meta}, -1},
		{"item of 4 bytes", vhdxImage{region: good.region, meta: metadataTable(64<<10, 4, 5<<30)}, -1},
		{"zero size", vhdxImage{region: good.region, meta: metadataTable(64<<10, 8, 0)}, -1},
		{"size beyond 1 EiB", vhdxImage{region: good.region, meta: metadataTable(64<<10, 8, 1<<61)}, -1},
		{"no metadata region", vhdxImage{region: []byte("regi"), meta: good.meta}, -1},
		{"metadata signature", vhdxImage{region: good.region, meta: []byte("metadatX")}, -1},
	} {
		got, err := VHDXVirtualSize(bytes.NewReader(c.img.bytes()))
		if c.want < 0 {
			if !errors.Is(err, ErrNoVirtualSize) {
				t.Errorf("%s: got %d, %v; want ErrNoVirtualSize", c.name, got, err)
			}
		} else if err != nil || got != c.want {
			t.Errorf("%s: got %d, %v; want %d", c.name, got, err, c.want)
		}
	}
}

// FuzzVHDX: the header, region table and metadata parsers never panic and
// never report a negative or unbounded size. The fuzzer's bytes are used
// both as a whole file (checksums and all) and as the region table and
// metadata region of an image whose checksums the test computes, so that
// the mutations reach the tables behind the checksums.
func FuzzVHDX(f *testing.F) {
	good := metadataTable(64<<10, 8, 5<<30)
	f.Add([]byte("vhdxfile"), regionTable(1<<20, 1<<20), good[:48], uint32(64<<10), uint64(5<<30))
	f.Add([]byte("vhdxfile\x00\x00"), regionTable(1<<20, 64<<10+8), good[:64], uint32(64<<10-4), uint64(1<<40))
	f.Fuzz(func(t *testing.T, file, region, metaHead []byte, itemOff uint32, size uint64) {
		check := func(what string, n int64, err error) {
			if err == nil && (n <= 0 || n > maxVirtualSize) {
				t.Fatalf("%s: size %d", what, n)
			}
			if err != nil && !errors.Is(err, ErrNoVirtualSize) {
				t.Fatalf("%s: error %v does not wrap ErrNoVirtualSize", what, err)
			}
		}
		n, err := VHDXVirtualSize(bytes.NewReader(file))
		check("file", n, err)
		if len(region) > vhdxRegionLen {
			region = region[:vhdxRegionLen]
		}
		if len(metaHead) > 64<<10 {
			metaHead = metaHead[:64<<10]
		}
		meta := make([]byte, 64<<10+64)
		copy(meta, metaHead)
		if int(itemOff)+8 <= len(meta) {
			binary.LittleEndian.PutUint64(meta[itemOff:], size)
		}
		n, err = VHDXVirtualSize(bytes.NewReader(vhdxImage{region: region, meta: meta}.bytes()))
		check("built", n, err)
	})
}
