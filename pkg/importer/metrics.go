package importer

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kubefill/kubefill/pkg/contract"
	"github.com/kubefill/kubefill/pkg/pki"
	"github.com/kubefill/kubefill/pkg/workermetrics"
)

// Progress publishes import progress as CDI does: a counter labelled with
// the owner's UID whose value is the percentage done.
type Progress = workermetrics.Progress

// NewProgress registers the import progress counter on reg.
func NewProgress(reg prometheus.Registerer, ownerUID string) (*Progress, error) {
	return workermetrics.NewProgress(reg, contract.ImportProgressMetric, "The import progress in percentage", ownerUID)
}

// MetricsServer serves /metrics over TLS.
type MetricsServer = workermetrics.Server

// StartMetrics listens on addr and serves reg on /metrics over TLS. With
// empty certFile/keyFile it uses a fresh self-signed certificate, as CDI's
// importer does; Prometheus scrapes it with verification disabled.
func StartMetrics(addr, certFile, keyFile string, reg *prometheus.Registry) (*MetricsServer, error) {
	return workermetrics.Start(addr, reg, workermetrics.ServerOptions{
		Path: "/metrics",
		TLS: pki.ServingOptions{
			CertFile: certFile, KeyFile: keyFile,
			GeneratedName: "kubefill-importer", GeneratedHosts: []string{"localhost", "127.0.0.1"},
		},
	})
}
