package uploadproxy

import (
	"bytes"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// countingConn counts the writes, that is the system calls, made on it.
type countingConn struct {
	net.Conn
	writes atomic.Int64
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// received is what the TLS server end of a pair has read so far.
type received struct {
	mu   sync.Mutex
	data bytes.Buffer
	done chan struct{}
}

func (r *received) len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.data.Len()
}

// upstreamPair connects an upstreamConn over loopback to a TLS server that
// reads everything; closeServer ends the server's side.
func upstreamPair(t *testing.T) (c *upstreamConn, raw *countingConn, got *received, closeServer func()) {
	t.Helper()
	ca := newTestCA(t, "stream-ca")
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{ca.tlsCert(t, "server", []string{"127.0.0.1"}, false)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	got = &received{done: make(chan struct{})}
	accepted := make(chan net.Conn, 1)
	go func() {
		defer close(got.done)
		s, err := ln.Accept()
		if err != nil {
			return
		}
		accepted <- s
		buf := make([]byte, 64<<10)
		for {
			n, err := s.Read(buf)
			got.mu.Lock()
			got.data.Write(buf[:n])
			got.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	tcp, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	raw = &countingConn{Conn: tcp}
	bc := &batchConn{Conn: raw}
	tc := tls.Client(bc, &tls.Config{RootCAs: ca.pool(), ServerName: "127.0.0.1"})
	if err := tc.Handshake(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tc.Close() })
	s := <-accepted
	return &upstreamConn{Conn: tc, raw: bc}, raw, got, func() { s.Close() }
}

// pieces returns at most n bytes per Read, pausing every so often, as a
// client on a slow network does.
type pieces struct {
	r     io.Reader
	n     int
	reads int
}

func (p *pieces) Read(b []byte) (int, error) {
	p.reads++
	if p.reads%64 == 0 {
		time.Sleep(time.Millisecond)
	}
	return p.r.Read(b[:min(len(b), p.n)])
}

func TestReadFromSendsEverythingInOrder(t *testing.T) {
	data := make([]byte, 3*ringSize+12345) // wraps around the ring
	if _, err := rand.Read(data); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		r    func() io.Reader
	}{
		{"fast", func() io.Reader { return bytes.NewReader(data) }},
		{"TLS-record pieces", func() io.Reader { return &pieces{r: bytes.NewReader(data), n: 16 << 10} }},
		{"odd small pieces", func() io.Reader { return &pieces{r: bytes.NewReader(data), n: 1000} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _, got, _ := upstreamPair(t)
			n, err := c.ReadFrom(tc.r())
			if err != nil || n != int64(len(data)) {
				t.Fatalf("ReadFrom: %d, %v; want %d, nil", n, err, len(data))
			}
			c.Close()
			<-got.done
			if !bytes.Equal(got.data.Bytes(), data) {
				t.Fatalf("the server got %d bytes that differ from the %d sent", got.data.Len(), len(data))
			}
		})
	}
}

// TestReadFromBatchesRecords: a fast body goes in writes of up to maxSend,
// not in one write per 16 KiB TLS record.
func TestReadFromBatchesRecords(t *testing.T) {
	c, raw, got, _ := upstreamPair(t)
	const size = 8 << 20
	before := raw.writes.Load()
	if _, err := c.ReadFrom(io.LimitReader(zeros{}, size)); err != nil {
		t.Fatal(err)
	}
	writes := raw.writes.Load() - before
	c.Close()
	<-got.done
	if got.len() != size {
		t.Fatalf("the server got %d bytes, want %d", got.len(), size)
	}
	records := size / (16 << 10)
	t.Logf("%d MiB in %d writes (%d TLS records)", size>>20, writes, records)
	if writes > 2*size/maxSend {
		t.Errorf("%d writes for %d TLS records: not batched", writes, records)
	}
}

// gate gives its bytes, then blocks until released, then ends.
type gate struct {
	first   []byte
	release chan struct{}
}

func (g *gate) Read(b []byte) (int, error) {
	if len(g.first) > 0 {
		n := copy(b, g.first)
		g.first = g.first[n:]
		return n, nil
	}
	<-g.release
	return 0, io.EOF
}

// TestReadFromForwardsWhatHasArrived: bytes are not held back waiting for a
// full buffer while the client pauses.
func TestReadFromForwardsWhatHasArrived(t *testing.T) {
	c, _, got, _ := upstreamPair(t)
	g := &gate{first: make([]byte, 100<<10), release: make(chan struct{})}
	errc := make(chan error, 1)
	go func() { _, err := c.ReadFrom(g); errc <- err }()
	deadline := time.Now().Add(10 * time.Second)
	for got.len() < 100<<10 {
		if time.Now().After(deadline) {
			t.Fatalf("the server got %d of the 100 KiB read while the body paused", got.len())
		}
		time.Sleep(5 * time.Millisecond)
	}
	close(g.release)
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

// failing gives n bytes, then fails.
type failing struct{ n int }

func (f *failing) Read(b []byte) (int, error) {
	if f.n == 0 {
		return 0, errors.New("client went away")
	}
	m := min(len(b), f.n)
	clear(b[:m])
	f.n -= m
	return m, nil
}

func TestReadFromReportsReadErrors(t *testing.T) {
	c, _, got, _ := upstreamPair(t)
	n, err := c.ReadFrom(&failing{n: 1 << 20})
	if err == nil || err.Error() != "client went away" || n != 1<<20 {
		t.Fatalf("ReadFrom: %d, %v; want 1 MiB sent and the read error", n, err)
	}
	c.Close()
	<-got.done
	if got.len() != 1<<20 {
		t.Errorf("the server got %d bytes, want the 1 MiB read before the error", got.len())
	}
}

// endless counts its reads.
type endless struct{ reads atomic.Int64 }

func (e *endless) Read(b []byte) (int, error) {
	e.reads.Add(1)
	clear(b)
	return len(b), nil
}

// TestReadFromStopsOnWriteErrors: when the upload server goes away,
// ReadFrom returns its error and has stopped reading the body.
func TestReadFromStopsOnWriteErrors(t *testing.T) {
	c, _, _, closeServer := upstreamPair(t)
	body := &endless{}
	errc := make(chan error, 1)
	go func() { _, err := c.ReadFrom(body); errc <- err }()
	time.Sleep(50 * time.Millisecond)
	closeServer()
	select {
	case err := <-errc:
		if err == nil {
			t.Fatal("ReadFrom succeeded on a connection the server closed")
		}
		t.Logf("after the server closed: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("ReadFrom still sending 10 s after the server closed")
	}
	reads := body.reads.Load()
	time.Sleep(50 * time.Millisecond)
	if body.reads.Load() != reads {
		t.Error("the body is still read after ReadFrom returned")
	}
}
