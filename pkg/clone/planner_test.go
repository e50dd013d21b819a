package clone

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

const (
	driverA = "a.csi.example"
	driverB = "b.csi.example"
	gi      = int64(1) << 30
)

var (
	block = ptr.To(corev1.PersistentVolumeBlock)
	fs    = ptr.To(corev1.PersistentVolumeFilesystem)
)

func class(name, provisioner string, expand bool) *storagev1.StorageClass {
	return &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Provisioner: provisioner, AllowVolumeExpansion: ptr.To(expand)}
}

func claim(name, request string, mode *corev1.PersistentVolumeMode, className string) *corev1.PersistentVolumeClaim {
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{}},
		Spec:       corev1.PersistentVolumeClaimSpec{VolumeMode: mode, StorageClassName: ptr.To(className)},
	}
	if request != "" {
		pvc.Spec.Resources.Requests = corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(request)}
	}
	return pvc
}

func bound(pvc *corev1.PersistentVolumeClaim, capacity string) *corev1.PersistentVolumeClaim {
	pvc.Status.Capacity = corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(capacity)}
	return pvc
}

func strategy(s cdiv1.CDICloneStrategy) *cdiv1.CDICloneStrategy { return &s }

// claimInput is a same-driver, Filesystem, 10Gi to 10Gi clone with one
// snapshot class: the snapshot default.
func claimInput() Input {
	return Input{
		SourceClaim: &SourceClaim{
			Claim:    bound(claim("src", "10Gi", nil, "slow"), "10Gi"),
			Class:    class("slow", driverA, false),
			PVDriver: driverA,
		},
		Target:             claim("tgt", "10Gi", fs, "fast"),
		TargetClass:        class("fast", driverA, false),
		SnapshotClasses:    []SnapshotClass{{Name: "snap-a", Driver: driverA}, {Name: "snap-b", Driver: driverB, Default: true}},
		FilesystemOverhead: 0.06,
	}
}

// snapshotInput is a 10Gi Filesystem snapshot of driver A restored into a
// 10Gi Filesystem target of driver A.
func snapshotInput() Input {
	return Input{
		SourceSnapshot: &SourceSnapshot{
			RestoreSize:      ptr.To(resource.MustParse("10Gi")),
			ContentDriver:    driverA,
			SourceVolumeMode: fs,
		},
		Target:             claim("tgt", "10Gi", fs, "fast"),
		TargetClass:        class("fast", driverA, false),
		FilesystemOverhead: 0.06,
	}
}

var (
	fromClaimSnapshot   = []PhaseName{PhaseSnapshot, PhaseSnapshotClone, PhasePrepClaim, PhaseRebind}
	fromClaimCSIClone   = []PhaseName{PhaseCSIClone, PhasePrepClaim, PhaseRebind}
	fromClaimCopy       = []PhaseName{PhaseHostClone, PhaseRebind}
	fromSnapshotRestore = []PhaseName{PhaseSnapshotClone, PhasePrepClaim, PhaseRebind}
	fromSnapshotCopy    = []PhaseName{PhaseSnapshotClone, PhasePrepClaim, PhaseHostClone, PhaseRebind}
)

// want is what a case checks; empty fields are not checked, except that
// FallbackReason is always compared (a fallback nobody expected is a bug).
type want struct {
	strategy      cdiv1.CDICloneStrategy
	from          string
	pinned        bool
	reason        string
	hint          string // substring
	snapshotClass string
	classEvent    string
	size          int64
	sizeless      bool
	phases        []PhaseName
}

