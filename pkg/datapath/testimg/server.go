package testimg

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Server serves files from a directory over real loopback HTTP(S) with
// http.ServeContent (Range, ETag) and optional misbehaviour.
type Server struct {
	*httptest.Server
	Dir string
	// DropAfter, when > 0, makes the first DropTimes responses close the
	// connection after sending that many body bytes.
	DropAfter int64
	DropTimes atomic.Int32
	// NoRange makes the server ignore Range headers (and not advertise them).
	NoRange bool
	// LieLength adds this many bytes to the announced Content-Length.
	LieLength int64
	// User/Pass require basic auth; Header/Value require a request header.
	User, Pass    string
	Header, Value string
	// Delay pauses after every 256 KiB of body sent (a slow link).
	Delay         time.Duration
	Requests      atomic.Int64
	RangeRequests atomic.Int64
	mu            sync.Mutex
}

// NewServer starts a loopback server; tls selects HTTPS with a fresh CA.
func NewServer(t testing.TB, dir string, tls bool) *Server {
	s := &Server{Dir: dir}
	h := http.HandlerFunc(s.serve)
	if tls {
		s.Server = httptest.NewTLSServer(h)
	} else {
		s.Server = httptest.NewServer(h)
	}
	t.Cleanup(s.Close)
	return s
}

// URL returns the URL of a file in Dir.
func (s *Server) FileURL(name string) string { return s.Server.URL + "/" + name }

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	s.Requests.Add(1)
	if r.Header.Get("Range") != "" {
		s.RangeRequests.Add(1)
	}
	if s.User != "" {
		u, p, ok := r.BasicAuth()
		if !ok || u != s.User || p != s.Pass {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
	}
	if s.Header != "" && r.Header.Get(s.Header) != s.Value {
		http.Error(w, "missing header", http.StatusForbidden)
		return
	}
	f, err := os.Open(filepath.Join(s.Dir, filepath.Base(r.URL.Path)))
	if err != nil {
		http.NotFound(w, r)
		return
	}
	defer f.Close()
	st, _ := f.Stat()
	if s.NoRange || s.LieLength > 0 {
		w.Header().Set("Content-Length", strconv.FormatInt(st.Size()+s.LieLength, 10))
		w.WriteHeader(http.StatusOK)
		var r io.Reader = f
		if s.DropAfter > 0 && s.DropTimes.Load() > 0 {
			s.DropTimes.Add(-1)
			r = io.LimitReader(f, s.DropAfter)
		}
		s.copy(w, r)
		return
	}
	if s.DropAfter > 0 && s.DropTimes.Load() > 0 {
		s.DropTimes.Add(-1)
		// Serve normally but cut the connection after DropAfter bytes.
		dw := &dropWriter{ResponseWriter: w, left: s.DropAfter}
		http.ServeContent(dw, r, st.Name(), time.Unix(1700000000, 0), f)
		if dw.dropped {
			panic(http.ErrAbortHandler) // closes the connection mid-body
		}
		return
	}
	w.Header().Set("ETag", `"`+strconv.FormatInt(st.Size(), 10)+`"`)
	var out http.ResponseWriter = w
	if s.Delay > 0 {
		out = &slowWriter{ResponseWriter: w, delay: s.Delay}
	}
	http.ServeContent(out, r, st.Name(), time.Unix(1700000000, 0), f)
}

func (s *Server) copy(w http.ResponseWriter, f io.Reader) {
	buf := make([]byte, 256<<10)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			break
		}
	}
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
	// Close the connection so a lying Content-Length ends in a short body.
	panic(http.ErrAbortHandler)
}

type dropWriter struct {
	http.ResponseWriter
	left    int64
	dropped bool
}

func (d *dropWriter) Write(p []byte) (int, error) {
	if d.dropped {
		return 0, net.ErrClosed
	}
	if int64(len(p)) > d.left {
		p = p[:d.left]
		d.dropped = true
	}
	n, err := d.ResponseWriter.Write(p)
	d.left -= int64(n)
	if f, ok := d.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
	if d.dropped {
		return n, net.ErrClosed
	}
	return n, err
}

type slowWriter struct {
	http.ResponseWriter
	delay time.Duration
	sent  int
}

func (s *slowWriter) Write(p []byte) (int, error) {
	var total int
	for len(p) > 0 {
		n := min(len(p), 256<<10-s.sent%(256<<10))
		k, err := s.ResponseWriter.Write(p[:n])
		total += k
		s.sent += k
		if err != nil {
			return total, err
		}
		p = p[n:]
		if s.sent%(256<<10) == 0 {
			if f, ok := s.ResponseWriter.(http.Flusher); ok {
				f.Flush()
			}
			time.Sleep(s.delay)
		}
	}
	return total, nil
}
