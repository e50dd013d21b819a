package controller

import (
	"regexp"

	"github.com/prometheus/client_golang/prometheus"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

// crReady is CDI's kubevirt_cdi_cr_ready: 1 while the honoured CDI resource
// is Available, 0 once it is neither Available nor Progressing (the
// CDINotReady alert fires on 0 for 5 minutes), and -1 until the first
// reconcile, so that a controller that has not looked yet does not alert.
var crReady = prometheus.NewGauge(prometheus.GaugeOpts{
	Name: "kubevirt_cdi_cr_ready",
	Help: "CDI install ready",
})

func init() { crReady.Set(-1) }

// CRReadyValue is the value kubevirt_cdi_cr_ready takes for a status, and
// whether it changes at all: a resource still Progressing keeps the old value.
func CRReadyValue(st cdiv1.CDIStatus) (float64, bool) {
	switch {
	case CDIConditionTrue(st, cdiv1.CDIConditionAvailable):
		return 1, true
	case !CDIConditionTrue(st, cdiv1.CDIConditionProgressing):
		return 0, true
	}
	return 0, false
}

func setCRReady(st cdiv1.CDIStatus) {
	if v, ok := CRReadyValue(st); ok {
		crReady.Set(v)
	}
}

// CDICollectors are the controller's CDI-resource metrics, registered by the manager.
func CDICollectors() []prometheus.Collector { return []prometheus.Collector{crReady} }

// fqNamePattern reads a metric's name from its Desc (client_golang's
// Desc.String() is `Desc{fqName: "<name>", ...}`).
var fqNamePattern = regexp.MustCompile(`fqName: "([^"]+)"`)

// ControllerMetricNames are the names of the metrics the controller
// exports from its own collectors: the CDI resource's readiness, pending
// DataVolumes, DataVolumes restarting unusually often and the StorageProfile
// info series.
func ControllerMetricNames() []string {
	ch := make(chan *prometheus.Desc, 16)
	go func() {
		for _, c := range append(CDICollectors(), pendingCollector{}, restartCollector{}, storageProfileInfo) {
			c.Describe(ch)
		}
		close(ch)
	}()
	var names []string
	for d := range ch {
		if m := fqNamePattern.FindStringSubmatch(d.String()); m != nil {
			names = append(names, m[1])
		}
	}
	return names
}
