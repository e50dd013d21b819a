// Package datapath is Kubefill's reusable import pipeline: it takes a
// source stream (HTTP, S3, registry, upload body, local file), detects the
// format by magic bytes, unwraps gzip/xz/zstd/bzip2 layers, converts the
// image to raw and writes it sparsely, bounded and durably to a file or
// block device, or extracts a tar archive into a directory.
//
// qcow2 over a source that supports byte ranges is converted in-process
// with a streaming plan (package qcow2): no scratch space and no full
// download. Other formats (vmdk, vdi, vhd, vhdx, qcow v1, or qcow2 behind a
// compression wrapper or a non-seekable stream) are first spooled to a
// bounded scratch file and converted by qemu-img (package convert) or, for
// qcow2, by the same plan over the local file.
package datapath

import (
	"bufio"
	"bytes"
	"compress/bzip2"
	"context"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
	"github.com/ulikunitz/xz"
	"golang.org/x/sys/unix"

	"github.com/kubefill/kubefill/pkg/datapath/archive"
	"github.com/kubefill/kubefill/pkg/datapath/convert"
	"github.com/kubefill/kubefill/pkg/datapath/format"
	"github.com/kubefill/kubefill/pkg/datapath/qcow2"
	"github.com/kubefill/kubefill/pkg/datapath/sink"
	"github.com/kubefill/kubefill/pkg/datapath/source"
)

// ContentType is CDI's contentType: a disk image or a tar archive.
type ContentType string

// Content types.
const (
	ContentKubevirt ContentType = "kubevirt"
	ContentArchive  ContentType = "archive"
)

// Errors callers may test with errors.Is.
var (
	// ErrScratchRequired: the image needs scratch space and none was given.
	ErrScratchRequired = errors.New("scratch space required and none found")
	// ErrTooBig: the image does not fit the target.
	ErrTooBig = sink.ErrTooBig
	// ErrUnsupported: the source's format or content cannot be imported.
	ErrUnsupported = errors.New("unsupported source")
)

// maxWrappers bounds nested compression (e.g. .gz inside .xz).
const maxWrappers = 3

// Options describe one import.
type Options struct {
	ContentType ContentType
	// Path is the image file (Filesystem), the device (Block) or, for
	// archives, the directory to extract into.
	Path  string
	Block bool
	// Size is the usable size in bytes (requested size minus filesystem
	// overhead). A file is resized to it; a larger image fails before
	// anything is written. Zero means no limit and no resize.
	Size        int64
	Preallocate bool
	Checksum    *Checksum
	// ScratchDir holds temporary copies for formats that need them; empty
	// means none is available and such imports fail with ErrScratchRequired.
	ScratchDir string
	// Progress receives source bytes consumed and the total (-1 unknown).
	// It is never called concurrently, and done never decreases.
	Progress func(done, total int64)
	// MemoryLimit is the worker's memory limit in bytes (0 = not known);
	// it bounds the history a decompressor may keep.
	MemoryLimit int64
	Log         logr.Logger
}

// Result describes a finished import.
type Result struct {
	Format               format.Format
	Wrappers             []format.Format
	Method               string
	VirtualSize          int64
	Written              int64
	PreallocationApplied bool
	// SyncTime is how long the final fsync took.
	SyncTime time.Duration
	// Labels are what the source's image asks its claim to carry (a
	// containerdisk's instancetype defaults); nil for other sources.
	Labels map[string]string
}

type counter struct {
	r     io.Reader
	n     atomic.Int64
	total int64
	cb    func(done, total int64)
}

func (c *counter) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if n > 0 {
		d := c.n.Add(int64(n))
		if c.cb != nil {
			c.cb(d, c.total)
		}
	}
	return n, err
}

