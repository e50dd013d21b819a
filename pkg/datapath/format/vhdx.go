package format

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
)

// VHDX layout (MS-VHDX): the file type identifier at 0, two 4 KiB headers
// at 64 KiB and 128 KiB, two 64 KiB region tables at 192 KiB and 256 KiB.
// The region table points at the metadata region, whose table lists the
// Virtual Disk Size item. Every structure is little-endian; GUIDs are in
// Microsoft's mixed-endian byte order.
const (
	vhdxHeader1     = 64 << 10
	vhdxHeader2     = 128 << 10
	vhdxHeaderLen   = 4 << 10
	vhdxRegion1     = 192 << 10
	vhdxRegion2     = 256 << 10
	vhdxRegionLen   = 64 << 10
	vhdxMaxRegions  = 2047
	vhdxMetaHdrLen  = 32
	vhdxMetaEntLen  = 32
	vhdxMaxMetaEnts = 2047
	// vhdxMaxMetaTable bounds what is read of the metadata table: its
	// header and at most 2047 entries (64 KiB).
	vhdxMaxMetaTable = vhdxMetaHdrLen + vhdxMaxMetaEnts*vhdxMetaEntLen
)

var (
	crc32c = crc32.MakeTable(crc32.Castagnoli)
	// 8B7CA206-4790-4B9A-B8FE-575F050F886E
	vhdxMetadataRegion = guid(0x8B7CA206, 0x4790, 0x4B9A, [8]byte{0xB8, 0xFE, 0x57, 0x5F, 0x05, 0x0F, 0x88, 0x6E})
	// 2FA54224-CD1B-4876-B211-5DBED83BF4B8
	vhdxVirtualDiskSize = guid(0x2FA54224, 0xCD1B, 0x4876, [8]byte{0xB2, 0x11, 0x5D, 0xBE, 0xD8, 0x3B, 0xF4, 0xB8})
)

// guid lays a GUID out as VHDX stores it: the first three fields
// little-endian, the last eight bytes as written.
func guid(a uint32, b, c uint16, d [8]byte) [16]byte {
	var g [16]byte
	binary.LittleEndian.PutUint32(g[0:], a)
	binary.LittleEndian.PutUint16(g[4:], b)
	binary.LittleEndian.PutUint16(g[6:], c)
	copy(g[8:], d[:])
	return g
}

// checksumOK verifies a VHDX CRC-32C, stored at b[4:8] and computed with
// that field zeroed.
func checksumOK(b []byte) bool {
	want := binary.LittleEndian.Uint32(b[4:8])
	h := crc32.New(crc32c)
	h.Write(b[:4])
	h.Write([]byte{0, 0, 0, 0})
	h.Write(b[8:])
	return h.Sum32() == want
}

// VHDXVirtualSize returns the virtual size of a VHDX image read through r,
// from the Virtual Disk Size metadata item. Headers and region tables must
// carry valid checksums (the first valid region table is used); an image
// whose current header names a log to replay is not trusted, since the log
// may change the metadata. r may end early (a prefix of the file); reads
// beyond it give ErrNoVirtualSize.
func VHDXVirtualSize(r io.ReaderAt) (int64, error) {
	var id [8]byte
	if err := readAt(r, id[:], 0); err != nil || !bytes.Equal(id[:], magicVHDX) {
		return 0, fmt.Errorf("%w: not a vhdx image", ErrNoVirtualSize)
	}
	if err := vhdxCheckHeaders(r); err != nil {
		return 0, err
	}
	off, length, err := vhdxMetadataLocation(r)
	if err != nil {
		return 0, err
	}
	table := make([]byte, min(int64(vhdxMaxMetaTable), length))
	if err := readAt(r, table, off); err != nil {
		return 0, fmt.Errorf("%w: vhdx metadata table at byte %d: %v", ErrNoVirtualSize, off, err)
	}
	if len(table) < vhdxMetaHdrLen || !bytes.Equal(table[:8], []byte("metadata")) {
		return 0, fmt.Errorf("%w: vhdx metadata table signature", ErrNoVirtualSize)
	}
	count := int(binary.LittleEndian.Uint16(table[10:]))
	if count > vhdxMaxMetaEnts || vhdxMetaHdrLen+count*vhdxMetaEntLen > len(table) {
		return 0, fmt.Errorf("%w: vhdx metadata table has %d entries", ErrNoVirtualSize, count)
	}
	for i := range count {
		e := table[vhdxMetaHdrLen+i*vhdxMetaEntLen:][:vhdxMetaEntLen]
		if !bytes.Equal(e[:16], vhdxVirtualDiskSize[:]) {
			continue
		}
		itemOff := int64(binary.LittleEndian.Uint32(e[16:]))
		itemLen := int64(binary.LittleEndian.Uint32(e[20:]))
		// The item lies inside the metadata region, past the table's 64 KiB.
		if itemLen != 8 || itemOff < 64<<10 || itemOff+itemLen > length {
			return 0, fmt.Errorf("%w: vhdx virtual disk size item at %d, %d bytes", ErrNoVirtualSize, itemOff, itemLen)
		}
		var v [8]byte
		if err := readAt(r, v[:], off+itemOff); err != nil {
			return 0, fmt.Errorf("%w: vhdx virtual disk size item: %v", ErrNoVirtualSize, err)
		}
		size := binary.LittleEndian.Uint64(v[:])
		if size == 0 || size > maxVirtualSize {
			return 0, fmt.Errorf("%w: vhdx virtual disk size %d", ErrNoVirtualSize, size)
		}
		return int64(size), nil
	}
	return 0, fmt.Errorf("%w: vhdx metadata has no virtual disk size item", ErrNoVirtualSize)
}

