package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	snapshotv1 "github.com/kubernetes-csi/external-snapshotter/client/v6/apis/volumesnapshot/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/controller"
	"github.com/kubefill/kubefill/tests/kit"
)

// The DataSource controller against the real kube-apiserver: Ready as CDI
// computes it for each kind of source, the *.kubevirt.io labels copied from
// the source, spec.source.dataSource resolved one hop into status.source,
// and a clone DataVolume that waits on a DataSource until it is Ready.

func startDataSourceController(t *testing.T) {
	t.Helper()
	startReconcilers(t, func(mgr ctrl.Manager) error {
		return (&controller.DataSourceReconciler{}).SetupWithManager(mgr)
	})
}

// readyIs says whether a DataSource's Ready condition is status/reason and
// its message contains msg.
func readyIs(status corev1.ConditionStatus, reason, msg string) func(*cdiv1.DataSource) bool {
	return func(ds *cdiv1.DataSource) bool {
		for _, c := range ds.Status.Conditions {
			if c.Type == cdiv1.DataSourceReady {
				return c.Status == status && c.Reason == reason && (msg == "" || c.Message == msg) &&
					!c.LastTransitionTime.IsZero() && !c.LastHeartbeatTime.IsZero()
			}
		}
		return false
	}
}

func waitDataSource(t *testing.T, ns, name, what string, cond func(*cdiv1.DataSource) bool) *cdiv1.DataSource {
	t.Helper()
	ds := &cdiv1.DataSource{}
	kit.Until(t, 30*time.Second, fmt.Sprintf("DataSource %s/%s %s", ns, name, what), func() bool {
		return k8sClient.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, ds) == nil && cond(ds)
	})
	return ds
}

func dataSourceOf(ns, name string, src cdiv1.DataSourceSource) *cdiv1.DataSource {
	return &cdiv1.DataSource{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: cdiv1.DataSourceSpec{Source: src}}
}

func pvcSourceOf(ns, name string) cdiv1.DataSourceSource {
	return cdiv1.DataSourceSource{PVC: &cdiv1.DataVolumeSourcePVC{Namespace: ns, Name: name}}
}

func refSourceOf(ns, name string) cdiv1.DataSourceSource {
	return cdiv1.DataSourceSource{DataSource: &cdiv1.DataSourceRefSourceDataSource{Namespace: ns, Name: name}}
}

