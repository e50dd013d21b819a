package controller

import (
	"fmt"
	"strings"
	"testing"

	snapshotv1 "github.com/kubernetes-csi/external-snapshotter/client/v6/apis/volumesnapshot/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

// sets renders claim property sets compactly, e.g. "RWX/Block RWO/Filesystem".
func sets(s []cdiv1.ClaimPropertySet) string {
	short := map[corev1.PersistentVolumeAccessMode]string{
		corev1.ReadWriteOnce: "RWO", corev1.ReadWriteMany: "RWX", corev1.ReadOnlyMany: "ROX", corev1.ReadWriteOncePod: "RWOP",
	}
	var parts []string
	for _, set := range s {
		var modes []string
		for _, m := range set.AccessModes {
			modes = append(modes, short[m])
		}
		vm := "<nil>"
		if set.VolumeMode != nil {
			vm = string(*set.VolumeMode)
		}
		parts = append(parts, strings.Join(modes, ",")+"/"+vm)
	}
	return strings.Join(parts, " ")
}

func TestClaimPropertySetsFor(t *testing.T) {
	tests := []struct {
		provisioner string
		params      map[string]string
		want        string
	}{
		{"rook-ceph.rbd.csi.ceph.com", nil, "RWX/Block RWO/Block RWO/Filesystem"},
		{"rbd.csi.ceph.com", map[string]string{"pool": "x"}, "RWX/Block RWO/Block RWO/Filesystem"},
		{"cephfs.csi.ceph.com", nil, "RWX/Filesystem"},
		{"kubevirt.io.hostpath-provisioner", nil, "RWO/Filesystem"},
		{"kubevirt.io/hostpath-provisioner", nil, "RWO/Filesystem"},
		{"topolvm.io", nil, "RWO/Block RWO/Filesystem"},
		{"topolvm.cybozu.com", nil, "RWO/Block RWO/Filesystem"},
		{"nfs.csi.k8s.io", nil, "RWX/Filesystem"},
		{"pd.csi.storage.gke.io", nil, "RWO/Block"},
		{"pd.csi.storage.gke.io", map[string]string{"type": "pd-ssd"}, "RWO/Block"},
		{"pd.csi.storage.gke.io", map[string]string{"type": "hyperdisk-balanced"}, "RWX/Block RWO/Block RWO/Filesystem"},
		{"ebs.csi.aws.com", nil, "RWO/Block"},
		{"ebs.csi.aws.com", map[string]string{"type": "io2"}, "RWX/Block RWO/Block RWO/Filesystem"},
		{"ebs.csi.aws.com", map[string]string{"type": "gp3"}, "RWO/Block"},
		{"disk.csi.azure.com", nil, "RWO/Block"},
		{"file.csi.azure.com", nil, "RWX/Filesystem"},
		{"efs.csi.aws.com", nil, "RWX/Filesystem RWO/Filesystem"},
		{"csi.trident.netapp.io", map[string]string{"backendType": "ontap-nas-economy"}, "RWX/Filesystem RWO/Filesystem"},
		{"csi.trident.netapp.io", map[string]string{"backendType": "ontap-san"}, "RWX/Block"},
		{"csi.trident.netapp.io", map[string]string{"backendType": "solidfire-san"}, ""},
		{"csi.trident.netapp.io", nil, ""},
		{"driver.longhorn.io", nil, "RWO/Block"},
		{"driver.longhorn.io", map[string]string{"migratable": "true"}, "RWX/Block RWO/Block"},
		{"driver.longhorn.io", map[string]string{"nfsOptions": "vers=4.2"}, "RWX/Filesystem RWO/Filesystem"},
		{"driver.longhorn.io", map[string]string{"fsType": "ext4"}, "RWO/Filesystem"},
		{"pxd.portworx.com", nil, "RWX/Block RWX/Filesystem RWO/Block RWO/Filesystem"},
		{"pxd.portworx.com", map[string]string{"sharedv4_mount_options": "vers=3.0, nolock"}, "RWX/Filesystem RWO/Filesystem"},
		{"pxd.portworx.com", map[string]string{"backend": "pure_block"}, ""},
		{"csi.vsphere.vmware.com", nil, "RWO/Block RWO/Filesystem"},
		{"csi.vsphere.vmware.com", map[string]string{"csi.storage.k8s.io/fstype": "NFS4"}, "RWX/Filesystem RWO/Block RWO/Filesystem"},
		{"csi-powerstore.dellemc.com", nil, "RWX/Block RWO/Block RWO/Filesystem ROX/Block"},
		{"csi-powerstore.dellemc.com", map[string]string{"csi.storage.k8s.io/fstype": "nfs"}, "RWX/Filesystem RWO/Filesystem ROX/Filesystem"},
		{"csi-unity.dellemc.com", map[string]string{"protocol": "NFS"}, "RWX/Filesystem RWO/Filesystem ROX/Filesystem"},
		{"linstor.csi.linbit.com", nil, "RWX/Block RWO/Block RWO/Filesystem ROX/Block ROX/Filesystem"},
		{"kubesan.gitlab.io", nil, "RWX/Block ROX/Block RWO/Block RWO/Filesystem"},
		{LocalTestDriver, nil, "RWO/Filesystem RWO/Block"},
		{"example.com/unknown", nil, ""},
		{"kubernetes.io/no-provisioner", nil, ""},
		{"", nil, ""},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s%v", tt.provisioner, tt.params), func(t *testing.T) {
			got := ClaimPropertySetsFor(tt.provisioner, tt.params)
			if sets(got) != tt.want {
				t.Errorf("ClaimPropertySetsFor(%q, %v) = %q, want %q", tt.provisioner, tt.params, sets(got), tt.want)
			}
			if tt.want == "" && got != nil {
				t.Errorf("unknown provisioner gave non-nil %#v", got)
			}
		})
	}
}

