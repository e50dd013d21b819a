package controller

import (
	"maps"
	"testing"
	"time"

	snapshotv1 "github.com/kubernetes-csi/external-snapshotter/client/v6/apis/volumesnapshot/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

func pvcDataSource(ns, name, pvcNS, pvc string) *cdiv1.DataSource {
	return &cdiv1.DataSource{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: cdiv1.DataSourceSpec{Source: cdiv1.DataSourceSource{PVC: &cdiv1.DataVolumeSourcePVC{Namespace: pvcNS, Name: pvc}}}}
}

func refDataSource(ns, name, refNS, ref string) *cdiv1.DataSource {
	return &cdiv1.DataSource{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: cdiv1.DataSourceSpec{Source: cdiv1.DataSourceSource{DataSource: &cdiv1.DataSourceRefSourceDataSource{Namespace: refNS, Name: ref}}}}
}

func TestComputeDataSourceReady(t *testing.T) {
	dv := func(phase cdiv1.DataVolumePhase, labels map[string]string) *cdiv1.DataVolume {
		return &cdiv1.DataVolume{ObjectMeta: metav1.ObjectMeta{Name: "fedora-1", Labels: labels}, Status: cdiv1.DataVolumeStatus{Phase: phase}}
	}
	claim := func(labels map[string]string) *corev1.PersistentVolumeClaim {
		return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "fedora-1", Labels: labels}}
	}
	snap := func(ready *bool, labels map[string]string) *snapshotv1.VolumeSnapshot {
		s := &snapshotv1.VolumeSnapshot{ObjectMeta: metav1.ObjectMeta{Name: "fedora-1", Labels: labels}}
		if ready != nil {
			s.Status = &snapshotv1.VolumeSnapshotStatus{ReadyToUse: ready}
		}
		return s
	}
	snapDS := &cdiv1.DataSource{ObjectMeta: metav1.ObjectMeta{Namespace: "os", Name: "fedora"},
		Spec: cdiv1.DataSourceSpec{Source: cdiv1.DataSourceSource{Snapshot: &cdiv1.DataVolumeSourceSnapshot{Namespace: "os", Name: "fedora-1"}}}}
	plain := pvcDataSource("os", "fedora", "os", "fedora-1")
	pvcSource := cdiv1.DataSourceSource{PVC: &cdiv1.DataVolumeSourcePVC{Namespace: "os", Name: "fedora-1"}}
	instancetype := map[string]string{
		cdiv1.LabelDefaultPreference: "fedora", cdiv1.LabelDefaultInstancetype: "u1.medium",
		"app": "x", "example.com/other": "y", "kubevirt.io/os": "linux", "not.kubevirt.io/a.b": "dotted name is not copied",
	}
	copied := map[string]string{cdiv1.LabelDefaultPreference: "fedora", cdiv1.LabelDefaultInstancetype: "u1.medium", "kubevirt.io/os": "linux"}

	cases := []struct {
		name       string
		ds         *cdiv1.DataSource
		obs        DataSourceObservation
		status     corev1.ConditionStatus
		reason     string
		message    string
		source     cdiv1.DataSourceSource
		wantLabels map[string]string
	}{
		{"no source", &cdiv1.DataSource{ObjectMeta: metav1.ObjectMeta{Namespace: "os", Name: "empty"}}, DataSourceObservation{},
			corev1.ConditionFalse, "NoSource", "No source PVC set", cdiv1.DataSourceSource{}, nil},
		{"pvc, DataVolume succeeded", plain, DataSourceObservation{DataVolume: dv(cdiv1.Succeeded, nil), Claim: claim(nil)},
			corev1.ConditionTrue, "Ready", "DataSource is ready to be consumed", pvcSource, map[string]string{}},
		{"pvc, DataVolume importing", plain, DataSourceObservation{DataVolume: dv(cdiv1.ImportInProgress, nil), Claim: claim(nil)},
			corev1.ConditionFalse, "ImportInProgress", "Import DataVolume phase ImportInProgress", cdiv1.DataSourceSource{}, nil},
		{"pvc, DataVolume pending without a claim", plain, DataSourceObservation{DataVolume: dv(cdiv1.Pending, nil)},
			corev1.ConditionFalse, "Pending", "Import DataVolume phase Pending", cdiv1.DataSourceSource{}, nil},
		{"pvc, DataVolume failed", plain, DataSourceObservation{DataVolume: dv(cdiv1.Failed, nil), Claim: claim(nil)},
			corev1.ConditionFalse, "Failed", "Import DataVolume phase Failed", cdiv1.DataSourceSource{}, nil},
		{"pvc, no DataVolume, the claim exists (any phase)", plain, DataSourceObservation{Claim: claim(nil)},
			corev1.ConditionTrue, "Ready", "DataSource is ready to be consumed", pvcSource, map[string]string{}},
		{"pvc, nothing there", plain, DataSourceObservation{},
			corev1.ConditionFalse, "NotFound", "PVC not found", cdiv1.DataSourceSource{}, nil},
		{"pvc, empty namespace is kept as written", pvcDataSource("os", "fedora", "", "fedora-1"), DataSourceObservation{Claim: claim(nil)},
			corev1.ConditionTrue, "Ready", "DataSource is ready to be consumed",
			cdiv1.DataSourceSource{PVC: &cdiv1.DataVolumeSourcePVC{Name: "fedora-1"}}, map[string]string{}},
		{"pvc, labels from the DataVolume and the claim (the claim's win)", plain,
			DataSourceObservation{DataVolume: dv(cdiv1.Succeeded, map[string]string{cdiv1.LabelDefaultPreference: "old", "kubevirt.io/dv": "1"}), Claim: claim(instancetype)},
			corev1.ConditionTrue, "Ready", "DataSource is ready to be consumed", pvcSource,
			map[string]string{cdiv1.LabelDefaultPreference: "fedora", cdiv1.LabelDefaultInstancetype: "u1.medium", "kubevirt.io/os": "linux", "kubevirt.io/dv": "1"}},
		{"snapshot ready", snapDS, DataSourceObservation{Snapshot: snap(ptr.To(true), instancetype)},
			corev1.ConditionTrue, "Ready", "DataSource is ready to be consumed", snapDS.Spec.Source, copied},
		{"snapshot not ready", snapDS, DataSourceObservation{Snapshot: snap(ptr.To(false), instancetype)},
			corev1.ConditionFalse, "SnapshotNotReady", "Snapshot phase is not ready", cdiv1.DataSourceSource{}, nil},
		{"snapshot without status", snapDS, DataSourceObservation{Snapshot: snap(nil, nil)},
			corev1.ConditionFalse, "SnapshotNotReady", "Snapshot phase is not ready", cdiv1.DataSourceSource{}, nil},
		{"snapshot missing", snapDS, DataSourceObservation{},
			corev1.ConditionFalse, "NotFound", "Snapshot not found", cdiv1.DataSourceSource{}, nil},
		{"reference resolved one hop", refDataSource("os", "latest", "", "fedora"),
			DataSourceObservation{Referenced: plain, DataVolume: dv(cdiv1.Succeeded, nil), Claim: claim(instancetype)},
			corev1.ConditionTrue, "Ready", "DataSource is ready to be consumed", pvcSource, copied},
		{"reference to a snapshot DataSource", refDataSource("os", "latest", "os", "fedora"),
			DataSourceObservation{Referenced: snapDS, Snapshot: snap(ptr.To(true), nil)},
			corev1.ConditionTrue, "Ready", "DataSource is ready to be consumed", snapDS.Spec.Source, map[string]string{}},
		{"reference whose source is importing", refDataSource("os", "latest", "os", "fedora"),
			DataSourceObservation{Referenced: plain, DataVolume: dv(cdiv1.ImportScheduled, nil)},
			corev1.ConditionFalse, "ImportScheduled", "Import DataVolume phase ImportScheduled", cdiv1.DataSourceSource{}, nil},
		{"self reference", refDataSource("os", "fedora", "", "fedora"), DataSourceObservation{},
			corev1.ConditionFalse, "SelfReference", "DataSource cannot self-reference", cdiv1.DataSourceSource{}, nil},
		{"self reference with the namespace written", refDataSource("os", "fedora", "os", "fedora"), DataSourceObservation{},
			corev1.ConditionFalse, "SelfReference", "DataSource cannot self-reference", cdiv1.DataSourceSource{}, nil},
		{"cross namespace", refDataSource("os", "latest", "other", "fedora"), DataSourceObservation{Referenced: plain},
			corev1.ConditionFalse, "CrossNamespaceReference", "DataSource cannot reference a DataSource in another namespace", cdiv1.DataSourceSource{}, nil},
		{"reference to a reference", refDataSource("os", "latest", "os", "middle"),
			DataSourceObservation{Referenced: refDataSource("os", "middle", "os", "fedora")},
			corev1.ConditionFalse, "MaxReferenceDepthReached", "DataSource reference chain exceeds maximum depth of 1", cdiv1.DataSourceSource{}, nil},
		{"referenced DataSource missing", refDataSource("os", "latest", "os", "fedora"), DataSourceObservation{},
			corev1.ConditionFalse, "NotFound", `datasources.cdi.kubevirt.io "fedora" not found`, cdiv1.DataSourceSource{}, nil},
		{"referenced DataSource without a source", refDataSource("os", "latest", "os", "fedora"),
			DataSourceObservation{Referenced: &cdiv1.DataSource{ObjectMeta: metav1.ObjectMeta{Namespace: "os", Name: "fedora"}}},
			corev1.ConditionFalse, "NoSource", "No source PVC set", cdiv1.DataSourceSource{}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := ComputeDataSourceReady(c.ds, c.obs)
			if got.Status != c.status || got.Reason != c.reason || got.Message != c.message {
				t.Errorf("Ready = %s %q %q, want %s %q %q", got.Status, got.Reason, got.Message, c.status, c.reason, c.message)
			}
			if !sameDataSourceSource(got.Source, c.source) {
				t.Errorf("source = %+v, want %+v", got.Source, c.source)
			}
			if !maps.Equal(got.Labels, c.wantLabels) {
				t.Errorf("labels = %v, want %v", got.Labels, c.wantLabels)
			}
		})
	}
}

