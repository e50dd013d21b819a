package controller

import (
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/clone"
	"github.com/kubefill/kubefill/pkg/token"
)

// Rendering a clone DataVolume's VolumeCloneSource and claim: pure
// functions, table-tested.

// Event reasons of a clone DataVolume, CDI's.
const (
	EventCloneWithoutSource    = "CloneWithoutSource"
	EventCloneValidationFailed = clone.EventCloneValidationFailed
	EventCloneSucceeded        = "CloneSucceeded"
)

// CloneSource is what a clone DataVolume copies, after following a sourceRef.
type CloneSource struct {
	Snapshot  bool
	Namespace string
	Name      string
}

// word is the source's kind as CDI's messages name it.
func (s CloneSource) word() string {
	if s.Snapshot {
		return "snapshot"
	}
	return "pvc"
}

// kind is the source's Kubernetes kind, for messages.
func (s CloneSource) kind() string {
	if s.Snapshot {
		return "VolumeSnapshot"
	}
	return "PersistentVolumeClaim"
}

// Resource is the source's resource as clone tokens name it.
func (s CloneSource) Resource() metav1.GroupVersionResource {
	if s.Snapshot {
		return token.ResourceVolumeSnapshot
	}
	return token.ResourcePVC
}

// Ref is the VolumeCloneSource's spec.source for it.
func (s CloneSource) Ref() corev1.TypedLocalObjectReference {
	if s.Snapshot {
		return corev1.TypedLocalObjectReference{APIGroup: ptr.To("snapshot.storage.k8s.io"), Kind: "VolumeSnapshot", Name: s.Name}
	}
	return corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: s.Name}
}

// IsClone reports whether a DataVolume clones: spec.source.pvc or
// spec.source.snapshot, or a sourceRef to a DataSource.
func IsClone(dv *cdiv1.DataVolume) bool {
	if ref := dv.Spec.SourceRef; ref != nil {
		return dv.Spec.Source == nil && ref.Kind == cdiv1.DataVolumeDataSource
	}
	s := dv.Spec.Source
	return s != nil && (s.PVC != nil || s.Snapshot != nil)
}

// CloneSourceName is the name of the VolumeCloneSource a DataVolume has,
// in the source's namespace.
func CloneSourceName(dv *cdiv1.DataVolume) string {
	return "volume-clone-source-" + string(dv.UID)
}

// cloneSourceOf returns the source a pvc or snapshot pair names; an empty
// namespace is defNS. nil when the pair names nothing.
func cloneSourceOf(pvc *cdiv1.DataVolumeSourcePVC, snap *cdiv1.DataVolumeSourceSnapshot, defNS string) *CloneSource {
	or := func(ns string) string {
		if ns == "" {
			return defNS
		}
		return ns
	}
	switch {
	case pvc != nil:
		return &CloneSource{Namespace: or(pvc.Namespace), Name: pvc.Name}
	case snap != nil:
		return &CloneSource{Snapshot: true, Namespace: or(snap.Namespace), Name: snap.Name}
	}
	return nil
}

// DirectCloneSource is the source spec.source names; nil for a sourceRef
// or a DataVolume that does not clone.
func DirectCloneSource(dv *cdiv1.DataVolume) *CloneSource {
	if dv.Spec.Source == nil {
		return nil
	}
	return cloneSourceOf(dv.Spec.Source.PVC, dv.Spec.Source.Snapshot, dv.Namespace)
}

// DataSourceNotReady returns why a DataSource cannot be cloned from yet, ""
// when it can: a Ready condition that is not True. A DataSource with no
// Ready condition yet (the DataSource controller has not seen it) is used
// as its spec says, as CDI's DataVolume controller uses spec.source.
func DataSourceNotReady(ds *cdiv1.DataSource) string {
	for _, c := range ds.Status.Conditions {
		if c.Type != cdiv1.DataSourceReady || c.Status == corev1.ConditionTrue {
			continue
		}
		msg := fmt.Sprintf("DataSource %s/%s is not ready (Ready=%s", ds.Namespace, ds.Name, c.Status)
		if c.Reason != "" {
			msg += ", " + c.Reason
		}
		if c.Message != "" {
			msg += ": " + c.Message
		}
		return msg + "); the DataVolume waits until it is"
	}
	return ""
}

// CloneSourceSpecFor renders the VolumeCloneSource spec of a clone of src.
func CloneSourceSpecFor(dv *cdiv1.DataVolume, src CloneSource) cdiv1.VolumeCloneSourceSpec {
	spec := cdiv1.VolumeCloneSourceSpec{Source: src.Ref(), Preallocation: dv.Spec.Preallocation}
	if dv.Spec.PriorityClassName != "" {
		spec.PriorityClassName = ptr.To(dv.Spec.PriorityClassName)
	}
	return *spec.DeepCopy()
}

// CloneSize is what the size rules need about the source.
type CloneSize struct {
	// Size is the source claim's status.capacity or the snapshot's
	// status.restoreSize; nil when not known yet.
	Size *resource.Quantity
	// Minimum is what the target must not be smaller than: the source
	// claim's request, or the restoreSize; nil when unknown.
	Minimum *resource.Quantity
	// Mode is the source's volume mode; nil when the source does not say (a
	// snapshot then counts as of the target's mode).
	Mode *corev1.PersistentVolumeMode
}

// errSizeUnknown says a sizeless clone must wait for the source's size.
var errSizeUnknown = errors.New("the source's size is not known yet")

// cloneRefusal is a clone that cannot work as asked (CloneValidationFailed).
type cloneRefusal struct{ msg string }

func (e *cloneRefusal) Error() string { return e.msg }

