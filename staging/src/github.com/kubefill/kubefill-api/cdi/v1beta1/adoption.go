package v1beta1

import (
	"slices"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Decisions on binding and claim adoption, written once so that the
// controller, the populators and the webhooks agree, with CDI's semantics.

// ImmediateBindingRequested reports whether obj asks to bind without waiting
// for a first consumer: the annotation's presence counts, whatever its value
// (virtctl --force-bind and CDI's gate-off path write "").
func ImmediateBindingRequested(obj metav1.Object) bool {
	_, ok := obj.GetAnnotations()[AnnImmediateBinding]
	return ok
}

// FeatureGateEnabled reports whether config lists gate in spec.featureGates.
func FeatureGateEnabled(config *CDIConfig, gate string) bool {
	return config != nil && slices.Contains(config.Spec.FeatureGates, gate)
}

// HonorsWaitForFirstConsumer reports whether new claims may wait for their
// first consumer under config. No CDIConfig yet counts as Kubefill's default
// one, which lists the gate as CDI's release CDI resource does.
func HonorsWaitForFirstConsumer(config *CDIConfig) bool {
	return config == nil || FeatureGateEnabled(config, FeatureGateHonorWaitForFirstConsumer)
}

// DataVolumePrePopulated reports whether dv says its claim is filled by
// someone else: no claim is created for it, and it waits to adopt one.
func DataVolumePrePopulated(dv *DataVolume) bool {
	_, ok := dv.Annotations[AnnPrePopulated]
	return ok
}

// ClaimPopulatedFor reports whether pvc was filled for the DataVolume named
// dvName (storage.populatedFor), as a restored or copied claim is.
func ClaimPopulatedFor(pvc *corev1.PersistentVolumeClaim, dvName string) bool {
	v, ok := pvc.Annotations[AnnPopulatedFor]
	return ok && v == dvName
}

// AllowClaimAdoption reports whether dv may adopt an existing claim it does
// not own: the DataVolume's allowClaimAdoption annotation, read as a
// strconv.ParseBool ("1", "t", "True" count; an unreadable value refuses),
// or, with no annotation, the DataVolumeClaimAdoption gate.
func AllowClaimAdoption(dv *DataVolume, adoptionGate bool) bool {
	if v, ok := dv.Annotations[AnnAllowClaimAdoption]; ok {
		allow, _ := strconv.ParseBool(v)
		return allow
	}
	return adoptionGate
}

// ClaimMayExistBeforeDataVolume reports whether an existing claim of dv's
// name is dv's to take: populated for it, or adoption allowed. Whether the
// claim is already another controller's is checked apart.
func ClaimMayExistBeforeDataVolume(pvc *corev1.PersistentVolumeClaim, dv *DataVolume, adoptionGate bool) bool {
	return ClaimPopulatedFor(pvc, dv.Name) || AllowClaimAdoption(dv, adoptionGate)
}
