package storage

import (
	"strings"
	"testing"

	snapshotv1 "github.com/kubernetes-csi/external-snapshotter/client/v6/apis/volumesnapshot/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

func strategyPtr(s cdiv1.CDICloneStrategy) *cdiv1.CDICloneStrategy { return &s }

func TestCloneStrategyFor(t *testing.T) {
	ann := func(v string) map[string]string { return map[string]string{cdiv1.AnnCloneStrategy: v} }
	tests := []struct {
		name        string
		spec        *cdiv1.CDICloneStrategy
		annotations map[string]string
		provisioner string
		params      map[string]string
		snapClass   string
		want        cdiv1.CDICloneStrategy
	}{
		{"no snapshot class gives copy", nil, nil, LocalTestDriver, nil, "", cdiv1.CloneStrategyHostAssisted},
		{"a snapshot class gives snapshot", nil, nil, LocalTestDriver, nil, "vsc", cdiv1.CloneStrategySnapshot},
		{"spec wins over everything", strategyPtr(cdiv1.CloneStrategyCsiClone), ann("copy"), LocalTestDriver, nil, "vsc", cdiv1.CloneStrategyCsiClone},
		{"spec snapshot kept without a class", strategyPtr(cdiv1.CloneStrategySnapshot), nil, LocalTestDriver, nil, "", cdiv1.CloneStrategySnapshot},
		{"annotation copy beats a snapshot class", nil, ann("copy"), LocalTestDriver, nil, "vsc", cdiv1.CloneStrategyHostAssisted},
		{"annotation csi-clone", nil, ann("csi-clone"), LocalTestDriver, nil, "", cdiv1.CloneStrategyCsiClone},
		{"annotation snapshot kept without a class", nil, ann("snapshot"), LocalTestDriver, nil, "", cdiv1.CloneStrategySnapshot},
		{"bad annotation ignored", nil, ann("teleport"), LocalTestDriver, nil, "vsc", cdiv1.CloneStrategySnapshot},
		{"empty annotation ignored", nil, ann(""), LocalTestDriver, nil, "", cdiv1.CloneStrategyHostAssisted},
		{"ceph rbd advises csi-clone", nil, nil, "rook-ceph.rbd.csi.ceph.com", nil, "", cdiv1.CloneStrategyCsiClone},
		{"topolvm advises copy over a snapshot class", nil, nil, "topolvm.io", nil, "vsc", cdiv1.CloneStrategyHostAssisted},
		{"gke advises snapshot and has a class", nil, nil, "pd.csi.storage.gke.io", nil, "vsc", cdiv1.CloneStrategySnapshot},
		{"gke advises snapshot but has no class", nil, nil, "pd.csi.storage.gke.io", nil, "", cdiv1.CloneStrategyHostAssisted},
		{"trident ontap-san variant", nil, nil, "csi.trident.netapp.io", map[string]string{"backendType": "ontap-san"}, "vsc", cdiv1.CloneStrategySnapshot},
		{"unknown driver with class", nil, nil, "example.com/x", nil, "vsc", cdiv1.CloneStrategySnapshot},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, from := CloneStrategyFor(tt.spec, tt.annotations, tt.provisioner, tt.params, tt.snapClass)
			if got != tt.want {
				t.Errorf("got %q (from %s), want %q", got, from, tt.want)
			}
			if from == "" {
				t.Error("no origin given")
			}
		})
	}
}

func vsc(name, driver string, isDefault bool) snapshotv1.VolumeSnapshotClass {
	c := snapshotv1.VolumeSnapshotClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Driver: driver, DeletionPolicy: snapshotv1.VolumeSnapshotContentDelete}
	if isDefault {
		c.Annotations = map[string]string{AnnDefaultSnapshotClass: "true"}
	}
	return c
}

