package cloner

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"syscall"
	"time"
)

// readBuf is the size of each read from the source.
const readBuf = 1 << 20

// Source is the volume a clone reads, read-only.
type Source struct {
	Mode Mode
	// Path is the mount point of a Filesystem source or the device of a
	// Block source.
	Path string
	// Dense sends files whole, holes as zeros, in plain tar entries (CDI's
	// cloner drops tar -S when preallocation is requested); the progress
	// total is then the files' apparent size (du -sb).
	Dense bool
	// Compression chooses which blocks are compressed; CompressAuto if zero.
	Compression Compression
}

// ContentType is the stream's x-cdi-content-type.
func (s Source) ContentType() string { return ContentTypeFor(s.Mode) }

// Stats says what a stream held.
type Stats struct {
	// Total is the progress total: the allocated size of the files (what
	// du -s counts) for a Filesystem source, the device size for Block.
	Total int64
	// Read is the number of bytes read from the source: only data extents
	// for a Filesystem source.
	Read int64
	// Files, SparseFiles, Dirs, Symlinks and Hardlinks count tar entries.
	Files, SparseFiles, Dirs, Symlinks, Hardlinks int
	// Skipped lists special files (device nodes, FIFOs, sockets) that were
	// left out: the receiving side would refuse them.
	Skipped []string
}

// WriteStream writes the clone stream of src to w: snappy-framed, a sparse
// tar for a Filesystem source, raw bytes for a Block source (see the
// package documentation). progress, if not nil, is called as source bytes
// are read with done < total until the stream is complete, and once with
// done == total at the end. On error the stream written so far is
// incomplete; the caller must make sure the receiver sees it fail (abort
// the request rather than end it cleanly).
func WriteStream(ctx context.Context, w io.Writer, src Source, progress func(done, total int64)) (Stats, error) {
	zw := newStreamWriter(w, src.Compression)
	p := &progressCounter{fn: progress}
	var st Stats
	var err error
	switch src.Mode {
	case Block:
		err = writeDevice(ctx, zw, src.Path, p, &st)
	case Filesystem, "":
		err = writeTree(ctx, zw, src, p, &st)
	default:
		err = fmt.Errorf("unknown volume mode %q", src.Mode)
	}
	st.Read = p.done
	if err != nil {
		zw.Reset(nil) // stop the compressor's goroutines
		return st, err
	}
	if err := zw.Close(); err != nil {
		return st, fmt.Errorf("writing the clone stream: %w", err)
	}
	p.finish()
	return st, nil
}

// progressCounter reports bytes read, never reaching the total early.
type progressCounter struct {
	fn          func(done, total int64)
	done, total int64
}

func (p *progressCounter) add(n int64) {
	p.done += n
	if p.fn != nil {
		p.fn(min(p.done, max(p.total-1, 0)), p.total)
	}
}

func (p *progressCounter) finish() {
	if p.fn != nil {
		p.fn(p.total, p.total)
	}
}

// writeDevice streams a device's bytes in large reads.
func writeDevice(ctx context.Context, zw io.Writer, dev string, p *progressCounter, st *Stats) error {
	f, err := os.Open(dev)
	if err != nil {
		return fmt.Errorf("opening the source device: %w", err)
	}
	defer f.Close()
	size, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return fmt.Errorf("sizing the source device %s: %w", dev, err)
	}
	st.Total, p.total = size, size
	p.add(0)
	buf := make([]byte, readBuf)
	for off := int64(0); off < size; {
		if err := ctx.Err(); err != nil {
			return context.Cause(ctx)
		}
		n, err := f.ReadAt(buf[:min(int64(len(buf)), size-off)], off)
		if n > 0 {
			if _, werr := zw.Write(buf[:n]); werr != nil {
				return fmt.Errorf("writing the clone stream: %w", werr)
			}
			off += int64(n)
			p.add(int64(n))
		}
		if err == io.EOF && off < size {
			return fmt.Errorf("reading the source device %s: it ended at byte %d of %d", dev, off, size)
		}
		if err != nil && err != io.EOF {
			return fmt.Errorf("reading the source device %s at byte %d: %w", dev, off, err)
		}
	}
	return nil
}

