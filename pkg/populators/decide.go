package populators

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

// The pure decisions of the populator flow: no I/O, table-tested.

// PrimeName is the name of the PVC-prime that fills target.
func PrimeName(target *corev1.PersistentVolumeClaim) string {
	return cdiv1.PrimeName(string(target.UID))
}

// Handles reports whether target asks to be filled by the populator of kind.
func Handles(target *corev1.PersistentVolumeClaim, kind string) bool {
	return cdiv1.RefersTo(target, kind)
}

// SourceNamespace is where target's populator source lives: for a
// VolumeCloneSource, the namespace cdi.kubevirt.io/dataSourceNamespace names
// (CDI's cross-namespace clone, authorised by a clone token); else the ref's
// namespace when set (cross-namespace refs, authorised by a ReferenceGrant);
// else the claim's.
func SourceNamespace(target *corev1.PersistentVolumeClaim) string {
	if ns := AnnotatedSourceNamespace(target); ns != "" {
		return ns
	}
	if ns := target.Spec.DataSourceRef.Namespace; ns != nil && *ns != "" {
		return *ns
	}
	return target.Namespace
}

// AnnotatedSourceNamespace is the namespace a clone target's
// cdi.kubevirt.io/dataSourceNamespace names, or "" when it names none (or
// the target is no clone): CDI's way to clone across namespaces.
func AnnotatedSourceNamespace(target *corev1.PersistentVolumeClaim) string {
	if !cdiv1.RefersTo(target, cdiv1.VolumeCloneSourceRef) {
		return ""
	}
	return target.Annotations[cdiv1.AnnDataSourceNamespace]
}

// UnsupportedClass explains why a StorageClass cannot back a populated
// claim, or returns "" when it can. Populators need a dynamic CSI provisioner:
// in-tree plugins and static classes never provision the prime.
func UnsupportedClass(sc *storagev1.StorageClass) string {
	switch {
	case sc.Provisioner == "kubernetes.io/no-provisioner":
		return fmt.Sprintf("StorageClass %s has no provisioner (kubernetes.io/no-provisioner); populators need a CSI driver that provisions volumes", sc.Name)
	case strings.HasPrefix(sc.Provisioner, "kubernetes.io/"):
		return fmt.Sprintf("StorageClass %s uses the in-tree provisioner %s; populators need a CSI driver", sc.Name, sc.Provisioner)
	}
	return ""
}

// WaitsForConsumer reports whether target must wait for the scheduler to
// pick a node before its prime may be created: the class binds on first
// consumer, no node is chosen yet, CDIConfig honours WaitForFirstConsumer
// (honorGate, cdiv1.HonorsWaitForFirstConsumer) and the claim does not ask
// for immediate binding (cdiv1.ImmediateBindingRequested, any value).
func WaitsForConsumer(target *corev1.PersistentVolumeClaim, sc *storagev1.StorageClass, honorGate bool) bool {
	if sc.VolumeBindingMode == nil || *sc.VolumeBindingMode != storagev1.VolumeBindingWaitForFirstConsumer {
		return false
	}
	if target.Annotations[cdiv1.AnnSelectedNode] != "" {
		return false
	}
	return honorGate && !cdiv1.ImmediateBindingRequested(target)
}

// NewPrime renders the PVC-prime for target: same access modes, volume mode,
// class and request, the node the scheduler chose, owned by target so the
// garbage collector removes it with target.
func NewPrime(target *corev1.PersistentVolumeClaim, kind string) *corev1.PersistentVolumeClaim {
	prime := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{
			Name:      PrimeName(target),
			Namespace: target.Namespace,
			Labels: map[string]string{
				cdiv1.LabelApp:          cdiv1.LabelAppValue,
				cdiv1.LabelOwnedByUID:   string(target.UID),
				cdiv1.LabelAppManagedBy: "kubefill",
			},
			Annotations: map[string]string{
				cdiv1.AnnPopulatorKind: kind,
			},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion:         "v1",
				Kind:               "PersistentVolumeClaim",
				Name:               target.Name,
				UID:                target.UID,
				Controller:         ptr.To(true),
				BlockOwnerDeletion: ptr.To(true),
			}},
		},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      append([]corev1.PersistentVolumeAccessMode(nil), target.Spec.AccessModes...),
			Resources:        *target.Spec.Resources.DeepCopy(),
			StorageClassName: target.Spec.StorageClassName,
			VolumeMode:       target.Spec.VolumeMode,
		},
	}
	for _, key := range append([]string{cdiv1.AnnSelectedNode, cdiv1.AnnPodRetainAfterCompletion, cdiv1.AnnPriorityClassName}, WorkerPodAnnotationKeys...) {
		if v, ok := target.Annotations[key]; ok {
			prime.Annotations[key] = v
		}
	}
	return prime
}

// RebindStep is what the rebind of a filled prime's volume must do next.
type RebindStep int

const (
	// RebindWait: the prime is not bound to a volume yet.
	RebindWait RebindStep = iota
	// RebindPatchClaimRef: point the volume's claimRef at the target.
	RebindPatchClaimRef
	// RebindWaitForBind: the claimRef names the target; the PV controller has yet to bind it.
	RebindWaitForBind
	// RebindDone: the target is bound to the filled volume; the prime may go.
	RebindDone
	// RebindConflict: the volume belongs to neither claim; stop and report.
	RebindConflict
)

// NextRebindStep decides the next rebind step from the prime, its volume and
// the target. It never lets the prime go before the target is bound to the
// very volume that holds the data.
func NextRebindStep(target, prime *corev1.PersistentVolumeClaim, pv *corev1.PersistentVolume) RebindStep {
	if target.Spec.VolumeName != "" && pv != nil && target.Spec.VolumeName == pv.Name && target.Status.Phase == corev1.ClaimBound {
		return RebindDone
	}
	if pv == nil {
		return RebindWait
	}
	ref := pv.Spec.ClaimRef
	switch {
	case ref == nil:
		return RebindConflict
	case ref.UID == target.UID && ref.Namespace == target.Namespace && ref.Name == target.Name:
		return RebindWaitForBind
	case prime != nil && ref.UID == prime.UID && ref.Namespace == prime.Namespace && ref.Name == prime.Name:
		return RebindPatchClaimRef
	}
	return RebindConflict
}

// FormatProgress renders a fraction as CDI's progress string, e.g. "45.20%".
// It never shows 100% unless done, so a user never sees a finished import
// that has not finished.
func FormatProgress(percent float64, done bool) string {
	if done {
		return "100.0%"
	}
	switch {
	case percent < 0:
		percent = 0
	case percent > 99.99:
		percent = 99.99
	}
	return fmt.Sprintf("%.2f%%", percent)
}

// HandedOver reports whether the prime's volume has started moving to the
// target (or the prime is going away). From then on the flow only rebinds
// and cleans up: it must never start a worker again, even when a stale cache
// shows the worker gone.
func HandedOver(target, prime *corev1.PersistentVolumeClaim) bool {
	return prime.DeletionTimestamp != nil ||
		prime.Status.Phase == corev1.ClaimLost ||
		target.Spec.VolumeName != "" ||
		target.Status.Phase == corev1.ClaimBound
}
