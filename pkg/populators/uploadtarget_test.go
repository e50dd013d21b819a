package populators

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

func TestIsUploadTarget(t *testing.T) {
	annotated := map[string]string{cdiv1.AnnUploadRequest: ""}
	ref := &corev1.TypedObjectReference{APIGroup: ptr.To(cdiv1.GroupName), Kind: cdiv1.VolumeUploadSourceRef, Name: "src"}
	for _, tc := range []struct {
		name string
		pvc  corev1.PersistentVolumeClaim
		want bool
	}{
		{"virtctl image-upload pvc: annotated, no dataSourceRef", corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Annotations: annotated}}, true},
		{"plain claim", corev1.PersistentVolumeClaim{}, false},
		{"the upload populator's prime", corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{
			cdiv1.AnnUploadRequest: "", cdiv1.AnnPopulatorKind: cdiv1.VolumeUploadSourceRef}}}, false},
		{"annotated but populated through a VolumeUploadSource", corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Annotations: annotated}, Spec: corev1.PersistentVolumeClaimSpec{DataSourceRef: ref}}, false},
		{"annotated but restored from a snapshot", corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Annotations: annotated}, Spec: corev1.PersistentVolumeClaimSpec{DataSource: &corev1.TypedLocalObjectReference{Kind: "VolumeSnapshot", Name: "s"}}}, false},
	} {
		if got := IsUploadTarget(&tc.pvc); got != tc.want {
			t.Errorf("%s: IsUploadTarget = %v, want %v", tc.name, got, tc.want)
		}
	}
}
