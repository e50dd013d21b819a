package importer

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kubefill/kubefill/pkg/contract"
)

// Progress publishes import progress as CDI does: a counter labelled with
// the owner's UID whose value is the percentage done.
type Progress struct {
	vec      *prometheus.CounterVec
	ownerUID string
	mu       sync.Mutex
	last     float64
}

// NewProgress registers the progress counter on reg.
func NewProgress(reg prometheus.Registerer, ownerUID string) (*Progress, error) {
	vec := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: contract.ImportProgressMetric,
		Help: "The import progress in percentage",
	}, []string{"ownerUID"})
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

// Set raises the percentage to pct (a counter never goes down).
func (p *Progress) Set(pct float64) {
	pct = min(pct, 100)
	p.mu.Lock()
	defer p.mu.Unlock()
	if pct > p.last {
		p.vec.WithLabelValues(p.ownerUID).Add(pct - p.last)
		p.last = pct
	}
}

// Reset starts the percentage again from zero, for a new attempt (the upload
// server's next upload after a failed one). The counter resets as it does
// when a process restarts.
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

// MetricsServer serves /metrics over TLS.
type MetricsServer struct {
	srv *http.Server
	ln  net.Listener
}

// StartMetrics listens on addr and serves reg over TLS. With empty
// certFile/keyFile it uses a fresh self-signed certificate, as CDI's
// importer does; Prometheus scrapes it with verification disabled.
func StartMetrics(addr, certFile, keyFile string, reg *prometheus.Registry) (*MetricsServer, error) {
	var cert tls.Certificate
	var err error
	if certFile != "" || keyFile != "" {
		cert, err = tls.LoadX509KeyPair(certFile, keyFile)
	} else {
		cert, err = selfSigned()
	}
	if err != nil {
		return nil, fmt.Errorf("metrics TLS certificate: %w", err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics listener: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	s := &MetricsServer{ln: ln, srv: &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 10 * time.Second,
		TLSConfig:         &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}},
	}}
	go func() {
		if err := s.srv.ServeTLS(ln, "", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
			_ = err // the import goes on without metrics
		}
	}()
	return s, nil
}

// Addr returns the listening address.
func (s *MetricsServer) Addr() string { return s.ln.Addr().String() }

// Close stops the server.
func (s *MetricsServer) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return s.srv.Shutdown(ctx)
}

func selfSigned() (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "kubefill-importer"},
		NotBefore:    time.Now().Add(-time.Minute),
		NotAfter:     time.Now().Add(10 * 365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}
