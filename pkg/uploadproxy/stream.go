package uploadproxy

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"sync"
)

// Sizes of the buffers an upload goes through on its way to the upload
// server. Each upload holds one ring and one batch buffer, from pools.
const (
	// ringSize is what the proxy may have read from the client and not yet
	// sent on: enough that reading and sending overlap.
	ringSize = 512 << 10
	// maxSend is the most plaintext sent to the upload server at once.
	maxSend = 256 << 10
	// batchSize holds maxSend as TLS records (16 KiB of plaintext each,
	// plus at most 256 bytes of header, tag and padding).
	batchSize = maxSend + (maxSend/(16<<10)+1)*256
)

var (
	ringPool  = sync.Pool{New: func() any { b := make([]byte, ringSize); return &b }}
	batchPool = sync.Pool{New: func() any { b := make([]byte, 0, batchSize); return &b }}
)

// upstreamConn is the TLS connection to an upload server. http.Transport
// sends a request body with io.Copy to the connection, which finds ReadFrom
// here: the body is sent in pieces of whatever has arrived (up to maxSend),
// each as one write system call instead of one per 16 KiB TLS record.
type upstreamConn struct {
	*tls.Conn
	raw *batchConn
}

// batchConn is the TCP connection under the TLS one. Between begin and
// flush, what TLS writes (whole records) collects in a buffer.
type batchConn struct {
	net.Conn
	mu  sync.Mutex
	buf *[]byte // non-nil while batching
}

func (b *batchConn) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.buf == nil {
		return b.Conn.Write(p)
	}
	if len(*b.buf)+len(p) > cap(*b.buf) {
		if err := b.flushLocked(); err != nil {
			return 0, err
		}
		if len(p) > cap(*b.buf) {
			return b.Conn.Write(p)
		}
	}
	*b.buf = append(*b.buf, p...)
	return len(p), nil
}

func (b *batchConn) begin(buf *[]byte) {
	b.mu.Lock()
	*buf = (*buf)[:0]
	b.buf = buf
	b.mu.Unlock()
}

// end sends what was collected since begin and stops batching.
func (b *batchConn) end() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	err := b.flushLocked()
	b.buf = nil
	return err
}

func (b *batchConn) flushLocked() error {
	if len(*b.buf) == 0 {
		return nil
	}
	_, err := b.Conn.Write(*b.buf)
	*b.buf = (*b.buf)[:0]
	return err
}

// ReadFrom sends r on the connection: one goroutine reads r into a ring
// while this one sends what is there, so that a slow client's bytes are
// forwarded as soon as they arrive and a fast client's in large writes.
// It returns after the reading goroutine has stopped using r.
func (c *upstreamConn) ReadFrom(r io.Reader) (int64, error) {
	ringp := ringPool.Get().(*[]byte)
	batchp := batchPool.Get().(*[]byte)
	p := &pump{ring: *ringp, exited: make(chan struct{})}
	p.dataReady.L, p.spaceFree.L = &p.mu, &p.mu
	go p.fill(r)
	defer func() {
		p.mu.Lock()
		p.stopped = true
		p.spaceFree.Signal()
		p.mu.Unlock()
		<-p.exited
		ringPool.Put(ringp)
		batchPool.Put(batchp)
	}()
	var sent int64
	for {
		chunk, rerr := p.next()
		if len(chunk) > 0 {
			c.raw.begin(batchp)
			n, err := c.Conn.Write(chunk)
			if ferr := c.raw.end(); err == nil {
				err = ferr
			}
			sent += int64(n)
			p.consumed(n)
			if err != nil {
				return sent, err
			}
			continue
		}
		if errors.Is(rerr, io.EOF) {
			return sent, nil
		}
		return sent, rerr
	}
}

// pump is a ring buffer between one reader and one sender. in and out count
// the bytes read into and sent out of the ring.
type pump struct {
	ring                 []byte
	mu                   sync.Mutex
	dataReady, spaceFree sync.Cond
	in, out              int64
	err                  error // the reader's last error; it stops then
	stopped              bool  // the sender stopped; so does the reader
	exited               chan struct{}
}

func (p *pump) fill(r io.Reader) {
	defer close(p.exited)
	size := int64(len(p.ring))
	p.mu.Lock()
	for {
		for p.in-p.out == size && !p.stopped {
			p.spaceFree.Wait()
		}
		if p.stopped {
			p.mu.Unlock()
			return
		}
		start := p.in % size
		end := min(size, start+size-(p.in-p.out))
		p.mu.Unlock()
		n, err := r.Read(p.ring[start:end])
		p.mu.Lock()
		p.in += int64(n)
		if err != nil {
			p.err = err
		}
		p.dataReady.Signal()
		if err != nil {
			p.mu.Unlock()
			return
		}
	}
}

// next waits for bytes to send and returns them (at most maxSend, not
// wrapping around the ring's end), or, once all are sent, the reader's error.
func (p *pump) next() ([]byte, error) {
	size := int64(len(p.ring))
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.in == p.out && p.err == nil {
		p.dataReady.Wait()
	}
	if p.in == p.out {
		return nil, p.err
	}
	start := p.out % size
	end := min(size, start+p.in-p.out, start+maxSend)
	return p.ring[start:end], nil
}

func (p *pump) consumed(n int) {
	p.mu.Lock()
	p.out += int64(n)
	p.spaceFree.Signal()
	p.mu.Unlock()
}
