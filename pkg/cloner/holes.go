package cloner

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/kubefill/kubefill/pkg/datapath/sink"
)

// zeroBlock is the granularity at which zeros become holes on the target.
// CDI's upload server uses 32 KiB; 4 KiB (the page and file-system block
// size) keeps the target's allocation as close to the source's, for the
// same cost (the check is a memory compare).
const zeroBlock = sink.BlockSize

// ErrTooBig is returned when the stream does not fit the destination.
var ErrTooBig = errors.New("the clone source is larger than the destination")

// holeWriter writes a stream sequentially into f, turning all-zero blocks
// into holes. On a fresh file (fresh) holes are made by not writing, and
// finish sets the length; otherwise (a device, or a file standing in for
// one) zero ranges are punched, or written as zeros where punching fails,
// so no stale data survives.
type holeWriter struct {
	f     *os.File
	name  string
	fresh bool
	limit int64 // no byte at or past limit may be written; 0 = none
	// prealloc keeps zeros allocated: a device's zero ranges are zeroed
	// in place (FALLOC_FL_ZERO_RANGE) rather than punched, and a fresh
	// file is fully allocated when finished.
	prealloc bool

	off       int64 // logical position
	data      int64 // bytes of data written
	zeroStart int64 // pending zero range [zeroStart, off) on a device
	noPunch   bool
	unsynced  int64 // data written since writeback was last started

	// direct is f opened again with O_DIRECT, for a fresh file: large
	// aligned runs go through it, straight to the disk, past the page
	// cache (see writeDirect). nil until first needed; noDirect once the
	// file system refused it.
	direct   *os.File
	noDirect bool
}

// directBytes counts bytes written with O_DIRECT (for tests).
var directBytes atomic.Int64

// directMin is the smallest run written with O_DIRECT: smaller ones are
// cheaper through the page cache.
const directMin = 64 << 10

// writebackEvery: every so many bytes written, the kernel is asked to start
// writing the dirty pages out, so that the disk works while the stream
// goes on and the final fsync has little left to do.
const writebackEvery = 32 << 20

func newHoleWriter(f *os.File, name string, fresh bool, limit int64) *holeWriter {
	return &holeWriter{f: f, name: name, fresh: fresh, limit: limit, zeroStart: -1}
}

// Write implements io.Writer.
func (w *holeWriter) Write(p []byte) (int, error) {
	if w.limit > 0 && w.off+int64(len(p)) > w.limit {
		return 0, fmt.Errorf("%w: more than %d bytes received, but %s holds only %d", ErrTooBig, w.limit, w.name, w.limit)
	}
	i := 0
	for i < len(p) {
		// Blocks are aligned on absolute offsets.
		j, zero := sink.NextRun(p, w.off, i)
		if zero {
			if w.zeroStart < 0 {
				w.zeroStart = w.off + int64(i)
			}
			i = j
			continue
		}
		at := w.off + int64(i)
		if err := w.flushZeros(at); err != nil {
			return i, err
		}
		direct, err := w.writeDirect(p[i:j], at)
		if !direct && err == nil {
			_, err = w.f.WriteAt(p[i:j], at)
		}
		if err != nil {
			if errors.Is(err, unix.ENOSPC) {
				return i, fmt.Errorf("%w: the destination is full (writing %s at byte %d)", ErrTooBig, w.name, at)
			}
			return i, fmt.Errorf("writing %s at byte %d: %w", w.name, at, err)
		}
		w.data += int64(j - i)
		if w.unsynced += int64(j - i); !direct && w.unsynced >= writebackEvery {
			w.unsynced = 0
			_ = unix.SyncFileRange(int(w.f.Fd()), 0, 0, unix.SYNC_FILE_RANGE_WRITE)
		}
		i = j
	}
	w.off += int64(len(p))
	return len(p), nil
}

