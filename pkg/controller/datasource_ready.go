package controller

import (
	"fmt"
	"regexp"

	snapshotv1 "github.com/kubernetes-csi/external-snapshotter/client/v6/apis/volumesnapshot/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

// The Ready reasons and messages of a DataSource, CDI's (v1.62, and v1.63+
// for the spec.source.dataSource ones).
const (
	DataSourceReasonReady          = "Ready"
	DataSourceReasonNoSource       = "NoSource"
	DataSourceReasonNotFound       = "NotFound"
	DataSourceReasonSnapshotNotRdy = "SnapshotNotReady"
	DataSourceReasonMaxDepth       = "MaxReferenceDepthReached"
	DataSourceReasonSelfReference  = "SelfReference"
	DataSourceReasonCrossNamespace = "CrossNamespaceReference"

	DataSourceMessageReady          = "DataSource is ready to be consumed"
	DataSourceMessageNoSource       = "No source PVC set"
	DataSourceMessagePVCNotFound    = "PVC not found"
	DataSourceMessageSnapNotFound   = "Snapshot not found"
	DataSourceMessageSnapNotReady   = "Snapshot phase is not ready"
	DataSourceMessageMaxDepth       = "DataSource reference chain exceeds maximum depth of 1"
	DataSourceMessageSelfReference  = "DataSource cannot self-reference"
	DataSourceMessageCrossNamespace = "DataSource cannot reference a DataSource in another namespace"
)

// copiedLabel matches the label keys a Ready DataSource takes from its
// source (DataVolume and claim, or snapshot): every *.kubevirt.io/ and
// kubevirt.io/ key, such as instancetype.kubevirt.io/default-preference.
var copiedLabel = regexp.MustCompile(`^([\w.]+\.kubevirt.io|kubevirt.io)/[\w-]+$`)

// DataSourceObservation is what the controller read for a DataSource: the
// DataSource its spec.source.dataSource names, and the DataVolume and claim,
// or the snapshot, its effective source names. A nil field was not found
// (or not looked for).
type DataSourceObservation struct {
	Referenced *cdiv1.DataSource
	DataVolume *cdiv1.DataVolume
	Claim      *corev1.PersistentVolumeClaim
	Snapshot   *snapshotv1.VolumeSnapshot
}

// DataSourceReadiness is the computed Ready condition, the resolved source
// for status.source (empty unless Ready), and the labels to copy onto the
// DataSource.
type DataSourceReadiness struct {
	Status  corev1.ConditionStatus
	Reason  string
	Message string
	Source  cdiv1.DataSourceSource
	Labels  map[string]string
}

// DataSourceReference is the DataSource that ds's spec.source.dataSource
// names, when it should be read: ok is false when there is no reference, or
// when it is refused without reading anything (another namespace, or ds
// itself). Pure.
func DataSourceReference(ds *cdiv1.DataSource) (key types.NamespacedName, ok bool) {
	ref := ds.Spec.Source.DataSource
	if ref == nil {
		return key, false
	}
	key = types.NamespacedName{Namespace: orNamespace(ref.Namespace, ds.Namespace), Name: ref.Name}
	if key.Namespace != ds.Namespace || key.Name == ds.Name {
		return key, false
	}
	return key, true
}

// EffectiveDataSourceSource is the pvc or snapshot source ds stands for:
// its own spec.source, or the spec.source of the DataSource it references
// (one hop). nil when it cannot be known (no source, a refused or missing
// reference, a reference to another reference). Pure.
func EffectiveDataSourceSource(ds *cdiv1.DataSource, referenced *cdiv1.DataSource) *cdiv1.DataSourceSource {
	if ds.Spec.Source.DataSource == nil {
		return &ds.Spec.Source
	}
	if _, ok := DataSourceReference(ds); !ok || referenced == nil || referenced.Spec.Source.DataSource != nil {
		return nil
	}
	return &referenced.Spec.Source
}

// ComputeDataSourceReady decides a DataSource's Ready condition as CDI does:
//   - spec.source.dataSource: refused when it names another namespace, the
//     DataSource itself, a DataSource that is not there, or one that is itself
//     a reference; otherwise the referenced DataSource's pvc or snapshot
//     counts as this one's;
//   - a pvc: with a DataVolume of the same name, Ready once it Succeeded, else
//     not Ready with the DataVolume's phase as reason; with none, Ready when
//     the claim exists;
//   - a snapshot: Ready when readyToUse.
//
// Pure.
func ComputeDataSourceReady(ds *cdiv1.DataSource, obs DataSourceObservation) DataSourceReadiness {
	notReady := func(reason, msg string) DataSourceReadiness {
		return DataSourceReadiness{Status: corev1.ConditionFalse, Reason: reason, Message: msg}
	}
	if ref := ds.Spec.Source.DataSource; ref != nil {
		key, ok := DataSourceReference(ds)
		switch {
		case key.Namespace != ds.Namespace:
			return notReady(DataSourceReasonCrossNamespace, DataSourceMessageCrossNamespace)
		case !ok:
			return notReady(DataSourceReasonSelfReference, DataSourceMessageSelfReference)
		case obs.Referenced == nil:
			// The API's NotFound error text, as CDI reports it.
			return notReady(DataSourceReasonNotFound, fmt.Sprintf("datasources.%s %q not found", cdiv1.GroupName, key.Name))
		case obs.Referenced.Spec.Source.DataSource != nil:
			return notReady(DataSourceReasonMaxDepth, DataSourceMessageMaxDepth)
		}
	}
	src := EffectiveDataSourceSource(ds, obs.Referenced)
	ready := DataSourceReadiness{Status: corev1.ConditionTrue, Reason: DataSourceReasonReady, Message: DataSourceMessageReady,
		Source: *src.DeepCopy(), Labels: map[string]string{}}
	switch {
	case src.PVC != nil:
		switch dv := obs.DataVolume; {
		case dv != nil && dv.Status.Phase != cdiv1.Succeeded:
			return notReady(string(dv.Status.Phase), fmt.Sprintf("Import DataVolume phase %s", dv.Status.Phase))
		case dv == nil && obs.Claim == nil:
			return notReady(DataSourceReasonNotFound, DataSourceMessagePVCNotFound)
		}
		if obs.DataVolume != nil {
			copyAllowedLabels(ready.Labels, obs.DataVolume.Labels)
		}
		if obs.Claim != nil {
			copyAllowedLabels(ready.Labels, obs.Claim.Labels)
		}
	case src.Snapshot != nil:
		snap := obs.Snapshot
		switch {
		case snap == nil:
			return notReady(DataSourceReasonNotFound, DataSourceMessageSnapNotFound)
		case snap.Status == nil || snap.Status.ReadyToUse == nil || !*snap.Status.ReadyToUse:
			return notReady(DataSourceReasonSnapshotNotRdy, DataSourceMessageSnapNotReady)
		}
		copyAllowedLabels(ready.Labels, snap.Labels)
	default:
		return notReady(DataSourceReasonNoSource, DataSourceMessageNoSource)
	}
	return ready
}

// copyAllowedLabels copies into dst the labels of src that a DataSource takes.
func copyAllowedLabels(dst, src map[string]string) {
	for k, v := range src {
		if copiedLabel.MatchString(k) {
			dst[k] = v
		}
	}
}

// WithDataSourceLabels returns labels with the copied ones set (they win
// over existing values) and whether anything changed. Pure.
func WithDataSourceLabels(labels, copied map[string]string) (map[string]string, bool) {
	changed := false
	for k, v := range copied {
		if cur, ok := labels[k]; ok && cur == v {
			continue
		}
		if labels == nil {
			labels = map[string]string{}
		}
		labels[k] = v
		changed = true
	}
	return labels, changed
}

// WithDataSourceReady returns status with the Ready condition and the
// resolved source of r, and whether it changed. As CDI's conditions do, the
// transition time moves only when the status flips, and the heartbeat
// whenever status, reason or message change. Pure.
func WithDataSourceReady(status cdiv1.DataSourceStatus, r DataSourceReadiness, now metav1.Time) (cdiv1.DataSourceStatus, bool) {
	out := *status.DeepCopy()
	changed := false
	if !sameDataSourceSource(out.Source, r.Source) {
		out.Source = *r.Source.DeepCopy()
		changed = true
	}
	i := -1
	for j := range out.Conditions {
		if out.Conditions[j].Type == cdiv1.DataSourceReady {
			i = j
			break
		}
	}
	if i < 0 {
		out.Conditions = append(out.Conditions, cdiv1.DataSourceCondition{Type: cdiv1.DataSourceReady})
		i = len(out.Conditions) - 1
	}
	c := &out.Conditions[i].ConditionState
	if c.Status != r.Status || c.Reason != r.Reason || c.Message != r.Message {
		if c.Status != r.Status {
			c.Status = r.Status
			c.LastTransitionTime = now
		}
		c.LastHeartbeatTime = now
		c.Reason, c.Message = r.Reason, r.Message
		changed = true
	}
	return out, changed
}

func sameDataSourceSource(a, b cdiv1.DataSourceSource) bool {
	eq := func(x, y *cdiv1.DataVolumeSourcePVC) bool { return (x == nil) == (y == nil) && (x == nil || *x == *y) }
	eqSnap := func(x, y *cdiv1.DataVolumeSourceSnapshot) bool {
		return (x == nil) == (y == nil) && (x == nil || *x == *y)
	}
	eqRef := func(x, y *cdiv1.DataSourceRefSourceDataSource) bool {
		return (x == nil) == (y == nil) && (x == nil || *x == *y)
	}
	return eq(a.PVC, b.PVC) && eqSnap(a.Snapshot, b.Snapshot) && eqRef(a.DataSource, b.DataSource)
}

func orNamespace(ns, def string) string {
	if ns == "" {
		return def
	}
	return ns
}
