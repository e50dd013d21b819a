package controller

import (
	"fmt"
	"math"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

// Rendering a DataVolume's claim: pure functions, table-tested.

// UploadSourceFor renders the VolumeUploadSource spec for an upload DataVolume.
func UploadSourceFor(dv *cdiv1.DataVolume) cdiv1.VolumeUploadSourceSpec {
	spec := cdiv1.VolumeUploadSourceSpec{ContentType: dv.Spec.ContentType, Preallocation: dv.Spec.Preallocation}
	return *spec.DeepCopy()
}

// ImportSourceFor renders the VolumeImportSource spec for an import DataVolume.
func ImportSourceFor(dv *cdiv1.DataVolume) cdiv1.VolumeImportSourceSpec {
	s := dv.Spec.Source
	spec := cdiv1.VolumeImportSourceSpec{
		Source: &cdiv1.ImportSourceType{
			HTTP: s.HTTP, S3: s.S3, GCS: s.GCS, Registry: s.Registry, Blank: s.Blank, Imageio: s.Imageio, VDDK: s.VDDK,
		},
		ContentType:   dv.Spec.ContentType,
		Preallocation: dv.Spec.Preallocation,
	}
	if len(dv.Spec.Checkpoints) > 0 {
		spec.Checkpoints = dv.Spec.Checkpoints
		final := dv.Spec.FinalCheckpoint
		spec.FinalCheckpoint = &final
	}
	return *spec.DeepCopy()
}

// RenderClaimSpec renders the claim spec for a DataVolume. spec.pvc is used
// as written; spec.storage is completed from the StorageProfile: access
// modes and volume mode from its first matching claim property set, and for
// Filesystem volumes a request grown by the filesystem overhead so that the
// image itself gets the size the user asked for.
func RenderClaimSpec(dv *cdiv1.DataVolume, profile *cdiv1.StorageProfile, storageClass string, overhead float64) (*corev1.PersistentVolumeClaimSpec, error) {
	return renderClaimSpec(dv, profile, storageClass, overhead, nil)
}

// renderClaimSpec is RenderClaimSpec where sizeless, when not nil, gives
// the request of a claim that names none (a clone's, from its source),
// from the claim's volume mode; that size is used as it comes, already
// allowing for the filesystem.
func renderClaimSpec(dv *cdiv1.DataVolume, profile *cdiv1.StorageProfile, storageClass string, overhead float64,
	sizeless func(corev1.PersistentVolumeMode) (resource.Quantity, error)) (*corev1.PersistentVolumeClaimSpec, error) {
	if dv.Spec.PVC != nil {
		spec := dv.Spec.PVC.DeepCopy()
		if size, ok := spec.Resources.Requests[corev1.ResourceStorage]; sizeless != nil && (!ok || size.IsZero()) {
			mode := corev1.PersistentVolumeFilesystem
			if spec.VolumeMode != nil {
				mode = *spec.VolumeMode
			}
			q, err := sizeless(mode)
			if err != nil {
				return nil, err
			}
			if spec.Resources.Requests == nil {
				spec.Resources.Requests = corev1.ResourceList{}
			}
			spec.Resources.Requests[corev1.ResourceStorage] = q
		}
		return spec, nil
	}
	st := dv.Spec.Storage
	if st == nil {
		return nil, fmt.Errorf("the DataVolume has neither spec.pvc nor spec.storage")
	}
	spec := &corev1.PersistentVolumeClaimSpec{
		AccessModes:   append([]corev1.PersistentVolumeAccessMode(nil), st.AccessModes...),
		Selector:      st.Selector.DeepCopy(),
		Resources:     *st.Resources.DeepCopy(),
		VolumeName:    st.VolumeName,
		VolumeMode:    st.VolumeMode,
		DataSource:    st.DataSource.DeepCopy(),
		DataSourceRef: st.DataSourceRef.DeepCopy(),
	}
	if storageClass != "" {
		spec.StorageClassName = &storageClass
	}
	if spec.VolumeMode != nil && *spec.VolumeMode == cdiv1.PersistentVolumeFromStorageProfile {
		spec.VolumeMode = nil
	}
	if len(spec.AccessModes) == 0 || spec.VolumeMode == nil {
		set, err := pickClaimPropertySet(profile, spec.VolumeMode, storageClass)
		if err != nil {
			return nil, err
		}
		if len(spec.AccessModes) == 0 {
			spec.AccessModes = append(spec.AccessModes, set.AccessModes...)
		}
		if spec.VolumeMode == nil {
			mode := *set.VolumeMode
			spec.VolumeMode = &mode
		}
	}
	size, ok := spec.Resources.Requests[corev1.ResourceStorage]
	if (!ok || size.IsZero()) && sizeless != nil {
		q, err := sizeless(*spec.VolumeMode)
		if err != nil {
			return nil, err
		}
		if spec.Resources.Requests == nil {
			spec.Resources.Requests = corev1.ResourceList{}
		}
		spec.Resources.Requests[corev1.ResourceStorage] = q
		return spec, nil
	}
	if !ok || size.IsZero() {
		return nil, fmt.Errorf("spec.storage.resources.requests.storage is missing: an import needs a size")
	}
	if *spec.VolumeMode == corev1.PersistentVolumeFilesystem {
		spec.Resources.Requests[corev1.ResourceStorage] = WithOverhead(size, overhead)
	}
	return spec, nil
}

// pickClaimPropertySet picks the profile's first claim property set, or the
// first of the wanted volume mode.
func pickClaimPropertySet(profile *cdiv1.StorageProfile, mode *corev1.PersistentVolumeMode, storageClass string) (cdiv1.ClaimPropertySet, error) {
	if profile == nil || len(profile.Status.ClaimPropertySets) == 0 {
		return cdiv1.ClaimPropertySet{}, fmt.Errorf("no accessModes or volumeMode given, and StorageProfile %q has no claimPropertySets to complete them: "+
			"set spec.storage.accessModes and volumeMode, or fill the StorageProfile's spec.claimPropertySets", storageClass)
	}
	for _, set := range profile.Status.ClaimPropertySets {
		if set.VolumeMode != nil && len(set.AccessModes) > 0 && (mode == nil || *set.VolumeMode == *mode) {
			return set, nil
		}
	}
	return cdiv1.ClaimPropertySet{}, fmt.Errorf("StorageProfile %q has no claimPropertySet for volumeMode %s", storageClass, *mode)
}

// WithOverhead grows a Filesystem request so that size bytes remain once
// the filesystem has taken its share, rounded up to a whole MiB.
func WithOverhead(size resource.Quantity, overhead float64) resource.Quantity {
	if overhead <= 0 || overhead >= 1 {
		return size
	}
	const mib = 1 << 20
	grown := math.Ceil(float64(size.Value()) / (1 - overhead))
	rounded := int64(math.Ceil(grown/mib)) * mib
	return *resource.NewQuantity(rounded, resource.BinarySI)
}