func TestSnapshotClassFor(t *testing.T) {
	name := func(s string) *string { return &s }
	all := []snapshotv1.VolumeSnapshotClass{
		vsc("z-other", "other.csi", true),
		vsc("b-mine", LocalTestDriver, false),
		vsc("a-mine", LocalTestDriver, false),
	}
	withDefault := append([]snapshotv1.VolumeSnapshotClass{vsc("m-mine-default", LocalTestDriver, true)}, all...)
	tests := []struct {
		name     string
		spec     *string
		classes  []snapshotv1.VolumeSnapshotClass
		want     string
		wantNote string
	}{
		{"none at all", nil, nil, "", ""},
		{"only other drivers", nil, all[:1], "", ""},
		{"first by name", nil, all, "a-mine", ""},
		{"default annotation wins", nil, withDefault, "m-mine-default", ""},
		{"spec names a matching class", name("b-mine"), all, "b-mine", ""},
		{"spec names another driver's class", name("z-other"), all, "", "serves driver"},
		{"spec names a missing class", name("gone"), all, "", "does not exist"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, note := SnapshotClassFor(LocalTestDriver, tt.spec, tt.classes)
			if got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
			if (tt.wantNote == "") != (note == "") || !strings.Contains(note, tt.wantNote) {
				t.Errorf("note %q, want one containing %q", note, tt.wantNote)
			}
		})
	}
}

func TestSmartCloneFor(t *testing.T) {
	snapshot, csiClone, copyStrategy := cdiv1.CloneStrategySnapshot, cdiv1.CloneStrategyCsiClone, cdiv1.CloneStrategyHostAssisted
	vscName := "vsc"
	for _, tt := range []struct {
		status cdiv1.StorageProfileStatus
		driver bool
		want   bool
	}{
		{cdiv1.StorageProfileStatus{CloneStrategy: &snapshot}, true, false},
		{cdiv1.StorageProfileStatus{CloneStrategy: &snapshot, SnapshotClass: &vscName}, false, true},
		{cdiv1.StorageProfileStatus{CloneStrategy: &csiClone}, true, true},
		{cdiv1.StorageProfileStatus{CloneStrategy: &csiClone}, false, false},
		{cdiv1.StorageProfileStatus{CloneStrategy: &copyStrategy, SnapshotClass: &vscName}, true, false},
		{cdiv1.StorageProfileStatus{}, true, false},
	} {
		if got := SmartCloneFor(tt.status, tt.driver); got != tt.want {
			t.Errorf("SmartCloneFor(%v, snapclass %v, driver %v) = %v, want %v", ptrStrategy(tt.status.CloneStrategy), ptrString(tt.status.SnapshotClass), tt.driver, got, tt.want)
		}
	}
}

func ptrStrategy(p *cdiv1.CDICloneStrategy) string {
	if p == nil {
		return "<nil>"
	}
	return string(*p)
}

// TestSnapshotClassForReadsTheSnapshotControllersAnnotation pins the
// annotation's spelling: the API group snapshot.storage.k8s.io is not it.
func TestSnapshotClassForReadsTheSnapshotControllersAnnotation(t *testing.T) {
	classes := []snapshotv1.VolumeSnapshotClass{
		vsc("a-plain", LocalTestDriver, false),
		{ObjectMeta: metav1.ObjectMeta{Name: "b-group-spelling", Annotations: map[string]string{"snapshot.storage.k8s.io/is-default-class": "true"}}, Driver: LocalTestDriver},
		{ObjectMeta: metav1.ObjectMeta{Name: "c-default", Annotations: map[string]string{"snapshot.storage.kubernetes.io/is-default-class": "true"}}, Driver: LocalTestDriver},
	}
	if got, _ := SnapshotClassFor(LocalTestDriver, nil, classes); got != "c-default" {
		t.Errorf("got %q, want the class annotated snapshot.storage.kubernetes.io/is-default-class", got)
	}
}

func TestDataImportCronSourceFormatFor(t *testing.T) {
	pvc, snap := cdiv1.DataImportCronSourceFormatPvc, cdiv1.DataImportCronSourceFormatSnapshot
	tests := []struct {
		spec        *cdiv1.DataImportCronSourceFormat
		provisioner string
		snapClass   string
		want        cdiv1.DataImportCronSourceFormat
	}{
		{nil, LocalTestDriver, "vsc", pvc},
		{nil, "rook-ceph.rbd.csi.ceph.com", "vsc", snap},
		{nil, "rook-ceph.rbd.csi.ceph.com", "", pvc},
		{&snap, LocalTestDriver, "", snap},
	}
	for _, tt := range tests {
		if got := DataImportCronSourceFormatFor(tt.spec, tt.provisioner, nil, tt.snapClass); got != tt.want {
			t.Errorf("(%v, %s, %q) = %s, want %s", tt.spec, tt.provisioner, tt.snapClass, got, tt.want)
		}
	}
}
