package qcow2

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"sync"

	"github.com/klauspost/compress/flate"
	"github.com/klauspost/compress/zstd"
)

// Fetcher opens a sequential reader over length bytes of the image file
// starting at off, for example one HTTP Range request.
type Fetcher func(ctx context.Context, off, length int64) (io.ReadCloser, error)

// ExecOptions tunes Execute.
type ExecOptions struct {
	// Workers decompress and write in parallel; default GOMAXPROCS.
	Workers int
	// MaxGap is the largest hole between two extents that one sequential
	// read spans rather than starting a new request; default 8 MiB.
	MaxGap int64
	// WholeFile, when set, makes Execute read the entire file from offset 0
	// to FileSize in one sequential pass and copy every byte into it, so the
	// caller can checksum the source exactly once.
	WholeFile io.Writer
	// Progress is called with the number of file bytes consumed so far.
	Progress func(consumed int64)
}

type job struct {
	buf    []byte
	n      int
	guest  int64
	length int64
	comp   bool
}

const chunk = 1 << 20

// Execute fetches the plan's extents and writes guest data to w. Holes are
// not written: w must already read as zeros there (a fresh sparse file, or
// a writer that handles it). w.WriteAt is called from several goroutines.
func Execute(ctx context.Context, p *Plan, fetch Fetcher, w io.WriterAt, opt ExecOptions) error {
	if opt.Workers <= 0 {
		opt.Workers = runtime.GOMAXPROCS(0)
	}
	if opt.MaxGap <= 0 {
		opt.MaxGap = 8 << 20
	}
	cs := p.Header.ClusterSize()
	bufSize := max(int64(chunk), 2*cs)
	for _, e := range p.Extents {
		if e.CompLen > bufSize {
			return invalidf("corrupt qcow2: compressed cluster at %#x claims %d stored bytes", e.Host, e.CompLen)
		}
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)

	free := make(chan []byte, 2*opt.Workers+2)
	for range cap(free) {
		free <- make([]byte, bufSize)
	}
	jobs := make(chan job, cap(free))
	var wg sync.WaitGroup
	for range opt.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d := newDecoder(p.Header.CompressionType, cs)
			defer d.close()
			for j := range jobs {
				if ctx.Err() == nil {
					if err := d.do(j, w); err != nil {
						cancel(err)
					}
				}
				free <- j.buf
			}
		}()
	}
	var consumed int64
	readErr := runReads(ctx, p, fetch, opt, free, jobs, &consumed)
	close(jobs)
	wg.Wait()
	if readErr != nil {
		return readErr
	}
	if err := context.Cause(ctx); err != nil {
		return err
	}
	return nil
}

// runReads walks the extents in host order and queues jobs.
func runReads(ctx context.Context, p *Plan, fetch Fetcher, opt ExecOptions, free chan []byte, jobs chan<- job, consumed *int64) error {
	progress := func(n int64) {
		*consumed += n
		if opt.Progress != nil {
			opt.Progress(*consumed)
		}
	}
	var late []Extent // extents that lie behind the read position (shared clusters)
	i := 0
	exts := p.Extents
	for i < len(exts) || (opt.WholeFile != nil && i == 0) {
		start, end := int64(0), p.FileSize
		j := len(exts)
		if opt.WholeFile == nil {
			start = exts[i].Host
			end = start + exts[i].stored()
			for j = i + 1; j < len(exts); j++ {
				e := exts[j]
				if e.Host > end+opt.MaxGap {
					break
				}
				end = max(end, e.Host+e.stored())
			}
		}
		rc, err := fetch(ctx, start, end-start)
		if err != nil {
			return fmt.Errorf("fetching image bytes %d-%d: %w", start, end-1, err)
		}
		var r io.Reader = rc
		if opt.WholeFile != nil {
			r = io.TeeReader(rc, opt.WholeFile)
		}
		pos := start
		err = func() error {
			for ; i < j; i++ {
				e := exts[i]
				if e.Host < pos {
					late = append(late, e)
					continue
				}
				if gap := e.Host - pos; gap > 0 {
					if _, err := io.CopyN(io.Discard, r, gap); err != nil {
						return readErr(err, pos, end)
					}
					pos += gap
					progress(gap)
				}
				if err := queueExtent(ctx, r, e, free, jobs); err != nil {
					return readErr(err, pos, end)
				}
				pos += e.stored()
				progress(e.stored())
			}
			if opt.WholeFile != nil && pos < end {
				n, err := io.Copy(io.Discard, r)
				pos += n
				progress(n)
				if err != nil {
					return readErr(err, pos, end)
				}
				if pos != end {
					return invalidf("image file ended at byte %d, expected %d bytes", pos, end)
				}
			}
			return nil
		}()
		rc.Close()
		if err != nil {
			return err
		}
		if len(exts) == 0 {
			break
		}
	}
	for _, e := range late {
		rc, err := fetch(ctx, e.Host, e.stored())
		if err != nil {
			return fmt.Errorf("fetching image bytes at %d: %w", e.Host, err)
		}
		err = queueExtent(ctx, rc, e, free, jobs)
		rc.Close()
		if err != nil {
			return readErr(err, e.Host, e.Host+e.stored())
		}
	}
	return nil
}