// Import runs the whole pipeline from src into the destination.
func Import(ctx context.Context, src source.Source, opt Options) (res *Result, err error) {
	if opt.ContentType == "" {
		opt.ContentType = ContentKubevirt
	}
	defer func() {
		if err != nil && !opt.Block && opt.ContentType == ContentKubevirt {
			// Leave nothing that looks like a finished image behind.
			_ = os.Truncate(opt.Path, 0)
		}
	}()
	rc, err := src.Open(ctx)
	if err != nil {
		return nil, fmt.Errorf("opening source %s: %w", src, err)
	}
	defer func() { rc.Close() }()
	cnt := &counter{r: rc, total: src.Size(), cb: opt.Progress}
	var stream io.Reader = cnt
	var hasher hash.Hash
	if opt.Checksum != nil {
		hasher = opt.Checksum.New()
		stream = io.TeeReader(cnt, hasher)
	}
	outer := bufio.NewReaderSize(stream, format.HeaderSize)
	hdr, err := peek(outer)
	if err != nil {
		return nil, fmt.Errorf("reading source %s: %w", src, err)
	}
	res = &Result{Format: format.Detect(hdr)}
	opt.Log.V(1).Info("detected format", "format", res.Format, "source", src.String(), "size", src.Size())

	if res.Format == format.Qcow2 && opt.ContentType == ContentKubevirt {
		if rg, ok := src.(source.Ranger); ok && rg.CanRange() && rg.Size() > 0 {
			rc.Close()
			return importQcow2Ranged(ctx, rg, hdr, opt, res)
		}
	}

	outerHdr := append([]byte(nil), hdr...)
	in := io.Reader(outer)
	for res.Format.IsCompression() {
		if len(res.Wrappers) == maxWrappers {
			return nil, fmt.Errorf("%w: more than %d nested compression layers", ErrUnsupported, maxWrappers)
		}
		budget := DecoderBudget(opt.MemoryLimit)
		if err := CheckDecoderMemory(res.Format, hdr, opt.MemoryLimit); err != nil {
			return nil, err
		}
		dr, closeFn, err := decompressor(res.Format, in, budget, opt.MemoryLimit)
		if err != nil {
			return nil, fmt.Errorf("opening %s stream: %w", res.Format, err)
		}
		defer closeFn()
		res.Wrappers = append(res.Wrappers, res.Format)
		br := bufio.NewReaderSize(dr, format.HeaderSize)
		if hdr, err = peek(br); err != nil {
			return nil, fmt.Errorf("decompressing %s: %w", res.Format, err)
		}
		res.Format = format.Detect(hdr)
		in = br
	}

	switch {
	case opt.ContentType == ContentArchive:
		if res.Format != format.Tar {
			return nil, fmt.Errorf("%w: content type archive needs a tar archive, but the source is %s", ErrUnsupported, res.Format)
		}
		n, err := archive.Extract(in, opt.Path, opt.Size)
		if err != nil {
			return nil, err
		}
		res.Method, res.Written = "archive", n
		if err := finishStream(outer, hasher, opt.Checksum); err != nil {
			return nil, err
		}
		if err := syncDir(opt.Path); err != nil {
			return nil, err
		}
		return res, nil

	case res.Format == format.Raw || res.Format == format.ISO || res.Format == format.Tar:
		if len(res.Wrappers) == 0 && opt.Size > 0 && src.Size() > opt.Size {
			return nil, fmt.Errorf("%w: the source has %d bytes but only %d are usable", ErrTooBig, src.Size(), opt.Size)
		}
		if len(res.Wrappers) == 1 && opt.Size > 0 {
			if n, ok := format.MinDecompressedSize(res.Wrappers[0], outerHdr, tailBytes(ctx, src)); ok && n > opt.Size {
				return nil, fmt.Errorf("%w: the %s stream holds at least %d bytes but only %d are usable", ErrTooBig, res.Wrappers[0], n, opt.Size)
			}
		}
		if rg, ok := src.(source.Ranger); ok && len(res.Wrappers) == 0 && opt.Checksum == nil && rg.CanRange() && rg.Size() >= parallelRawMin {
			rc.Close()
			return importRawRanged(ctx, rg, opt, res)
		}
		tgt, err := openTarget(opt, false)
		if err != nil {
			return nil, err
		}
		defer tgt.Close()
		n, err := tgt.Writer().ReadFrom(in)
		if err != nil {
			return nil, fmt.Errorf("copying raw image from %s: %w", src, err)
		}
		if err := finishStream(outer, hasher, opt.Checksum); err != nil {
			return nil, err
		}
		res.Method, res.VirtualSize = "stream", n
		return finish(tgt, opt, res)

	default:
		known, err := checkVirtualSize(ctx, src, hdr, opt, res)
		if err != nil {
			return nil, err
		}
		return importViaScratch(ctx, in, outer, hasher, opt, res, known)
	}
}

