package selftest

import (
	"context"
	"encoding/json"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// staticPV makes a PV of a storage class no provisioner serves, so that
// only the PV controller's binding is at work.
func staticPV(t *testing.T, class string) *corev1.PersistentVolume {
	t.Helper()
	hostType := corev1.HostPathDirectoryOrCreate
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "static-"},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			StorageClassName:              class,
			PersistentVolumeSource: corev1.PersistentVolumeSource{
				HostPath: &corev1.HostPathVolumeSource{Path: filepath.Join(cl.Dir, "static", class), Type: &hostType},
			},
		},
	}
	out, err := cl.Client.CoreV1().PersistentVolumes().Create(context.Background(), pv, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create PV: %v", err)
	}
	t.Cleanup(func() {
		_ = cl.Client.CoreV1().PersistentVolumes().Delete(context.Background(), out.Name, metav1.DeleteOptions{})
	})
	return out
}

// TestStaticBinding: the real PV controller binds a PVC to a matching PV.
func TestStaticBinding(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	class := "static-" + ns
	pv := staticPV(t, class)
	createPVC(t, ns, pvcSpec("claim", class, "1Gi", corev1.PersistentVolumeFilesystem))
	start := time.Now()
	pvc := waitPVCPhase(t, ns, "claim", corev1.ClaimBound, 30*time.Second)
	t.Logf("static PVC bound in %s", time.Since(start).Round(time.Millisecond))
	if pvc.Spec.VolumeName != pv.Name {
		t.Fatalf("PVC bound to %q, want %q", pvc.Spec.VolumeName, pv.Name)
	}
	got := waitPV(t, pv.Name, 10*time.Second, "Bound", func(p *corev1.PersistentVolume) bool { return p.Status.Phase == corev1.VolumeBound })
	if got.Spec.ClaimRef == nil || got.Spec.ClaimRef.UID != pvc.UID {
		t.Fatalf("PV claimRef = %+v, want the PVC's uid %s", got.Spec.ClaimRef, pvc.UID)
	}
}

// rebindPV points a bound PV's claimRef at another PVC, as a volume
// populator does with its prime PVC's volume.
func rebindPV(t *testing.T, pvName string, target *corev1.PersistentVolumeClaim) {
	t.Helper()
	patch, err := json.Marshal(map[string]any{
		"spec": map[string]any{
			"claimRef": map[string]any{
				"namespace":       target.Namespace,
				"name":            target.Name,
				"uid":             string(target.UID),
				"resourceVersion": target.ResourceVersion,
				"apiVersion":      "v1",
				"kind":            "PersistentVolumeClaim",
			},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Client.CoreV1().PersistentVolumes().Patch(context.Background(), pvName, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatalf("patch PV %s claimRef: %v", pvName, err)
	}
}

// TestStaticRebind: moving a PV's claimRef from one PVC to another leaves
// the first Lost and the second Bound to that PV, done by the real PV
// controller alone.
func TestStaticRebind(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	class := "static-" + ns
	pv := staticPV(t, class)
	createPVC(t, ns, pvcSpec("prime", class, "1Gi", corev1.PersistentVolumeFilesystem))
	waitPVCPhase(t, ns, "prime", corev1.ClaimBound, 30*time.Second)
	target := createPVC(t, ns, pvcSpec("target", class, "1Gi", corev1.PersistentVolumeFilesystem))

	start := time.Now()
	rebindPV(t, pv.Name, target)
	bound := waitPVCPhase(t, ns, "target", corev1.ClaimBound, 30*time.Second)
	if bound.Spec.VolumeName != pv.Name {
		t.Fatalf("target bound to %q, want %q", bound.Spec.VolumeName, pv.Name)
	}
	waitPVCPhase(t, ns, "prime", corev1.ClaimLost, 30*time.Second)
	t.Logf("rebind: target Bound and prime Lost in %s", time.Since(start).Round(time.Millisecond))

	// Deleting the Lost prime leaves the PV bound to the target.
	if err := cl.Client.CoreV1().PersistentVolumeClaims(ns).Delete(context.Background(), "prime", metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete prime: %v", err)
	}
	time.Sleep(2 * time.Second) // two claim resyncs
	got := waitPV(t, pv.Name, 10*time.Second, "Bound to the target", func(p *corev1.PersistentVolume) bool {
		return p.Status.Phase == corev1.VolumeBound && p.Spec.ClaimRef != nil && p.Spec.ClaimRef.UID == target.UID
	})
	if got.Spec.ClaimRef.Name != "target" {
		t.Fatalf("PV claimRef %+v, want target", got.Spec.ClaimRef)
	}
}