// writeDirect writes b at off with O_DIRECT when it can: a fresh file (a
// device keeps its own caching rules), and b large and aligned on 4 KiB in
// memory, offset and length, as O_DIRECT requires. A clone writes every
// byte once and fsyncs it at the end, so the page cache only costs CPU,
// which the upload pod's CPU limit (CDI's default is 750m) makes scarce:
// the copy into it and a page to allocate and charge for every 4 KiB.
// It reports whether it wrote b; false with a nil error means "write it
// the ordinary way".
func (w *holeWriter) writeDirect(b []byte, off int64) (bool, error) {
	if !w.fresh || w.noDirect || len(b) < directMin || off%zeroBlock != 0 || len(b)%zeroBlock != 0 ||
		uintptr(unsafe.Pointer(unsafe.SliceData(b)))%zeroBlock != 0 {
		return false, nil
	}
	if w.direct == nil {
		// The same open file, again: /proc/self/fd reopens its inode, so
		// no path (and no symlink in the volume) is involved.
		d, err := os.OpenFile(fmt.Sprintf("/proc/self/fd/%d", w.f.Fd()), os.O_WRONLY|unix.O_DIRECT, 0)
		if err != nil {
			w.noDirect = true // tmpfs, say: the page cache it is
			return false, nil
		}
		w.direct = d
	}
	n, err := w.direct.WriteAt(b, off)
	directBytes.Add(int64(n))
	if err != nil {
		if errors.Is(err, unix.EINVAL) {
			// An alignment this file system wants and 4 KiB is not.
			w.noDirect = true
			return false, nil
		}
		return true, err
	}
	return true, nil
}

// closeDirect closes the O_DIRECT descriptor, beside the close of f, on
// success and failure alike; the data it wrote is on the disk, and the
// fsync of f makes the file's allocation durable too.
func (w *holeWriter) closeDirect() error {
	if w.direct == nil {
		return nil
	}
	err := w.direct.Close()
	w.direct = nil
	if err != nil {
		return fmt.Errorf("closing %s: %w", w.name, err)
	}
	return nil
}

// hole leaves n bytes of zeros: nothing to do on a fresh file, a pending
// punch on a device.
func (w *holeWriter) hole(n int64) error {
	if w.limit > 0 && w.off+n > w.limit {
		return fmt.Errorf("%w: more than %d bytes received, but %s holds only %d", ErrTooBig, w.limit, w.name, w.limit)
	}
	if w.zeroStart < 0 {
		w.zeroStart = w.off
	}
	w.off += n
	return nil
}

// flushZeros makes the pending zero range, which ends at end, read as zeros.
func (w *holeWriter) flushZeros(end int64) error {
	start := w.zeroStart
	w.zeroStart = -1
	if start < 0 || w.fresh || end <= start {
		return nil
	}
	if !w.noPunch {
		mode := uint32(unix.FALLOC_FL_PUNCH_HOLE | unix.FALLOC_FL_KEEP_SIZE)
		if w.prealloc {
			mode = unix.FALLOC_FL_ZERO_RANGE | unix.FALLOC_FL_KEEP_SIZE
		}
		err := unix.Fallocate(int(w.f.Fd()), mode, start, end-start)
		if err == nil {
			return nil
		}
		if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOSYS) {
			w.noPunch = true // not this device: write zeros from now on
		}
		// Other errors (an unaligned tail, say): write zeros for this range.
	}
	if at, err := sink.WriteZeros(w.f, start, end-start); err != nil {
		return fmt.Errorf("zeroing %s at byte %d: %w", w.name, at, err)
	}
	return nil
}

// finish completes the pending holes and, on a fresh file, sets its length.
func (w *holeWriter) finish() error {
	if err := w.flushZeros(w.off); err != nil {
		return err
	}
	if w.fresh {
		if err := w.f.Truncate(w.off); err != nil {
			return fmt.Errorf("setting the size of %s: %w", w.name, err)
		}
		if w.prealloc && w.off > 0 {
			if err := unix.Fallocate(int(w.f.Fd()), 0, 0, w.off); err != nil {
				return fmt.Errorf("preallocating %s: %w", w.name, err)
			}
		}
	}
	return nil
}

