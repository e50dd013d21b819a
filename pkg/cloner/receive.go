package cloner

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/klauspost/compress/s2"
	"golang.org/x/sys/unix"

	"github.com/kubefill/kubefill/pkg/datapath/archive"
)

// Errors of the receiving side. An upload server answers ErrContentType,
// ErrUnsafe, ErrTooBig and ErrNoImage with a 4xx (retrying cannot help),
// ErrTruncated and the rest with a 5xx.
var (
	// ErrContentType: not a clone content type.
	ErrContentType = errors.New("unsupported clone content type")
	// ErrUnsafe: a hostile tar entry (absolute path, "..", a link that
	// leaves the volume, a device node or FIFO).
	ErrUnsafe = archive.ErrUnsafe
	// ErrTruncated: the stream ended early or is corrupt.
	ErrTruncated = errors.New("the clone stream is truncated or corrupt")
	// ErrNoImage: a filesystem-clone into a Block volume held no disk.img.
	ErrNoImage = errors.New("the filesystem clone holds no disk.img for the block volume")
)

// Destination is where a clone stream goes.
type Destination struct {
	Mode Mode
	// Path is, for a Filesystem destination, the volume's directory: a
	// filesystem-clone is unpacked into it, a blockdevice-clone becomes
	// Path/disk.img. For a Block destination it is the device, or a regular
	// file standing in for one (a file of size 0 is filled like disk.img).
	Path string
	// Capacity is the largest image (logical bytes, holes included) that
	// is accepted: the device content, or disk.img. Zero means the
	// device's size, or the file system's size for a Filesystem volume.
	// The data of a filesystem-clone is bounded by the file system's free
	// space (ENOSPC is reported as ErrTooBig).
	Capacity int64
	// Preallocate (PREALLOCATION) keeps every block allocated: zeros are
	// zeroed in place on a device instead of punched, and files are fully
	// allocated (fallocate) once written.
	Preallocate bool
}

// DestinationFor maps an upload server's DESTINATION (CDI's
// /dev/cdi-block-volume or /data/disk.img) to a Destination: a device is
// Block, anything else the Filesystem volume holding it.
func DestinationFor(dest string) Destination {
	if fi, err := os.Stat(dest); err == nil && fi.Mode()&fs.ModeDevice != 0 {
		return Destination{Mode: Block, Path: dest}
	}
	return Destination{Mode: Filesystem, Path: filepath.Dir(dest)}
}

// ReceiveStream reads a clone stream of contentType from r into dst and
// returns the bytes written, holes included (the files' sizes, or the
// image's). All-zero blocks become holes (see the package documentation);
// everything is fsynced before it returns nil. A stream that ends early,
// fails its CRC, or (filesystem-clone) lacks the tar end marker is an
// error, never a success. A blockdevice-clone stream cut exactly at a
// snappy chunk boundary looks complete: the format has no length, so the
// HTTP layer (chunked encoding, Content-Length) must report a cut body as
// an error, which net/http does.
func ReceiveStream(ctx context.Context, r io.Reader, contentType string, dst Destination) (int64, error) {
	if contentType != ContentTypeFilesystem && contentType != ContentTypeBlock {
		return 0, fmt.Errorf("%w: %q (want %s or %s)", ErrContentType, contentType, ContentTypeFilesystem, ContentTypeBlock)
	}
	zr := s2.NewReader(&ctxReader{ctx: ctx, r: r}, s2.ReaderMaxBlockSize(64<<10))
	pf := &streamErrReader{zr}
	var n int64
	var err error
	switch {
	case contentType == ContentTypeFilesystem && dst.Mode == Block:
		n, err = receiveImageEntry(pf, dst)
	case contentType == ContentTypeFilesystem:
		n, err = receiveTree(pf, dst)
	case dst.Mode == Block:
		n, err = receiveRaw(pf, dst)
	default:
		n, err = receiveRawImage(pf, dst)
	}
	if err != nil && ctx.Err() != nil {
		return n, fmt.Errorf("%w (%w)", context.Cause(ctx), err)
	}
	return n, err
}

