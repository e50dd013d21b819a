package format

import (
	"encoding/binary"
	"fmt"
	"io"
)

// TailSize is how many trailing bytes MinDecompressedSize can use.
const TailSize = 64 * 1024

// MinDecompressedSize returns a lower bound on the decompressed size of a
// compressed stream, from its first bytes (head) and last bytes (tail, may
// be nil when the source cannot read ranges), and false when the stream
// does not say. It is pure. A lower bound is enough to refuse an image
// that cannot fit before anything is written:
//   - gzip: ISIZE of the last member (its size mod 2^32, so at most the
//     real size of that member);
//   - zstd: Frame_Content_Size of the first frame, when present;
//   - xz: the uncompressed sizes in the index of the last stream.
func MinDecompressedSize(f Format, head, tail []byte) (int64, bool) {
	switch f {
	case Gzip:
		if len(tail) < 4 {
			return 0, false
		}
		return int64(binary.LittleEndian.Uint32(tail[len(tail)-4:])), true
	case Zstd:
		return zstdContentSize(head)
	case Xz:
		return xzIndexSize(tail)
	}
	return 0, false
}

func zstdContentSize(b []byte) (int64, bool) {
	if len(b) < 5 || binary.LittleEndian.Uint32(b) != 0xfd2fb528 {
		return 0, false
	}
	fhd := b[4]
	fcsFlag := fhd >> 6
	single := fhd&0x20 != 0
	dictFlag := fhd & 0x03
	off := 5
	if !single {
		off++ // window descriptor
	}
	off += [4]int{0, 1, 2, 4}[dictFlag]
	var n int
	switch fcsFlag {
	case 0:
		if !single {
			return 0, false // size not stored
		}
		n = 1
	case 1:
		n = 2
	case 2:
		n = 4
	case 3:
		n = 8
	}
	if len(b) < off+n {
		return 0, false
	}
	var v uint64
	switch n {
	case 1:
		v = uint64(b[off])
	case 2:
		v = uint64(binary.LittleEndian.Uint16(b[off:])) + 256
	case 4:
		v = uint64(binary.LittleEndian.Uint32(b[off:]))
	case 8:
		v = binary.LittleEndian.Uint64(b[off:])
	}
	if v > 1<<62 {
		return 0, false
	}
	return int64(v), true
}

// xzIndexSize sums the uncompressed sizes recorded in the index of the
// last xz stream in tail.
func xzIndexSize(t []byte) (int64, bool) {
	// Streams may be followed by zero padding in multiples of 4 bytes.
	for len(t) >= 12 && t[len(t)-1] == 0 && t[len(t)-2] == 0 && t[len(t)-3] == 0 && t[len(t)-4] == 0 {
		t = t[:len(t)-4]
	}
	if len(t) < 12 || t[len(t)-2] != 'Y' || t[len(t)-1] != 'Z' {
		return 0, false
	}
	footer := t[len(t)-12:]
	backward := (int64(binary.LittleEndian.Uint32(footer[4:8])) + 1) * 4
	if backward > int64(len(t)-12) {
		return 0, false
	}
	idx := t[int64(len(t)-12)-backward : len(t)-12]
	if len(idx) == 0 || idx[0] != 0 {
		return 0, false
	}
	p := 1
	varint := func() (uint64, bool) {
		var v uint64
		for i := 0; i < 9; i++ {
			if p >= len(idx) {
				return 0, false
			}
			c := idx[p]
			p++
			v |= uint64(c&0x7f) << (7 * i)
			if c&0x80 == 0 {
				return v, true
			}
		}
		return 0, false
	}
	records, ok := varint()
	if !ok || records > uint64(len(idx)) {
		return 0, false
	}
	var total uint64
	for range records {
		if _, ok := varint(); !ok { // unpadded size
			return 0, false
		}
		u, ok := varint()
		if !ok {
			return 0, false
		}
		total += u
		if total > 1<<62 {
			return 0, false
		}
	}
	return int64(total), true
}

// VirtualSize returns the virtual size a vmdk or vhdx image states, read
// through r (which may hold only the file's first bytes), or an error
// wrapping ErrNoVirtualSize when the image does not say or f is another
// format. It reads only the few structures it needs, each bounded.
func VirtualSize(f Format, r io.ReaderAt) (int64, error) {
	switch f {
	case VMDK:
		return VMDKVirtualSize(r)
	case VHDX:
		return VHDXVirtualSize(r)
	}
	return 0, fmt.Errorf("%w: %s images are not read here", ErrNoVirtualSize, f)
}
