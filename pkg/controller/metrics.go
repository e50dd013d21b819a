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

// highRestartThreshold is the restart count above which CDI's recording
// rules call a population workload's restarts unusual.
const highRestartThreshold = 3

// highRestartDesc counts, by kind, the DataVolumes whose worker failed and
// was started again more than highRestartThreshold times. CDI's recording
// rules count container restarts of its pods, which restart in place;
// Kubefill replaces a failed worker pod, so its container restarts stay 0
// and the rules read this gauge instead (CDIDataVolumeUnusualRestartCount
// fires on them).
var highRestartDesc = prometheus.NewDesc("kubevirt_cdi_datavolume_high_restart",
	"Number of unfinished DataVolumes whose worker was restarted more than 3 times, by kind (import, upload, clone)", []string{"kind"}, nil)

// restartCollector reads the DataVolumes from the manager's cache at scrape time.
type restartCollector struct {
	reader client.Reader
}

func (r restartCollector) Describe(ch chan<- *prometheus.Desc) { ch <- highRestartDesc }

func (r restartCollector) Collect(ch chan<- prometheus.Metric) {
	list := &cdiv1.DataVolumeList{}
	if err := r.reader.List(context.Background(), list); err != nil {
		ch <- prometheus.NewInvalidMetric(highRestartDesc, err)
		return
	}
	counts := CountHighRestarts(list.Items)
	for _, k := range sourceKinds {
		ch <- prometheus.MustNewConstMetric(highRestartDesc, prometheus.GaugeValue, float64(counts[k.name]), k.name)
	}
}

// CountHighRestarts counts, by kind name, the DataVolumes not yet
// Succeeded or Failed whose restartCount is above the threshold: the
// workloads CDI's rules would find restarting now.
func CountHighRestarts(dvs []cdiv1.DataVolume) map[string]int {
	counts := map[string]int{}
	for i := range dvs {
		dv := &dvs[i]
		if dv.Status.Phase == cdiv1.Succeeded || dv.Status.Phase == cdiv1.Failed || dv.Status.RestartCount <= highRestartThreshold {
			continue
		}
		counts[reportingKindOf(dv).name]++
	}
	return counts
}
