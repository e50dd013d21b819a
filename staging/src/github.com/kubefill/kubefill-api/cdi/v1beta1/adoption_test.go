package v1beta1

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestImmediateBindingRequested(t *testing.T) {
	for _, tc := range []struct {
		name string
		ann  map[string]string
		want bool
	}{
		{"no annotations", nil, false},
		{"other annotation", map[string]string{AnnPrePopulated: "x"}, false},
		{"true", map[string]string{AnnImmediateBinding: "true"}, true},
		{"empty, as virtctl --force-bind writes", map[string]string{AnnImmediateBinding: ""}, true},
		{"false still counts: presence decides", map[string]string{AnnImmediateBinding: "false"}, true},
	} {
		pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Annotations: tc.ann}}
		if got := ImmediateBindingRequested(pvc); got != tc.want {
			t.Errorf("%s: ImmediateBindingRequested = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestHonorsWaitForFirstConsumer(t *testing.T) {
	gates := func(g ...string) *CDIConfig { return &CDIConfig{Spec: CDIConfigSpec{FeatureGates: g}} }
	for _, tc := range []struct {
		name   string
		config *CDIConfig
		want   bool
	}{
		{"no CDIConfig yet: the default one lists the gate", nil, true},
		{"gate listed", gates(FeatureGateHonorWaitForFirstConsumer), true},
		{"gate listed among others", gates(FeatureGateDataVolumeClaimAdoption, FeatureGateHonorWaitForFirstConsumer), true},
		{"no gates", gates(), false},
		{"other gate only", gates(FeatureGateDataVolumeClaimAdoption), false},
		{"names are case-sensitive", gates("honorwaitforfirstconsumer"), false},
	} {
		if got := HonorsWaitForFirstConsumer(tc.config); got != tc.want {
			t.Errorf("%s: HonorsWaitForFirstConsumer = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestClaimMayExistBeforeDataVolume(t *testing.T) {
	dv := func(ann map[string]string) *DataVolume {
		return &DataVolume{ObjectMeta: metav1.ObjectMeta{Name: "disk", Annotations: ann}}
	}
	claim := func(ann map[string]string) *corev1.PersistentVolumeClaim {
		return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "disk", Annotations: ann}}
	}
	populated := claim(map[string]string{AnnPopulatedFor: "disk"})
	plain := claim(nil)
	for _, tc := range []struct {
		name string
		pvc  *corev1.PersistentVolumeClaim
		dv   *DataVolume
		gate bool
		want bool
	}{
		{"populated for this DataVolume", populated, dv(nil), false, true},
		{"populated for another DataVolume", claim(map[string]string{AnnPopulatedFor: "other"}), dv(nil), false, false},
		{"populated for it, adoption refused by annotation", populated, dv(map[string]string{AnnAllowClaimAdoption: "false"}), false, true},
		{"plain claim, nothing asks", plain, dv(nil), false, false},
		{"plain claim, annotation true", plain, dv(map[string]string{AnnAllowClaimAdoption: "true"}), false, true},
		{"annotation 1", plain, dv(map[string]string{AnnAllowClaimAdoption: "1"}), false, true},
		{"annotation t", plain, dv(map[string]string{AnnAllowClaimAdoption: "t"}), false, true},
		{"annotation True", plain, dv(map[string]string{AnnAllowClaimAdoption: "True"}), false, true},
		{"annotation yes is no bool: refused", plain, dv(map[string]string{AnnAllowClaimAdoption: "yes"}), true, false},
		{"gate on, no annotation", plain, dv(nil), true, true},
		{"gate on, annotation false wins", plain, dv(map[string]string{AnnAllowClaimAdoption: "false"}), true, false},
		{"gate off, annotation true wins", plain, dv(map[string]string{AnnAllowClaimAdoption: "true"}), false, true},
	} {
		if got := ClaimMayExistBeforeDataVolume(tc.pvc, tc.dv, tc.gate); got != tc.want {
			t.Errorf("%s: ClaimMayExistBeforeDataVolume = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestDataVolumePrePopulated(t *testing.T) {
	for ann, want := range map[string]bool{AnnPrePopulated: true, AnnPopulatedFor: false} {
		dv := &DataVolume{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{ann: ""}}}
		if got := DataVolumePrePopulated(dv); got != want {
			t.Errorf("annotation %s: DataVolumePrePopulated = %v, want %v", ann, got, want)
		}
	}
}
