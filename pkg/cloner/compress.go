package cloner

import (
	"runtime"
	"sync"

	"github.com/klauspost/compress/s2"

	"github.com/kubefill/kubefill/pkg/datapath/sink"
)

// Compression says which blocks of the stream are snappy-compressed. The
// framing is snappy's either way (every chunk carries its CRC, and raw
// chunks are part of the format), so any snappy reader, CDI's included,
// reads both.
type Compression int

const (
	// CompressAuto compresses the blocks that a 4 KiB probe shows to
	// shrink at least 8× (zeros, mostly-empty blocks: what a Block source
	// and preallocated files are full of) and sends the others raw.
	// Snappy runs at 0.5–0.9 GB/s per core on ordinary data here, slower
	// than an in-cluster network and than the disks, so compressing it
	// makes a clone slower on 2 cores rather than faster; zeros compress
	// about 20× at 3.5 GB/s and are always worth it.
	CompressAuto Compression = iota
	// CompressAll compresses every block, as CDI's cloner does: for links
	// slower than about 2 Gb/s.
	CompressAll
)

const (
	probeLen = 4 << 10
	// A probe must shrink to 1/probeRatio or less for its block to be compressed.
	probeRatio = 8
)

var probeBufs = sync.Pool{New: func() any { b := make([]byte, s2.MaxEncodedLen(probeLen)); return &b }}

// autoEncoder is an s2 custom encoder: -1 lets s2 compress the block with
// its snappy encoder, 0 stores it raw.
func autoEncoder(_, src []byte) int {
	if len(src) <= probeLen {
		return -1
	}
	if sink.IsZero(src) {
		return -1
	}
	mid := (len(src) / 2) &^ (probeLen - 1)
	sample := src[mid:min(len(src), mid+probeLen)]
	bp := probeBufs.Get().(*[]byte)
	out := s2.EncodeSnappy(*bp, sample)
	probeBufs.Put(bp)
	if len(out)*probeRatio <= len(sample) {
		return -1
	}
	return 0
}

// newStreamWriter is the snappy-framed writer of the clone stream.
func newStreamWriter(w interface{ Write([]byte) (int, error) }, c Compression) *s2.Writer {
	opts := []s2.WriterOption{s2.WriterSnappyCompat(), s2.WriterConcurrency(runtime.GOMAXPROCS(0))}
	if c == CompressAuto {
		opts = append(opts, s2.WriterCustomEncoder(autoEncoder))
	}
	return s2.NewWriter(w, opts...)
}
