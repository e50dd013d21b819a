package cloner

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync/atomic"

	"github.com/kubefill/kubefill/pkg/datapath/sink"
)

// Go's archive/tar reads a sparse entry's holes back as zeros, so a
// 20 GiB disk.img holding 1 GiB would cost 19 GiB of zeros to make and
// check. For PAX sparse 1.0 entries (what WriteStream and GNU tar
// --format=posix write) the receiver therefore reads the sparse map itself
// and copies only the data fragments, straight from the stream:
//
//   - tailReader records the bytes archive/tar reads during Next; for a
//     1.0 entry they end with the entry's header block and its map;
//   - the map found there is checked against the header (checksum, data
//     size) and the real size, else the entry takes the ordinary path;
//   - the data is read past archive/tar, which is then told, through
//     Seek, that the bytes it would skip are already gone.

// fastEntries counts entries copied by the fast path (for tests).
var fastEntries atomic.Int64

// tailReader sits between the stream and archive/tar.
type tailReader struct {
	r io.Reader
	// real counts bytes read from r; tail keeps the last 1024 of them, so
	// the end of a tar can be told from a cut (two zero blocks).
	real int64
	tail [2 * blockSize]byte
	// capture holds what archive/tar reads during Next (capturing).
	capturing bool
	capture   []byte
	// fake bytes are handed to archive/tar as already skipped: data the
	// fast path read itself.
	fake, skipped int64
}

// maxCapture bounds capture: PAX headers and sparse maps are each at
// most 1 MiB in archive/tar; past this the fast path is not used.
var maxCapture = 3 << 20 // a variable for tests

func (t *tailReader) Read(p []byte) (int, error) {
	if t.fake > 0 {
		n := int(min(int64(len(p)), t.fake))
		clear(p[:n])
		t.fake -= int64(n)
		return n, nil
	}
	n, err := t.r.Read(p)
	t.note(p[:n])
	return n, err
}

func (t *tailReader) note(p []byte) {
	n := len(p)
	t.real += int64(n)
	if n >= len(t.tail) {
		copy(t.tail[:], p[n-len(t.tail):])
	} else if n > 0 {
		copy(t.tail[:], t.tail[n:])
		copy(t.tail[len(t.tail)-n:], p)
	}
	if t.capturing {
		if len(t.capture)+n > maxCapture {
			t.capturing, t.capture = false, nil
		} else {
			t.capture = append(t.capture, p...)
		}
	}
}

// Seek lets archive/tar skip the fake bytes; any other seek fails, and
// archive/tar then reads what it skips.
func (t *tailReader) Seek(off int64, whence int) (int64, error) {
	if whence != io.SeekCurrent || t.fake == 0 || off < 0 || off > t.fake {
		return -1, errors.New("not seekable")
	}
	t.fake -= off
	t.skipped += off
	return t.real + t.skipped, nil
}

// sparseFragments returns the data fragments of a PAX sparse 1.0 entry
// just returned by Next, read from the capture, and the size of its data;
// ok is false when the entry is not one, or anything fails to check.
func (t *tailReader) sparseFragments(h *tar.Header) (frags []extent, data int64, ok bool) {
	if h.PAXRecords["GNU.sparse.major"] != "1" || h.PAXRecords["GNU.sparse.minor"] != "0" || !isRegular(h) {
		return nil, 0, false
	}
	c := t.capture
	if len(c)%blockSize != 0 && len(c) > 0 {
		// The capture starts with the previous entry's padding.
		c = c[len(c)%blockSize:]
	}
	for k := 1; (k+1)*blockSize <= len(c); k++ {
		hdr := c[len(c)-(k+1)*blockSize : len(c)-k*blockSize]
		if !validHeader(hdr) {
			continue
		}
		frags, ok := parseMap1x0(c[len(c)-k*blockSize:])
		if !ok {
			return nil, 0, false
		}
		var sum, end int64
		for _, f := range frags {
			if f.off < end || f.len < 0 || f.off+f.len > h.Size || f.off+f.len < f.off {
				return nil, 0, false
			}
			sum += f.len
			end = f.off + f.len
		}
		raw, ok := headerSize(hdr, h)
		if !ok || raw != int64(k*blockSize)+sum {
			return nil, 0, false
		}
		return frags, sum, true
	}
	return nil, 0, false
}

// validHeader: a ustar/GNU header block with a correct checksum.
func validHeader(b []byte) bool {
	if len(b) != blockSize || (!bytes.Equal(b[257:263], []byte("ustar\x00")) && !bytes.Equal(b[257:265], []byte("ustar  \x00"))) {
		return false
	}
	want, ok := parseOctal(b[148:156])
	if !ok {
		return false
	}
	var sum int64
	for i, c := range b {
		if i >= 148 && i < 156 {
			c = ' '
		}
		sum += int64(c)
	}
	return sum == want
}

