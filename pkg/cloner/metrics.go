package cloner

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kubefill/kubefill/pkg/contract"
	"github.com/kubefill/kubefill/pkg/pki"
)

// Progress publishes clone progress as CDI's cloner does: the counter
// kubevirt_cdi_clone_progress_total{ownerUID} holding the percentage.
// (pkg/importer has the same shape for imports; the two could share a
// leaf package.)
type Progress struct {
	vec      *prometheus.CounterVec
	ownerUID string
	mu       sync.Mutex
	last     float64
}

// NewProgress registers the counter on reg, at 0.
func NewProgress(reg prometheus.Registerer, ownerUID string) (*Progress, error) {
	vec := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: contract.CloneProgressMetric,
		Help: "The clone progress in percentage",
	}, []string{"ownerUID"})
	if err := reg.Register(vec); err != nil {
		return nil, err
	}
	vec.WithLabelValues(ownerUID).Add(0)
	return &Progress{vec: vec, ownerUID: ownerUID}, nil
}

// maxBeforeDone is the highest percentage shown before the upload server
// has answered: the last bytes may still be in flight or being fsynced.
const maxBeforeDone = 99.9

// Update shows done/total, below 100% (Done shows 100%).
func (p *Progress) Update(done, total int64) {
	if total <= 0 {
		return
	}
	p.set(min(100*float64(done)/float64(total), maxBeforeDone))
}

// Done shows 100%: the upload server has the data.
func (p *Progress) Done() { p.set(100) }

func (p *Progress) set(pct float64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if pct > p.last { // a counter only goes up
		p.vec.WithLabelValues(p.ownerUID).Add(pct - p.last)
		p.last = pct
	}
}

// Value is the percentage shown.
func (p *Progress) Value() float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.last
}

// MetricsServer serves a registry over HTTPS on any path, with a
// self-signed certificate (the controller scrapes it without verifying, as
// CDI's does).
type MetricsServer struct {
	srv *http.Server
	ln  net.Listener
}

// StartMetrics listens on addr and serves reg.
func StartMetrics(addr string, reg *prometheus.Registry) (*MetricsServer, error) {
	cfg, err := pki.ServerTLS(pki.ServingOptions{GeneratedName: "kubefill-cloner", GeneratedHosts: []string{"localhost", "127.0.0.1"}})
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	s := &MetricsServer{ln: ln, srv: &http.Server{
		Handler:           promhttp.HandlerFor(reg, promhttp.HandlerOpts{}),
		TLSConfig:         cfg,
		ReadHeaderTimeout: 10 * time.Second,
	}}
	go func() {
		if err := s.srv.ServeTLS(ln, "", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
			_ = err // the clone goes on without metrics
		}
	}()
	return s, nil
}

// Addr is the listening address.
func (s *MetricsServer) Addr() string { return s.ln.Addr().String() }

// Close stops the server.
func (s *MetricsServer) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return s.srv.Shutdown(ctx)
}