func TestPlan(t *testing.T) {
	cases := []struct {
		name  string
		input func() Input
		want  want
	}{
		{"default is snapshot with the driver's first class", claimInput,
			want{strategy: cdiv1.CloneStrategySnapshot, from: "default", snapshotClass: "snap-a",
				classEvent: "First VolumeSnapshotClass selected snap-a", size: 10 * gi, phases: fromClaimSnapshot}},
		{"the driver's default class wins over the first by name", func() Input {
			in := claimInput()
			in.SnapshotClasses = append(in.SnapshotClasses, SnapshotClass{Name: "z-default", Driver: driverA, Default: true})
			return in
		}, want{strategy: cdiv1.CloneStrategySnapshot, snapshotClass: "z-default", classEvent: "Default VolumeSnapshotClass selected z-default"}},
		{"the class both StorageProfiles name wins", func() Input {
			in := claimInput()
			in.SnapshotClasses = append(in.SnapshotClasses, SnapshotClass{Name: "z-default", Driver: driverA, Default: true}, SnapshotClass{Name: "profiled", Driver: driverA})
			in.SourceClaim.Profile = &cdiv1.StorageProfileStatus{SnapshotClass: ptr.To("profiled")}
			in.TargetProfile = &cdiv1.StorageProfileStatus{SnapshotClass: ptr.To("profiled")}
			return in
		}, want{strategy: cdiv1.CloneStrategySnapshot, snapshotClass: "profiled", classEvent: "VolumeSnapshotClass selected according to StorageProfile profiled"}},
		{"the StorageProfiles' class of another driver → NoVolumeSnapshotClass", func() Input {
			in := claimInput()
			in.SourceClaim.Profile = &cdiv1.StorageProfileStatus{SnapshotClass: ptr.To("snap-b")}
			in.TargetProfile = &cdiv1.StorageProfileStatus{SnapshotClass: ptr.To("snap-b")}
			return in
		}, want{strategy: cdiv1.CloneStrategyHostAssisted, reason: cdiv1.FallbackNoVolumeSnapshotClass, hint: `serves driver "b.csi.example", not "a.csi.example"`, phases: fromClaimCopy}},
		{"the override wins over the StorageProfile", func() Input {
			in := claimInput()
			in.CloneStrategyOverride = strategy(cdiv1.CloneStrategyHostAssisted)
			in.TargetProfile = &cdiv1.StorageProfileStatus{CloneStrategy: strategy(cdiv1.CloneStrategyCsiClone)}
			return in
		}, want{strategy: cdiv1.CloneStrategyHostAssisted, from: "CDI spec.cloneStrategyOverride", phases: fromClaimCopy}},
		{"override csi-clone", func() Input {
			in := claimInput()
			in.CloneStrategyOverride = strategy(cdiv1.CloneStrategyCsiClone)
			return in
		}, want{strategy: cdiv1.CloneStrategyCsiClone, phases: fromClaimCSIClone}},
		{"the StorageProfile's strategy", func() Input {
			in := claimInput()
			in.TargetProfile = &cdiv1.StorageProfileStatus{CloneStrategy: strategy(cdiv1.CloneStrategyCsiClone)}
			return in
		}, want{strategy: cdiv1.CloneStrategyCsiClone, from: "StorageProfile fast status.cloneStrategy", phases: fromClaimCSIClone}},
		{"csi-clone across StorageClasses of the same driver", func() Input {
			in := claimInput()
			in.SourceClaim.PVDriver = "" // the driver comes from the source's class
			in.TargetProfile = &cdiv1.StorageProfileStatus{CloneStrategy: strategy(cdiv1.CloneStrategyCsiClone)}
			return in
		}, want{strategy: cdiv1.CloneStrategyCsiClone, phases: fromClaimCSIClone}},
		{"no snapshot class → copy, NoVolumeSnapshotClass", func() Input {
			in := claimInput()
			in.SnapshotClasses = in.SnapshotClasses[1:] // only driver B's
			return in
		}, want{strategy: cdiv1.CloneStrategyHostAssisted, reason: cdiv1.FallbackNoVolumeSnapshotClass,
			hint: `create a VolumeSnapshotClass for driver "a.csi.example"`, phases: fromClaimCopy}},
		{"different drivers → IncompatibleProvisioners, not NoVolumeSnapshotClass", func() Input {
			in := claimInput()
			in.SourceClaim.PVDriver = driverB
			return in
		}, want{strategy: cdiv1.CloneStrategyHostAssisted, reason: cdiv1.FallbackIncompatibleProvisioners,
			hint: `the source's volume is on driver "b.csi.example" but StorageClass fast provisions with "a.csi.example"`, phases: fromClaimCopy}},
		{"different drivers with csi-clone → IncompatibleProvisioners", func() Input {
			in := claimInput()
			in.SourceClaim.PVDriver = driverB
			in.CloneStrategyOverride = strategy(cdiv1.CloneStrategyCsiClone)
			return in
		}, want{strategy: cdiv1.CloneStrategyHostAssisted, reason: cdiv1.FallbackIncompatibleProvisioners}},
		{"a source of unknown driver → IncompatibleProvisioners", func() Input {
			in := claimInput()
			in.SourceClaim.PVDriver, in.SourceClaim.Class = "", nil
			return in
		}, want{strategy: cdiv1.CloneStrategyHostAssisted, reason: cdiv1.FallbackIncompatibleProvisioners, hint: "the source's driver is unknown"}},
		{"volume modes differ → IncompatibleVolumeModes, copied as a disk image", func() Input {
			in := claimInput()
			in.SourceClaim.Claim.Spec.VolumeMode = block
			in.Target = claim("tgt", "11Gi", fs, "fast")
			return in
		}, want{strategy: cdiv1.CloneStrategyHostAssisted, reason: cdiv1.FallbackIncompatibleVolumeModes,
			hint: "give the target volumeMode Block", size: 11 * gi, phases: fromClaimCopy}},
		{"an unset volume mode is Filesystem", func() Input {
			in := claimInput()
			in.SourceClaim.Claim.Spec.VolumeMode = nil
			return in
		}, want{strategy: cdiv1.CloneStrategySnapshot, snapshotClass: "snap-a"}},
		{"larger target, class without expansion → NoVolumeExpansion", func() Input {
			in := claimInput()
			in.Target = claim("tgt", "20Gi", fs, "fast")
			return in
		}, want{strategy: cdiv1.CloneStrategyHostAssisted, reason: cdiv1.FallbackNoVolumeExpansion,
			hint: "set allowVolumeExpansion: true on it, or ask for 10Gi", size: 20 * gi, phases: fromClaimCopy}},
		{"larger target, class with expansion → snapshot kept, PrepClaim expands", func() Input {
			in := claimInput()
			in.Target = claim("tgt", "20Gi", fs, "fast")
			in.TargetClass.AllowVolumeExpansion = ptr.To(true)
			return in
		}, want{strategy: cdiv1.CloneStrategySnapshot, snapshotClass: "snap-a", size: 20 * gi, phases: fromClaimSnapshot}},
		{"larger target with csi-clone, class without expansion → NoVolumeExpansion", func() Input {
			in := claimInput()
			in.Target = claim("tgt", "20Gi", fs, "fast")
			in.CloneStrategyOverride = strategy(cdiv1.CloneStrategyCsiClone)
			return in
		}, want{strategy: cdiv1.CloneStrategyHostAssisted, reason: cdiv1.FallbackNoVolumeExpansion}},
		{"pinned copy wins over a StorageProfile edited to snapshot", func() Input {
			in := claimInput()
			in.Target.Annotations[cdiv1.AnnCloneType] = "copy"
			in.TargetProfile = &cdiv1.StorageProfileStatus{CloneStrategy: strategy(cdiv1.CloneStrategySnapshot)}
			return in
		}, want{strategy: cdiv1.CloneStrategyHostAssisted, pinned: true, from: "target annotation cdi.kubevirt.io/cloneType", phases: fromClaimCopy}},
		{"pinned snapshot wins over a StorageProfile edited to copy, and keeps its class", func() Input {
			in := claimInput()
			in.Target.Annotations[cdiv1.AnnCloneType] = "snapshot"
			in.TargetProfile = &cdiv1.StorageProfileStatus{CloneStrategy: strategy(cdiv1.CloneStrategyHostAssisted)}
			return in
		}, want{strategy: cdiv1.CloneStrategySnapshot, pinned: true, snapshotClass: "snap-a", phases: fromClaimSnapshot}},
		{"pinned snapshot whose class is gone: no fallback, the hint says what to create", func() Input {
			in := claimInput()
			in.Target.Annotations[cdiv1.AnnCloneType] = "snapshot"
			in.SnapshotClasses = nil
			return in
		}, want{strategy: cdiv1.CloneStrategySnapshot, pinned: true, hint: `create a VolumeSnapshotClass for driver "a.csi.example"`, phases: fromClaimSnapshot}},
		{"pinned skips the size gate", func() Input {
			in := claimInput()
			in.Target = claim("tgt", "5Gi", fs, "fast")
			in.Target.Annotations[cdiv1.AnnCloneType] = "csi-clone"
			return in
		}, want{strategy: cdiv1.CloneStrategyCsiClone, pinned: true, size: 5 * gi, phases: fromClaimCSIClone}},
		{"permissiveClone lets a smaller target through", func() Input {
			in := claimInput()
			in.Target = claim("tgt", "5Gi", fs, "fast")
			in.Target.Annotations[cdiv1.AnnPermissiveClone] = "true"
			return in
		}, want{strategy: cdiv1.CloneStrategySnapshot, size: 5 * gi, phases: fromClaimSnapshot}},
		{"sizeless, same mode: the source's capacity", func() Input {
			in := claimInput()
			in.SourceClaim.Claim = bound(claim("src", "10Gi", fs, "slow"), "12Gi")
			in.Target = claim("tgt", "", fs, "fast")
			return in
		}, want{strategy: cdiv1.CloneStrategySnapshot, size: 12 * gi, sizeless: true, phases: fromClaimSnapshot}},
		{"sizeless Filesystem target of a Block source: capacity plus overhead", func() Input {
			in := claimInput()
			in.SourceClaim.Claim.Spec.VolumeMode = block
			in.Target = claim("tgt", "", fs, "fast")
			in.FilesystemOverhead = 0.055
			return in
		}, want{strategy: cdiv1.CloneStrategyHostAssisted, reason: cdiv1.FallbackIncompatibleVolumeModes, size: 11362347344, sizeless: true, phases: fromClaimCopy}},
		{"sizeless Block target of a Filesystem source: the capacity", func() Input {
			in := claimInput()
			in.Target = claim("tgt", "", block, "fast")
			return in
		}, want{strategy: cdiv1.CloneStrategyHostAssisted, reason: cdiv1.FallbackIncompatibleVolumeModes, size: 10 * gi, sizeless: true}},
		{"Block to Filesystem copy with permissiveClone skips the usable-space check", func() Input {
			in := claimInput()
			in.SourceClaim.Claim.Spec.VolumeMode = block
			in.Target.Annotations[cdiv1.AnnPermissiveClone] = "true"
			return in
		}, want{strategy: cdiv1.CloneStrategyHostAssisted, reason: cdiv1.FallbackIncompatibleVolumeModes, size: 10 * gi}},
		{"archive content copies Filesystem to Filesystem", func() Input {
			in := claimInput()
			in.CloneStrategyOverride = strategy(cdiv1.CloneStrategyHostAssisted)
			in.ContentType = cdiv1.DataVolumeArchive
			return in
		}, want{strategy: cdiv1.CloneStrategyHostAssisted, phases: fromClaimCopy}},

		{"snapshot source: restored", snapshotInput,
			want{strategy: cdiv1.CloneStrategySnapshot, from: "snapshot source", size: 10 * gi, phases: fromSnapshotRestore}},
		{"snapshot source ignores the override and the StorageProfile", func() Input {
			in := snapshotInput()
			in.CloneStrategyOverride = strategy(cdiv1.CloneStrategyHostAssisted)
			in.TargetProfile = &cdiv1.StorageProfileStatus{CloneStrategy: strategy(cdiv1.CloneStrategyHostAssisted)}
			return in
		}, want{strategy: cdiv1.CloneStrategySnapshot, phases: fromSnapshotRestore}},
		{"snapshot of another driver → NoProvisionerMatch", func() Input {
			in := snapshotInput()
			in.SourceSnapshot.ContentDriver = driverB
			return in
		}, want{strategy: cdiv1.CloneStrategyHostAssisted, reason: cdiv1.FallbackNoProvisionerMatch,
			hint: `restore it into a StorageClass of driver "b.csi.example"`, phases: fromSnapshotCopy}},
		{"snapshot into a larger target, class without expansion → NoVolumeExpansion", func() Input {
			in := snapshotInput()
			in.Target = claim("tgt", "20Gi", fs, "fast")
			return in
		}, want{strategy: cdiv1.CloneStrategyHostAssisted, reason: cdiv1.FallbackNoVolumeExpansion, hint: "restoreSize 10Gi", phases: fromSnapshotCopy}},
		{"snapshot into a larger target, class with expansion → restored", func() Input {
			in := snapshotInput()
			in.Target = claim("tgt", "20Gi", fs, "fast")
			in.TargetClass.AllowVolumeExpansion = ptr.To(true)
			return in
		}, want{strategy: cdiv1.CloneStrategySnapshot, size: 20 * gi, phases: fromSnapshotRestore}},
		{"snapshot with restoreSize 0 restores at the target's size: no expansion needed", func() Input {
			in := snapshotInput()
			in.SourceSnapshot.RestoreSize = ptr.To(resource.MustParse("0"))
			in.Target = claim("tgt", "20Gi", fs, "fast")
			return in
		}, want{strategy: cdiv1.CloneStrategySnapshot, size: 20 * gi}},
		{"snapshot of a Block volume into a Filesystem target → IncompatibleVolumeModes", func() Input {
			in := snapshotInput()
			in.SourceSnapshot.SourceVolumeMode = block
			in.Target = claim("tgt", "11Gi", fs, "fast")
			return in
		}, want{strategy: cdiv1.CloneStrategyHostAssisted, reason: cdiv1.FallbackIncompatibleVolumeModes, phases: fromSnapshotCopy}},
		{"snapshot of unknown mode counts as Filesystem for a restore, as the target's for the copy", func() Input {
			in := snapshotInput()
			in.SourceSnapshot.SourceVolumeMode = nil
			in.Target = claim("tgt", "10Gi", block, "fast")
			in.ContentType = cdiv1.DataVolumeArchive
			return in
		}, want{strategy: cdiv1.CloneStrategyHostAssisted, reason: cdiv1.FallbackIncompatibleVolumeModes, phases: fromSnapshotCopy}},
		{"snapshot into a smaller target with permissiveClone", func() Input {
			in := snapshotInput()
			in.Target = claim("tgt", "5Gi", fs, "fast")
			in.Target.Annotations[cdiv1.AnnPermissiveClone] = ""
			return in
		}, want{strategy: cdiv1.CloneStrategySnapshot, size: 5 * gi}},
		{"sizeless snapshot clone: the restoreSize", func() Input {
			in := snapshotInput()
			in.Target = claim("tgt", "", fs, "fast")
			return in
		}, want{strategy: cdiv1.CloneStrategySnapshot, size: 10 * gi, sizeless: true}},
		{"sizeless Filesystem target of a Block snapshot: restoreSize plus overhead", func() Input {
			in := snapshotInput()
			in.SourceSnapshot.SourceVolumeMode = block
			in.Target = claim("tgt", "", fs, "fast")
			return in
		}, want{strategy: cdiv1.CloneStrategyHostAssisted, reason: cdiv1.FallbackIncompatibleVolumeModes, size: 11422785362, sizeless: true}},
		{"pinned copy of a snapshot", func() Input {
			in := snapshotInput()
			in.Target.Annotations[cdiv1.AnnCloneType] = "copy"
			return in
		}, want{strategy: cdiv1.CloneStrategyHostAssisted, pinned: true, phases: fromSnapshotCopy}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d, err := Plan(c.input())
			if err != nil {
				t.Fatalf("Plan: %v", err)
			}
			check(t, d, c.want)
		})
	}
}

