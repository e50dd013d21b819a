package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	snapshotv1 "github.com/kubernetes-csi/external-snapshotter/client/v6/apis/volumesnapshot/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/clone"
	"github.com/kubefill/kubefill/pkg/controller"
	"github.com/kubefill/kubefill/tests/kit"
)

// The clone populator's snapshot paths, on control planes of their own that
// serve the snapshot CRDs (the shared one must not, for
// TestStorageProfileWithoutSnapshotCRDs). See clone_populator_test.go.

// TestCloneBySnapshot, on a control plane of its own that serves the
// snapshot CRDs: a class whose StorageProfile asks for snapshot clones and
// whose driver has a VolumeSnapshotClass clones by snapshot. The source is
// snapshotted (tmp-snapshot-<uid>), the claim waits, saying so, until the
// snapshot is ready, tmp-pvc-<uid> is restored from it at its restore size
// and expanded to the target's larger size, and its volume moves to the
// claim; the snapshot goes.
func TestCloneBySnapshot(t *testing.T) {
	ctx := context.Background()
	sc := useSnapshotControlPlane(t)

	ns, installNS := newNamespace(t), newNamespace(t)
	className := ns + "-csi"
	mode := storagev1.VolumeBindingImmediate
	createClusterScoped(t, k8sClient, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: className}, Provisioner: cloneDriver,
		VolumeBindingMode: &mode, AllowVolumeExpansion: ptr.To(true)})
	createClusterScoped(t, k8sClient, &cdiv1.StorageProfile{ObjectMeta: metav1.ObjectMeta{Name: className}, Spec: cdiv1.StorageProfileSpec{
		ClaimPropertySets: []cdiv1.ClaimPropertySet{rwoFilesystem}, CloneStrategy: ptr.To(cdiv1.CloneStrategySnapshot)}})
	createClusterScoped(t, sc, &snapshotv1.VolumeSnapshotClass{ObjectMeta: metav1.ObjectMeta{Name: ns + "-snap"}, Driver: cloneDriver,
		DeletionPolicy: snapshotv1.VolumeSnapshotContentDelete})
	runManager(t, controller.ManagerOptions{MetricsBindAddress: "0", HealthProbeBindAddress: "0",
		WorkerImage: "kubefill/kubefill:test", InstallNamespace: installNS})
	waitProfile(t, className, "asks for snapshot clones", strategyIs(cdiv1.CloneStrategySnapshot))
	src := cloneSourceClaim(t, ns, className)

	target := kit.PVC(ns, "disk", "2Gi", kit.Class(className), kit.SourceRef(cdiv1.VolumeCloneSourceRef, "vcs"))
	mustCreate(t, k8sClient, target)
	snap := &snapshotv1.VolumeSnapshot{}
	snapKey := types.NamespacedName{Namespace: ns, Name: clone.TmpSnapshotName(target.UID)}
	kit.Until(t, 30*time.Second, "the temporary snapshot of the source", func() bool {
		return sc.Get(ctx, snapKey, snap) == nil
	})
	if ptr.Deref(snap.Spec.Source.PersistentVolumeClaimName, "") != src.Name || ptr.Deref(snap.Spec.VolumeSnapshotClassName, "") != ns+"-snap" ||
		snap.Labels[cdiv1.LabelOwnedByUID] != string(target.UID) {
		t.Errorf("snapshot spec %+v labels %v", snap.Spec, snap.Labels)
	}
	_ = k8sClient.Get(ctx, client.ObjectKeyFromObject(target), target)
	if target.Annotations[cdiv1.AnnCloneType] != "snapshot" || target.Annotations[cdiv1.AnnCloneFallbackReason] != "" {
		t.Errorf("target annotations %v: want cloneType snapshot and no fallback", target.Annotations)
	}
	if !eventReasons(t, ns, target.UID)[clone.EventVolumeSnapshotClassSelected] {
		t.Error("no VolumeSnapshotClassSelected event")
	}

	// The snapshotter takes it; it is not ready yet: the claim says so.
	now := metav1.Now()
	snap.Status = &snapshotv1.VolumeSnapshotStatus{CreationTime: &now, ReadyToUse: ptr.To(false)}
	if err := sc.Status().Update(ctx, snap); err != nil {
		t.Fatal(err)
	}
	kit.Until(t, 30*time.Second, "the claim waiting for the snapshot to be ready", func() bool {
		_ = k8sClient.Get(ctx, client.ObjectKeyFromObject(target), target)
		return target.Annotations[cdiv1.AnnClonePhase] == "SnapshotClone" &&
			target.Annotations[cdiv1.AnnRunningConditionMessage] == "waiting for snapshot "+snapKey.String()+" to be ready"
	})
	_ = sc.Get(ctx, snapKey, snap)
	snap.Status.ReadyToUse, snap.Status.RestoreSize = ptr.To(true), ptr.To(resource.MustParse("1Gi"))
	if err := sc.Status().Update(ctx, snap); err != nil {
		t.Fatal(err)
	}
	prime := &corev1.PersistentVolumeClaim{}
	primeKey := types.NamespacedName{Namespace: ns, Name: clone.TmpClaimName(target.UID)}
	kit.Until(t, 30*time.Second, "the prime restored from the snapshot", func() bool {
		return k8sClient.Get(ctx, primeKey, prime) == nil
	})
	if ds := prime.Spec.DataSourceRef; ds == nil || ds.Kind != "VolumeSnapshot" || ds.Name != snapKey.Name {
		t.Errorf("prime dataSourceRef %+v, want the snapshot", ds)
	}
	if got := prime.Spec.Resources.Requests[corev1.ResourceStorage]; got.String() != "1Gi" {
		t.Errorf("prime request %s, want the restore size 1Gi", got.String())
	}

	// Restored at 1Gi: PrepClaim raises the request to the target's 2Gi.
	pv := fakeBind(t, prime)
	kit.Until(t, 30*time.Second, "the prime's request raised to 2Gi", func() bool {
		_ = k8sClient.Get(ctx, primeKey, prime)
		req := prime.Spec.Resources.Requests[corev1.ResourceStorage]
		return req.String() == "2Gi"
	})
	// The phase is recorded on the target after the prime's request is
	// raised (in the same reconcile or the next), so wait for it.
	kit.Until(t, 10*time.Second, "clonePhase PrepClaim on the target while the prime expands", func() bool {
		_ = k8sClient.Get(ctx, client.ObjectKeyFromObject(target), target)
		return target.Annotations[cdiv1.AnnClonePhase] == "PrepClaim"
	})
	pv.Spec.Capacity = corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("2Gi")}
	if err := k8sClient.Update(ctx, pv); err != nil {
		t.Fatal(err)
	}
	prime.Status.Capacity = pv.Spec.Capacity
	if err := k8sClient.Status().Update(ctx, prime); err != nil {
		t.Fatal(err)
	}
	bindTargetOnceRebound(t, pv, target, "the volume pointed at the claim")
	kit.Until(t, 30*time.Second, "the clone to finish, the snapshot and the finalizer gone", func() bool {
		_ = k8sClient.Get(ctx, client.ObjectKeyFromObject(target), target)
		return target.Annotations[cdiv1.AnnClonePhase] == "Succeeded" && !controllerutil.ContainsFinalizer(target, cdiv1.FinalizerClonePopulator) &&
			gone(ctx, &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: primeKey.Name}}) &&
			func() bool {
				s := &snapshotv1.VolumeSnapshot{}
				err := sc.Get(ctx, snapKey, s)
				return err != nil || s.DeletionTimestamp != nil
			}()
	})
}

