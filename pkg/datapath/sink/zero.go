package sink

import (
	"bytes"
	"io"
)

// zeros is a source of zero bytes for comparing and writing.
var zeros = make([]byte, 1<<20)

// IsZero reports whether b holds only zero bytes.
func IsZero(b []byte) bool {
	for len(b) > 0 {
		n := min(len(b), len(zeros))
		if !bytes.Equal(b[:n], zeros[:n]) {
			return false
		}
		b = b[n:]
	}
	return true
}

// NextRun splits p, whose first byte lies at absolute offset off, into runs
// for sparse writing. It returns the end of the run starting at p[i]: one
// all-zero block (blocks are BlockSize long and aligned on absolute
// offsets, the first and last possibly cut short by p's ends), or a run of
// consecutive blocks that are not all zero; zero says which.
func NextRun(p []byte, off int64, i int) (end int, zero bool) {
	end = min(len(p), i+BlockSize-int((off+int64(i))%BlockSize))
	if IsZero(p[i:end]) {
		return end, true
	}
	for end < len(p) {
		k := min(len(p), end+BlockSize)
		if IsZero(p[end:k]) {
			break
		}
		end = k
	}
	return end, false
}

// WriteZeros writes explicit zeros over [off, off+n) of w. On failure it
// returns the offset of the write that failed.
func WriteZeros(w io.WriterAt, off, n int64) (int64, error) {
	for end := off + n; off < end; {
		k := min(end-off, int64(len(zeros)))
		if _, err := w.WriteAt(zeros[:k], off); err != nil {
			return off, err
		}
		off += k
	}
	return off, nil
}

// Fill reads into buf until it is full or r fails. Unlike io.ReadFull it
// hands back r's own error untouched: io.EOF is the stream's end, while an
// io.ErrUnexpectedEOF from r (a body cut short) is a failure, never an end.
func Fill(r io.Reader, buf []byte) (int, error) {
	n := 0
	for n < len(buf) {
		m, err := r.Read(buf[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}