// TestDataSourceReadyFromPVC walks a pvc DataSource through every branch of
// Ready, and DataSources referencing it through theirs.
func TestDataSourceReadyFromPVC(t *testing.T) {
	ctx := context.Background()
	ns, other := newNamespace(t), newNamespace(t)
	startDataSourceController(t)

	mustCreate(t, k8sClient, dataSourceOf(ns, "empty", cdiv1.DataSourceSource{}))
	waitDataSource(t, ns, "empty", "NoSource", readyIs(corev1.ConditionFalse, "NoSource", "No source PVC set"))

	// Nothing there yet.
	mustCreate(t, k8sClient, dataSourceOf(ns, "fedora", pvcSourceOf(ns, "golden")))
	ds := waitDataSource(t, ns, "fedora", "NotFound", readyIs(corev1.ConditionFalse, "NotFound", "PVC not found"))
	if ds.Status.Source.PVC != nil {
		t.Errorf("status.source %+v while not Ready, want empty", ds.Status.Source)
	}
	// A DataSource referencing it, created before it is Ready.
	mustCreate(t, k8sClient, dataSourceOf(ns, "latest", refSourceOf("", "fedora")))
	waitDataSource(t, ns, "latest", "NotFound through the reference", readyIs(corev1.ConditionFalse, "NotFound", "PVC not found"))

	// The import DataVolume exists and runs (no DataVolume controller here:
	// the test writes its phase).
	dv := &cdiv1.DataVolume{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "golden", Labels: map[string]string{
			cdiv1.LabelDefaultPreference: "from-dv", "kubevirt.io/from-dv": "yes", "app": "not-copied"}},
		Spec: cdiv1.DataVolumeSpec{Source: &cdiv1.DataVolumeSource{Blank: &cdiv1.DataVolumeBlankImage{}},
			Storage: &cdiv1.StorageSpec{}},
	}
	mustCreate(t, k8sClient, dv)
	dv.Status.Phase = cdiv1.ImportInProgress
	if err := k8sClient.Status().Update(ctx, dv); err != nil {
		t.Fatal(err)
	}
	waitDataSource(t, ns, "fedora", "ImportInProgress",
		readyIs(corev1.ConditionFalse, "ImportInProgress", "Import DataVolume phase ImportInProgress"))

	// Its claim appears with the instancetype labels; the import succeeds.
	pvc := kit.PVC(ns, "golden", "1Gi")
	pvc.Labels = map[string]string{cdiv1.LabelDefaultPreference: "fedora", cdiv1.LabelDefaultInstancetype: "u1.medium",
		cdiv1.LabelDefaultInstancetypeKind: "VirtualMachineClusterInstancetype", "example.com/other": "not-copied"}
	mustCreate(t, k8sClient, pvc)
	dv.Status.Phase = cdiv1.Succeeded
	if err := k8sClient.Status().Update(ctx, dv); err != nil {
		t.Fatal(err)
	}
	ds = waitDataSource(t, ns, "fedora", "Ready", readyIs(corev1.ConditionTrue, "Ready", "DataSource is ready to be consumed"))
	if p := ds.Status.Source.PVC; p == nil || p.Namespace != ns || p.Name != "golden" {
		t.Errorf("status.source %+v, want pvc %s/golden", ds.Status.Source, ns)
	}
	wantLabels := map[string]string{cdiv1.LabelDefaultPreference: "fedora", cdiv1.LabelDefaultInstancetype: "u1.medium",
		cdiv1.LabelDefaultInstancetypeKind: "VirtualMachineClusterInstancetype", "kubevirt.io/from-dv": "yes"}
	ds = waitDataSource(t, ns, "fedora", "with the source's kubevirt.io labels", func(ds *cdiv1.DataSource) bool {
		for k, v := range wantLabels {
			if ds.Labels[k] != v {
				return false
			}
		}
		return true
	})
	if _, ok := ds.Labels["app"]; ok || ds.Labels["example.com/other"] != "" {
		t.Errorf("labels %v: only *.kubevirt.io ones are copied", ds.Labels)
	}

	// The reference follows one hop: Ready, status.source the resolved pvc,
	// and the labels of that pvc.
	latest := waitDataSource(t, ns, "latest", "Ready through the reference", readyIs(corev1.ConditionTrue, "Ready", "DataSource is ready to be consumed"))
	if p := latest.Status.Source.PVC; p == nil || p.Name != "golden" || latest.Status.Source.DataSource != nil {
		t.Errorf("status.source of the reference %+v, want the resolved pvc golden", latest.Status.Source)
	}
	waitDataSource(t, ns, "latest", "with the instancetype labels", func(ds *cdiv1.DataSource) bool {
		return ds.Labels[cdiv1.LabelDefaultPreference] == "fedora" && ds.Labels[cdiv1.LabelDefaultInstancetype] == "u1.medium"
	})

	// References that are refused.
	mustCreate(t, k8sClient, dataSourceOf(ns, "self", refSourceOf(ns, "self")))
	mustCreate(t, k8sClient, dataSourceOf(ns, "deeper", refSourceOf(ns, "latest")))
	mustCreate(t, k8sClient, dataSourceOf(ns, "elsewhere", refSourceOf(other, "fedora")))
	mustCreate(t, k8sClient, dataSourceOf(ns, "dangling", refSourceOf(ns, "centos")))
	waitDataSource(t, ns, "self", "SelfReference", readyIs(corev1.ConditionFalse, "SelfReference", "DataSource cannot self-reference"))
	waitDataSource(t, ns, "deeper", "MaxReferenceDepthReached",
		readyIs(corev1.ConditionFalse, "MaxReferenceDepthReached", "DataSource reference chain exceeds maximum depth of 1"))
	waitDataSource(t, ns, "elsewhere", "CrossNamespaceReference",
		readyIs(corev1.ConditionFalse, "CrossNamespaceReference", "DataSource cannot reference a DataSource in another namespace"))
	waitDataSource(t, ns, "dangling", "NotFound", readyIs(corev1.ConditionFalse, "NotFound", `datasources.cdi.kubevirt.io "centos" not found`))
	// The missing one comes: the reference resolves.
	mustCreate(t, k8sClient, dataSourceOf(ns, "centos", pvcSourceOf(ns, "golden")))
	waitDataSource(t, ns, "dangling", "Ready once its target exists", readyIs(corev1.ConditionTrue, "Ready", ""))

	// The DataVolume goes (garbage collected after success): the claim
	// alone keeps it Ready.
	if err := k8sClient.Delete(ctx, dv); err != nil {
		t.Fatal(err)
	}
	kit.Until(t, 30*time.Second, "the DataVolume to go", func() bool {
		return apierrors.IsNotFound(k8sClient.Get(ctx, client.ObjectKeyFromObject(dv), &cdiv1.DataVolume{}))
	})
	ds = waitDataSource(t, ns, "fedora", "Ready", readyIs(corev1.ConditionTrue, "Ready", ""))
	readyAt := ds.Status.Conditions[0].LastTransitionTime

	// The claim goes too: NotFound, status.source emptied, here and through
	// the reference.
	if err := k8sClient.Delete(ctx, pvc); err != nil {
		t.Fatal(err)
	}
	// No kube-controller-manager here to lift pvc-protection.
	if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(pvc), pvc); err == nil && len(pvc.Finalizers) > 0 {
		pvc.Finalizers = nil
		if err := k8sClient.Update(ctx, pvc); err != nil {
			t.Fatal(err)
		}
	}
	ds = waitDataSource(t, ns, "fedora", "NotFound after the claim is deleted", func(ds *cdiv1.DataSource) bool {
		return readyIs(corev1.ConditionFalse, "NotFound", "PVC not found")(ds) && ds.Status.Source.PVC == nil
	})
	if ds.Status.Conditions[0].LastTransitionTime.Before(&readyAt) {
		t.Errorf("transition time %v is before the Ready one %v", ds.Status.Conditions[0].LastTransitionTime, readyAt)
	}
	waitDataSource(t, ns, "latest", "NotFound through the reference", func(ds *cdiv1.DataSource) bool {
		return readyIs(corev1.ConditionFalse, "NotFound", "PVC not found")(ds) && ds.Status.Source.PVC == nil
	})
	// Copied labels stay, as CDI's do.
	if ds.Labels[cdiv1.LabelDefaultPreference] != "fedora" {
		t.Errorf("labels %v after the source went", ds.Labels)
	}
}

