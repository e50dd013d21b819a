// Package sink writes a raw disk image into a file or block device:
// sparsely (all-zero blocks are skipped), bounded (nothing is written past
// the target's usable size, which also bounds decompression bombs), and
// durably (Sync fsyncs before the caller reports success).
package sink

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// BlockSize is the granularity at which zero data is skipped.
const BlockSize = 4096

// ErrTooBig is returned when data would be written past the target's limit.
var ErrTooBig = errors.New("image is larger than the target volume")

// Target is an open destination. WriteAt may be called concurrently.
type Target struct {
	f     *os.File
	path  string
	block bool
	limit int64
	// writeZeros disables hole skipping (block device that cannot be zeroed
	// cheaply, or preallocation requested on a block device).
	writeZeros bool
	written    atomic.Int64 // bytes of non-zero data written
	end        atomic.Int64 // highest offset+len seen
	// Early writeback: every writebackEvery bytes, a background goroutine
	// asks the kernel to start writing dirty pages, so the final fsync has
	// little left to do and memory pressure stays low.
	kick     chan struct{}
	done     chan struct{}
	unkicked atomic.Int64
}

const writebackEvery = 32 << 20

func (t *Target) startWriteback() {
	t.kick = make(chan struct{}, 1)
	t.done = make(chan struct{})
	go func() {
		defer close(t.done)
		for range t.kick {
			_ = unix.SyncFileRange(int(t.f.Fd()), 0, 0, unix.SYNC_FILE_RANGE_WRITE)
		}
	}()
}

func (t *Target) noteWritten(n int64) {
	t.written.Add(n)
	if t.kick != nil && t.unkicked.Add(n) >= writebackEvery {
		t.unkicked.Store(0)
		select {
		case t.kick <- struct{}{}:
		default:
		}
	}
}

// Options describe the destination.
type Options struct {
	// Block is true for a raw block device, false for an image file.
	Block bool
	// Limit is the usable size: no byte may be written at or past it.
	// Zero means the device size for Block and unlimited for files.
	Limit int64
	// WriteZeros forces zero blocks to be written instead of skipped.
	WriteZeros bool
	// Preallocate, for Block, zeroes the device without deallocating it.
	Preallocate bool
	// Keep opens an existing file without truncating it (for example after
	// qemu-img has written it) and skips zeroing a block device.
	Keep bool
}

// Open opens (and for files creates and empties) the destination.
func Open(path string, opt Options) (*Target, error) {
	t := &Target{path: path, block: opt.Block, limit: opt.Limit, writeZeros: opt.WriteZeros}
	if opt.Block {
		f, err := os.OpenFile(path, os.O_WRONLY, 0)
		if err != nil {
			return nil, fmt.Errorf("opening block device %s: %w", path, err)
		}
		t.f = f
		size, err := f.Seek(0, io.SeekEnd)
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("sizing block device %s: %w", path, err)
		}
		if t.limit == 0 || t.limit > size {
			t.limit = size
		}
		t.startWriteback()
		if !opt.Keep {
			// Skipped blocks must read as zeros: zero the device once,
			// cheaply if the device supports it, explicitly otherwise.
			if err := zeroDevice(f, size, opt.Preallocate); err != nil {
				if err := t.FillZeros(0, size); err != nil {
					f.Close()
					return nil, err
				}
			}
		}
		return t, nil
	}
	flags := os.O_RDWR | os.O_CREATE | os.O_TRUNC
	if opt.Keep {
		flags = os.O_RDWR
	}
	f, err := os.OpenFile(path, flags, 0o660)
	if err != nil {
		return nil, fmt.Errorf("creating image file %s: %w", path, err)
	}
	t.f = f
	t.startWriteback()
	if opt.Keep {
		if st, err := f.Stat(); err == nil {
			t.end.Store(st.Size())
		}
	}
	return t, nil
}

// zeroDevice makes the whole device read as zeros. Without preallocation
// it may deallocate (punch holes / unmap); with it, blocks stay allocated
// (FALLOC_FL_ZERO_RANGE and BLKZEROOUT do not unmap).
func zeroDevice(f *os.File, n int64, preallocate bool) error {
	fd := int(f.Fd())
	if !preallocate {
		if err := unix.Fallocate(fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 0, n); err == nil {
			return nil
		}
	}
	if err := unix.Fallocate(fd, unix.FALLOC_FL_ZERO_RANGE|unix.FALLOC_FL_KEEP_SIZE, 0, n); err == nil {
		return nil
	}
	r := [2]uint64{0, uint64(n)}
	return ioctlRange(fd, unix.BLKZEROOUT, &r)
}

// Path returns the destination path.
func (t *Target) Path() string { return t.path }

// Block reports whether the destination is a block device.
func (t *Target) Block() bool { return t.block }

// Limit returns the usable size (0 = unlimited file).
func (t *Target) Limit() int64 { return t.limit }

// Written returns the number of data bytes actually written.
func (t *Target) Written() int64 { return t.written.Load() }

