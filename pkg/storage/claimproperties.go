package storage

import (
	"fmt"
	"sort"

	corev1 "k8s.io/api/core/v1"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

// accessModeRank and volumeModeRank order derived claim properties: shared
// access and raw block first, as the table does.
var (
	accessModeRank = map[corev1.PersistentVolumeAccessMode]int{
		corev1.ReadWriteMany: 0, corev1.ReadWriteOnce: 1, corev1.ReadOnlyMany: 2, corev1.ReadWriteOncePod: 3,
	}
	volumeModeRank = map[corev1.PersistentVolumeMode]int{corev1.PersistentVolumeBlock: 0, corev1.PersistentVolumeFilesystem: 1}
)

// ClaimPropertySetsFromVolumes derives the claim properties of a class
// without a provisioner from the PersistentVolumes made by hand for it: one
// set per access mode and volume mode found, shared access and Block first.
// It returns nil when no volume of the class exists.
func ClaimPropertySetsFromVolumes(className string, pvs []corev1.PersistentVolume) []cdiv1.ClaimPropertySet {
	found := map[volumeAdvice]bool{}
	for i := range pvs {
		if pvs[i].Spec.StorageClassName != className {
			continue
		}
		volumeMode := corev1.PersistentVolumeFilesystem
		if pvs[i].Spec.VolumeMode != nil {
			volumeMode = *pvs[i].Spec.VolumeMode
		}
		for _, m := range pvs[i].Spec.AccessModes {
			found[volumeAdvice{m, volumeMode}] = true
		}
	}
	if len(found) == 0 {
		return nil
	}
	advice := make([]volumeAdvice, 0, len(found))
	for a := range found {
		advice = append(advice, a)
	}
	sort.Slice(advice, func(i, j int) bool {
		if advice[i].mode != advice[j].mode {
			return accessModeRank[advice[i].mode] < accessModeRank[advice[j].mode]
		}
		return volumeModeRank[advice[i].volume] < volumeModeRank[advice[j].volume]
	})
	sets := make([]cdiv1.ClaimPropertySet, 0, len(advice))
	for _, a := range advice {
		volumeMode := a.volume
		sets = append(sets, cdiv1.ClaimPropertySet{AccessModes: []corev1.PersistentVolumeAccessMode{a.mode}, VolumeMode: &volumeMode})
	}
	return sets
}

// ValidateClaimPropertySets returns an error naming the first set that lacks
// an access mode or a volume mode.
func ValidateClaimPropertySets(sets []cdiv1.ClaimPropertySet) error {
	for i, set := range sets {
		if len(set.AccessModes) == 0 {
			return fmt.Errorf("spec.claimPropertySets[%d] has no accessModes; give at least one", i)
		}
		if set.VolumeMode == nil || *set.VolumeMode == "" {
			return fmt.Errorf("spec.claimPropertySets[%d] has no volumeMode; give Filesystem or Block", i)
		}
	}
	return nil
}

// ClaimPropertySetsComplete reports whether sets are enough to complete a
// DataVolume's spec.storage: at least one, each with access and volume modes.
func ClaimPropertySetsComplete(sets []cdiv1.ClaimPropertySet) bool {
	return len(sets) > 0 && ValidateClaimPropertySets(sets) == nil
}
