// Package source opens the bytes of a disk image wherever they live: an
// HTTP(S) server, an S3 bucket, an OCI/Docker registry, or a local file.
//
// Every source streams; none reads a whole object into memory. Sources that
// can read byte ranges (HTTP with Range support, S3, local files) also
// implement Ranger, which lets the qcow2 reader fetch only what it needs.
package source

import (
	"context"
	"fmt"
	"io"
	"os"
)

// Source is where image bytes come from.
type Source interface {
	// Open returns a reader over the whole object from its first byte.
	Open(ctx context.Context) (io.ReadCloser, error)
	// Size is the object's size in bytes once Open has returned, or -1
	// when the source does not know it.
	Size() int64
	// String describes the source for logs and errors; it never contains
	// credentials.
	String() string
}

// Ranger is a Source that can also read byte ranges. CanRange is
// meaningful once Open has returned.
type Ranger interface {
	Source
	CanRange() bool
	// OpenRange returns a reader over n bytes starting at off.
	OpenRange(ctx context.Context, off, n int64) (io.ReadCloser, error)
}

// ReaderAt adapts a Ranger to io.ReaderAt, one range read per call. It
// deliberately has no Name method, so no library can resolve paths
// relative to it.
func ReaderAt(ctx context.Context, r Ranger) io.ReaderAt { return &rangerAt{ctx: ctx, r: r} }

type rangerAt struct {
	ctx context.Context
	r   Ranger
}

func (a *rangerAt) ReadAt(p []byte, off int64) (int, error) {
	if size := a.r.Size(); size >= 0 && off+int64(len(p)) > size {
		if off >= size {
			return 0, io.EOF
		}
		n, err := a.ReadAt(p[:size-off], off)
		if err == nil {
			err = io.EOF
		}
		return n, err
	}
	rc, err := a.r.OpenRange(a.ctx, off, int64(len(p)))
	if err != nil {
		return 0, err
	}
	defer rc.Close()
	return io.ReadFull(rc, p)
}

// File is a local image file. It is a Ranger.
type File struct {
	Path string
	size int64
	f    *os.File
}

// Open implements Source.
func (s *File) Open(context.Context) (io.ReadCloser, error) {
	f, err := os.Open(s.Path)
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", s.Path, err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	s.size = st.Size()
	return f, nil
}

// Size implements Source.
func (s *File) Size() int64 {
	if s.size == 0 {
		if st, err := os.Stat(s.Path); err == nil {
			s.size = st.Size()
		}
	}
	return s.size
}

// String implements Source.
func (s *File) String() string { return "file " + s.Path }

// CanRange implements Ranger.
func (s *File) CanRange() bool { return true }

// OpenRange implements Ranger.
func (s *File) OpenRange(_ context.Context, off, n int64) (io.ReadCloser, error) {
	f, err := os.Open(s.Path)
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", s.Path, err)
	}
	return &sectionCloser{io.NewSectionReader(f, off, n), f}, nil
}

type sectionCloser struct {
	*io.SectionReader
	f *os.File
}

func (s *sectionCloser) Close() error { return s.f.Close() }

// Stream wraps an already open body (an upload request, a clone stream)
// as a Source. It can be opened once. Size may be -1.
type Stream struct {
	Name string
	Body io.ReadCloser
	Len  int64
	used bool
}

// Open implements Source.
func (s *Stream) Open(context.Context) (io.ReadCloser, error) {
	if s.used {
		return nil, fmt.Errorf("%s: a stream can be read only once", s.Name)
	}
	s.used = true
	return s.Body, nil
}

// Size implements Source.
func (s *Stream) Size() int64 { return s.Len }

// String implements Source.
func (s *Stream) String() string { return s.Name }