// TestDataSourceReadyFromSnapshot, on a control plane serving the snapshot
// CRDs: a snapshot DataSource is NotFound, SnapshotNotReady, then Ready
// with the snapshot's labels.
func TestDataSourceReadyFromSnapshot(t *testing.T) {
	ctx := context.Background()
	sc := useSnapshotControlPlane(t)
	ns := newNamespace(t)
	startDataSourceController(t)

	mustCreate(t, k8sClient, dataSourceOf(ns, "fedora", cdiv1.DataSourceSource{Snapshot: &cdiv1.DataVolumeSourceSnapshot{Namespace: ns, Name: "fedora-0123"}}))
	waitDataSource(t, ns, "fedora", "NotFound", readyIs(corev1.ConditionFalse, "NotFound", "Snapshot not found"))

	snap := &snapshotv1.VolumeSnapshot{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "fedora-0123", Labels: map[string]string{
			cdiv1.LabelDefaultPreference: "fedora", cdiv1.LabelDataImportCron: "fedora-cron", "app": "containerized-data-importer"}},
		Spec: snapshotv1.VolumeSnapshotSpec{Source: snapshotv1.VolumeSnapshotSource{PersistentVolumeClaimName: ptr.To("fedora-0123")}},
	}
	mustCreate(t, sc, snap)
	waitDataSource(t, ns, "fedora", "SnapshotNotReady", readyIs(corev1.ConditionFalse, "SnapshotNotReady", "Snapshot phase is not ready"))

	now := metav1.Now()
	snap.Status = &snapshotv1.VolumeSnapshotStatus{CreationTime: &now, ReadyToUse: ptr.To(true)}
	if err := sc.Status().Update(ctx, snap); err != nil {
		t.Fatal(err)
	}
	ds := waitDataSource(t, ns, "fedora", "Ready with the snapshot's labels", func(ds *cdiv1.DataSource) bool {
		return readyIs(corev1.ConditionTrue, "Ready", "DataSource is ready to be consumed")(ds) &&
			ds.Labels[cdiv1.LabelDefaultPreference] == "fedora" && ds.Labels[cdiv1.LabelDataImportCron] == "fedora-cron"
	})
	if s := ds.Status.Source.Snapshot; s == nil || s.Name != "fedora-0123" {
		t.Errorf("status.source %+v, want the snapshot", ds.Status.Source)
	}
	if _, ok := ds.Labels["app"]; ok {
		t.Errorf("labels %v: app is not copied", ds.Labels)
	}
}