func TestDataSourceReference(t *testing.T) {
	if _, ok := DataSourceReference(plainDS()); ok {
		t.Error("a pvc DataSource has no reference to read")
	}
	if key, ok := DataSourceReference(refDataSource("os", "latest", "", "fedora")); !ok || key.String() != "os/fedora" {
		t.Errorf("reference = %s %v, want os/fedora true", key, ok)
	}
	for _, ds := range []*cdiv1.DataSource{refDataSource("os", "fedora", "", "fedora"), refDataSource("os", "latest", "other", "fedora")} {
		if _, ok := DataSourceReference(ds); ok {
			t.Errorf("%s/%s -> %+v: a refused reference is not read", ds.Namespace, ds.Name, ds.Spec.Source.DataSource)
		}
	}
}

func plainDS() *cdiv1.DataSource { return pvcDataSource("os", "fedora", "os", "fedora-1") }

func TestWithDataSourceReady(t *testing.T) {
	t0 := metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	t1 := metav1.NewTime(t0.Add(time.Minute))
	t2 := metav1.NewTime(t0.Add(2 * time.Minute))
	notReady := DataSourceReadiness{Status: corev1.ConditionFalse, Reason: "ImportInProgress", Message: "Import DataVolume phase ImportInProgress"}
	src := cdiv1.DataSourceSource{PVC: &cdiv1.DataVolumeSourcePVC{Namespace: "os", Name: "fedora-1"}}
	ready := DataSourceReadiness{Status: corev1.ConditionTrue, Reason: "Ready", Message: "DataSource is ready to be consumed", Source: src}

	s, changed := WithDataSourceReady(cdiv1.DataSourceStatus{}, notReady, t0)
	if !changed || len(s.Conditions) != 1 || s.Conditions[0].LastTransitionTime != t0 || s.Conditions[0].LastHeartbeatTime != t0 ||
		s.Conditions[0].Reason != "ImportInProgress" || s.Source.PVC != nil {
		t.Fatalf("first write: %+v changed %v", s, changed)
	}
	if again, changed := WithDataSourceReady(s, notReady, t1); changed || again.Conditions[0].LastHeartbeatTime != t0 {
		t.Errorf("same readiness again: changed %v, heartbeat %v (nothing to write)", changed, again.Conditions[0].LastHeartbeatTime)
	}
	other := notReady
	other.Reason, other.Message = "Pending", "Import DataVolume phase Pending"
	s2, changed := WithDataSourceReady(s, other, t1)
	if !changed || s2.Conditions[0].LastTransitionTime != t0 || s2.Conditions[0].LastHeartbeatTime != t1 {
		t.Errorf("reason change: changed %v, transition %v heartbeat %v; want the transition kept, the heartbeat moved", changed,
			s2.Conditions[0].LastTransitionTime, s2.Conditions[0].LastHeartbeatTime)
	}
	s3, changed := WithDataSourceReady(s2, ready, t2)
	if !changed || s3.Conditions[0].Status != corev1.ConditionTrue || s3.Conditions[0].LastTransitionTime != t2 || s3.Source.PVC == nil || *s3.Source.PVC != *src.PVC {
		t.Errorf("ready: %+v changed %v", s3, changed)
	}
	if s2.Source.PVC != nil {
		t.Error("the input status was changed")
	}
	// Not ready again: status.source is emptied.
	s4, _ := WithDataSourceReady(s3, notReady, t2)
	if s4.Source.PVC != nil || s4.Conditions[0].Status != corev1.ConditionFalse {
		t.Errorf("not ready after ready: %+v", s4)
	}
}

