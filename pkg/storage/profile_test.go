package storage

import (
	"testing"

	snapshotv1 "github.com/kubernetes-csi/external-snapshotter/client/v6/apis/volumesnapshot/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

func TestDecideStorageProfile(t *testing.T) {
	block := corev1.PersistentVolumeBlock
	class := func(name, provisioner string, annotations map[string]string) *storagev1.StorageClass {
		return &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: annotations}, Provisioner: provisioner}
	}
	userSets := []cdiv1.ClaimPropertySet{{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany}, VolumeMode: &block}}
	tests := []struct {
		name           string
		sc             *storagev1.StorageClass
		spec           cdiv1.StorageProfileSpec
		classes        []snapshotv1.VolumeSnapshotClass
		pvs            []corev1.PersistentVolume
		wantSets       string
		wantStrategy   cdiv1.CDICloneStrategy
		wantSnapClass  string
		wantRecognized metav1.ConditionStatus
		wantReason     string
		wantNotes      int
	}{
		{
			name: "local driver with a snapshot class", sc: class("local", LocalTestDriver, nil),
			classes:  []snapshotv1.VolumeSnapshotClass{vsc("local-snap", LocalTestDriver, false)},
			wantSets: "RWO/Filesystem RWO/Block", wantStrategy: cdiv1.CloneStrategySnapshot, wantSnapClass: "local-snap",
			wantRecognized: metav1.ConditionTrue, wantReason: ReasonKnownProvisioner,
		},
		{
			name: "unknown provisioner", sc: class("odd", "example.com/odd", nil),
			wantSets: "", wantStrategy: cdiv1.CloneStrategyHostAssisted,
			wantRecognized: metav1.ConditionFalse, wantReason: ReasonUnknownProvisioner,
		},
		{
			name: "no provisioner: sets from the class's volumes", sc: class("static", NoProvisioner, nil),
			pvs:      []corev1.PersistentVolume{pv("a", "static", &block, corev1.ReadWriteOnce), pv("b", "static", nil, corev1.ReadWriteOnce), pv("c", "elsewhere", nil, corev1.ReadWriteMany)},
			wantSets: "RWO/Block RWO/Filesystem", wantStrategy: cdiv1.CloneStrategyHostAssisted,
			wantRecognized: metav1.ConditionTrue, wantReason: ReasonStaticVolumes,
		},
		{
			name: "no provisioner and no volumes", sc: class("static", NoProvisioner, nil),
			wantSets: "", wantStrategy: cdiv1.CloneStrategyHostAssisted,
			wantRecognized: metav1.ConditionFalse, wantReason: ReasonUnknownProvisioner,
		},
		{
			name: "user sets win over the table", sc: class("local", LocalTestDriver, nil), spec: cdiv1.StorageProfileSpec{ClaimPropertySets: userSets},
			wantSets: "RWX/Block", wantStrategy: cdiv1.CloneStrategyHostAssisted,
			wantRecognized: metav1.ConditionTrue, wantReason: ReasonUserClaimPropertySets,
		},
		{
			name: "user sets without a volume mode are refused, not applied", sc: class("local", LocalTestDriver, nil),
			spec:     cdiv1.StorageProfileSpec{ClaimPropertySets: []cdiv1.ClaimPropertySet{{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}}}},
			wantSets: "", wantStrategy: cdiv1.CloneStrategyHostAssisted,
			wantRecognized: metav1.ConditionFalse, wantReason: ReasonInvalidClaimPropertySet, wantNotes: 1,
		},
		{
			name: "annotation overrides the snapshot class", sc: class("local", LocalTestDriver, map[string]string{cdiv1.AnnCloneStrategy: "copy"}),
			classes:  []snapshotv1.VolumeSnapshotClass{vsc("local-snap", LocalTestDriver, false)},
			wantSets: "RWO/Filesystem RWO/Block", wantStrategy: cdiv1.CloneStrategyHostAssisted, wantSnapClass: "local-snap",
			wantRecognized: metav1.ConditionTrue, wantReason: ReasonKnownProvisioner,
		},
		{
			name: "a bad annotation is noted", sc: class("local", LocalTestDriver, map[string]string{cdiv1.AnnCloneStrategy: "fast"}),
			wantSets: "RWO/Filesystem RWO/Block", wantStrategy: cdiv1.CloneStrategyHostAssisted,
			wantRecognized: metav1.ConditionTrue, wantReason: ReasonKnownProvisioner, wantNotes: 1,
		},
		{
			name: "spec snapshot class of another driver is noted and unused", sc: class("local", LocalTestDriver, nil),
			spec:     cdiv1.StorageProfileSpec{SnapshotClass: func() *string { s := "theirs"; return &s }()},
			classes:  []snapshotv1.VolumeSnapshotClass{vsc("theirs", "other.csi", false), vsc("mine", LocalTestDriver, false)},
			wantSets: "RWO/Filesystem RWO/Block", wantStrategy: cdiv1.CloneStrategyHostAssisted,
			wantRecognized: metav1.ConditionTrue, wantReason: ReasonKnownProvisioner, wantNotes: 1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := DecideStorageProfile(tt.sc, tt.spec, tt.classes, tt.pvs)
			if *d.Status.StorageClass != tt.sc.Name || *d.Status.Provisioner != tt.sc.Provisioner {
				t.Errorf("storageClass/provisioner = %s/%s", *d.Status.StorageClass, *d.Status.Provisioner)
			}
			if sets(d.Status.ClaimPropertySets) != tt.wantSets {
				t.Errorf("claimPropertySets = %q, want %q", sets(d.Status.ClaimPropertySets), tt.wantSets)
			}
			if *d.Status.CloneStrategy != tt.wantStrategy {
				t.Errorf("cloneStrategy = %s, want %s", *d.Status.CloneStrategy, tt.wantStrategy)
			}
			if ptrString(d.Status.SnapshotClass) != tt.wantSnapClass {
				t.Errorf("snapshotClass = %q, want %q", ptrString(d.Status.SnapshotClass), tt.wantSnapClass)
			}
			if d.Recognized.Type != cdiv1.StorageProfileRecognized || d.Recognized.Status != tt.wantRecognized || d.Recognized.Reason != tt.wantReason || d.Recognized.Message == "" {
				t.Errorf("Recognized = %+v, want %s/%s with a message", d.Recognized, tt.wantRecognized, tt.wantReason)
			}
			if len(d.Notes) != tt.wantNotes {
				t.Errorf("notes = %q, want %d", d.Notes, tt.wantNotes)
			}
			if d.Status.DataImportCronSourceFormat == nil || *d.Status.DataImportCronSourceFormat != cdiv1.DataImportCronSourceFormatPvc {
				t.Errorf("dataImportCronSourceFormat = %v", d.Status.DataImportCronSourceFormat)
			}
		})
	}
}

func ptrString(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}