func check(t *testing.T, d Decision, w want) {
	t.Helper()
	if d.Strategy != w.strategy {
		t.Errorf("strategy %q, want %q (from %s, fallback %s: %s)", d.Strategy, w.strategy, d.StrategyFrom, d.FallbackReason, d.Hint)
	}
	if w.from != "" && d.StrategyFrom != w.from {
		t.Errorf("from %q, want %q", d.StrategyFrom, w.from)
	}
	if d.Pinned != w.pinned {
		t.Errorf("pinned %v, want %v", d.Pinned, w.pinned)
	}
	if d.FallbackReason != w.reason {
		t.Errorf("fallback reason %q, want %q (hint %q)", d.FallbackReason, w.reason, d.Hint)
	}
	if d.FallbackMessage != fallbackMessages[w.reason] {
		t.Errorf("fallback message %q, want %q", d.FallbackMessage, fallbackMessages[w.reason])
	}
	if w.reason != "" && d.Hint == "" {
		t.Error("a fallback without a hint")
	}
	if !strings.Contains(d.Hint, w.hint) {
		t.Errorf("hint %q, want it to contain %q", d.Hint, w.hint)
	}
	if w.snapshotClass != "" && d.SnapshotClass != w.snapshotClass {
		t.Errorf("snapshot class %q, want %q", d.SnapshotClass, w.snapshotClass)
	}
	if d.Strategy != cdiv1.CloneStrategySnapshot && d.SnapshotClass != "" {
		t.Errorf("snapshot class %q for a %s clone", d.SnapshotClass, d.Strategy)
	}
	if w.classEvent != "" && d.SnapshotClassEvent != w.classEvent {
		t.Errorf("class event %q, want %q", d.SnapshotClassEvent, w.classEvent)
	}
	if w.size != 0 && d.TargetSize.Value() != w.size {
		t.Errorf("target size %d, want %d", d.TargetSize.Value(), w.size)
	}
	if d.Sizeless != w.sizeless {
		t.Errorf("sizeless %v, want %v", d.Sizeless, w.sizeless)
	}
	if w.phases != nil && !reflect.DeepEqual(d.Phases, w.phases) {
		t.Errorf("phases %v, want %v", d.Phases, w.phases)
	}
}