// SizelessCloneSize is the request of a sizeless clone into a target of
// mode target: the source's size, inflated by the filesystem overhead where
// a Block source fills a Filesystem target, so that the whole device fits
// in disk.img.
func SizelessCloneSize(src CloneSize, target corev1.PersistentVolumeMode, overhead float64) (resource.Quantity, error) {
	if src.Size == nil || src.Size.IsZero() {
		return resource.Quantity{}, errSizeUnknown
	}
	srcMode := target
	if src.Mode != nil {
		srcMode = *src.Mode
	}
	if srcMode != corev1.PersistentVolumeBlock || target != corev1.PersistentVolumeFilesystem {
		return src.Size.DeepCopy(), nil
	}
	grown, err := clone.SizeWithOverhead(src.Size.Value(), overhead)
	if err != nil {
		return resource.Quantity{}, err
	}
	return *resource.NewQuantity(grown, resource.BinarySI), nil
}

// RenderCloneClaimSpec renders a clone DataVolume's claim spec: as
// RenderClaimSpec, except that a claim with no size takes the source's
// (SizelessCloneSize), and that a target smaller than the source is refused
// (a *cloneRefusal) unless the DataVolume is annotated permissiveClone.
// errSizeUnknown says to wait for the source's size.
func RenderCloneClaimSpec(dv *cdiv1.DataVolume, profile *cdiv1.StorageProfile, storageClass string, overhead float64, src CloneSize) (*corev1.PersistentVolumeClaimSpec, error) {
	spec, err := renderClaimSpec(dv, profile, storageClass, overhead, func(mode corev1.PersistentVolumeMode) (resource.Quantity, error) {
		return SizelessCloneSize(src, mode, overhead)
	})
	if err != nil {
		return nil, err
	}
	if dv.Annotations[cdiv1.AnnPermissiveClone] == "true" || src.Minimum == nil {
		return spec, nil
	}
	target := spec.Resources.Requests[corev1.ResourceStorage]
	if target.Cmp(*src.Minimum) < 0 {
		return nil, &cloneRefusal{fmt.Sprintf("target resources requests storage size is smaller than the source %d < %d: the claim would get %s, the source needs %s; ask for at least %s",
			target.Value(), src.Minimum.Value(), target.String(), src.Minimum.String(), src.Minimum.String())}
	}
	return spec, nil
}

// CloneClaimAnnotations are the annotations of a clone's claim on top of
// claimAnnotations: permissiveClone, and for a clone from another namespace
// the source's namespace. Unlike CDI, the DataVolume's short token is not
// copied: the populator accepts on a claim only the extended token bound
// to the claim's UID, which annotateClaimToken adds once the claim exists,
// so a copy would only spread a bearer credential.
func CloneClaimAnnotations(dv *cdiv1.DataVolume, src CloneSource) map[string]string {
	ann := claimAnnotations(dv)
	if v, ok := dv.Annotations[cdiv1.AnnPermissiveClone]; ok {
		ann[cdiv1.AnnPermissiveClone] = v
	}
	if src.Namespace != dv.Namespace {
		ann[cdiv1.AnnDataSourceNamespace] = src.Namespace
	}
	return ann
}

// cloneEvent is the Normal event for a clone DataVolume entering phase,
// with CDI's reason and text; ok is false for a phase with none.
func cloneEvent(phase cdiv1.DataVolumePhase, dv *cdiv1.DataVolume, src CloneSource) (reason, message string, ok bool) {
	switch phase {
	case cdiv1.CloneScheduled:
		return string(phase), fmt.Sprintf("Cloning from %s/%s into %s/%s scheduled", src.Namespace, src.Name, dv.Namespace, dv.Name), true
	case cdiv1.CloneInProgress:
		return string(phase), fmt.Sprintf("Cloning from %s/%s into %s/%s in progress", src.Namespace, src.Name, dv.Namespace, dv.Name), true
	case cdiv1.SnapshotForSmartCloneInProgress:
		return string(phase), fmt.Sprintf("Creating snapshot for smart-clone is in progress (for pvc %s/%s)", src.Namespace, src.Name), true
	case cdiv1.CloneFromSnapshotSourceInProgress:
		return string(phase), fmt.Sprintf("Creating PVC from snapshot source is in progress (for %s %s/%s)", src.word(), src.Namespace, src.Name), true
	case cdiv1.CSICloneInProgress:
		return string(phase), fmt.Sprintf("CSI Volume clone in progress (for pvc %s/%s)", src.Namespace, src.Name), true
	case cdiv1.PrepClaimInProgress:
		return string(phase), fmt.Sprintf("Prepping PersistentVolumeClaim for DataVolume %s/%s", dv.Namespace, dv.Name), true
	case cdiv1.RebindInProgress:
		return string(phase), fmt.Sprintf("Rebinding PersistentVolumeClaim for DataVolume %s/%s", dv.Namespace, dv.Name), true
	case cdiv1.Succeeded:
		return EventCloneSucceeded, fmt.Sprintf("Successfully cloned from %s/%s into %s/%s", src.Namespace, src.Name, dv.Namespace, dv.Name), true
	}
	return "", "", false
}

// clonePhase is a clone DataVolume's phase before it succeeds: the claim's
// clonePhase mapped as CDI maps it; a claim that waits for its first
// consumer before the populator starts is PendingPopulation.
func clonePhase(w workerView) cdiv1.DataVolumePhase {
	if w.ClonePhase == "" && w.WaitsForConsumer {
		return cdiv1.PendingPopulation
	}
	if w.ClonePhase == string(clone.PhaseSucceeded) {
		// Done, but the claim is not bound to the volume yet.
		return cdiv1.RebindInProgress
	}
	current := w.Current
	if current == "" {
		current = cdiv1.Pending
	}
	return clone.DataVolumePhaseFor(w.ClonePhase, current)
}