// ctxReader stops reading once ctx is done.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c *ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, context.Cause(c.ctx)
	}
	return c.r.Read(p)
}

// streamErrReader marks decompression errors as ErrTruncated.
type streamErrReader struct{ r io.Reader }

func (s *streamErrReader) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if err != nil && err != io.EOF {
		err = fmt.Errorf("%w: %w", ErrTruncated, err)
	}
	return n, err
}

func entryErr(name string, err error) error {
	if errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%w: %s: %w", ErrTruncated, name, err)
	}
	return err
}

func isRegular(h *tar.Header) bool {
	return h.Typeflag == tar.TypeReg || h.Typeflag == tar.TypeGNUSparse
}

// openTarget opens a Block destination: a device (or a non-empty file)
// is written in place, holes punched; an empty regular file is filled like
// disk.img. limit is the capacity.
func openTarget(dst Destination) (*holeWriter, *os.File, error) {
	f, err := os.OpenFile(dst.Path, os.O_RDWR, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("opening the destination: %w", err)
	}
	size, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("sizing the destination %s: %w", dst.Path, err)
	}
	if size == 0 {
		if fi, err := f.Stat(); err == nil && fi.Mode().IsRegular() {
			hw := newHoleWriter(f, dst.Path, true, dst.Capacity)
			hw.prealloc = dst.Preallocate
			return hw, f, nil
		}
	}
	limit := size
	if dst.Capacity > 0 && dst.Capacity < limit {
		limit = dst.Capacity
	}
	hw := newHoleWriter(f, dst.Path, false, limit)
	hw.prealloc = dst.Preallocate
	return hw, f, nil
}

// openImage creates Path/disk.img afresh, inside the volume (a symlink
// left there cannot redirect it).
func openImage(dst Destination) (*holeWriter, *os.File, error) {
	root, err := os.OpenRoot(dst.Path)
	if err != nil {
		return nil, nil, fmt.Errorf("opening the destination volume: %w", err)
	}
	defer root.Close()
	if fi, err := root.Lstat(ImageName); err == nil && !fi.Mode().IsRegular() {
		if err := root.RemoveAll(ImageName); err != nil {
			return nil, nil, fmt.Errorf("removing the old %s: %w", ImageName, err)
		}
	}
	f, err := root.OpenFile(ImageName, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o660)
	if err != nil {
		return nil, nil, fmt.Errorf("creating %s: %w", ImageName, err)
	}
	limit := dst.Capacity
	if limit == 0 {
		var s unix.Statfs_t
		if err := unix.Fstatfs(int(f.Fd()), &s); err == nil {
			limit = int64(s.Blocks) * s.Frsize
		}
	}
	hw := newHoleWriter(f, filepath.Join(dst.Path, ImageName), true, limit)
	hw.prealloc = dst.Preallocate
	return hw, f, nil
}

func closeSynced(f *os.File, hw *holeWriter, err error) error {
	if err == nil {
		err = hw.finish()
	}
	if err == nil {
		if err = f.Sync(); err != nil {
			err = fmt.Errorf("fsync %s: %w", hw.name, err)
		}
	}
	if cerr := hw.closeDirect(); err == nil && cerr != nil {
		err = cerr
	}
	if cerr := f.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("closing %s: %w", hw.name, cerr)
	}
	return err
}

// receiveRaw: blockdevice-clone into a Block volume.
func receiveRaw(r io.Reader, dst Destination) (int64, error) {
	hw, f, err := openTarget(dst)
	if err != nil {
		return 0, err
	}
	_, err = newCopier().copy(hw, r, -1)
	return hw.off, closeSynced(f, hw, err)
}

// receiveRawImage: blockdevice-clone into a Filesystem volume's disk.img.
func receiveRawImage(r io.Reader, dst Destination) (int64, error) {
	hw, f, err := openImage(dst)
	if err != nil {
		return 0, err
	}
	_, err = newCopier().copy(hw, r, -1)
	return hw.off, closeSynced(f, hw, err)
}

