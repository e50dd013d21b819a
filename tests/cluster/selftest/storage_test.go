package selftest

import (
	"context"
	"fmt"
	"testing"
	"time"

	snapshotv1 "github.com/kubernetes-csi/external-snapshotter/client/v6/apis/volumesnapshot/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/utils/ptr"

	"github.com/kubefill/kubefill/tests/cluster"
	"github.com/kubefill/kubefill/tests/kit"
)

const annSelectedNode = "volume.kubernetes.io/selected-node"

// TestImmediateClassBinds: a PVC of the Immediate class is provisioned by
// the real external-provisioner through our CSI driver and bound by the real
// PV controller, in both volume modes.
func TestImmediateClassBinds(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	for _, mode := range []corev1.PersistentVolumeMode{corev1.PersistentVolumeFilesystem, corev1.PersistentVolumeBlock} {
		name := "imm-" + map[corev1.PersistentVolumeMode]string{corev1.PersistentVolumeFilesystem: "fs", corev1.PersistentVolumeBlock: "block"}[mode]
		start := time.Now()
		createPVC(t, ns, pvcSpec(name, cluster.StorageClassImmediate, "16Mi", mode))
		pvc := waitPVCPhase(t, ns, name, corev1.ClaimBound, time.Minute)
		t.Logf("%s PVC bound in %s", mode, time.Since(start).Round(time.Millisecond))
		pv, err := cl.Client.CoreV1().PersistentVolumes().Get(context.Background(), pvc.Spec.VolumeName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if pv.Spec.CSI == nil || pv.Spec.CSI.Driver != cluster.DriverName {
			t.Fatalf("PV %s is not a %s volume: %+v", pv.Name, cluster.DriverName, pv.Spec.PersistentVolumeSource)
		}
		if pv.Spec.VolumeMode == nil || *pv.Spec.VolumeMode != mode {
			t.Fatalf("PV volume mode = %v, want %s", pv.Spec.VolumeMode, mode)
		}
		if got := pvc.Status.Capacity[corev1.ResourceStorage]; got.String() != "16Mi" {
			t.Fatalf("PVC capacity = %s, want 16Mi", got.String())
		}
	}
}

// TestWaitForFirstConsumer: a PVC of the WaitForFirstConsumer class stays
// Pending until a pod uses it; then the real scheduler picks the node and
// sets volume.kubernetes.io/selected-node, the provisioner provisions, and
// the pod runs with the volume.
func TestWaitForFirstConsumer(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	createPVC(t, ns, pvcSpec("wffc", cluster.StorageClassWFFC, "16Mi", corev1.PersistentVolumeFilesystem))
	time.Sleep(2 * time.Second)
	pvc := waitPVCPhase(t, ns, "wffc", corev1.ClaimPending, 10*time.Second)
	if _, ok := pvc.Annotations[annSelectedNode]; ok {
		t.Fatalf("PVC has %s before any pod uses it", annSelectedNode)
	}
	start := time.Now()
	msg := runToCompletion(t, ns, podWithClaim("consumer", "wffc", false, "echo consumed > /data/f && cat /data/f > /dev/termination-log"))
	if msg != "consumed\n" {
		t.Fatalf("consumer wrote %q", msg)
	}
	pvc = waitPVCPhase(t, ns, "wffc", corev1.ClaimBound, time.Minute)
	if got := pvc.Annotations[annSelectedNode]; got != cl.NodeName {
		t.Fatalf("%s = %q, want %q", annSelectedNode, got, cl.NodeName)
	}
	t.Logf("WaitForFirstConsumer: selected node %s, bound and consumed in %s", cl.NodeName, time.Since(start).Round(time.Millisecond))
}

// TestPodWritesSecondPodReads: bytes a pod writes into a PVC are what a
// second pod reads back, for both volume modes.
func TestPodWritesSecondPodReads(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	for _, block := range []bool{false, true} {
		mode, suffix := corev1.PersistentVolumeFilesystem, "fs"
		if block {
			mode, suffix = corev1.PersistentVolumeBlock, "block"
		}
		claim := "data-" + suffix
		createPVC(t, ns, pvcSpec(claim, cluster.StorageClassImmediate, "16Mi", mode))
		waitPVCPhase(t, ns, claim, corev1.ClaimBound, time.Minute)
		start := time.Now()
		wrote := runToCompletion(t, ns, podWithClaim("writer-"+suffix, claim, block, writeScript(block)))
		read := runToCompletion(t, ns, podWithClaim("reader-"+suffix, claim, block, readScript(block)))
		if len(wrote) != 65 || read != wrote {
			t.Fatalf("%s: writer reported %q, reader %q", suffix, wrote, read)
		}
		t.Logf("%s: write and read-back pods took %s", suffix, time.Since(start).Round(time.Millisecond))
	}
}

func dynamicClient(t *testing.T) dynamic.Interface {
	t.Helper()
	d, err := dynamic.NewForConfig(cl.Config)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestSnapshotRestore: a VolumeSnapshot of a written PVC becomes ReadyToUse
// through the real snapshot-controller and csi-snapshotter, and a PVC
// restored from it holds the same bytes.
func TestSnapshotRestore(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	createPVC(t, ns, pvcSpec("source", cluster.StorageClassImmediate, "16Mi", corev1.PersistentVolumeFilesystem))
	waitPVCPhase(t, ns, "source", corev1.ClaimBound, time.Minute)
	wrote := runToCompletion(t, ns, podWithClaim("writer", "source", false, writeScript(false)))

	snap := &snapshotv1.VolumeSnapshot{
		TypeMeta:   metav1.TypeMeta{APIVersion: "snapshot.storage.k8s.io/v1", Kind: "VolumeSnapshot"},
		ObjectMeta: metav1.ObjectMeta{Name: "snap", Namespace: ns},
		Spec: snapshotv1.VolumeSnapshotSpec{
			Source:                  snapshotv1.VolumeSnapshotSource{PersistentVolumeClaimName: ptr.To("source")},
			VolumeSnapshotClassName: ptr.To(cluster.VolumeSnapshotClass),
		},
	}
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(snap)
	if err != nil {
		t.Fatal(err)
	}
	dyn := dynamicClient(t)
	start := time.Now()
	if _, err := dyn.Resource(cluster.VolumeSnapshotGVR).Namespace(ns).Create(context.Background(), &unstructured.Unstructured{Object: obj}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create VolumeSnapshot: %v", err)
	}
	last := kit.Await(t, 2*time.Minute, pollInterval, "VolumeSnapshot "+ns+"/snap to become ReadyToUse",
		func() (*snapshotv1.VolumeSnapshot, error) {
			u, err := dyn.Resource(cluster.VolumeSnapshotGVR).Namespace(ns).Get(context.Background(), "snap", metav1.GetOptions{})
			if err != nil {
				return nil, err
			}
			var got snapshotv1.VolumeSnapshot
			return &got, runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &got)
		},
		func(s *snapshotv1.VolumeSnapshot) bool {
			return s.Status != nil && s.Status.ReadyToUse != nil && *s.Status.ReadyToUse
		},
		func(s *snapshotv1.VolumeSnapshot) string {
			var st any
			if s != nil {
				st = s.Status
			}
			return fmt.Sprintf("last status %+v\nevents:\n%s", st, eventsFor(ns, "snap"))
		})
	t.Logf("VolumeSnapshot ReadyToUse in %s (content %s)", time.Since(start).Round(time.Millisecond), ptr.Deref(last.Status.BoundVolumeSnapshotContentName, ""))

	restore := pvcSpec("restored", cluster.StorageClassImmediate, "32Mi", corev1.PersistentVolumeFilesystem)
	restore.Spec.DataSource = &corev1.TypedLocalObjectReference{APIGroup: ptr.To("snapshot.storage.k8s.io"), Kind: "VolumeSnapshot", Name: "snap"}
	createPVC(t, ns, restore)
	waitPVCPhase(t, ns, "restored", corev1.ClaimBound, time.Minute)
	read := runToCompletion(t, ns, podWithClaim("reader", "restored", false, readScript(false)))
	if len(wrote) != 65 || read != wrote {
		t.Fatalf("source held %q, restored PVC holds %q", wrote, read)
	}
}

// TestClone: a PVC cloned from a PVC (dataSource PersistentVolumeClaim)
// holds the same bytes, block mode included.
func TestClone(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	for _, block := range []bool{false, true} {
		mode, suffix := corev1.PersistentVolumeFilesystem, "fs"
		if block {
			mode, suffix = corev1.PersistentVolumeBlock, "block"
		}
		createPVC(t, ns, pvcSpec("src-"+suffix, cluster.StorageClassImmediate, "16Mi", mode))
		waitPVCPhase(t, ns, "src-"+suffix, corev1.ClaimBound, time.Minute)
		wrote := runToCompletion(t, ns, podWithClaim("writer-"+suffix, "src-"+suffix, block, writeScript(block)))
		clone := pvcSpec("clone-"+suffix, cluster.StorageClassImmediate, "16Mi", mode)
		clone.Spec.DataSource = &corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: "src-" + suffix}
		start := time.Now()
		createPVC(t, ns, clone)
		waitPVCPhase(t, ns, "clone-"+suffix, corev1.ClaimBound, time.Minute)
		t.Logf("%s clone bound in %s", suffix, time.Since(start).Round(time.Millisecond))
		read := runToCompletion(t, ns, podWithClaim("reader-"+suffix, "clone-"+suffix, block, readScript(block)))
		if len(wrote) != 65 || read != wrote {
			t.Fatalf("%s: source held %q, clone holds %q", suffix, wrote, read)
		}
	}
}