func readErr(err error, pos, end int64) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return invalidf("image file ended early near byte %d (expected data up to %d; truncated image?): %v", pos, end, err)
	}
	return fmt.Errorf("reading image near byte %d: %w", pos, err)
}

func queueExtent(ctx context.Context, r io.Reader, e Extent, free chan []byte, jobs chan<- job) error {
	if e.CompLen > 0 {
		buf, err := take(ctx, free)
		if err != nil {
			return err
		}
		if _, err := io.ReadFull(r, buf[:e.CompLen]); err != nil {
			free <- buf
			return err
		}
		jobs <- job{buf: buf, n: int(e.CompLen), guest: e.Guest, length: e.Length, comp: true}
		return nil
	}
	for off := int64(0); off < e.Length; {
		buf, err := take(ctx, free)
		if err != nil {
			return err
		}
		n := min(int64(len(buf)), e.Length-off)
		if _, err := io.ReadFull(r, buf[:n]); err != nil {
			free <- buf
			return err
		}
		jobs <- job{buf: buf, n: int(n), guest: e.Guest + off, length: n}
		off += n
	}
	return nil
}

func take(ctx context.Context, free chan []byte) ([]byte, error) {
	select {
	case b := <-free:
		return b, nil
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
}

type decoder struct {
	kind uint8
	out  []byte
	br   bytes.Reader
	fl   io.ReadCloser
	zs   *zstd.Decoder
}

func newDecoder(kind uint8, cs int64) *decoder {
	return &decoder{kind: kind, out: make([]byte, cs)}
}

func (d *decoder) close() {
	if d.zs != nil {
		d.zs.Close()
	}
}

func (d *decoder) do(j job, w io.WriterAt) error {
	if !j.comp {
		if _, err := w.WriteAt(j.buf[:j.n], j.guest); err != nil {
			return fmt.Errorf("writing guest offset %d: %w", j.guest, err)
		}
		return nil
	}
	d.br.Reset(j.buf[:j.n])
	var r io.Reader
	switch d.kind {
	case CompressionZlib:
		if d.fl == nil {
			d.fl = flate.NewReader(&d.br)
		} else if err := d.fl.(flate.Resetter).Reset(&d.br, nil); err != nil {
			return err
		}
		r = d.fl
	case CompressionZstd:
		if d.zs == nil {
			z, err := zstd.NewReader(&d.br, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxMemory(64<<20))
			if err != nil {
				return err
			}
			d.zs = z
		} else if err := d.zs.Reset(&d.br); err != nil {
			return invalidf("corrupt compressed cluster for guest offset %d: %v", j.guest, err)
		}
		r = d.zs
	default:
		return invalidf("unsupported compression type %d", d.kind)
	}
	n, err := io.ReadFull(r, d.out)
	if err != nil && !(errors.Is(err, io.ErrUnexpectedEOF) && int64(n) >= j.length) {
		return invalidf("corrupt compressed cluster for guest offset %d: %v", j.guest, err)
	}
	if _, err := w.WriteAt(d.out[:j.length], j.guest); err != nil {
		return fmt.Errorf("writing guest offset %d: %w", j.guest, err)
	}
	return nil
}