// vhdxCheckHeaders finds the current header (the valid one with the higher
// sequence number) and refuses one that names a log.
func vhdxCheckHeaders(r io.ReaderAt) error {
	var best []byte
	var bestSeq uint64
	for _, off := range []int64{vhdxHeader1, vhdxHeader2} {
		h := make([]byte, vhdxHeaderLen)
		if err := readAt(r, h, off); err != nil {
			continue
		}
		if !bytes.Equal(h[:4], []byte("head")) || !checksumOK(h) {
			continue
		}
		if seq := binary.LittleEndian.Uint64(h[8:]); best == nil || seq > bestSeq {
			best, bestSeq = h, seq
		}
	}
	if best == nil {
		return fmt.Errorf("%w: no valid vhdx header", ErrNoVirtualSize)
	}
	if !bytes.Equal(best[48:64], make([]byte, 16)) {
		return fmt.Errorf("%w: the vhdx log must be replayed first", ErrNoVirtualSize)
	}
	return nil
}

// vhdxMetadataLocation returns the metadata region's offset and length from
// the first region table with a valid checksum.
func vhdxMetadataLocation(r io.ReaderAt) (int64, int64, error) {
	for _, off := range []int64{vhdxRegion1, vhdxRegion2} {
		t := make([]byte, vhdxRegionLen)
		if err := readAt(r, t, off); err != nil {
			continue
		}
		if !bytes.Equal(t[:4], []byte("regi")) || !checksumOK(t) {
			continue
		}
		count := int(binary.LittleEndian.Uint32(t[8:]))
		if count > vhdxMaxRegions {
			continue
		}
		for i := range count {
			e := t[16+i*32:][:32]
			if !bytes.Equal(e[:16], vhdxMetadataRegion[:]) {
				continue
			}
			fo := binary.LittleEndian.Uint64(e[16:])
			length := int64(binary.LittleEndian.Uint32(e[24:]))
			// Regions are 1 MiB aligned, past the header section, and at
			// least as long as the 64 KiB table.
			if fo < 1<<20 || fo%(1<<20) != 0 || fo > maxVirtualSize || length < 64<<10 {
				return 0, 0, fmt.Errorf("%w: vhdx metadata region at byte %d, %d bytes", ErrNoVirtualSize, fo, length)
			}
			return int64(fo), length, nil
		}
		return 0, 0, fmt.Errorf("%w: vhdx region table has no metadata region", ErrNoVirtualSize)
	}
	return 0, 0, fmt.Errorf("%w: no valid vhdx region table", ErrNoVirtualSize)
}

// readAt fills b from off; a full read that also reports io.EOF is fine.
func readAt(r io.ReaderAt, b []byte, off int64) error {
	n, err := r.ReadAt(b, off)
	if n == len(b) {
		return nil
	}
	if err == nil {
		err = io.ErrUnexpectedEOF
	}
	return err
}