// copier copies an entry or a raw stream into a holeWriter. Reading
// (decompressing, parsing the tar) stays on the caller's goroutine while
// a second goroutine checks for zeros and writes, each 1 MiB buffer handed
// over without a copy.
type copier struct {
	bufs [][]byte
}

func newCopier() *copier {
	c := &copier{}
	for range 3 {
		c.bufs = append(c.bufs, make([]byte, 1<<20))
	}
	return c
}

// work is data to write, or a hole to leave, in order.
type work struct {
	b    []byte
	hole int64
}

// pipeline runs a holeWriter on its own goroutine.
type pipeline struct {
	free   chan []byte
	work   chan work
	failed atomic.Bool
	werr   chan error
}

func (c *copier) start(w *holeWriter) *pipeline {
	p := &pipeline{free: make(chan []byte, len(c.bufs)), work: make(chan work, len(c.bufs)+1), werr: make(chan error, 1)}
	for _, b := range c.bufs {
		p.free <- b
	}
	go func() {
		var werr error
		for it := range p.work {
			if werr == nil {
				if it.b != nil {
					_, werr = w.Write(it.b)
				} else {
					werr = w.hole(it.hole)
				}
				if werr != nil {
					p.failed.Store(true)
				}
			}
			if it.b != nil {
				p.free <- it.b[:cap(it.b)]
			}
		}
		p.werr <- werr
	}()
	return p
}

// finish waits for the writes; the writer's error wins over rerr.
func (p *pipeline) finish(rerr error) error {
	close(p.work)
	if werr := <-p.werr; werr != nil {
		return werr
	}
	return rerr
}

// copy copies r to w until r's io.EOF; any other error from r (an
// io.ErrUnexpectedEOF from a body cut short, a CRC error) fails it. size,
// if known (>= 0), lets small entries skip the second goroutine.
func (c *copier) copy(w *holeWriter, r io.Reader, size int64) (int64, error) {
	if size >= 0 && size <= int64(len(c.bufs[0])) {
		return copySync(w, r, c.bufs[0])
	}
	p := c.start(w)
	var total int64
	var rerr error
	for !p.failed.Load() {
		b := <-p.free
		n, err := sink.Fill(r, b)
		if n > 0 {
			p.work <- work{b: b[:n]}
			total += int64(n)
		} else {
			p.free <- b
		}
		if err != nil {
			if err != io.EOF {
				rerr = err
			}
			break
		}
	}
	return total, p.finish(rerr)
}

// copyFragments writes the data fragments read from r at their offsets,
// leaving holes between them and up to size.
func (c *copier) copyFragments(w *holeWriter, r io.Reader, frags []extent, size int64) error {
	p := c.start(w)
	pos := int64(0)
	var rerr error
	for _, f := range frags {
		if f.off > pos {
			p.work <- work{hole: f.off - pos}
		}
		for left := f.len; left > 0 && rerr == nil && !p.failed.Load(); {
			b := <-p.free
			n, err := io.ReadFull(r, b[:min(int64(len(b)), left)])
			if n > 0 {
				p.work <- work{b: b[:n]}
				left -= int64(n)
			} else {
				p.free <- b
			}
			if err != nil {
				rerr = err
				if !errors.Is(err, ErrTruncated) {
					rerr = fmt.Errorf("%w: %w", ErrTruncated, err)
				}
			}
		}
		if rerr != nil || p.failed.Load() {
			return p.finish(rerr)
		}
		pos = f.off + f.len
	}
	if size > pos {
		p.work <- work{hole: size - pos}
	}
	return p.finish(nil)
}

func copySync(w *holeWriter, r io.Reader, buf []byte) (int64, error) {
	var total int64
	for {
		n, err := sink.Fill(r, buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return total, werr
			}
			total += int64(n)
		}
		if err == io.EOF {
			return total, nil
		}
		if err != nil {
			return total, err
		}
	}
}