// headerSize is the size of the entry's data area: the PAX size record,
// else the header's size field.
func headerSize(hdr []byte, h *tar.Header) (int64, bool) {
	if v, ok := h.PAXRecords["size"]; ok {
		n, err := strconv.ParseInt(v, 10, 64)
		return n, err == nil && n >= 0
	}
	f := hdr[124:136]
	if f[0]&0x80 != 0 { // base-256
		if f[0] != 0x80 || f[1]|f[2]|f[3] != 0 {
			return 0, false
		}
		var n int64
		for _, c := range f[4:] {
			n = n<<8 | int64(c)
		}
		return n, n >= 0
	}
	return parseOctal(f)
}

func parseOctal(f []byte) (int64, bool) {
	s := string(bytes.Trim(f, " \x00"))
	if s == "" {
		return 0, true
	}
	n, err := strconv.ParseInt(s, 8, 64)
	return n, err == nil && n >= 0
}

// parseMap1x0 parses a 1.0 sparse map that fills exactly the blocks of b
// (its last newline in the last block), as archive/tar reads it.
func parseMap1x0(b []byte) ([]extent, bool) {
	nl := bytes.IndexByte(b, '\n')
	if nl <= 0 {
		return nil, false
	}
	n, err := strconv.ParseInt(string(b[:nl]), 10, 64)
	if err != nil || n < 0 || n > int64(len(b)) {
		return nil, false
	}
	pos := nl + 1
	next := func() (int64, bool) {
		e := bytes.IndexByte(b[pos:], '\n')
		if e < 0 {
			return 0, false
		}
		v, err := strconv.ParseInt(string(b[pos:pos+e]), 10, 64)
		pos += e + 1
		return v, err == nil
	}
	frags := make([]extent, 0, n)
	for i := int64(0); i < n; i++ {
		off, ok1 := next()
		l, ok2 := next()
		if !ok1 || !ok2 {
			return nil, false
		}
		frags = append(frags, extent{off, l})
	}
	// archive/tar read up to the block holding the last newline, no more.
	if (pos-1)/blockSize != len(b)/blockSize-1 {
		return nil, false
	}
	return frags, true
}

// next returns the next tar header; at the end it checks the end marker
// and that nothing but zeros follows.
func (t *tailReader) next(tr *tar.Reader) (*tar.Header, error) {
	before := t.real
	t.capturing, t.capture = true, t.capture[:0]
	h, err := tr.Next()
	t.capturing = false
	if t.fake != 0 {
		return nil, fmt.Errorf("internal error: %d bytes of a sparse entry were not skipped", t.fake)
	}
	if err == io.EOF {
		if t.real-before < int64(len(t.tail)) || !sink.IsZero(t.tail[:]) {
			return nil, fmt.Errorf("%w: the tar archive ends without its end marker", ErrTruncated)
		}
		// GNU tar pads archives to 10 KiB records; anything else after the
		// end marker is not part of a clone.
		buf := make([]byte, 32<<10)
		for left := 1 << 20; ; {
			n, err := t.r.Read(buf[:min(len(buf), left)])
			if !sink.IsZero(buf[:n]) {
				return nil, fmt.Errorf("%w: data follows the end of the tar archive", ErrTruncated)
			}
			if left -= n; err == io.EOF {
				return nil, io.EOF
			} else if err != nil {
				return nil, err
			} else if left <= 0 {
				return nil, fmt.Errorf("%w: more than 1 MiB follows the end of the tar archive", ErrTruncated)
			}
		}
	}
	if err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, tar.ErrHeader) {
			return nil, fmt.Errorf("%w: reading the tar archive: %w", ErrTruncated, err)
		}
		return nil, fmt.Errorf("reading the tar archive: %w", err)
	}
	return h, nil
}

// rawReader reads the stream under archive/tar (for the fast path).
type rawReader struct{ t *tailReader }

func (r rawReader) Read(p []byte) (int, error) {
	n, err := r.t.r.Read(p)
	r.t.note(p[:n])
	if err == io.EOF {
		err = io.ErrUnexpectedEOF // inside an entry, the end is a cut
	}
	return n, err
}

// copyEntry writes a regular entry's content to hw: the fragments alone
// for a PAX sparse 1.0 entry, everything through archive/tar otherwise.
func (c *copier) copyEntry(t *tailReader, tr *tar.Reader, h *tar.Header, hw *holeWriter) error {
	frags, data, ok := t.sparseFragments(h)
	if !ok {
		_, err := c.copy(hw, tr, h.Size)
		return err
	}
	if err := c.copyFragments(hw, rawReader{t}, frags, h.Size); err != nil {
		return err
	}
	fastEntries.Add(1)
	t.fake = data // archive/tar skips these next
	return nil
}
