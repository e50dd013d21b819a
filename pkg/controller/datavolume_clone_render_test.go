package controller

import (
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

func qty(s string) *resource.Quantity { q := resource.MustParse(s); return &q }

func TestCloneSources(t *testing.T) {
	dv := func(s *cdiv1.DataVolumeSource, ref *cdiv1.DataVolumeSourceRef) *cdiv1.DataVolume {
		return &cdiv1.DataVolume{ObjectMeta: metav1.ObjectMeta{Name: "disk", Namespace: "tgt", UID: "dv-uid"}, Spec: cdiv1.DataVolumeSpec{Source: s, SourceRef: ref}}
	}
	cases := []struct {
		name  string
		dv    *cdiv1.DataVolume
		clone bool
		want  *CloneSource
	}{
		{"pvc, same namespace", dv(&cdiv1.DataVolumeSource{PVC: &cdiv1.DataVolumeSourcePVC{Namespace: "tgt", Name: "golden"}}, nil), true, &CloneSource{Namespace: "tgt", Name: "golden"}},
		{"pvc, no namespace", dv(&cdiv1.DataVolumeSource{PVC: &cdiv1.DataVolumeSourcePVC{Name: "golden"}}, nil), true, &CloneSource{Namespace: "tgt", Name: "golden"}},
		{"pvc, other namespace", dv(&cdiv1.DataVolumeSource{PVC: &cdiv1.DataVolumeSourcePVC{Namespace: "src", Name: "golden"}}, nil), true, &CloneSource{Namespace: "src", Name: "golden"}},
		{"snapshot", dv(&cdiv1.DataVolumeSource{Snapshot: &cdiv1.DataVolumeSourceSnapshot{Namespace: "src", Name: "snap"}}, nil), true, &CloneSource{Snapshot: true, Namespace: "src", Name: "snap"}},
		{"DataSource", dv(nil, &cdiv1.DataVolumeSourceRef{Kind: "DataSource", Name: "fedora"}), true, nil},
		{"http", dv(&cdiv1.DataVolumeSource{HTTP: &cdiv1.DataVolumeSourceHTTP{URL: "http://x"}}, nil), false, nil},
	}
	for _, c := range cases {
		if got := IsClone(c.dv); got != c.clone {
			t.Errorf("%s: IsClone = %v", c.name, got)
		}
		got := DirectCloneSource(c.dv)
		if (got == nil) != (c.want == nil) || got != nil && *got != *c.want {
			t.Errorf("%s: DirectCloneSource = %+v, want %+v", c.name, got, c.want)
		}
	}
	if got := CloneSourceName(dv(nil, nil)); got != "volume-clone-source-dv-uid" {
		t.Errorf("CloneSourceName = %s", got)
	}
}

func TestCloneSourceSpecFor(t *testing.T) {
	dv := &cdiv1.DataVolume{Spec: cdiv1.DataVolumeSpec{Preallocation: ptr.To(true), PriorityClassName: "high"}}
	pvc := CloneSourceSpecFor(dv, CloneSource{Namespace: "src", Name: "golden"})
	if pvc.Source.APIGroup != nil || pvc.Source.Kind != "PersistentVolumeClaim" || pvc.Source.Name != "golden" ||
		!ptr.Deref(pvc.Preallocation, false) || ptr.Deref(pvc.PriorityClassName, "") != "high" {
		t.Errorf("pvc source spec %+v", pvc)
	}
	snap := CloneSourceSpecFor(&cdiv1.DataVolume{}, CloneSource{Snapshot: true, Namespace: "src", Name: "s"})
	if ptr.Deref(snap.Source.APIGroup, "") != "snapshot.storage.k8s.io" || snap.Source.Kind != "VolumeSnapshot" || snap.Source.Name != "s" ||
		snap.Preallocation != nil || snap.PriorityClassName != nil {
		t.Errorf("snapshot source spec %+v", snap)
	}
}

func TestDataSourceNotReady(t *testing.T) {
	ds := &cdiv1.DataSource{ObjectMeta: metav1.ObjectMeta{Namespace: "os", Name: "fedora"}}
	if msg := DataSourceNotReady(ds); msg != "" {
		t.Errorf("a DataSource without conditions waits: %s", msg)
	}
	ds.Status.Conditions = []cdiv1.DataSourceCondition{{Type: cdiv1.DataSourceReady, ConditionState: cdiv1.ConditionState{Status: corev1.ConditionFalse, Reason: "NotFound", Message: "no pvc"}}}
	if msg := DataSourceNotReady(ds); !strings.Contains(msg, "os/fedora is not ready") || !strings.Contains(msg, "NotFound: no pvc") {
		t.Errorf("not ready: %q", msg)
	}
	ds.Status.Conditions[0].Status = corev1.ConditionTrue
	if msg := DataSourceNotReady(ds); msg != "" {
		t.Errorf("ready: %q", msg)
	}
}

func TestSizelessCloneSize(t *testing.T) {
	block, fs := corev1.PersistentVolumeBlock, corev1.PersistentVolumeFilesystem
	cases := []struct {
		name   string
		src    CloneSize
		target corev1.PersistentVolumeMode
		want   int64
		err    error
	}{
		{"fs to fs: capacity as it is", CloneSize{Size: qty("1Gi"), Mode: &fs}, fs, 1 << 30, nil},
		{"block to block", CloneSize{Size: qty("1Gi"), Mode: &block}, block, 1 << 30, nil},
		{"fs to block", CloneSize{Size: qty("1Gi"), Mode: &fs}, block, 1 << 30, nil},
		// 1 GiB / (1 - 0.055), CDI's rule.
		{"block to fs: inflated", CloneSize{Size: qty("1Gi"), Mode: &block}, fs, 1136234735, nil},
		{"unknown mode counts as the target's", CloneSize{Size: qty("1Gi")}, fs, 1 << 30, nil},
		{"no size yet", CloneSize{Mode: &fs}, fs, 0, errSizeUnknown},
	}
	for _, c := range cases {
		got, err := SizelessCloneSize(c.src, c.target, 0.055)
		if !errors.Is(err, c.err) || err == nil && got.Value() != c.want {
			t.Errorf("%s: SizelessCloneSize = %s (%d), %v; want %d, %v", c.name, got.String(), got.Value(), err, c.want, c.err)
		}
	}
}

func TestRenderCloneClaimSpec(t *testing.T) {
	fs, block := corev1.PersistentVolumeFilesystem, corev1.PersistentVolumeBlock
	profile := &cdiv1.StorageProfile{Status: cdiv1.StorageProfileStatus{ClaimPropertySets: []cdiv1.ClaimPropertySet{
		{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, VolumeMode: &fs},
		{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany}, VolumeMode: &block},
	}}}
	storage := func(size string, mode *corev1.PersistentVolumeMode) *cdiv1.StorageSpec {
		st := &cdiv1.StorageSpec{VolumeMode: mode}
		if size != "" {
			st.Resources.Requests = corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)}
		}
		return st
	}
	fsSource := CloneSize{Size: qty("2Gi"), Minimum: qty("2Gi"), Mode: &fs}
	blockSource := CloneSize{Size: qty("1Gi"), Minimum: qty("1Gi"), Mode: &block}
	cases := []struct {
		name       string
		spec       cdiv1.DataVolumeSpec
		ann        map[string]string
		src        CloneSize
		want       int64
		mode       corev1.PersistentVolumeMode
		refused    bool
		waits      bool
		accessMode corev1.PersistentVolumeAccessMode
	}{
		{name: "sizeless storage takes the capacity", spec: cdiv1.DataVolumeSpec{Storage: storage("", nil)}, src: fsSource, want: 2 << 30, mode: fs, accessMode: corev1.ReadWriteOnce},
		{name: "sizeless Block target", spec: cdiv1.DataVolumeSpec{Storage: storage("", &block)}, src: blockSource, want: 1 << 30, mode: block, accessMode: corev1.ReadWriteMany},
		{name: "sizeless Filesystem target of a Block source: inflated", spec: cdiv1.DataVolumeSpec{Storage: storage("", &fs)}, src: blockSource, want: 1136234735, mode: fs, accessMode: corev1.ReadWriteOnce},
		{name: "sizeless spec.pvc", spec: cdiv1.DataVolumeSpec{PVC: &corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}}}, src: fsSource, want: 2 << 30, accessMode: corev1.ReadWriteOnce},
		{name: "explicit size grows by the overhead, as imports", spec: cdiv1.DataVolumeSpec{Storage: storage("3Gi", &fs)}, src: fsSource, want: 3408920576, mode: fs, accessMode: corev1.ReadWriteOnce},
		{name: "smaller than the source", spec: cdiv1.DataVolumeSpec{Storage: storage("1Gi", &block)}, src: fsSource, refused: true},
		{name: "smaller spec.pvc", spec: cdiv1.DataVolumeSpec{PVC: &corev1.PersistentVolumeClaimSpec{Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}}}, src: fsSource, refused: true},
		{name: "smaller but permissive", spec: cdiv1.DataVolumeSpec{Storage: storage("1Gi", &block)}, ann: map[string]string{cdiv1.AnnPermissiveClone: "true"}, src: fsSource, want: 1 << 30, mode: block, accessMode: corev1.ReadWriteMany},
		{name: "sizeless, source size unknown", spec: cdiv1.DataVolumeSpec{Storage: storage("", nil)}, src: CloneSize{Mode: &fs}, waits: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dv := &cdiv1.DataVolume{ObjectMeta: metav1.ObjectMeta{Name: "disk", Annotations: c.ann}, Spec: c.spec}
			spec, err := RenderCloneClaimSpec(dv, profile, "csi", 0.055, c.src)
			var refusal *cloneRefusal
			switch {
			case c.refused:
				if !errors.As(err, &refusal) || !strings.Contains(err.Error(), "target resources requests storage size is smaller than the source") {
					t.Fatalf("err = %v, want a refusal", err)
				}
				return
			case c.waits:
				if !errors.Is(err, errSizeUnknown) {
					t.Fatalf("err = %v, want errSizeUnknown", err)
				}
				return
			case err != nil:
				t.Fatal(err)
			}
			size := spec.Resources.Requests[corev1.ResourceStorage]
			if size.Value() != c.want {
				t.Errorf("size %s (%d), want %d", size.String(), size.Value(), c.want)
			}
			if c.mode != "" && ptr.Deref(spec.VolumeMode, "") != c.mode {
				t.Errorf("mode %v, want %s", spec.VolumeMode, c.mode)
			}
			if len(spec.AccessModes) != 1 || spec.AccessModes[0] != c.accessMode {
				t.Errorf("access modes %v", spec.AccessModes)
			}
		})
	}
	// The DataVolume is not changed.
	dv := &cdiv1.DataVolume{Spec: cdiv1.DataVolumeSpec{PVC: &corev1.PersistentVolumeClaimSpec{}}}
	if _, err := RenderCloneClaimSpec(dv, nil, "", 0.055, fsSource); err != nil || dv.Spec.PVC.Resources.Requests != nil {
		t.Errorf("the DataVolume's spec.pvc was changed: %v, %v", dv.Spec.PVC.Resources.Requests, err)
	}
	// Imports still need a size.
	if _, err := RenderClaimSpec(&cdiv1.DataVolume{Spec: cdiv1.DataVolumeSpec{Storage: storage("", &fs)}}, profile, "csi", 0.055); err == nil {
		t.Error("a sizeless import rendered")
	}
}