// TestPopulatorRebind is the volume-populator mechanism by hand: a prime
// PVC is provisioned and written; the target PVC, whose dataSourceRef names
// a kind no provisioner serves, waits; moving the PV's claimRef to the
// target leaves the prime Lost and the target Bound to the same bytes.
func TestPopulatorRebind(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	createPVC(t, ns, pvcSpec("prime", cluster.StorageClassImmediate, "16Mi", corev1.PersistentVolumeFilesystem))
	prime := waitPVCPhase(t, ns, "prime", corev1.ClaimBound, time.Minute)
	wrote := runToCompletion(t, ns, podWithClaim("writer", "prime", false, writeScript(false)))

	target := pvcSpec("target", cluster.StorageClassImmediate, "16Mi", corev1.PersistentVolumeFilesystem)
	target.Spec.DataSourceRef = &corev1.TypedObjectReference{APIGroup: ptr.To("cdi.kubevirt.io"), Kind: "VolumeImportSource", Name: "not-served"}
	created := createPVC(t, ns, target)
	time.Sleep(2 * time.Second)
	created = waitPVCPhase(t, ns, "target", corev1.ClaimPending, 10*time.Second)

	start := time.Now()
	rebindPV(t, prime.Spec.VolumeName, created)
	bound := waitPVCPhase(t, ns, "target", corev1.ClaimBound, 30*time.Second)
	if bound.Spec.VolumeName != prime.Spec.VolumeName {
		t.Fatalf("target bound to %q, want the prime's %q", bound.Spec.VolumeName, prime.Spec.VolumeName)
	}
	waitPVCPhase(t, ns, "prime", corev1.ClaimLost, 30*time.Second)
	t.Logf("rebind: target Bound, prime Lost in %s", time.Since(start).Round(time.Millisecond))
	if err := cl.Client.CoreV1().PersistentVolumeClaims(ns).Delete(context.Background(), "prime", metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete prime: %v", err)
	}
	read := runToCompletion(t, ns, podWithClaim("reader", "target", false, readScript(false)))
	if len(wrote) != 65 || read != wrote {
		t.Fatalf("prime held %q, target holds %q", wrote, read)
	}
	pv := waitPV(t, prime.Spec.VolumeName, 10*time.Second, "Bound to the target", func(p *corev1.PersistentVolume) bool {
		return p.Status.Phase == corev1.VolumeBound && p.Spec.ClaimRef != nil && p.Spec.ClaimRef.UID == created.UID
	})
	if pv.Spec.ClaimRef.Name != "target" {
		t.Fatalf("PV claimRef = %+v", pv.Spec.ClaimRef)
	}
}