// checkVirtualSize refuses a vmdk or vhdx image whose stated virtual size
// does not fit, before anything is spooled or written: from the image's
// own first bytes (hdr), or through ranges of the source when it is not
// compressed and can serve them. It reports whether the size was known.
func checkVirtualSize(ctx context.Context, src source.Source, hdr []byte, opt Options, res *Result) (bool, error) {
	if opt.Size <= 0 || (res.Format != format.VMDK && res.Format != format.VHDX) {
		return false, nil
	}
	var r io.ReaderAt = bytes.NewReader(hdr)
	if rg, ok := src.(source.Ranger); ok && len(res.Wrappers) == 0 && rg.CanRange() && rg.Size() > 0 {
		r = source.ReaderAt(ctx, rg)
	}
	return refuseVirtualSize(r, opt, res)
}

func refuseVirtualSize(r io.ReaderAt, opt Options, res *Result) (bool, error) {
	n, err := format.VirtualSize(res.Format, r)
	if err != nil {
		opt.Log.V(1).Info("virtual size not known yet", "format", res.Format, "reason", err.Error())
		return false, nil
	}
	if n > opt.Size {
		return true, tooSmall(res.Format, n, opt.Size)
	}
	return true, nil
}

// tooSmall says that an image does not fit and what to ask for.
func tooSmall(f format.Format, virtual, usable int64) error {
	return fmt.Errorf("%w: the %s virtual size is %d bytes (%s) but only %d bytes (%s) of the target are usable; request a larger volume",
		ErrTooBig, f, virtual, humanBytes(virtual), usable, humanBytes(usable))
}

func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 5; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// tailBytes returns the last bytes of a Range-capable source (for the
// size fields compressors keep at the end), or nil.
func tailBytes(ctx context.Context, src source.Source) []byte {
	rg, ok := src.(source.Ranger)
	if !ok || !rg.CanRange() || rg.Size() <= 0 {
		return nil
	}
	n := min(int64(format.TailSize), rg.Size())
	b := make([]byte, n)
	if _, err := source.ReaderAt(ctx, rg).ReadAt(b, rg.Size()-n); err != nil {
		return nil
	}
	return b
}

func peek(br *bufio.Reader) ([]byte, error) {
	hdr, err := br.Peek(format.HeaderSize)
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, bufio.ErrBufferFull) {
		return nil, err
	}
	return hdr, nil
}

// finishStream reads what is left of the source (so the checksum covers
// every byte) and verifies the checksum.
func finishStream(outer io.Reader, h hash.Hash, c *Checksum) error {
	if c == nil {
		return nil
	}
	if _, err := io.Copy(io.Discard, outer); err != nil {
		return fmt.Errorf("reading the rest of the source: %w", err)
	}
	return c.Verify(h)
}

func decompressor(f format.Format, r io.Reader, budget, limit int64) (io.Reader, func(), error) {
	switch f {
	case format.Gzip:
		z, err := gzip.NewReader(r)
		if err != nil {
			return nil, nil, err
		}
		return z, func() { z.Close() }, nil
	case format.Xz:
		z, err := xz.NewReader(r)
		if err != nil {
			return nil, nil, err
		}
		return z, func() {}, nil
	case format.Zstd:
		// The window cap follows the worker's memory; a later frame with a
		// larger window fails with the same advice as the first one.
		z, err := zstd.NewReader(r, zstd.WithDecoderMaxMemory(uint64(budget)), zstd.WithDecoderMaxWindow(uint64(budget)), zstd.WithDecoderConcurrency(2))
		if err != nil {
			return nil, nil, err
		}
		return &zstdReader{z: z, limit: limit}, z.Close, nil
	case format.Bzip2:
		return bzip2.NewReader(r), func() {}, nil
	}
	return nil, nil, fmt.Errorf("%s is not a compression format", f)
}

func openTarget(opt Options, keep bool) (*sink.Target, error) {
	return sink.Open(opt.Path, sink.Options{Block: opt.Block, Limit: opt.Size, Keep: keep, Preallocate: opt.Preallocate})
}

