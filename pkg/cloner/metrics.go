package cloner

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kubefill/kubefill/pkg/contract"
	"github.com/kubefill/kubefill/pkg/pki"
	"github.com/kubefill/kubefill/pkg/workermetrics"
)

// Progress publishes clone progress as CDI's cloner does: the counter
// kubevirt_cdi_clone_progress_total{ownerUID} holding the percentage.
type Progress struct {
	*workermetrics.Progress
}

// NewProgress registers the counter on reg, at 0.
func NewProgress(reg prometheus.Registerer, ownerUID string) (*Progress, error) {
	p, err := workermetrics.NewProgress(reg, contract.CloneProgressMetric, "The clone progress in percentage", ownerUID)
	if err != nil {
		return nil, err
	}
	return &Progress{p}, nil
}

// maxBeforeDone is the highest percentage shown before the upload server
// has answered: the last bytes may still be in flight or being fsynced.
const maxBeforeDone = 99.9

// Update shows done/total, below 100% (Done shows 100%).
func (p *Progress) Update(done, total int64) {
	if total <= 0 {
		return
	}
	p.Set(min(100*float64(done)/float64(total), maxBeforeDone))
}

// Done shows 100%: the upload server has the data.
func (p *Progress) Done() { p.Set(100) }

// MetricsServer serves a registry over HTTPS on any path, with a
// self-signed certificate (the controller scrapes it without verifying, as
// CDI's does).
type MetricsServer = workermetrics.Server

// StartMetrics listens on addr and serves reg.
func StartMetrics(addr string, reg *prometheus.Registry) (*MetricsServer, error) {
	return workermetrics.Start(addr, reg, workermetrics.ServerOptions{
		TLS: pki.ServingOptions{GeneratedName: "kubefill-cloner", GeneratedHosts: []string{"localhost", "127.0.0.1"}},
	})
}