type fileID struct{ dev, ino uint64 }

// treeWriter writes a directory tree as a tar with sparse entries.
type treeWriter struct {
	ctx   context.Context
	zw    io.Writer
	tw    *tar.Writer
	dense bool
	buf   []byte
	p     *progressCounter
	st    *Stats
	links map[fileID]string
}

func writeTree(ctx context.Context, zw io.Writer, src Source, p *progressCounter, st *Stats) error {
	fi, err := os.Stat(src.Path)
	if err != nil {
		return fmt.Errorf("source volume: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("source volume %s is not a directory", src.Path)
	}
	// First pass: the allocated total, as du -s counts it (du -sb when dense).
	seen := map[fileID]bool{}
	err = walkSource(ctx, src.Path, func(_, _ string, info fs.FileInfo) error {
		if !info.Mode().IsRegular() {
			return nil
		}
		sys := info.Sys().(*syscall.Stat_t)
		if sys.Nlink > 1 {
			id := fileID{uint64(sys.Dev), sys.Ino}
			if seen[id] {
				return nil
			}
			seen[id] = true
		}
		if src.Dense {
			p.total += info.Size()
		} else {
			p.total += sys.Blocks * 512
		}
		return nil
	})
	if err != nil {
		return err
	}
	st.Total = p.total
	p.add(0)

	t := &treeWriter{ctx: ctx, zw: zw, tw: tar.NewWriter(zw), dense: src.Dense,
		buf: make([]byte, readBuf), p: p, st: st, links: map[fileID]string{}}
	if err := walkSource(ctx, src.Path, t.add); err != nil {
		return err
	}
	if err := t.tw.Close(); err != nil {
		return fmt.Errorf("writing the clone stream: %w", err)
	}
	return nil
}

// walkSource calls fn for every entry below root, in lexical order, except
// root itself and the top-level lost+found. Symlinks are not followed.
func walkSource(ctx context.Context, root string, fn func(full, rel string, info fs.FileInfo) error) error {
	top, err := os.ReadDir(root)
	if err != nil {
		return fmt.Errorf("reading the source volume: %w", err)
	}
	sort.Slice(top, func(i, j int) bool { return top[i].Name() < top[j].Name() })
	for _, e := range top {
		if e.Name() == lostFound {
			continue
		}
		err := filepath.WalkDir(filepath.Join(root, e.Name()), func(full string, d fs.DirEntry, err error) error {
			if err != nil {
				return fmt.Errorf("reading the source volume: %w", err)
			}
			if err := ctx.Err(); err != nil {
				return context.Cause(ctx)
			}
			info, err := d.Info()
			if err != nil {
				return fmt.Errorf("reading the source volume: %w", err)
			}
			rel, err := filepath.Rel(root, full)
			if err != nil {
				return err
			}
			return fn(full, filepath.ToSlash(rel), info)
		})
		if err != nil {
			return err
		}
	}
	return nil
}

func (t *treeWriter) add(full, rel string, info fs.FileInfo) error {
	sys := info.Sys().(*syscall.Stat_t)
	hdr := &tar.Header{
		Name:    rel,
		Mode:    int64(sys.Mode & 0o7777),
		Uid:     int(sys.Uid),
		Gid:     int(sys.Gid),
		ModTime: info.ModTime().Truncate(time.Second),
	}
	switch m := info.Mode(); {
	case m.IsDir():
		hdr.Typeflag, hdr.Name = tar.TypeDir, rel+"/"
		t.st.Dirs++
		return t.header(hdr)
	case m&fs.ModeSymlink != 0:
		target, err := os.Readlink(full)
		if err != nil {
			return fmt.Errorf("reading symlink %s: %w", rel, err)
		}
		hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, target
		t.st.Symlinks++
		return t.header(hdr)
	case m.IsRegular():
		if sys.Nlink > 1 {
			id := fileID{uint64(sys.Dev), sys.Ino}
			if first, ok := t.links[id]; ok {
				hdr.Typeflag, hdr.Linkname = tar.TypeLink, first
				t.st.Hardlinks++
				return t.header(hdr)
			}
			t.links[id] = rel
		}
		return t.file(full, hdr, info.Size())
	default:
		t.st.Skipped = append(t.st.Skipped, rel)
		return nil
	}
}

func (t *treeWriter) header(hdr *tar.Header) error {
	if err := t.tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("writing the tar header of %s: %w", hdr.Name, err)
	}
	return nil
}

