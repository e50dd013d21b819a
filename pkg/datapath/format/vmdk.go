package format

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// ErrNoVirtualSize: the image does not say its virtual size in a form these
// parsers trust (malformed, truncated, or a layout they do not read). It is
// not a verdict on the image: qemu-img may still read it.
var ErrNoVirtualSize = errors.New("virtual size not found")

// Bounds applied to hostile input: nothing is allocated or looped over in
// proportion to a number the image states.
const (
	// maxVMDKDescriptor bounds an embedded or stand-alone descriptor
	// (qemu-img writes 10 KiB; qemu itself refuses more than 16 MiB).
	maxVMDKDescriptor = 1 << 20
	// maxVMDKExtents bounds the extent lines that are summed.
	maxVMDKExtents = 4096
	// maxVirtualSize is the largest virtual size believed (1 EiB).
	maxVirtualSize = 1 << 60
	sectorSize     = 512
)

// VMDKExtent is one extent line of a VMDK descriptor:
// `RW 2097152 SPARSE "disk.vmdk"`.
type VMDKExtent struct {
	Access  string // RW, RDONLY or NOACCESS
	Sectors int64
	Type    string // FLAT, SPARSE, ZERO, VMFS, VMFSSPARSE, ...
	File    string // empty for ZERO
}

// VMDKDescriptor is what the parsers read from a VMDK text descriptor.
type VMDKDescriptor struct {
	CreateType string
	Extents    []VMDKExtent
}

// VirtualSize is the sum of the extents' sizes in bytes.
func (d *VMDKDescriptor) VirtualSize() int64 {
	var n int64
	for _, e := range d.Extents {
		n += e.Sectors * sectorSize
	}
	return n
}

var vmdkExtentTypes = map[string]bool{
	"FLAT": true, "SPARSE": true, "ZERO": true, "VMFS": true, "VMFSSPARSE": true,
	"VMFSRDM": true, "VMFSRAW": true, "SESPARSE": true,
}

// ParseVMDKDescriptor reads a VMDK text descriptor. It is pure. Text after
// a NUL byte (the padding of an embedded descriptor) is ignored. A
// descriptor with no extent line, or an extent line it cannot read, is an
// error wrapping ErrNoVirtualSize; unknown key=value lines are ignored.
func ParseVMDKDescriptor(b []byte) (*VMDKDescriptor, error) {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	if len(b) > maxVMDKDescriptor {
		return nil, fmt.Errorf("%w: vmdk descriptor longer than %d bytes", ErrNoVirtualSize, maxVMDKDescriptor)
	}
	d := &VMDKDescriptor{}
	var total int64
	for line := range strings.Lines(string(b)) {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		if k, v, ok := strings.Cut(line, "="); ok && !strings.ContainsAny(k, "\"") {
			if strings.TrimSpace(k) == "createType" {
				d.CreateType = strings.Trim(strings.TrimSpace(v), "\"")
			}
			continue
		}
		access, rest := line, ""
		if i := strings.IndexAny(line, " \t"); i >= 0 {
			access, rest = line[:i], line[i+1:]
		}
		if access != "RW" && access != "RDONLY" && access != "NOACCESS" {
			continue
		}
		e, err := parseVMDKExtent(access, rest)
		if err != nil {
			return nil, err
		}
		if len(d.Extents) == maxVMDKExtents {
			return nil, fmt.Errorf("%w: vmdk descriptor has more than %d extents", ErrNoVirtualSize, maxVMDKExtents)
		}
		total += e.Sectors * sectorSize
		if total > maxVirtualSize {
			return nil, fmt.Errorf("%w: vmdk extents add up to more than %d bytes", ErrNoVirtualSize, int64(maxVirtualSize))
		}
		d.Extents = append(d.Extents, e)
	}
	if len(d.Extents) == 0 {
		return nil, fmt.Errorf("%w: vmdk descriptor has no extent line", ErrNoVirtualSize)
	}
	// Extents of 0 sectors only: no size to check a target against.
	if total == 0 {
		return nil, fmt.Errorf("%w: vmdk extents add up to 0 bytes", ErrNoVirtualSize)
	}
	return d, nil
}

