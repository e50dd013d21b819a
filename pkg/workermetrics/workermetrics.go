// Package workermetrics is what the importer, upload server and cloner pods
// share to publish progress as CDI's workers do: a counter labelled with the
// owner's UID holding the percentage done, served over HTTPS with a
// self-signed certificate that the controller scrapes without verifying.
package workermetrics

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kubefill/kubefill/pkg/pki"
)

// Progress is a kubevirt_cdi_*_progress_total{ownerUID} counter whose value
// is a percentage.
type Progress struct {
	vec      *prometheus.CounterVec
	ownerUID string
	mu       sync.Mutex
	last     float64
}

// NewProgress registers the counter name (with help) on reg, at 0 for ownerUID.
func NewProgress(reg prometheus.Registerer, name, help, ownerUID string) (*Progress, error) {
	vec := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, []string{"ownerUID"})
	if err := reg.Register(vec); err != nil {
		return nil, err
	}
	vec.WithLabelValues(ownerUID).Add(0)
	return &Progress{vec: vec, ownerUID: ownerUID}, nil
}

// Update sets progress to done/total (ignored when total is unknown).
func (p *Progress) Update(done, total int64) {
	if total <= 0 {
		return
	}
	p.Set(100 * float64(done) / float64(total))
}

// Set raises the percentage to pct, at most 100 (a counter never goes down).
func (p *Progress) Set(pct float64) {
	pct = min(pct, 100)
	p.mu.Lock()
	defer p.mu.Unlock()
	if pct > p.last {
		p.vec.WithLabelValues(p.ownerUID).Add(pct - p.last)
		p.last = pct
	}
}

// Reset starts the percentage again from zero, for a new attempt. The
// counter resets as it does when a process restarts.
func (p *Progress) Reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.vec.DeleteLabelValues(p.ownerUID)
	p.vec.WithLabelValues(p.ownerUID).Add(0)
	p.last = 0
}

// Value returns the current percentage.
func (p *Progress) Value() float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.last
}

// ServerOptions say how a metrics server is served.
type ServerOptions struct {
	// Path is where the registry is served; empty serves it on every path.
	Path string
	// TLS is the certificate: files (reloaded when they change), or one
	// generated at start for GeneratedName and GeneratedHosts.
	TLS pki.ServingOptions
}

// Server serves a registry over HTTPS.
type Server struct {
	srv *http.Server
	ln  net.Listener
}

// Start listens on addr and serves reg over TLS until Close. Serving errors
// after the start are dropped: the work goes on without metrics.
func Start(addr string, reg *prometheus.Registry, opts ServerOptions) (*Server, error) {
	cfg, err := pki.ServerTLS(opts.TLS)
	if err != nil {
		return nil, fmt.Errorf("metrics TLS certificate: %w", err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics listener: %w", err)
	}
	var h http.Handler = promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	if opts.Path != "" {
		mux := http.NewServeMux()
		mux.Handle(opts.Path, h)
		h = mux
	}
	s := &Server{ln: ln, srv: &http.Server{
		Handler:           h,
		TLSConfig:         cfg,
		ReadHeaderTimeout: 10 * time.Second,
	}}
	go func() {
		if err := s.srv.ServeTLS(ln, "", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
			_ = err // the work goes on without metrics
		}
	}()
	return s, nil
}

// Addr returns the listening address.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Close stops the server.
func (s *Server) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return s.srv.Shutdown(ctx)
}