// receiveImageEntry: filesystem-clone into a Block volume: the first
// regular entry whose name contains disk.img goes to the device; the rest
// of the archive is read (to check it is whole) and dropped.
func receiveImageEntry(r io.Reader, dst Destination) (int64, error) {
	t := &tailReader{r: r}
	tr := tar.NewReader(t)
	c := newCopier()
	var written int64
	found := false
	for {
		h, err := t.next(tr)
		if err == io.EOF {
			break
		}
		if err != nil {
			return written, err
		}
		if found || !isRegular(h) || !strings.Contains(h.Name, ImageName) {
			if _, err := io.CopyBuffer(io.Discard, tr, c.bufs[0]); err != nil {
				return written, entryErr(h.Name, err)
			}
			continue
		}
		found = true
		hw, f, err := openTarget(dst)
		if err != nil {
			return 0, err
		}
		if hw.limit > 0 && h.Size > hw.limit {
			f.Close()
			return 0, fmt.Errorf("%w: the source's %s is %d bytes, the destination %s holds only %d", ErrTooBig, h.Name, h.Size, dst.Path, hw.limit)
		}
		err = c.copyEntry(t, tr, h, hw)
		written = hw.off
		if err := closeSynced(f, hw, entryErr(h.Name, err)); err != nil {
			return written, err
		}
	}
	if !found {
		return 0, ErrNoImage
	}
	return written, nil
}

// receiveTree: filesystem-clone into a Filesystem volume.
func receiveTree(r io.Reader, dst Destination) (int64, error) {
	root, err := os.OpenRoot(dst.Path)
	if err != nil {
		return 0, fmt.Errorf("opening the destination volume: %w", err)
	}
	defer root.Close()
	capacity := dst.Capacity
	if capacity == 0 {
		var s unix.Statfs_t
		if err := unix.Statfs(dst.Path, &s); err == nil {
			capacity = int64(s.Blocks) * s.Frsize
		}
	}
	x := &extractor{root: root, capacity: capacity, copier: newCopier(), asRoot: os.Geteuid() == 0, prealloc: dst.Preallocate}
	t := &tailReader{r: r}
	tr := tar.NewReader(t)
	for {
		h, err := t.next(tr)
		if err == io.EOF {
			break
		}
		if err != nil {
			return x.written, err
		}
		if err := x.entry(t, tr, h); err != nil {
			return x.written, err
		}
	}
	// Directories get their modes and times last, deepest first.
	for i := len(x.dirs) - 1; i >= 0; i-- {
		d := x.dirs[i]
		if err := root.Chmod(d.name, d.mode); err != nil {
			return x.written, fmt.Errorf("setting the mode of %s: %w", d.name, err)
		}
		if x.asRoot {
			_ = root.Lchown(d.name, d.uid, d.gid)
		}
		_ = root.Chtimes(d.name, d.mtime, d.mtime)
	}
	// Files were fsynced as they were written; now the directories that
	// name them, deepest first, and the volume's root.
	for i := len(x.dirs) - 1; i >= -1; i-- {
		name := "."
		if i >= 0 {
			name = x.dirs[i].name
		}
		if err := syncDir(root, name); err != nil {
			return x.written, err
		}
	}
	return x.written, nil
}

type dirMeta struct {
	name     string
	mode     os.FileMode
	uid, gid int
	mtime    time.Time
}

type extractor struct {
	root     *os.Root
	capacity int64
	copier   *copier
	asRoot   bool
	prealloc bool
	dirs     []dirMeta
	written  int64
}

