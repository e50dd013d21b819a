package qcow2

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"sort"
)

const (
	l1OffsetMask  = 0x00fffffffffffe00
	l2OffsetMask  = 0x00fffffffffffe00
	l2Compressed  = uint64(1) << 62
	l2ZeroFlag    = uint64(1)
	maxReadAtOnce = 1 << 20
)

// Extent is a run of guest data stored in the image file.
type Extent struct {
	Guest  int64 // guest (virtual) offset
	Host   int64 // offset in the image file
	Length int64 // guest bytes this extent produces
	// CompLen is the number of stored bytes of a compressed cluster (an upper
	// bound, trimmed to the next extent); zero for uncompressed data.
	CompLen int64
}

func (e Extent) stored() int64 {
	if e.CompLen > 0 {
		return e.CompLen
	}
	return e.Length
}

// Plan says which bytes of the image file hold guest data and where they go.
type Plan struct {
	Header   *Header
	FileSize int64
	// Extents are sorted by Host.
	Extents []Extent
	// StoredBytes is the number of file bytes the extents read.
	StoredBytes int64
	// GuestBytes is the number of guest bytes the extents produce.
	GuestBytes int64
}

// BuildPlan reads the L1 and L2 tables of the image through ra and builds
// its whole extent plan. fileSize is the size of the image file; every
// offset is checked against it. Unallocated and zero clusters produce no
// extent: they read as zeros because the image has no backing file.
func BuildPlan(ctx context.Context, ra io.ReaderAt, h *Header, fileSize int64) (*Plan, error) {
	var all *Plan
	err := WalkPlans(ctx, ra, h, fileSize, 0, func(p *Plan) error { all = p; return nil })
	return all, err
}

// WalkPlans is BuildPlan in bounded memory: it hands fn a plan each time
// at least maxExtents extents have accumulated (after a whole L2 table),
// and once more at the end. maxExtents 0 means one plan for the image.
// fn is called at least once.
func WalkPlans(ctx context.Context, ra io.ReaderAt, h *Header, fileSize int64, maxExtents int, fn func(*Plan) error) error {
	cs := h.ClusterSize()
	l1 := make([]byte, 0)
	if h.L1Size > 0 {
		if int64(h.L1TableOffset)+int64(h.L1Size)*8 > fileSize {
			return invalidf("corrupt qcow2: L1 table at %#x runs past the end of the %d-byte file (truncated image?)", h.L1TableOffset, fileSize)
		}
		l1 = make([]byte, int64(h.L1Size)*8)
		if _, err := ra.ReadAt(l1, int64(h.L1TableOffset)); err != nil {
			return fmt.Errorf("reading qcow2 L1 table: %w", err)
		}
	}
	p := &Plan{Header: h, FileSize: fileSize}
	calls := 0
	emit := func(force bool) error {
		if !force && (maxExtents <= 0 || len(p.Extents) < maxExtents) {
			return nil
		}
		if force && calls > 0 && len(p.Extents) == 0 {
			return nil
		}
		p.finish()
		calls++
		if err := fn(p); err != nil {
			return err
		}
		p = &Plan{Header: h, FileSize: fileSize}
		return nil
	}
	perL2 := cs * h.l2Entries()
	l2 := make([]byte, cs)
	compShift := 62 - (h.ClusterBits - 8)
	compOffMask := uint64(1)<<compShift - 1
	compSecMask := uint64(1)<<(h.ClusterBits-8) - 1
	for i := int64(0); i < int64(h.L1Size); i++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		base := i * perL2
		if base >= int64(h.Size) {
			break
		}
		l2off := int64(binary.BigEndian.Uint64(l1[i*8:]) & l1OffsetMask)
		if l2off == 0 {
			continue
		}
		if l2off%cs != 0 || l2off+cs > fileSize {
			return invalidf("corrupt qcow2: L2 table offset %#x invalid for a %d-byte file (truncated image?)", l2off, fileSize)
		}
		if _, err := ra.ReadAt(l2, l2off); err != nil {
			return fmt.Errorf("reading qcow2 L2 table at %#x: %w", l2off, err)
		}
		for j := int64(0); j < h.l2Entries(); j++ {
			guest := base + j*cs
			if guest >= int64(h.Size) {
				break
			}
			length := min(cs, int64(h.Size)-guest)
			e := binary.BigEndian.Uint64(l2[j*8:])
			if e&l2Compressed != 0 {
				host := int64(e & compOffMask)
				sectors := int64((e>>compShift)&compSecMask) + 1
				comp := sectors*512 - host%512
				if host == 0 || host >= fileSize {
					return invalidf("corrupt qcow2: compressed cluster for guest offset %#x at invalid host offset %#x (truncated image?)", guest, host)
				}
				comp = min(comp, fileSize-host)
				p.add(Extent{Guest: guest, Host: host, Length: length, CompLen: comp})
				continue
			}
			host := int64(e & l2OffsetMask)
			if e&l2ZeroFlag != 0 && h.Version >= 3 || host == 0 {
				continue // reads as zeros
			}
			if host%cs != 0 {
				return invalidf("corrupt qcow2: data cluster for guest offset %#x at unaligned host offset %#x", guest, host)
			}
			if host+length > fileSize {
				return invalidf("corrupt qcow2: data cluster for guest offset %#x at %#x runs past the end of the %d-byte file (truncated image?)", guest, host, fileSize)
			}
			p.add(Extent{Guest: guest, Host: host, Length: length})
		}
		if err := emit(false); err != nil {
			return err
		}
	}
	return emit(true)
}

// finish sorts the extents by host offset and computes the totals.
func (p *Plan) finish() {
	sort.Slice(p.Extents, func(a, b int) bool { return p.Extents[a].Host < p.Extents[b].Host })
	// A compressed cluster's stored length is rounded up to whole sectors and
	// may run into the next cluster's bytes; trim it so reads stay in order.
	for i := range p.Extents {
		e := &p.Extents[i]
		if e.CompLen > 0 && i+1 < len(p.Extents) {
			next := p.Extents[i+1].Host
			if next > e.Host && e.Host+e.CompLen > next {
				e.CompLen = next - e.Host
			}
		}
		p.StoredBytes += e.stored()
		p.GuestBytes += e.Length
	}
}

// add appends e, merging it with the previous extent when both are
// uncompressed and contiguous in guest and host space.
func (p *Plan) add(e Extent) {
	if n := len(p.Extents); n > 0 && e.CompLen == 0 {
		last := &p.Extents[n-1]
		if last.CompLen == 0 && last.Guest+last.Length == e.Guest && last.Host+last.Length == e.Host && last.Length < 64<<20 {
			last.Length += e.Length
			return
		}
	}
	p.Extents = append(p.Extents, e)
}