// finish resizes, preallocates and fsyncs.
func finish(tgt *sink.Target, opt Options, res *Result) (*Result, error) {
	res.Written = tgt.Written()
	if !opt.Block {
		size := opt.Size
		if size == 0 {
			size = res.VirtualSize
		}
		if res.VirtualSize > size {
			return nil, fmt.Errorf("%w: virtual size %d, usable %d", ErrTooBig, res.VirtualSize, size)
		}
		if err := tgt.Resize(size); err != nil {
			return nil, err
		}
		if opt.Preallocate {
			if err := tgt.Preallocate(size); err != nil {
				return nil, err
			}
			res.PreallocationApplied = true
		}
	} else if opt.Preallocate {
		// The device was zeroed without deallocation when it was opened.
		res.PreallocationApplied = true
	}
	start := time.Now()
	if err := tgt.Sync(); err != nil {
		return nil, err
	}
	res.SyncTime = time.Since(start)
	return res, nil
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// parallelRawMin is the size from which a raw image on a Range-capable
// source is fetched as several parallel ranges.
var parallelRawMin int64 = 256 << 20

// importRawRanged copies a raw image with a few parallel Range streams,
// which keeps both the network and the disk busy. Without a checksum
// there is no need to read the bytes in order.
func importRawRanged(ctx context.Context, rg source.Ranger, opt Options, res *Result) (*Result, error) {
	tgt, err := openTarget(opt, false)
	if err != nil {
		return nil, err
	}
	defer tgt.Close()
	size := rg.Size()
	streams := int64(2 * runtime.GOMAXPROCS(0))
	seg := (size/streams + sink.BlockSize - 1) / sink.BlockSize * sink.BlockSize
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	var mu sync.Mutex // Progress is called by one goroutine at a time
	var done int64
	for off := int64(0); off < size; off += seg {
		n := min(seg, size-off)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := copyRange(ctx, rg, tgt, off, n, func(k int64) {
				mu.Lock()
				defer mu.Unlock()
				done += k
				if opt.Progress != nil {
					opt.Progress(done, size)
				}
			}); err != nil {
				cancel(err)
			}
		}()
	}
	wg.Wait()
	if err := context.Cause(ctx); err != nil {
		return nil, fmt.Errorf("copying raw image from %s: %w", rg, err)
	}
	res.Method, res.VirtualSize = "stream-ranges", size
	return finish(tgt, opt, res)
}

func copyRange(ctx context.Context, rg source.Ranger, tgt *sink.Target, off, n int64, progress func(int64)) error {
	rc, err := rg.OpenRange(ctx, off, n)
	if err != nil {
		return err
	}
	defer rc.Close()
	buf := make([]byte, 1<<20)
	for n > 0 {
		k, err := io.ReadFull(rc, buf[:min(int64(len(buf)), n)])
		if k > 0 {
			if _, werr := tgt.WriteAt(buf[:k], off); werr != nil {
				return werr
			}
			off += int64(k)
			n -= int64(k)
			progress(int64(k))
		}
		if err != nil && n > 0 {
			return fmt.Errorf("source ended early at byte %d: %w", off, err)
		}
	}
	return nil
}

// maxPlanExtents bounds the qcow2 plan held in memory (32 bytes each):
// larger images are converted in several batches.
var maxPlanExtents = 128 << 10