// End returns the highest end offset passed to WriteAt.
func (t *Target) End() int64 { return t.end.Load() }

func (t *Target) check(off, n int64) error {
	if t.limit > 0 && off+n > t.limit {
		return fmt.Errorf("%w: data reaches byte %d but only %d bytes are usable", ErrTooBig, off+n, t.limit)
	}
	for {
		cur := t.end.Load()
		if off+n <= cur || t.end.CompareAndSwap(cur, off+n) {
			return nil
		}
	}
}

// WriteAt writes p at off, skipping aligned all-zero blocks.
func (t *Target) WriteAt(p []byte, off int64) (int, error) {
	if err := t.check(off, int64(len(p))); err != nil {
		return 0, err
	}
	if t.writeZeros {
		n, err := t.f.WriteAt(p, off)
		t.noteWritten(int64(n))
		return n, err
	}
	for i := 0; i < len(p); {
		j, zero := NextRun(p, off, i)
		if !zero {
			if _, err := t.f.WriteAt(p[i:j], off+int64(i)); err != nil {
				return i, fmt.Errorf("writing %s at %d: %w", t.path, off+int64(i), err)
			}
			t.noteWritten(int64(j - i))
		}
		i = j
	}
	return len(p), nil
}

// Writer returns a sequential io.Writer that writes at increasing offsets
// starting at 0.
func (t *Target) Writer() *SeqWriter { return &SeqWriter{t: t} }

// SeqWriter adapts Target to io.Writer.
type SeqWriter struct {
	t   *Target
	off int64
}

// Write implements io.Writer.
func (w *SeqWriter) Write(p []byte) (int, error) {
	n, err := w.t.WriteAt(p, w.off)
	w.off += int64(n)
	return n, err
}

// Offset returns the number of bytes written through w (holes included).
func (w *SeqWriter) Offset() int64 { return w.off }

// ReadFrom copies r in large chunks so that zero detection sees whole
// blocks. Reading and writing overlap: a goroutine fills a few 1 MiB
// buffers while the caller's goroutine writes them.
func (w *SeqWriter) ReadFrom(r io.Reader) (int64, error) {
	const nbuf = 4
	type chunk struct {
		b   []byte
		n   int
		err error
	}
	free := make(chan []byte, nbuf)
	for range nbuf {
		free <- make([]byte, 1<<20)
	}
	full := make(chan chunk, nbuf)
	stop := make(chan struct{})
	go func() {
		defer close(full)
		for {
			var buf []byte
			select {
			case buf = <-free:
			case <-stop:
				return
			}
			n, err := Fill(r, buf)
			full <- chunk{buf, n, err}
			if err != nil {
				return
			}
		}
	}()
	var total int64
	var werr error
	for c := range full {
		if c.n > 0 && werr == nil {
			if _, err := w.Write(c.b[:c.n]); err != nil {
				werr = err
				close(stop)
			} else {
				total += int64(c.n)
			}
		}
		if werr == nil && c.err != nil && c.err != io.EOF {
			werr = c.err
		}
		if werr == nil {
			free <- c.b
		}
	}
	return total, werr
}

// Resize sets a file's length to size (growing it sparsely). It refuses to
// cut off written data. For a block device it only checks that size fits.
func (t *Target) Resize(size int64) error {
	if end := t.End(); size < end {
		return fmt.Errorf("%w: image needs %d bytes, resize target is %d", ErrTooBig, end, size)
	}
	if t.block {
		if size > t.limit {
			return fmt.Errorf("%w: %d bytes requested, device has %d", ErrTooBig, size, t.limit)
		}
		return nil
	}
	if err := t.f.Truncate(size); err != nil {
		return fmt.Errorf("resizing %s to %d bytes: %w", t.path, size, err)
	}
	return nil
}

// Preallocate allocates every block of the first size bytes of a file.
// Block devices are preallocated when opened (Options.Preallocate).
func (t *Target) Preallocate(size int64) error {
	if t.block {
		return nil
	}
	if err := unix.Fallocate(int(t.f.Fd()), 0, 0, size); err != nil {
		return fmt.Errorf("preallocating %s: %w", t.path, err)
	}
	return nil
}

// FillZeros writes explicit zeros over [off, off+n) (block preallocation
// of a blank volume).
func (t *Target) FillZeros(off, n int64) error {
	if at, err := WriteZeros(t.f, off, n); err != nil {
		return fmt.Errorf("zero-filling %s at %d: %w", t.path, at, err)
	}
	return nil
}

// Sync flushes data to stable storage.
func (t *Target) Sync() error {
	if err := t.f.Sync(); err != nil {
		return fmt.Errorf("fsync %s: %w", t.path, err)
	}
	return nil
}

// Close closes the destination without syncing. It is safe to call twice.
func (t *Target) Close() error {
	if t.kick != nil {
		close(t.kick)
		<-t.done
		t.kick = nil
	}
	return t.f.Close()
}

// File exposes the underlying file (for qemu-img targets and tests).
func (t *Target) File() *os.File { return t.f }