func TestWithDataSourceLabels(t *testing.T) {
	got, changed := WithDataSourceLabels(nil, map[string]string{})
	if changed || got != nil {
		t.Errorf("nothing to copy: %v %v", got, changed)
	}
	got, changed = WithDataSourceLabels(map[string]string{"a": "1", cdiv1.LabelDefaultPreference: "old"}, map[string]string{cdiv1.LabelDefaultPreference: "fedora"})
	if !changed || got[cdiv1.LabelDefaultPreference] != "fedora" || got["a"] != "1" {
		t.Errorf("overwrite: %v %v", got, changed)
	}
	if _, changed = WithDataSourceLabels(got, map[string]string{cdiv1.LabelDefaultPreference: "fedora"}); changed {
		t.Error("same labels again: changed")
	}
}

func TestDataSourcePredicates(t *testing.T) {
	ds := plainDS()
	ds2 := ds.DeepCopy()
	ds2.Labels = map[string]string{"x": "y"}
	if dataSourceChanged.Update(updateEvent(ds, ds2)) {
		t.Error("a label change of a DataSource passed")
	}
	ds2.Spec.Source.PVC.Name = "fedora-2"
	if !dataSourceChanged.Update(updateEvent(ds, ds2)) {
		t.Error("a source change of a DataSource did not pass")
	}
	ds3 := ds.DeepCopy()
	ds3.Status.Conditions = []cdiv1.DataSourceCondition{{Type: cdiv1.DataSourceReady, ConditionState: cdiv1.ConditionState{Status: corev1.ConditionTrue}}}
	if !dataSourceChanged.Update(updateEvent(ds, ds3)) {
		t.Error("a Ready change did not pass (DataSources referencing it read it)")
	}
	dv := &cdiv1.DataVolume{Status: cdiv1.DataVolumeStatus{Phase: cdiv1.ImportInProgress, Progress: "10%"}}
	dv2 := dv.DeepCopy()
	dv2.Status.Progress = "20%"
	if phaseOrLabelsChanged.Update(updateEvent(dv, dv2)) {
		t.Error("a progress update of a DataVolume passed")
	}
	dv2.Status.Phase = cdiv1.Succeeded
	if !phaseOrLabelsChanged.Update(updateEvent(dv, dv2)) {
		t.Error("a phase change of a DataVolume did not pass")
	}
	snap := &snapshotv1.VolumeSnapshot{}
	snap2 := snap.DeepCopy()
	snap2.Status = &snapshotv1.VolumeSnapshotStatus{ReadyToUse: ptr.To(true)}
	if !phaseOrLabelsChanged.Update(updateEvent(snap, snap2)) {
		t.Error("a snapshot becoming ready did not pass")
	}
}