// TestDataVolumeWaitsForDataSourceReady: a clone DataVolume whose sourceRef
// names a DataSource that is not Ready waits, saying so, and makes its claim
// once the DataSource controller finds the source and says Ready.
func TestDataVolumeWaitsForDataSourceReady(t *testing.T) {
	ctx := context.Background()
	src, tgt := newNamespace(t), newNamespace(t)
	class := src + "-csi"
	csiClass(t, class, "hostpath.csi.kubefill.test", storagev1.VolumeBindingImmediate, rwoFilesystem)
	k := newCloneKeys(t)
	startCloneDataVolumeController(t, k, src, tgt)
	startDataSourceController(t)

	mustCreate(t, k8sClient, dataSourceOf(src, "fedora", pvcSourceOf(src, "golden")))
	waitDataSource(t, src, "fedora", "NotFound", readyIs(corev1.ConditionFalse, "NotFound", "PVC not found"))
	ref := &cdiv1.DataVolumeSourceRef{Kind: cdiv1.DataVolumeDataSource, Namespace: &src, Name: "fedora"}
	dv := cloneDataVolume(tgt, "vm-disk", class, nil, ref, map[string]string{cdiv1.AnnCloneToken: k.short(t, src, "golden", tgt, "vm-disk", 5*time.Minute)})
	mustCreate(t, k8sClient, dv)
	waitRunning(t, tgt, "vm-disk", "DataSource "+src+"/fedora is not ready (Ready=False, NotFound: PVC not found)")
	if err := k8sClient.Get(ctx, types.NamespacedName{Namespace: tgt, Name: "vm-disk"}, &corev1.PersistentVolumeClaim{}); err == nil {
		t.Fatal("a claim was made while the DataSource is not ready")
	}

	// The golden claim arrives: the DataSource turns Ready and the clone goes on.
	boundSource(t, src, "golden", class, "3Gi")
	waitDataSource(t, src, "fedora", "Ready", readyIs(corev1.ConditionTrue, "Ready", ""))
	pvc := waitClaim(t, tgt, "vm-disk", nil)
	if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(dv), dv); err != nil {
		t.Fatal(err)
	}
	checkCloneRef(t, pvc, dv)
}