func (x *extractor) entry(t *tailReader, tr *tar.Reader, h *tar.Header) error {
	name, err := archive.CheckName(h.Name)
	if err != nil {
		return err
	}
	if name == "." {
		return nil
	}
	mode := os.FileMode(h.Mode) & 0o777
	switch h.Typeflag {
	case tar.TypeDir:
		if err := x.clear(name, true); err != nil {
			return err
		}
		if err := x.root.MkdirAll(name, 0o700); err != nil {
			return fmt.Errorf("creating directory %s: %w", name, err)
		}
		x.dirs = append(x.dirs, dirMeta{name, mode, h.Uid, h.Gid, h.ModTime})
		return nil
	case tar.TypeReg, tar.TypeGNUSparse:
		return x.file(t, tr, h, name, mode)
	case tar.TypeSymlink:
		if err := archive.CheckLink(name, h.Linkname); err != nil {
			return err
		}
		if err := x.prepare(name); err != nil {
			return err
		}
		if err := x.root.Symlink(h.Linkname, name); err != nil {
			return fmt.Errorf("creating symlink %s: %w", name, err)
		}
		if x.asRoot {
			_ = x.root.Lchown(name, h.Uid, h.Gid)
		}
		return nil
	case tar.TypeLink:
		target, err := archive.CheckName(h.Linkname)
		if err != nil {
			return fmt.Errorf("hard link %s: %w", name, err)
		}
		if fi, err := x.root.Lstat(target); err != nil || !fi.Mode().IsRegular() {
			return fmt.Errorf("%w: hard link %s must name a regular file already unpacked, not %q", ErrUnsafe, name, h.Linkname)
		}
		if err := x.prepare(name); err != nil {
			return err
		}
		if err := x.root.Link(target, name); err != nil {
			return fmt.Errorf("creating hard link %s: %w", name, err)
		}
		return nil
	case tar.TypeChar, tar.TypeBlock:
		return fmt.Errorf("%w: %s is a device node", ErrUnsafe, name)
	case tar.TypeFifo:
		return fmt.Errorf("%w: %s is a FIFO", ErrUnsafe, name)
	case tar.TypeXGlobalHeader, tar.TypeXHeader:
		return nil
	default:
		return fmt.Errorf("%w: %s has the unsupported tar type %q", ErrUnsafe, name, h.Typeflag)
	}
}

// prepare makes name's parent and removes whatever is at name, so a new
// entry never writes through an old link.
func (x *extractor) prepare(name string) error {
	if d := path.Dir(name); d != "." {
		if err := x.root.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("creating directory %s: %w", d, err)
		}
	}
	return x.clear(name, false)
}

func (x *extractor) clear(name string, keepDir bool) error {
	fi, err := x.root.Lstat(name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("checking %s: %w", name, err)
	}
	if fi.IsDir() {
		if keepDir {
			return nil
		}
		return fmt.Errorf("%s exists in the destination as a directory", name)
	}
	if err := x.root.Remove(name); err != nil {
		return fmt.Errorf("replacing %s: %w", name, err)
	}
	return nil
}

func (x *extractor) file(t *tailReader, tr *tar.Reader, h *tar.Header, name string, mode os.FileMode) error {
	// No file may be bigger than the whole volume: that refuses a disk.img
	// too big for the target, and bounds the time a stream of nothing but
	// holes can take.
	if x.capacity > 0 && h.Size > x.capacity {
		return fmt.Errorf("%w: the source's %s is %d bytes, the destination volume holds only %d", ErrTooBig, name, h.Size, x.capacity)
	}
	if err := x.prepare(name); err != nil {
		return err
	}
	f, err := x.root.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("creating %s: %w", name, err)
	}
	hw := newHoleWriter(f, name, true, 0)
	hw.prealloc = x.prealloc
	err = x.copier.copyEntry(t, tr, h, hw)
	if err == nil {
		err = hw.finish()
	}
	if err == nil {
		err = f.Chmod(mode)
	}
	if err == nil && x.asRoot {
		_ = f.Chown(h.Uid, h.Gid)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := hw.closeDirect(); err == nil && cerr != nil {
		err = cerr
	}
	if cerr := f.Close(); err == nil && cerr != nil {
		err = cerr
	}
	x.written += hw.off
	if err != nil {
		return entryErr(name, err)
	}
	_ = x.root.Chtimes(name, h.ModTime, h.ModTime)
	return nil
}

func syncDir(root *os.Root, name string) error {
	d, err := root.Open(name)
	if err != nil {
		return fmt.Errorf("opening directory %s: %w", name, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("fsync directory %s: %w", name, err)
	}
	return nil
}