func TestPlanRefuses(t *testing.T) {
	cases := []struct {
		name    string
		input   func() Input
		event   string
		message string // exact unless it ends in "…", then a prefix
	}{
		{"target smaller than the source", func() Input {
			in := claimInput()
			in.Target = claim("tgt", "5Gi", fs, "fast")
			return in
		}, EventIncompatiblePVC, "target resources requests storage size is smaller than the source 5368709120 < 10737418240"},
		{"target smaller than the snapshot's restoreSize", func() Input {
			in := snapshotInput()
			in.Target = claim("tgt", "5Gi", fs, "fast")
			return in
		}, EventIncompatiblePVC, "target resources requests storage size is smaller than the source 5368709120 < 10737418240"},
		{"Block to Filesystem copy of archive content", func() Input {
			in := claimInput()
			in.SourceClaim.Claim.Spec.VolumeMode = block
			in.Target = claim("tgt", "20Gi", fs, "fast")
			in.Target.Annotations[cdiv1.AnnContentType] = "archive"
			return in
		}, EventIncompatiblePVC, "source volumeMode (Block) and target volumeMode (Filesystem) do not match, contentType (archive)"},
		{"Block snapshot to Filesystem copy of archive content", func() Input {
			in := snapshotInput()
			in.SourceSnapshot.SourceVolumeMode = block
			in.ContentType = cdiv1.DataVolumeArchive
			return in
		}, EventIncompatiblePVC, "source volumeMode (Block) and target volumeMode (Filesystem) do not match, contentType (archive)"},
		{"Block source into an equal Filesystem target: disk.img would not fit", func() Input {
			in := claimInput()
			in.SourceClaim.Claim.Spec.VolumeMode = block
			return in
		}, EventIncompatiblePVC, "target resources requests storage size is smaller than the source: a Filesystem target of 10737418240 bytes holds a 10092544000-byte disk.img after 6% filesystem overhead, " +
			"less than the Block source's 10737418240 bytes; ask for at least 11422785362"},
		{"sizeless clone of a snapshot without restoreSize", func() Input {
			in := snapshotInput()
			in.SourceSnapshot.RestoreSize = ptr.To(resource.MustParse("0"))
			in.Target = claim("tgt", "", fs, "fast")
			return in
		}, EventCloneValidationFailed, "size not specified by user/provisioner, can't tell how much needed for restore"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d, err := Plan(c.input())
			var r *Refusal
			if !errors.As(err, &r) {
				t.Fatalf("Plan = %+v, %v; want a refusal", d, err)
			}
			if r.Event != c.event || r.Message != c.message {
				t.Errorf("refusal %s %q,\nwant      %s %q", r.Event, r.Message, c.event, c.message)
			}
		})
	}
}

