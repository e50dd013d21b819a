package controller

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

// pendingDesc is CDI's gauge of DataVolumes waiting on something, kept under
// its CDI name so existing dashboards and alerts keep working.
var pendingDesc = prometheus.NewDesc("kubevirt_cdi_datavolume_pending",
	"Number of DataVolumes pending for default storage class to be configured", nil, nil)

// pendingCollector counts Pending DataVolumes from the manager's cache at
// scrape time, so the figure can never drift from the objects.
type pendingCollector struct {
	reader client.Reader
}

func (p pendingCollector) Describe(ch chan<- *prometheus.Desc) { ch <- pendingDesc }

func (p pendingCollector) Collect(ch chan<- prometheus.Metric) {
	list := &cdiv1.DataVolumeList{}
	if err := p.reader.List(context.Background(), list); err != nil {
		ch <- prometheus.NewInvalidMetric(pendingDesc, err)
		return
	}
	ch <- prometheus.MustNewConstMetric(pendingDesc, prometheus.GaugeValue, float64(CountPending(list.Items)))
}

// CountPending counts the DataVolumes waiting on the default storage class,
// as CDI does: in phase Pending or with no phase yet, and naming no class
// in spec.pvc or spec.storage (an explicit "" names none, but is a choice).
func CountPending(dvs []cdiv1.DataVolume) int {
	n := 0
	for _, dv := range dvs {
		if (dv.Status.Phase == cdiv1.Pending || dv.Status.Phase == "") && usesDefaultClass(&dv) {
			n++
		}
	}
	return n
}

// usesDefaultClass says whether a DataVolume's spec leaves the class to the default.
func usesDefaultClass(dv *cdiv1.DataVolume) bool {
	switch {
	case dv.Spec.PVC != nil:
		return dv.Spec.PVC.StorageClassName == nil
	case dv.Spec.Storage != nil:
		return dv.Spec.Storage.StorageClassName == nil
	}
	return true
}
