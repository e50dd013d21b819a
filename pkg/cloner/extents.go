package cloner

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// maxMapBytes bounds a sparse map. Go's archive/tar refuses maps over
// 1 MiB, so a file with more extents than fit is sent with its smallest
// holes filled in (as zeros, which compress and are skipped again on the
// target).
var maxMapBytes = 512 << 10 // a variable for tests

// dataExtents lists the data of f (size bytes) with SEEK_DATA/SEEK_HOLE.
// A file system without them yields one extent covering the file.
func dataExtents(f *os.File, size int64) ([]extent, error) {
	if size == 0 {
		return nil, nil
	}
	fd := int(f.Fd())
	var ext []extent
	mapLen := 0
	gap := int64(0) // holes up to gap bytes are filled in
	for off := int64(0); off < size; {
		d, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole is left
		}
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP) {
			return []extent{{0, size}}, nil
		}
		if err != nil {
			return nil, fmt.Errorf("finding data in %s: %w", f.Name(), err)
		}
		if d >= size {
			break
		}
		h, err := unix.Seek(fd, d, unix.SEEK_HOLE)
		if err != nil {
			return nil, fmt.Errorf("finding holes in %s: %w", f.Name(), err)
		}
		h = min(h, size)
		if h <= d {
			return nil, fmt.Errorf("finding holes in %s: no progress at offset %d", f.Name(), d)
		}
		if n := len(ext); n > 0 && d-ext[n-1].end() <= gap {
			mapLen -= entryLen(ext[n-1])
			ext[n-1].len = h - ext[n-1].off
			mapLen += entryLen(ext[n-1])
		} else {
			ext = append(ext, extent{d, h - d})
			mapLen += entryLen(ext[len(ext)-1])
		}
		for mapLen > maxMapBytes {
			gap = max(2*gap, 4<<10)
			ext, mapLen = mergeExtents(ext, gap)
		}
		off = h
	}
	return ext, nil
}

func (e extent) end() int64 { return e.off + e.len }

func entryLen(e extent) int {
	return len(strconv.FormatInt(e.off, 10)) + len(strconv.FormatInt(e.len, 10)) + 2
}

// mergeExtents joins extents separated by holes of at most gap bytes.
func mergeExtents(ext []extent, gap int64) ([]extent, int) {
	out := ext[:0]
	n := 0
	for _, e := range ext {
		if k := len(out); k > 0 && e.off-out[k-1].end() <= gap {
			n -= entryLen(out[k-1])
			out[k-1].len = e.end() - out[k-1].off
			n += entryLen(out[k-1])
			continue
		}
		out = append(out, e)
		n += entryLen(e)
	}
	return out, n
}

// dataBytes sums the extents' lengths.
func dataBytes(ext []extent) int64 {
	var n int64
	for _, e := range ext {
		n += e.len
	}
	return n
}
