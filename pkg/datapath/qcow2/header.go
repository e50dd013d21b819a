// Package qcow2 reads qcow2 images without qemu and without local files.
//
// ParseHeader is a pure function that refuses every header feature that
// could make a reader touch anything but the image itself (backing files,
// external data files) or that this reader does not implement faithfully
// (encryption, extended L2 entries, unknown incompatible features).
//
// BuildPlan reads the L1 and L2 tables through an io.ReaderAt and turns
// them into a list of data extents. Execute then fetches those extents in
// host-offset order with a few large sequential reads (for example HTTP
// Range requests), decompresses compressed clusters in parallel and writes
// guest data with WriteAt. No scratch space is used and memory stays
// bounded: the plan holds one small record per compressed cluster or per
// contiguous run of uncompressed clusters.
package qcow2

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// ErrUnsafe marks images refused for safety reasons rather than corruption.
var ErrUnsafe = errors.New("unsafe qcow2 image")

// ErrInvalid marks corrupt, truncated or unsupported images: retrying the
// same bytes cannot succeed.
var ErrInvalid = errors.New("invalid qcow2 image")

type invalidError struct{ msg string }

func (e *invalidError) Error() string        { return e.msg }
func (e *invalidError) Is(target error) bool { return target == ErrInvalid }

func invalidf(format string, args ...any) error {
	return &invalidError{msg: fmt.Sprintf(format, args...)}
}

// HeaderLen is the number of leading bytes ParseHeader needs.
const HeaderLen = 112

// Incompatible feature bits (qcow2 spec).
const (
	incompatDirty        = 1 << 0
	incompatCorrupt      = 1 << 1
	incompatExternalData = 1 << 2
	incompatCompression  = 1 << 3
	incompatExtendedL2   = 1 << 4
	incompatKnown        = incompatDirty | incompatCorrupt | incompatExternalData | incompatCompression | incompatExtendedL2
)

// Compression types stored in the header.
const (
	CompressionZlib uint8 = 0
	CompressionZstd uint8 = 1
)

const (
	minClusterBits = 9
	maxClusterBits = 21
	// maxL1Bytes mirrors qemu's own limit on the L1 table size.
	maxL1Bytes = 32 << 20
	// MaxVirtualSize bounds what we accept before any target check (64 TiB).
	MaxVirtualSize = 64 << 40
)

// Header holds the qcow2 header fields the reader needs.
type Header struct {
	Version         uint32
	ClusterBits     uint32
	Size            uint64 // virtual size in bytes
	L1Size          uint32 // number of L1 entries
	L1TableOffset   uint64
	Incompatible    uint64
	HeaderLength    uint32
	CompressionType uint8
}

// ClusterSize returns the cluster size in bytes.
func (h *Header) ClusterSize() int64 { return 1 << h.ClusterBits }

// l2Entries is the number of entries in one L2 table.
func (h *Header) l2Entries() int64 { return h.ClusterSize() / 8 }

// ParseHeader validates the first bytes of a qcow2 file and returns its
// header. It performs no I/O. Every refusal names the offending feature.
func ParseHeader(b []byte) (*Header, error) {
	if len(b) < 72 {
		return nil, invalidf("qcow2 header truncated: %d bytes", len(b))
	}
	if string(b[0:4]) != "QFI\xfb" {
		return nil, invalidf("not a qcow2 image: bad magic")
	}
	be := binary.BigEndian
	h := &Header{
		Version:       be.Uint32(b[4:]),
		ClusterBits:   be.Uint32(b[20:]),
		Size:          be.Uint64(b[24:]),
		L1Size:        be.Uint32(b[36:]),
		L1TableOffset: be.Uint64(b[40:]),
		HeaderLength:  72,
	}
	backingOffset := be.Uint64(b[8:])
	backingSize := be.Uint32(b[16:])
	cryptMethod := be.Uint32(b[32:])
	if h.Version != 2 && h.Version != 3 {
		return nil, invalidf("unsupported qcow2 version %d", h.Version)
	}
	if backingOffset != 0 || backingSize != 0 {
		return nil, fmt.Errorf("%w: it names a backing file; only self-contained images can be imported", ErrUnsafe)
	}
	if cryptMethod != 0 {
		return nil, fmt.Errorf("%w: it is encrypted (method %d); encrypted images are not supported", ErrUnsafe, cryptMethod)
	}
	if h.Version == 3 {
		if len(b) < 104 {
			return nil, invalidf("qcow2 v3 header truncated: %d bytes", len(b))
		}
		h.Incompatible = be.Uint64(b[72:])
		h.HeaderLength = be.Uint32(b[100:])
		if h.HeaderLength < 104 {
			return nil, invalidf("corrupt qcow2 header: header length %d", h.HeaderLength)
		}
		if h.HeaderLength > 104 {
			if len(b) < 105 {
				return nil, invalidf("qcow2 v3 header truncated: %d bytes", len(b))
			}
			h.CompressionType = b[104]
		}
	}
	switch {
	case h.Incompatible&incompatCorrupt != 0:
		return nil, fmt.Errorf("%w: the image is marked corrupt; repair it with 'qemu-img check -r all' first", ErrUnsafe)
	case h.Incompatible&incompatExternalData != 0:
		return nil, fmt.Errorf("%w: it uses an external data file", ErrUnsafe)
	case h.Incompatible&incompatExtendedL2 != 0:
		return nil, fmt.Errorf("%w: extended L2 entries (subclusters) are not supported", ErrUnsafe)
	case h.Incompatible&^uint64(incompatKnown) != 0:
		return nil, fmt.Errorf("%w: unknown incompatible features %#x", ErrUnsafe, h.Incompatible&^uint64(incompatKnown))
	}
	if h.Incompatible&incompatCompression == 0 && h.CompressionType != CompressionZlib {
		return nil, invalidf("corrupt qcow2 header: compression type %d without the compression-type feature bit", h.CompressionType)
	}
	if h.CompressionType != CompressionZlib && h.CompressionType != CompressionZstd {
		return nil, invalidf("unsupported qcow2 compression type %d", h.CompressionType)
	}
	if h.ClusterBits < minClusterBits || h.ClusterBits > maxClusterBits {
		return nil, invalidf("corrupt qcow2 header: cluster bits %d outside [%d,%d]", h.ClusterBits, minClusterBits, maxClusterBits)
	}
	if h.Size > MaxVirtualSize {
		return nil, invalidf("qcow2 virtual size %d exceeds the supported maximum %d", h.Size, uint64(MaxVirtualSize))
	}
	perL1 := uint64(h.ClusterSize()) * uint64(h.l2Entries())
	need := (h.Size + perL1 - 1) / perL1
	if uint64(h.L1Size) < need {
		return nil, invalidf("corrupt qcow2 header: L1 table has %d entries, %d needed for the virtual size", h.L1Size, need)
	}
	if uint64(h.L1Size)*8 > maxL1Bytes {
		return nil, invalidf("corrupt qcow2 header: L1 table of %d entries is too large", h.L1Size)
	}
	if h.L1TableOffset >= 1<<56 {
		return nil, invalidf("corrupt qcow2 header: L1 table offset %#x out of range", h.L1TableOffset)
	}
	if h.L1Size > 0 && h.L1TableOffset%uint64(h.ClusterSize()) != 0 {
		return nil, invalidf("corrupt qcow2 header: L1 table offset %#x not cluster aligned", h.L1TableOffset)
	}
	return h, nil
}
