package controller

import (
	"testing"

	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/storage"
)

func TestProfileMetricLabels(t *testing.T) {
	snapshot, copyStrategy := cdiv1.CloneStrategySnapshot, cdiv1.CloneStrategyHostAssisted
	vscName := "vsc"
	sc := &storagev1.StorageClass{
		ObjectMeta:  metav1.ObjectMeta{Name: "fast", Annotations: map[string]string{cdiv1.AnnDefaultStorageClass: "true"}},
		Provisioner: "rook-ceph.rbd.csi.ceph.com",
	}
	status := cdiv1.StorageProfileStatus{ClaimPropertySets: storage.ClaimPropertySetsFor(sc.Provisioner, nil), CloneStrategy: &snapshot, SnapshotClass: &vscName}
	got := ProfileMetricLabels(sc, status, storage.SmartCloneFor(status, false))
	want := map[string]string{
		"storageclass": "fast", "provisioner": "rook-ceph.rbd.csi.ceph.com", "clone_strategy": "snapshot", "complete": "true",
		"default": "true", "virtdefault": "false", "rwx": "true", "smartclone": "true", "degraded": "false",
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("label %s = %q, want %q", k, got[k], v)
		}
	}
	if len(got) != len(want) {
		t.Errorf("labels %v, want exactly %v", got, want)
	}

	odd := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "odd", Annotations: map[string]string{cdiv1.AnnDefaultVirtStorageClass: "true"}}, Provisioner: "example.com/odd"}
	got = ProfileMetricLabels(odd, cdiv1.StorageProfileStatus{CloneStrategy: &copyStrategy}, false)
	if got["complete"] != "false" || got["virtdefault"] != "true" || got["default"] != "false" || got["degraded"] != "true" || got["clone_strategy"] != "copy" {
		t.Errorf("unknown provisioner labels = %v", got)
	}
	bucket := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "b"}, Provisioner: "openshift-storage.noobaa.io/obc"}
	if got := ProfileMetricLabels(bucket, cdiv1.StorageProfileStatus{}, false); got["complete"] != "true" {
		t.Errorf("unsupported provisioner counted incomplete: %v", got)
	}
}