func updateEvent(old, new client.Object) event.UpdateEvent {
	return event.UpdateEvent{ObjectOld: old, ObjectNew: new}
}

func TestDataSourceNames(t *testing.T) {
	key := types.NamespacedName{Namespace: "os", Name: "fedora-1"}
	cases := []struct {
		ds   *cdiv1.DataSource
		what string
		want bool
	}{
		{pvcDataSource("os", "fedora", "os", "fedora-1"), namesPVC, true},
		{pvcDataSource("os", "fedora", "", "fedora-1"), namesPVC, true},
		{pvcDataSource("other", "fedora", "os", "fedora-1"), namesPVC, true},
		{pvcDataSource("other", "fedora", "", "fedora-1"), namesPVC, false},
		{pvcDataSource("os", "fedora", "os", "fedora-2"), namesPVC, false},
		{pvcDataSource("os", "fedora", "os", "fedora-1"), namesSnapshot, false},
		{refDataSource("os", "latest", "", "fedora-1"), namesDataSource, true},
		{refDataSource("os", "latest", "", "fedora-1"), namesPVC, false},
	}
	for i, c := range cases {
		if got := DataSourceNames(c.ds, c.what, key); got != c.want {
			t.Errorf("case %d: %s/%s names %s %s = %v, want %v", i, c.ds.Namespace, c.ds.Name, c.what, key, got, c.want)
		}
	}
}