// parseVMDKExtent reads `<sectors> <type> ["file" [offset]]`.
func parseVMDKExtent(access, rest string) (VMDKExtent, error) {
	e := VMDKExtent{Access: access}
	head, file, quoted := strings.Cut(rest, "\"")
	f := strings.Fields(head)
	if len(f) != 2 {
		return e, fmt.Errorf("%w: vmdk extent line %q", ErrNoVirtualSize, access+" "+rest)
	}
	n, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil || n < 0 || n > maxVirtualSize/sectorSize {
		return e, fmt.Errorf("%w: vmdk extent size %q", ErrNoVirtualSize, f[0])
	}
	if !vmdkExtentTypes[f[1]] {
		return e, fmt.Errorf("%w: vmdk extent type %q", ErrNoVirtualSize, f[1])
	}
	e.Sectors, e.Type = n, f[1]
	if quoted {
		name, _, ok := strings.Cut(file, "\"")
		if !ok {
			return e, fmt.Errorf("%w: vmdk extent file name is not closed", ErrNoVirtualSize)
		}
		e.File = name
	} else if e.Type != "ZERO" {
		return e, fmt.Errorf("%w: vmdk %s extent names no file", ErrNoVirtualSize, e.Type)
	}
	return e, nil
}

// VMDKVirtualSize returns the virtual size of a VMDK image read through r:
// a text descriptor, a hosted sparse extent (KDMV: monolithicSparse or
// streamOptimized, with its embedded descriptor) or an ESX sparse extent
// (COWD). For a sparse extent with a descriptor the smaller of the
// descriptor's sum and the header's capacity is returned, so the answer is
// never more than qemu-img would say. r may end early (a prefix of the
// file); reads beyond it give ErrNoVirtualSize.
func VMDKVirtualSize(r io.ReaderAt) (int64, error) {
	var hdr [512]byte
	n, err := r.ReadAt(hdr[:], 0)
	if n < len(magicVMDKd) {
		return 0, fmt.Errorf("%w: vmdk header: %v", ErrNoVirtualSize, err)
	}
	switch {
	case bytes.HasPrefix(hdr[:], magicVMDKd):
		b, err := readPrefix(r, 0, maxVMDKDescriptor+1)
		if err != nil {
			return 0, err
		}
		d, err := ParseVMDKDescriptor(b)
		if err != nil {
			return 0, err
		}
		return d.VirtualSize(), nil
	case bytes.HasPrefix(hdr[:], magicCOWD):
		if n < 16 {
			return 0, fmt.Errorf("%w: short COWD header", ErrNoVirtualSize)
		}
		sectors := int64(binary.LittleEndian.Uint32(hdr[12:]))
		if sectors == 0 {
			return 0, fmt.Errorf("%w: COWD header has no capacity", ErrNoVirtualSize)
		}
		return sectors * sectorSize, nil
	case bytes.HasPrefix(hdr[:], magicVMDK):
		if n < 80 {
			return 0, fmt.Errorf("%w: short vmdk sparse header", ErrNoVirtualSize)
		}
		capacity := binary.LittleEndian.Uint64(hdr[12:])
		descOff := binary.LittleEndian.Uint64(hdr[28:])
		descLen := binary.LittleEndian.Uint64(hdr[36:])
		if capacity == 0 || capacity > maxVirtualSize/sectorSize {
			return 0, fmt.Errorf("%w: vmdk sparse header capacity %d sectors", ErrNoVirtualSize, capacity)
		}
		size := int64(capacity) * sectorSize
		if descOff == 0 || descLen == 0 {
			return size, nil
		}
		if descLen > maxVMDKDescriptor/sectorSize || descOff > maxVirtualSize/sectorSize {
			return 0, fmt.Errorf("%w: vmdk embedded descriptor at sector %d, %d sectors long", ErrNoVirtualSize, descOff, descLen)
		}
		b, err := readPrefix(r, int64(descOff)*sectorSize, int(descLen)*sectorSize)
		if err != nil {
			return 0, err
		}
		if d, err := ParseVMDKDescriptor(b); err == nil {
			size = min(size, d.VirtualSize())
		}
		return size, nil
	}
	return 0, fmt.Errorf("%w: not a vmdk image", ErrNoVirtualSize)
}

// readPrefix reads up to n bytes at off; fewer at the end of r is fine,
// none is not.
func readPrefix(r io.ReaderAt, off int64, n int) ([]byte, error) {
	// Read incrementally: a short file costs what it holds, not n.
	b, err := io.ReadAll(io.NewSectionReader(r, off, int64(n)))
	if len(b) == 0 {
		return nil, fmt.Errorf("%w: nothing at byte %d: %v", ErrNoVirtualSize, off, err)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: reading byte %d: %v", ErrNoVirtualSize, off, err)
	}
	return b, nil
}
