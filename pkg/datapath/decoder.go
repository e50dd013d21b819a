package datapath

import (
	"errors"
	"fmt"
	"io"

	"github.com/klauspost/compress/zstd"

	"github.com/kubefill/kubefill/pkg/datapath/format"
)

// ErrDecoderMemory: decompressing the source needs more memory than the
// worker has. Recompressing the image or raising the limit fixes it.
var ErrDecoderMemory = errors.New("the compressed image needs more memory to decompress than the importer has")

const (
	// decoderReserve is what the worker keeps for itself (buffers, the Go
	// runtime, qemu-img's share is separate) out of its memory limit.
	decoderReserve = 96 << 20
	// defaultDecoderBudget applies when the memory limit is not known.
	defaultDecoderBudget = 1 << 30
	minDecoderBudget     = 8 << 20
)

// DecoderBudget is the history a decompressor may keep under a memory
// limit (0 = not known). It is pure.
func DecoderBudget(limit int64) int64 {
	if limit <= 0 {
		return defaultDecoderBudget
	}
	return max(limit-decoderReserve, minDecoderBudget)
}

// CheckDecoderMemory refuses a compressed stream whose header (head) asks
// for a dictionary or window larger than DecoderBudget(limit), with a
// message that gives both figures and what to do. It is pure.
func CheckDecoderMemory(f format.Format, head []byte, limit int64) error {
	need, ok := format.DecoderMemory(f, head)
	if !ok {
		return nil
	}
	return decoderMemoryError(f, need, limit)
}

func decoderMemoryError(f format.Format, need, limit int64) error {
	budget := DecoderBudget(limit)
	if need <= budget {
		return nil
	}
	what, fix := "dictionary", "recompress with a smaller dictionary (xz -6 or less, without --lzma2=dict= above the limit)"
	if f == format.Zstd {
		what, fix = "window", "recompress with a smaller window (zstd without --long, or --long= below the limit)"
	}
	return fmt.Errorf("%w: the %s stream needs a %s %s; %s; %s or raise the importer's memory limit (podResourceRequirements in CDIConfig)",
		ErrDecoderMemory, f, humanBytes(need), what, limitText(limit), fix)
}

func limitText(limit int64) string {
	if limit <= 0 {
		return fmt.Sprintf("the importer has no known memory limit and allows its decoder %s", humanBytes(DecoderBudget(limit)))
	}
	return fmt.Sprintf("the importer has a %s memory limit", humanBytes(limit))
}

// zstdReader turns the decoder's window errors (a later frame with a
// larger window than the first) into the same advice.
type zstdReader struct {
	z     *zstd.Decoder
	limit int64
}

func (r *zstdReader) Read(p []byte) (int, error) {
	n, err := r.z.Read(p)
	if err != nil && (errors.Is(err, zstd.ErrWindowSizeExceeded) || errors.Is(err, zstd.ErrDecoderSizeExceeded)) {
		return n, fmt.Errorf("%w: a zstd frame needs a window larger than %s; %s; recompress with a smaller window (zstd without --long) or raise the importer's memory limit (podResourceRequirements in CDIConfig)",
			ErrDecoderMemory, humanBytes(DecoderBudget(r.limit)), limitText(r.limit))
	}
	return n, err
}

var _ io.Reader = (*zstdReader)(nil)
