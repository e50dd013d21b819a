package cloner

import (
	"fmt"
	"path"
	"strconv"
	"strings"
)

// Go's archive/tar reads sparse files but does not write them, so the
// headers of a PAX sparse 1.0 entry are encoded here:
//
//	[ustar header, type 'x'] [PAX records, padded to 512]
//	[ustar header, type '0', name GNUSparseFile.0/<base>, size = map + data]
//	[sparse map: "<n>\n" then "<offset>\n<length>\n" n times, padded to 512]
//	[the data of each extent, back to back] [padding to 512]
//
// The PAX records are GNU.sparse.major=1, GNU.sparse.minor=0,
// GNU.sparse.name=<name>, GNU.sparse.realsize=<size>, and size, uid, gid
// and mtime when they do not fit the ustar fields. This is what GNU tar
// writes with --sparse --format=posix.

const blockSize = 512

// extent is a run of data in a file.
type extent struct{ off, len int64 }

// sparseMap renders the map that opens a 1.0 sparse entry's data, padded.
func sparseMap(ext []extent) []byte {
	var b strings.Builder
	b.WriteString(strconv.Itoa(len(ext)))
	b.WriteByte('\n')
	for _, e := range ext {
		b.WriteString(strconv.FormatInt(e.off, 10))
		b.WriteByte('\n')
		b.WriteString(strconv.FormatInt(e.len, 10))
		b.WriteByte('\n')
	}
	return padBlock([]byte(b.String()))
}

// sparseMapLen is len(sparseMap(ext)) before padding.
func sparseMapLen(ext []extent) int {
	n := len(strconv.Itoa(len(ext))) + 1
	for _, e := range ext {
		n += len(strconv.FormatInt(e.off, 10)) + len(strconv.FormatInt(e.len, 10)) + 2
	}
	return n
}

func padBlock(b []byte) []byte {
	if r := len(b) % blockSize; r != 0 {
		b = append(b, make([]byte, blockSize-r)...)
	}
	return b
}

// entryMeta is what a tar header says about a file besides its name and size.
type entryMeta struct {
	mode     int64
	uid, gid int
	mtime    int64 // seconds
}

// sparseHeaders returns the PAX header and the ustar header of a sparse
// entry whose real size is size and whose data area (map and extents) is
// raw bytes long.
func sparseHeaders(name string, size, raw int64, m entryMeta) ([]byte, error) {
	recs := []string{
		paxRecord("GNU.sparse.major", "1"),
		paxRecord("GNU.sparse.minor", "0"),
		paxRecord("GNU.sparse.name", name),
		paxRecord("GNU.sparse.realsize", strconv.FormatInt(size, 10)),
	}
	if strings.ContainsRune(name, 0) {
		return nil, fmt.Errorf("file name %q contains a NUL byte", name)
	}
	var main [blockSize]byte
	placeholder := sparsePlaceholder(name)
	copy(main[0:100], placeholder)
	fields := []struct {
		key   string
		v     int64
		field []byte
	}{
		{"mode", m.mode & 0o7777, main[100:108]},
		{"uid", int64(m.uid), main[108:116]},
		{"gid", int64(m.gid), main[116:124]},
		{"size", raw, main[124:136]},
		{"mtime", m.mtime, main[136:148]},
	}
	for _, f := range fields {
		if !putOctal(f.field, f.v) {
			if f.key == "mode" {
				return nil, fmt.Errorf("mode %o does not fit a tar header", f.v)
			}
			recs = append(recs, paxRecord(f.key, strconv.FormatInt(f.v, 10)))
			putOctal(f.field, 0)
		}
	}
	main[156] = '0'
	finishUstar(&main)

	pax := []byte(strings.Join(recs, ""))
	var x [blockSize]byte
	copy(x[0:100], paxPlaceholder(name))
	putOctal(x[100:108], 0o644)
	putOctal(x[108:116], 0)
	putOctal(x[116:124], 0)
	putOctal(x[124:136], int64(len(pax)))
	putOctal(x[136:148], max(0, min(m.mtime, 0o77777777777)))
	x[156] = 'x'
	finishUstar(&x)

	out := make([]byte, 0, 3*blockSize+len(pax))
	out = append(out, x[:]...)
	out = append(out, padBlock(pax)...)
	out = append(out, main[:]...)
	return out, nil
}

// sparsePlaceholder is the ustar name of a sparse entry, which readers that
// know the format replace with GNU.sparse.name: GNU tar's
// "<dir>/GNUSparseFile.<pid>/<base>", kept ASCII and within 100 bytes.
func sparsePlaceholder(name string) string {
	return placeholder(name, "GNUSparseFile.0")
}

func paxPlaceholder(name string) string {
	return placeholder(name, "PaxHeaders.0")
}

func placeholder(name, mid string) string {
	dir, base := path.Split(strings.TrimSuffix(name, "/"))
	p := path.Join(dir, mid, base)
	if len(p) > 99 || !isASCII(p) {
		p = path.Join(mid, "sparse")
	}
	return p
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] == 0 || s[i] >= 0x80 {
			return false
		}
	}
	return true
}

// paxRecord formats "<len> key=value\n", where len counts the whole record.
func paxRecord(k, v string) string {
	body := " " + k + "=" + v + "\n"
	n := len(body) + len(strconv.Itoa(len(body)))
	rec := strconv.Itoa(n) + body
	if len(rec) != n { // counting the length's digits added one
		rec = strconv.Itoa(len(rec)) + body
	}
	return rec
}

// putOctal writes v as zero-padded octal with a NUL terminator; false if
// it does not fit (or is negative).
func putOctal(f []byte, v int64) bool {
	s := strconv.FormatInt(v, 8)
	if v < 0 || len(s) > len(f)-1 {
		return false
	}
	copy(f, strings.Repeat("0", len(f)-1-len(s))+s)
	f[len(f)-1] = 0
	return true
}

// finishUstar sets the ustar magic and version and the checksum.
func finishUstar(b *[blockSize]byte) {
	copy(b[257:263], "ustar\x00")
	copy(b[263:265], "00")
	copy(b[148:156], "        ")
	var sum int64
	for _, c := range b {
		sum += int64(c)
	}
	s := strconv.FormatInt(sum, 8)
	copy(b[148:156], strings.Repeat("0", 6-len(s))+s+"\x00 ")
}