func TestPlanWaitsAndRejects(t *testing.T) {
	cases := []struct {
		name     string
		input    func() Input
		notReady bool
		contains string
	}{
		{"sizeless clone of an unbound source", func() Input {
			in := claimInput()
			in.SourceClaim.Claim.Status.Capacity = nil
			in.Target = claim("tgt", "", fs, "fast")
			return in
		}, true, "no status.capacity"},
		{"snapshot clone of an unbound source", func() Input {
			in := claimInput()
			in.SourceClaim.Claim.Status.Capacity = nil
			return in
		}, true, "is it Bound?"},
		{"snapshot without restoreSize yet", func() Input {
			in := snapshotInput()
			in.SourceSnapshot.RestoreSize = nil
			return in
		}, true, "restoreSize"},
		{"an unknown override", func() Input {
			in := claimInput()
			in.CloneStrategyOverride = strategy("network")
			return in
		}, false, `unknown clone strategy "network"`},
		{"an unknown pinned strategy", func() Input {
			in := claimInput()
			in.Target.Annotations[cdiv1.AnnCloneType] = "network"
			return in
		}, false, `"network", which this source cannot be cloned by`},
		{"a snapshot pinned to csi-clone", func() Input {
			in := snapshotInput()
			in.Target.Annotations[cdiv1.AnnCloneType] = "csi-clone"
			return in
		}, false, "cannot be cloned by"},
		{"a filesystem overhead of 1", func() Input {
			in := claimInput()
			in.SourceClaim.Claim.Spec.VolumeMode = block
			in.Target = claim("tgt", "", fs, "fast")
			in.FilesystemOverhead = 1
			return in
		}, false, "filesystem overhead 1"},
		{"no target class", func() Input {
			in := claimInput()
			in.TargetClass = nil
			return in
		}, false, "StorageClass"},
		{"two sources", func() Input {
			in := claimInput()
			in.SourceSnapshot = snapshotInput().SourceSnapshot
			return in
		}, false, "both"},
		{"no source", func() Input {
			in := claimInput()
			in.SourceClaim = nil
			return in
		}, false, "needs a source"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Plan(c.input())
			if err == nil {
				t.Fatal("Plan succeeded")
			}
			var r *Refusal
			if errors.As(err, &r) {
				t.Fatalf("a refusal, want an input error: %v", err)
			}
			if errors.Is(err, ErrSourceNotReady) != c.notReady {
				t.Errorf("errors.Is(%v, ErrSourceNotReady) = %v, want %v", err, !c.notReady, c.notReady)
			}
			if !strings.Contains(err.Error(), c.contains) {
				t.Errorf("error %q, want it to contain %q", err, c.contains)
			}
		})
	}
}