// TestCloneSnapshotByCopy, on a control plane with the snapshot CRDs: a
// VolumeSnapshot source whose driver is not the target class's cannot be
// restored into the target (NoProvisionerMatch), so it is copied: the
// snapshot is restored into tmp-source-pvc-<uid> in a class of its own
// driver, and once that is bound a source pod reads it, read-only, into
// the upload server on the prime.
func TestCloneSnapshotByCopy(t *testing.T) {
	ctx := context.Background()
	sc := useSnapshotControlPlane(t)
	ns, installNS := newNamespace(t), newNamespace(t)
	srcClass, tgtClass := copyTargetClasses(t, ns)
	runManager(t, controller.ManagerOptions{MetricsBindAddress: "0", HealthProbeBindAddress: "0",
		WorkerImage: "kubefill/kubefill:test", InstallNamespace: installNS})

	snap := readySnapshotCloneSource(t, sc, ns, "vcs")

	target := kit.PVC(ns, "disk", "1Gi", kit.Class(tgtClass), kit.SourceRef(cdiv1.VolumeCloneSourceRef, "vcs"))
	mustCreate(t, k8sClient, target)
	restore := &corev1.PersistentVolumeClaim{}
	restoreKey := types.NamespacedName{Namespace: ns, Name: clone.TmpSourceClaimName(target.UID)}
	kit.Until(t, 30*time.Second, "the snapshot restored into tmp-source-pvc", func() bool {
		return k8sClient.Get(ctx, restoreKey, restore) == nil
	})
	_ = k8sClient.Get(ctx, client.ObjectKeyFromObject(target), target)
	if target.Annotations[cdiv1.AnnCloneType] != "copy" || target.Annotations[cdiv1.AnnCloneFallbackReason] != cdiv1.FallbackMessageNoProvisionerMatch {
		t.Errorf("target annotations %v: want copy, falling back for %s", target.Annotations, cdiv1.FallbackNoProvisionerMatch)
	}
	if ds := restore.Spec.DataSource; ds == nil || ds.Kind != "VolumeSnapshot" || ds.Name != snap.Name || ptr.Deref(restore.Spec.StorageClassName, "") != srcClass {
		t.Errorf("restore dataSource %+v class %v, want the snapshot in %s", ds, restore.Spec.StorageClassName, srcClass)
	}
	fakeBind(t, restore)
	primeName := clone.TmpClaimName(target.UID)
	setPodStatus(t, ns, cdiv1.UploadPodName(primeName), corev1.PodRunning, true)
	sourcePod := &corev1.Pod{}
	kit.Until(t, 30*time.Second, "the source pod reading the restore", func() bool {
		return k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: clone.SourcePodName(target.UID)}, sourcePod) == nil
	})
	for _, v := range sourcePod.Spec.Volumes {
		if v.PersistentVolumeClaim != nil && (v.PersistentVolumeClaim.ClaimName != restoreKey.Name || !v.PersistentVolumeClaim.ReadOnly) {
			t.Errorf("source pod mounts %+v, want %s read-only", v.PersistentVolumeClaim, restoreKey.Name)
		}
	}
	// The populator records the phase on the target after it creates the pod.
	kit.Eventually(t, 30*time.Second, kit.Interval, "the target's clonePhase HostClone", func() (bool, string, error) {
		if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(target), target); err != nil {
			return false, "", err
		}
		p := target.Annotations[cdiv1.AnnClonePhase]
		return p == "HostClone", fmt.Sprintf("clonePhase %q", p), nil
	})
}