// file writes a regular file: a plain entry if it has no holes (or the
// stream is dense), a PAX sparse 1.0 entry otherwise.
func (t *treeWriter) file(full string, hdr *tar.Header, size int64) error {
	f, err := os.Open(full)
	if err != nil {
		return fmt.Errorf("opening %s: %w", hdr.Name, err)
	}
	defer f.Close()
	t.st.Files++
	ext := []extent{{0, size}}
	if !t.dense {
		if ext, err = dataExtents(f, size); err != nil {
			return err
		}
	}
	if size == 0 || (len(ext) == 1 && ext[0] == extent{0, size}) {
		hdr.Typeflag, hdr.Size = tar.TypeReg, size
		if err := t.header(hdr); err != nil {
			return err
		}
		if size == 0 {
			return nil
		}
		return t.copyExtents(f, hdr.Name, ext, t.tw)
	}

	// Sparse: GNU tar ends the map with an empty extent at the end of a
	// file that ends in a hole.
	if len(ext) == 0 || ext[len(ext)-1].end() < size {
		ext = append(ext, extent{size, 0})
	}
	m := sparseMap(ext)
	raw := int64(len(m)) + dataBytes(ext)
	hdrs, err := sparseHeaders(hdr.Name, size, raw, entryMeta{mode: hdr.Mode, uid: hdr.Uid, gid: hdr.Gid, mtime: hdr.ModTime.Unix()})
	if err != nil {
		return fmt.Errorf("%s: %w", hdr.Name, err)
	}
	if err := t.tw.Flush(); err != nil { // pad the previous entry
		return fmt.Errorf("writing the clone stream: %w", err)
	}
	if err := t.write(hdrs); err != nil {
		return err
	}
	if err := t.write(m); err != nil {
		return err
	}
	if err := t.copyExtents(f, hdr.Name, ext, t.zw); err != nil {
		return err
	}
	t.st.SparseFiles++
	if r := raw % blockSize; r != 0 {
		return t.write(make([]byte, blockSize-r))
	}
	return nil
}

func (t *treeWriter) write(b []byte) error {
	if _, err := t.zw.Write(b); err != nil {
		return fmt.Errorf("writing the clone stream: %w", err)
	}
	return nil
}

// copyExtents copies the extents of f to w, exactly their length.
func (t *treeWriter) copyExtents(f *os.File, name string, ext []extent, w io.Writer) error {
	for _, e := range ext {
		for off := e.off; off < e.end(); {
			if err := t.ctx.Err(); err != nil {
				return context.Cause(t.ctx)
			}
			n, err := f.ReadAt(t.buf[:min(int64(len(t.buf)), e.end()-off)], off)
			if n > 0 {
				if _, werr := w.Write(t.buf[:n]); werr != nil {
					return fmt.Errorf("writing the clone stream: %w", werr)
				}
				off += int64(n)
				t.p.add(int64(n))
			}
			if errors.Is(err, io.EOF) && off < e.end() {
				return fmt.Errorf("reading %s: the file shrank while it was read (now %d bytes)", name, off)
			}
			if err != nil && !errors.Is(err, io.EOF) {
				return fmt.Errorf("reading %s at byte %d: %w", name, off, err)
			}
		}
	}
	return nil
}
