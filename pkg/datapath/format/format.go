// Package format identifies disk-image formats and compression wrappers by
// their magic bytes. Detection is a pure function over the first bytes of a
// stream: it performs no I/O and never consults file names.
package format

import (
	"bytes"
	"encoding/binary"
)

// Format names what a byte stream starts with.
type Format string

// Formats recognised by Detect. Raw is the answer when nothing else matches.
const (
	Raw   Format = "raw"
	Qcow2 Format = "qcow2"
	// Qcow is the obsolete version-1 qcow format (same magic as qcow2).
	Qcow  Format = "qcow"
	VMDK  Format = "vmdk"
	VDI   Format = "vdi"
	VHD   Format = "vpc" // qemu-img calls VHD "vpc"
	VHDX  Format = "vhdx"
	ISO   Format = "iso"
	Gzip  Format = "gzip"
	Xz    Format = "xz"
	Zstd  Format = "zstd"
	Bzip2 Format = "bzip2"
	Tar   Format = "tar"
)

// HeaderSize is how many leading bytes Detect needs to recognise every
// format it knows (ISO 9660's volume descriptor sits at 32769).
const HeaderSize = 64 * 1024

// IsCompression reports whether f is a compression wrapper around another
// stream rather than a disk image.
func (f Format) IsCompression() bool {
	switch f {
	case Gzip, Xz, Zstd, Bzip2:
		return true
	}
	return false
}

// QemuFormat returns the name qemu-img uses for f with -f, and false when
// qemu-img should not be asked to read it.
func (f Format) QemuFormat() (string, bool) {
	switch f {
	case Raw, ISO:
		return "raw", true
	case Qcow2, Qcow, VMDK, VDI, VHD, VHDX:
		return string(f), true
	}
	return "", false
}

var (
	magicQcow   = []byte("QFI\xfb")
	magicVMDK   = []byte("KDMV")
	magicCOWD   = []byte("COWD")
	magicVMDKd  = []byte("# Disk DescriptorFile")
	magicVHD    = []byte("conectix")
	magicVHDX   = []byte("vhdxfile")
	magicGzip   = []byte{0x1f, 0x8b, 0x08}
	magicXz     = []byte{0xfd, '7', 'z', 'X', 'Z', 0x00}
	magicZstd   = []byte{0x28, 0xb5, 0x2f, 0xfd}
	magicBzip2  = []byte("BZh")
	magicISO    = []byte("CD001")
	magicUstar  = []byte("ustar")
	vdiSig      = uint32(0xbeda107f)
	isoOffset   = 0x8001
	tarOffset   = 257
	vdiSigOffet = 0x40
)

// Detect returns the format of a stream whose first bytes are b. Give it at
// least HeaderSize bytes when the stream has that many; a shorter slice is
// fine for a short stream and simply cannot match formats whose magic lies
// further in. The answer is Raw when nothing matches.
func Detect(b []byte) Format {
	switch {
	case bytes.HasPrefix(b, magicQcow):
		if len(b) >= 8 && binary.BigEndian.Uint32(b[4:8]) == 1 {
			return Qcow
		}
		return Qcow2
	case bytes.HasPrefix(b, magicVMDK), bytes.HasPrefix(b, magicCOWD), bytes.HasPrefix(b, magicVMDKd):
		return VMDK
	case bytes.HasPrefix(b, magicVHDX):
		return VHDX
	case bytes.HasPrefix(b, magicVHD):
		return VHD
	case bytes.HasPrefix(b, magicXz):
		return Xz
	case bytes.HasPrefix(b, magicZstd):
		return Zstd
	case bytes.HasPrefix(b, magicGzip):
		return Gzip
	case len(b) >= 4 && bytes.HasPrefix(b, magicBzip2) && b[3] >= '1' && b[3] <= '9':
		return Bzip2
	case len(b) >= vdiSigOffet+4 && binary.LittleEndian.Uint32(b[vdiSigOffet:]) == vdiSig:
		return VDI
	case len(b) >= isoOffset+len(magicISO) && bytes.Equal(b[isoOffset:isoOffset+len(magicISO)], magicISO):
		return ISO
	case len(b) >= tarOffset+len(magicUstar) && bytes.Equal(b[tarOffset:tarOffset+len(magicUstar)], magicUstar):
		return Tar
	}
	return Raw
}