func TestCloneClaimAnnotations(t *testing.T) {
	dv := &cdiv1.DataVolume{ObjectMeta: metav1.ObjectMeta{Name: "disk", Namespace: "tgt", Annotations: map[string]string{
		cdiv1.AnnCloneToken: "short", cdiv1.AnnPermissiveClone: "true", cdiv1.AnnExtendedCloneToken: "dv-bound"}}}
	same := CloneClaimAnnotations(dv, CloneSource{Namespace: "tgt", Name: "golden"})
	if _, ok := same[cdiv1.AnnDataSourceNamespace]; ok || same[cdiv1.AnnCloneToken] != "" || same[cdiv1.AnnPermissiveClone] != "true" {
		t.Errorf("same namespace: %v", same)
	}
	cross := CloneClaimAnnotations(dv, CloneSource{Namespace: "src", Name: "golden"})
	// The short token is not copied: the populator accepts only the
	// claim's own extended token.
	if _, short := cross[cdiv1.AnnCloneToken]; cross[cdiv1.AnnDataSourceNamespace] != "src" || short {
		t.Errorf("cross namespace: %v", cross)
	}
	if _, ok := cross[cdiv1.AnnExtendedCloneToken]; ok {
		t.Error("the DataVolume's extended token (bound to its UID) was copied to the claim")
	}
}