func importQcow2Ranged(ctx context.Context, rg source.Ranger, hdr []byte, opt Options, res *Result) (*Result, error) {
	h, err := qcow2.ParseHeader(hdr)
	if err != nil {
		return nil, fmt.Errorf("qcow2 image %s: %w", rg, err)
	}
	if opt.Size > 0 && int64(h.Size) > opt.Size {
		return nil, fmt.Errorf("%w: the qcow2 virtual size is %d bytes but only %d are usable", ErrTooBig, h.Size, opt.Size)
	}
	tgt, err := openTarget(opt, false)
	if err != nil {
		return nil, err
	}
	defer tgt.Close()
	fetch := func(ctx context.Context, off, n int64) (io.ReadCloser, error) { return rg.OpenRange(ctx, off, n) }
	var done int64
	run := func(p *qcow2.Plan, whole io.Writer, total int64) error {
		eo := qcow2.ExecOptions{WholeFile: whole}
		if opt.Progress != nil {
			base := done
			eo.Progress = func(n int64) { opt.Progress(base+n, total) }
		}
		if whole != nil {
			done += p.FileSize
		} else {
			done += p.StoredBytes
		}
		return qcow2.Execute(ctx, p, fetch, tgt, eo)
	}
	// Each batch is executed once the next one exists, so a single-batch
	// image (the usual case) can be read in one sequential pass that also
	// feeds the checksum.
	var pending *qcow2.Plan
	batches, extents := 0, 0
	err = qcow2.WalkPlans(ctx, source.ReaderAt(ctx, rg), h, rg.Size(), maxPlanExtents, func(p *qcow2.Plan) error {
		batches++
		extents += len(p.Extents)
		if pending != nil {
			if err := run(pending, nil, rg.Size()); err != nil {
				return err
			}
		}
		pending = p
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("qcow2 image %s: %w", rg, err)
	}
	var hasher hash.Hash
	if opt.Checksum != nil {
		hasher = opt.Checksum.New()
	}
	switch {
	case batches == 1 && hasher != nil:
		err = run(pending, hasher, pending.FileSize)
	case batches == 1:
		err = run(pending, nil, pending.StoredBytes)
	default:
		err = run(pending, nil, rg.Size())
		if err == nil && hasher != nil {
			// The batches read the file out of order: hash it in one more pass.
			err = hashRange(ctx, rg, hasher)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("qcow2 image %s: %w", rg, err)
	}
	if opt.Checksum != nil {
		if err := opt.Checksum.Verify(hasher); err != nil {
			return nil, err
		}
	}
	res.Method, res.VirtualSize = "qcow2-stream", int64(h.Size)
	opt.Log.V(1).Info("qcow2 plan done", "batches", batches, "extents", extents)
	return finish(tgt, opt, res)
}

func hashRange(ctx context.Context, rg source.Ranger, h hash.Hash) error {
	rc, err := rg.OpenRange(ctx, 0, rg.Size())
	if err != nil {
		return err
	}
	defer rc.Close()
	n, err := io.CopyBuffer(h, rc, make([]byte, 1<<20))
	if err == nil && n != rg.Size() {
		err = fmt.Errorf("image file ended at byte %d of %d", n, rg.Size())
	}
	return err
}

// scratchLimit bounds the spooled image file: an image file is at most a
// little larger than its virtual size.
func scratchLimit(opt Options, dir string) int64 {
	var st unix.Statfs_t
	free := int64(-1)
	if err := unix.Statfs(dir, &st); err == nil {
		free = int64(st.Bavail) * int64(st.Bsize)
	}
	lim := int64(-1)
	if opt.Size > 0 {
		lim = opt.Size + opt.Size/10 + 64<<20
	}
	switch {
	case lim < 0:
		return free
	case free >= 0 && free < lim:
		return free
	}
	return lim
}

type limitedWriter struct {
	w     io.Writer
	left  int64
	limit int64
}

func (l *limitedWriter) Write(p []byte) (int, error) {
	if l.left >= 0 && int64(len(p)) > l.left {
		return 0, fmt.Errorf("%w: the image file exceeds the %d-byte scratch bound", ErrTooBig, l.limit)
	}
	if l.left >= 0 {
		l.left -= int64(len(p))
	}
	return l.w.Write(p)
}

// probeBytes is how much of a vmdk or vhdx image is spooled before its
// virtual size is read from the scratch copy, when it could not be read
// earlier (a compressed or non-seekable source): VHDX keeps its metadata
// a few MiB into the file.
const probeBytes = 8 << 20

func importViaScratch(ctx context.Context, in, outer io.Reader, hasher hash.Hash, opt Options, res *Result, sizeKnown bool) (*Result, error) {
	qfmt, ok := res.Format.QemuFormat()
	if !ok {
		return nil, fmt.Errorf("%w: image format %s", ErrUnsupported, res.Format)
	}
	if opt.ScratchDir == "" {
		return nil, fmt.Errorf("%w: %s images need scratch space to be converted", ErrScratchRequired, res.Format)
	}
	f, err := os.CreateTemp(opt.ScratchDir, "image-*."+qfmt)
	if err != nil {
		return nil, fmt.Errorf("creating scratch file: %w", err)
	}
	scratch := f.Name()
	defer os.Remove(scratch)
	lim := scratchLimit(opt, opt.ScratchDir)
	lw := &limitedWriter{w: f, left: lim, limit: lim}
	buf := make([]byte, 1<<20)
	if !sizeKnown && opt.Size > 0 && (res.Format == format.VMDK || res.Format == format.VHDX) {
		var n int64
		n, err = io.CopyBuffer(lw, io.LimitReader(in, probeBytes), buf)
		if err == nil {
			if _, err = refuseVirtualSize(io.NewSectionReader(f, 0, n), opt, res); err != nil {
				f.Close()
				return nil, err
			}
		}
	}
	if err == nil {
		_, err = io.CopyBuffer(lw, in, buf)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("spooling %s image to scratch: %w", res.Format, err)
	}
	if err := finishStream(outer, hasher, opt.Checksum); err != nil {
		return nil, err
	}
	abs, _ := filepath.Abs(scratch)
	if res.Format == format.Qcow2 {
		// Our own reader: no qemu-img involved, and the same safety checks.
		res2, err := importQcow2Ranged(ctx, scratchCopy{&source.File{Path: abs}}, mustHeader(abs), Options{
			Path: opt.Path, Block: opt.Block, Size: opt.Size, Preallocate: opt.Preallocate, Log: opt.Log,
		}, res)
		if err != nil {
			return nil, err
		}
		res2.Method = "qcow2-scratch"
		return res2, nil
	}
	info, err := convert.QueryInfo(ctx, abs, qfmt)
	if err != nil {
		return nil, unnamePath(err, abs, scratchCopyName)
	}
	if opt.Size > 0 && info.VirtualSize > opt.Size {
		return nil, tooSmall(res.Format, info.VirtualSize, opt.Size)
	}
	if !opt.Block {
		if err := os.Remove(opt.Path); err != nil && !os.IsNotExist(err) {
			return nil, err
		}
	}
	if err := convert.ToRaw(ctx, abs, qfmt, opt.Path, opt.Block); err != nil {
		return nil, unnamePath(unnamePath(err, abs, scratchCopyName), opt.Path, "the target")
	}
	tgt, err := openTarget(opt, true)
	if err != nil {
		return nil, err
	}
	defer tgt.Close()
	res.Method, res.VirtualSize = "qemu-img", info.VirtualSize
	return finish(tgt, opt, res)
}

// scratchCopyName is how messages call the spooled copy of an image: its
// temporary path means nothing to the user who gave the URL.
const scratchCopyName = "the downloaded copy of the image"

// scratchCopy is the spooled image as a source, named for messages.
type scratchCopy struct{ *source.File }

func (scratchCopy) String() string { return "(its downloaded copy)" }

// pathless is an error whose text has a local path replaced by words; it
// still matches what it wraps.
type pathless struct {
	msg string
	err error
}

func (e *pathless) Error() string { return e.msg }
func (e *pathless) Unwrap() error { return e.err }

func unnamePath(err error, path, name string) error {
	if err == nil || path == "" || !strings.Contains(err.Error(), path) {
		return err
	}
	return &pathless{msg: strings.ReplaceAll(err.Error(), path, name), err: err}
}

func mustHeader(p string) []byte {
	b := make([]byte, qcow2.HeaderLen)
	f, err := os.Open(p)
	if err != nil {
		return nil
	}
	defer f.Close()
	n, _ := io.ReadFull(f, b)
	return b[:n]
}

// Blank creates an empty image of opt.Size bytes: a sparse file, or for a
// block device nothing at all unless preallocation asks for zeros.
func Blank(ctx context.Context, opt Options) (*Result, error) {
	if opt.Size <= 0 && !opt.Block {
		return nil, errors.New("a blank image needs a size")
	}
	// A Block volume is left untouched unless preallocation asks for zeros.
	tgt, err := sink.Open(opt.Path, sink.Options{Block: opt.Block, Limit: opt.Size, Keep: opt.Block && !opt.Preallocate, Preallocate: opt.Preallocate})
	if err != nil {
		return nil, err
	}
	defer tgt.Close()
	return finish(tgt, opt, &Result{Format: format.Raw, Method: "blank"})
}