// TestClaimPropertySetsForReturnsFreshSlices checks that callers cannot
// corrupt the table through a result.
func TestClaimPropertySetsForReturnsFreshSlices(t *testing.T) {
	a := ClaimPropertySetsFor(LocalTestDriver, nil)
	*a[0].VolumeMode = corev1.PersistentVolumeBlock
	a[0].AccessModes[0] = corev1.ReadOnlyMany
	if b := ClaimPropertySetsFor(LocalTestDriver, nil); sets(b) != "RWO/Filesystem RWO/Block" {
		t.Fatalf("table changed through a result: %s", sets(b))
	}
}

func TestTableEntriesAreValid(t *testing.T) {
	for key, advice := range adviceByKey {
		if len(advice) == 0 || len(advice) > 8 {
			t.Errorf("%s: %d sets, the API allows 1 to 8", key, len(advice))
		}
		seen := map[volumeAdvice]bool{}
		for _, a := range advice {
			if seen[a] {
				t.Errorf("%s: duplicate %v", key, a)
			}
			seen[a] = true
		}
	}
}

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

func pv(name, class string, volumeMode *corev1.PersistentVolumeMode, modes ...corev1.PersistentVolumeAccessMode) corev1.PersistentVolume {
	return corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       corev1.PersistentVolumeSpec{StorageClassName: class, VolumeMode: volumeMode, AccessModes: modes},
	}
}

func TestClaimPropertySetsFromVolumes(t *testing.T) {
	block, fs := corev1.PersistentVolumeBlock, corev1.PersistentVolumeFilesystem
	tests := []struct {
		name string
		pvs  []corev1.PersistentVolume
		want string
	}{
		{"none", nil, ""},
		{"only other classes", []corev1.PersistentVolume{pv("a", "other", nil, corev1.ReadWriteOnce)}, ""},
		{"unset volume mode is Filesystem", []corev1.PersistentVolume{pv("a", "local", nil, corev1.ReadWriteOnce)}, "RWO/Filesystem"},
		{
			"deduplicated and ordered shared-first, Block-first",
			[]corev1.PersistentVolume{
				pv("a", "local", &fs, corev1.ReadWriteOnce),
				pv("b", "local", &block, corev1.ReadWriteOnce, corev1.ReadWriteMany),
				pv("c", "local", &fs, corev1.ReadWriteOnce),
				pv("d", "local", &fs, corev1.ReadOnlyMany),
			},
			"RWX/Block RWO/Block RWO/Filesystem ROX/Filesystem",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := sets(ClaimPropertySetsFromVolumes("local", tt.pvs)); got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

func TestProfileMetricLabels(t *testing.T) {
	snapshot, csiClone, copyStrategy := cdiv1.CloneStrategySnapshot, cdiv1.CloneStrategyCsiClone, cdiv1.CloneStrategyHostAssisted
	vscName := "vsc"
	sc := &storagev1.StorageClass{
		ObjectMeta:  metav1.ObjectMeta{Name: "fast", Annotations: map[string]string{cdiv1.AnnDefaultStorageClass: "true"}},
		Provisioner: "rook-ceph.rbd.csi.ceph.com",
	}
	status := cdiv1.StorageProfileStatus{ClaimPropertySets: ClaimPropertySetsFor(sc.Provisioner, nil), CloneStrategy: &snapshot, SnapshotClass: &vscName}
	got := ProfileMetricLabels(sc, status, SmartCloneFor(status, false))
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