func TestClonePhaseAndEvents(t *testing.T) {
	cases := []struct {
		w    workerView
		want cdiv1.DataVolumePhase
	}{
		{workerView{}, cdiv1.CloneScheduled},
		{workerView{WaitsForConsumer: true}, cdiv1.PendingPopulation},
		{workerView{ClonePhase: "Pending", WaitsForConsumer: true}, cdiv1.CloneScheduled},
		{workerView{ClonePhase: "Snapshot"}, cdiv1.SnapshotForSmartCloneInProgress},
		{workerView{ClonePhase: "SnapshotClone"}, cdiv1.CloneFromSnapshotSourceInProgress},
		{workerView{ClonePhase: "CSIClone"}, cdiv1.CSICloneInProgress},
		{workerView{ClonePhase: "PrepClaim"}, cdiv1.PrepClaimInProgress},
		{workerView{ClonePhase: "HostClone"}, cdiv1.CloneInProgress},
		{workerView{ClonePhase: "Rebind"}, cdiv1.RebindInProgress},
		{workerView{ClonePhase: "Succeeded"}, cdiv1.RebindInProgress}, // not bound yet
		{workerView{ClonePhase: "Error", Current: cdiv1.CSICloneInProgress}, cdiv1.CSICloneInProgress},
		{workerView{ClonePhase: "Error"}, cdiv1.Pending},
	}
	for _, c := range cases {
		if got := clonePhase(c.w); got != c.want {
			t.Errorf("clonePhase(%+v) = %s, want %s", c.w, got, c.want)
		}
	}
	dv := &cdiv1.DataVolume{ObjectMeta: metav1.ObjectMeta{Name: "disk", Namespace: "tgt"}}
	src := CloneSource{Namespace: "src", Name: "golden"}
	events := map[cdiv1.DataVolumePhase][2]string{
		cdiv1.CloneScheduled:                    {"CloneScheduled", "Cloning from src/golden into tgt/disk scheduled"},
		cdiv1.CloneInProgress:                   {"CloneInProgress", "Cloning from src/golden into tgt/disk in progress"},
		cdiv1.SnapshotForSmartCloneInProgress:   {"SnapshotForSmartCloneInProgress", "Creating snapshot for smart-clone is in progress (for pvc src/golden)"},
		cdiv1.CloneFromSnapshotSourceInProgress: {"CloneFromSnapshotSourceInProgress", "Creating PVC from snapshot source is in progress (for pvc src/golden)"},
		cdiv1.CSICloneInProgress:                {"CSICloneInProgress", "CSI Volume clone in progress (for pvc src/golden)"},
		cdiv1.PrepClaimInProgress:               {"PrepClaimInProgress", "Prepping PersistentVolumeClaim for DataVolume tgt/disk"},
		cdiv1.RebindInProgress:                  {"RebindInProgress", "Rebinding PersistentVolumeClaim for DataVolume tgt/disk"},
		cdiv1.Succeeded:                         {"CloneSucceeded", "Successfully cloned from src/golden into tgt/disk"},
	}
	for phase, want := range events {
		reason, msg, ok := cloneEvent(phase, dv, src)
		if !ok || reason != want[0] || msg != want[1] {
			t.Errorf("cloneEvent(%s) = %s %q %v, want %s %q", phase, reason, msg, ok, want[0], want[1])
		}
	}
	if _, _, ok := cloneEvent(cdiv1.Pending, dv, src); ok {
		t.Error("an event for Pending")
	}
	// Clone claim status: Succeeded once the clone is done and the claim bound; never Failed on a pod.
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "disk", Annotations: map[string]string{
		cdiv1.AnnClonePhase: "Succeeded", cdiv1.AnnPodPhase: string(corev1.PodFailed)}}}
	cloneDV := &cdiv1.DataVolume{ObjectMeta: dv.ObjectMeta, Spec: cdiv1.DataVolumeSpec{Source: &cdiv1.DataVolumeSource{PVC: &cdiv1.DataVolumeSourcePVC{Namespace: "src", Name: "golden"}}}}
	if st := ComputeStatus(cloneDV, ClaimView{Claim: pvc}); st.Phase != cdiv1.RebindInProgress {
		t.Errorf("unbound succeeded clone: %s", st.Phase)
	}
	pvc.Status.Phase = corev1.ClaimBound
	st := ComputeStatus(cloneDV, ClaimView{Claim: pvc})
	if st.Phase != cdiv1.Succeeded || st.Progress != "100.0%" {
		t.Errorf("bound succeeded clone: %s %s", st.Phase, st.Progress)
	}
	for _, c := range st.Conditions {
		if c.Type == cdiv1.DataVolumeRunning && c.Message != "Clone Complete" {
			t.Errorf("Running %+v", c)
		}
	}
}
