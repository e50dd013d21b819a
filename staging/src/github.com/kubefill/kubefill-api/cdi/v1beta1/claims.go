package v1beta1

import corev1 "k8s.io/api/core/v1"

// Predicates on claims, written once next to the keys they read, so that the
// controller, the upload proxy and the token API server agree.

// RefersTo reports whether pvc's dataSourceRef names a cdi.kubevirt.io
// object of kind (VolumeImportSourceRef, VolumeUploadSourceRef, …).
func RefersTo(pvc *corev1.PersistentVolumeClaim, kind string) bool {
	ref := pvc.Spec.DataSourceRef
	return ref != nil && ref.APIGroup != nil && *ref.APIGroup == GroupName && ref.Kind == kind
}

// IsPrime reports whether pvc is a PVC-prime, a populator's temporary claim.
func IsPrime(pvc *corev1.PersistentVolumeClaim) bool {
	_, ok := pvc.Annotations[AnnPopulatorKind]
	return ok
}

// IsUploadTarget reports whether pvc accepts an upload at all: through the
// upload populator (a dataSourceRef to a VolumeUploadSource) or in place,
// annotated storage.upload.target.
func IsUploadTarget(pvc *corev1.PersistentVolumeClaim) bool {
	_, annotated := pvc.Annotations[AnnUploadRequest]
	return annotated || RefersTo(pvc, VolumeUploadSourceRef)
}

// IsInPlaceUploadTarget reports whether pvc asks for an upload the way CDI
// did before populators, and as `virtctl image-upload pvc` still does:
// annotated storage.upload.target with no data source. Such a claim is
// filled in place by an upload pod that mounts it; there is no prime. A
// PVC-prime carries the annotation too (clients follow
// storage.populator.pvcPrime to it), but its populator fills it.
func IsInPlaceUploadTarget(pvc *corev1.PersistentVolumeClaim) bool {
	_, annotated := pvc.Annotations[AnnUploadRequest]
	return annotated && !IsPrime(pvc) && pvc.Spec.DataSourceRef == nil && pvc.Spec.DataSource == nil
}

// UsesPopulator reports whether pvc is filled through a PVC-prime.
func UsesPopulator(pvc *corev1.PersistentVolumeClaim) bool {
	if _, ok := pvc.Annotations[AnnPVCPrimeName]; ok {
		return true
	}
	return pvc.Annotations[AnnUsePopulator] == "true" || RefersTo(pvc, VolumeUploadSourceRef) ||
		RefersTo(pvc, VolumeImportSourceRef) || RefersTo(pvc, VolumeCloneSourceRef)
}

// IsCompleted reports whether pvc holds its data: a populator handed it
// over (storage.populatedFor), or its in-place worker succeeded.
func IsCompleted(pvc *corev1.PersistentVolumeClaim) bool {
	if pvc == nil {
		return false
	}
	if _, ok := pvc.Annotations[AnnPopulatedFor]; ok {
		return true
	}
	return pvc.Annotations[AnnPodPhase] == string(corev1.PodSucceeded)
}

// ImporterPodName is CDI's name of the importer pod that fills claimName.
func ImporterPodName(claimName string) string { return "importer-" + claimName }

// ScratchClaimName is CDI's name of the scratch claim of the worker that
// fills claimName: <claim>-scratch, shortened as CDI's names are.
func ScratchClaimName(claimName string) string { return ResourceName(claimName, "scratch") }

// PrimeName is the name of the PVC-prime that fills the claim with uid.
func PrimeName(uid string) string { return "prime-" + uid }
