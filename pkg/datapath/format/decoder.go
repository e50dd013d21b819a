package format

import (
	"encoding/binary"
	"hash/crc32"
)

// DecoderMemory returns how much history a decoder of the compressed
// stream starting with head must keep in memory: the LZMA2 dictionary of
// the first xz block, or the window of the first zstd frame (its content
// size for a single-segment frame). It is pure, reads only the header
// bytes, and answers false when they do not say (another format, a short
// or damaged header, a filter chain without LZMA2).
func DecoderMemory(f Format, head []byte) (int64, bool) {
	switch f {
	case Xz:
		return xzDictSize(head)
	case Zstd:
		return zstdWindowSize(head)
	}
	return 0, false
}

// xzDictSize reads the first block header after the 12-byte stream header:
// size byte, flags, optional sizes, filter flags, padding, CRC32.
func xzDictSize(b []byte) (int64, bool) {
	const streamHeader = 12
	if len(b) < streamHeader+1 || b[streamHeader] == 0 { // 0: the index, no block
		return 0, false
	}
	size := (int(b[streamHeader]) + 1) * 4
	if len(b) < streamHeader+size {
		return 0, false
	}
	h := b[streamHeader : streamHeader+size]
	if crc32.ChecksumIEEE(h[:size-4]) != binary.LittleEndian.Uint32(h[size-4:]) {
		return 0, false
	}
	flags := h[1]
	if flags&0x3c != 0 {
		return 0, false // reserved bits
	}
	p := 2
	varint := func() (uint64, bool) {
		var v uint64
		for i := 0; i < 9 && p < size-4; i++ {
			c := h[p]
			p++
			v |= uint64(c&0x7f) << (7 * i)
			if c&0x80 == 0 {
				return v, true
			}
		}
		return 0, false
	}
	if flags&0x40 != 0 {
		if _, ok := varint(); !ok {
			return 0, false
		}
	}
	if flags&0x80 != 0 {
		if _, ok := varint(); !ok {
			return 0, false
		}
	}
	for range int(flags&0x03) + 1 {
		id, ok := varint()
		if !ok {
			return 0, false
		}
		n, ok := varint()
		if !ok || n > uint64(size-4-p) {
			return 0, false
		}
		props := h[p : p+int(n)]
		p += int(n)
		if id == 0x21 { // LZMA2: one byte of dictionary size
			if len(props) != 1 || props[0] > 40 {
				return 0, false
			}
			d := props[0]
			if d == 40 {
				return 1<<32 - 1, true
			}
			return int64(2|d&1) << (d/2 + 11), true
		}
	}
	return 0, false
}

// zstdWindowSize reads the first frame header's Window_Descriptor, or for
// a single-segment frame its Frame_Content_Size, which is then the window.
func zstdWindowSize(b []byte) (int64, bool) {
	if len(b) < 6 || binary.LittleEndian.Uint32(b) != 0xfd2fb528 {
		return 0, false
	}
	fhd := b[4]
	if fhd&0x08 != 0 {
		return 0, false // reserved bit
	}
	if fhd&0x20 == 0 {
		wd := b[5]
		exp, mant := int64(wd>>3), int64(wd&7)
		base := int64(1) << (10 + exp)
		return base + base/8*mant, true
	}
	return zstdContentSize(b)
}