// useSnapshotControlPlane points the shared clients at the hardened control
// plane, which serves the snapshot CRDs, and returns a client that knows the
// snapshot types.
func useSnapshotControlPlane(t *testing.T) client.Client {
	t.Helper()
	useHardenedControlPlane(t)
	return snapshotClient(t)
}

// copyTargetClasses makes a source class of the clone driver and a target
// class of another provisioner (so a snapshot clone falls back to a copy),
// with the target's StorageProfile, and returns both.
func copyTargetClasses(t *testing.T, ns string) (srcClass, tgtClass string) {
	t.Helper()
	srcClass, tgtClass = ns+"-a", ns+"-b"
	mode := storagev1.VolumeBindingImmediate
	createClusterScoped(t, k8sClient, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: srcClass}, Provisioner: cloneDriver, VolumeBindingMode: &mode})
	createClusterScoped(t, k8sClient, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: tgtClass}, Provisioner: "other.csi.kubefill.test", VolumeBindingMode: &mode})
	createClusterScoped(t, k8sClient, &cdiv1.StorageProfile{ObjectMeta: metav1.ObjectMeta{Name: tgtClass}, Spec: cdiv1.StorageProfileSpec{
		ClaimPropertySets: []cdiv1.ClaimPropertySet{rwoFilesystem}}})
	return srcClass, tgtClass
}

// readySnapshotCloneSource makes a ready 1Gi VolumeSnapshot golden-snap of
// the clone driver (a pre-provisioned content, as no snapshotter runs
// here) and the VolumeCloneSource vcsName naming it, in ns.
func readySnapshotCloneSource(t *testing.T, sc client.Client, ns, vcsName string) *snapshotv1.VolumeSnapshot {
	t.Helper()
	ctx := context.Background()
	contentName := "content-" + ns
	snap := &snapshotv1.VolumeSnapshot{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "golden-snap"},
		Spec: snapshotv1.VolumeSnapshotSpec{Source: snapshotv1.VolumeSnapshotSource{VolumeSnapshotContentName: ptr.To(contentName)}}}
	mustCreate(t, sc, snap)
	mustCreate(t, sc, &snapshotv1.VolumeSnapshotContent{ObjectMeta: metav1.ObjectMeta{Name: contentName}, Spec: snapshotv1.VolumeSnapshotContentSpec{
		Driver: cloneDriver, DeletionPolicy: snapshotv1.VolumeSnapshotContentRetain,
		Source:            snapshotv1.VolumeSnapshotContentSource{SnapshotHandle: ptr.To("h-1")},
		VolumeSnapshotRef: corev1.ObjectReference{Namespace: ns, Name: snap.Name}, SourceVolumeMode: ptr.To(corev1.PersistentVolumeFilesystem)}})
	snap.Status = &snapshotv1.VolumeSnapshotStatus{BoundVolumeSnapshotContentName: ptr.To(contentName), ReadyToUse: ptr.To(true),
		RestoreSize: ptr.To(resource.MustParse("1Gi")), CreationTime: ptr.To(metav1.Now())}
	if err := sc.Status().Update(ctx, snap); err != nil {
		t.Fatal(err)
	}
	mustCreate(t, k8sClient, &cdiv1.VolumeCloneSource{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: vcsName},
		Spec: cdiv1.VolumeCloneSourceSpec{Source: corev1.TypedLocalObjectReference{APIGroup: ptr.To("snapshot.storage.k8s.io"), Kind: "VolumeSnapshot", Name: snap.Name}}})
	return snap
}
