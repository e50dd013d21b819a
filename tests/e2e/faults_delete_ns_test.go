package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"

	"github.com/kubefill/kubefill/tests/kit"
)

// TestDeleteSourceNamespaceMidClone: the namespace of a cross-namespace
// host-assisted clone's source is deleted while the copy streams. The
// namespace goes (no finalizer of Kubefill's holds it or its temporary
// claim, pods, Secret and Service); the clone does not claim success on a
// half-written volume: the DataVolume waits, saying its source is missing;
// no temporary claim, pod or volume of the copy is left; deleting the
// DataVolume then leaves nothing, its finalizers released.
func TestDeleteSourceNamespaceMidClone(t *testing.T) {
	parallel(t)
	s := shared
	ctx := context.Background()
	st := cdiv1.CloneStrategyHostAssisted
	class := s.cloneClass(t, classOpts{strategy: st})
	srcNs, dstNs := s.namespace(t, "clone-src"), s.namespace(t, "clone-dst")
	src := s.makeSource(t, srcNs, "golden", class, "400Mi", false, 384)
	// All of it: a copy cut short may have the first bytes right.
	const full = 384 << 20
	fullSHA := readClaims(t, srcNs, full, map[string]bool{"golden": false})["golden"]
	s.create(t, kit.DataVolume(dstNs, "orphan", pvcSource(srcNs, "golden"), kit.WithPVC(cloneSpec(class, "400Mi", false))))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the clone when the test failed:\n%s", s.describeClone(dstNs, "orphan", srcNs, nil))
		}
	})
	dv := &cdiv1.DataVolume{}
	target := &corev1.PersistentVolumeClaim{}
	var inFlight string
	kit.Eventually(t, cloneTimeout, 100*time.Millisecond, "the copy to stream", func() (bool, string, error) {
		if err := s.c.Get(ctx, types.NamespacedName{Namespace: dstNs, Name: "orphan"}, dv); err != nil {
			return false, "", err
		}
		if dv.Status.Phase == cdiv1.Succeeded {
			t.Fatalf("the clone finished before the test saw it in flight\n%s", s.describeClone(dstNs, "orphan", srcNs, dv))
		}
		if err := s.c.Get(ctx, types.NamespacedName{Namespace: dstNs, Name: "orphan"}, target); err != nil {
			return false, "", err
		}
		inFlight = s.slowStepInFlight(ctx, st, srcNs, string(target.UID))
		return inFlight != "", fmt.Sprintf("DataVolume %s %s", dv.Status.Phase, dv.Status.Progress), nil
	})
	t.Logf("deleting namespace %s mid-clone: %s, DataVolume %s %s", srcNs, inFlight, dv.Status.Phase, dv.Status.Progress)
	if err := cl.Client.CoreV1().Namespaces().Delete(ctx, srcNs, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	begin := time.Now()
	// Left their grace period, the copy's pods would finish it; killed at
	// once (as a node going away would), they leave it half-written.
	if err := cl.Client.CoreV1().Pods(srcNs).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))}, metav1.ListOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatalf("killing the pods of %s: %v", srcNs, err)
	}
	kit.Eventually(t, 3*time.Minute, 250*time.Millisecond, "namespace "+srcNs+" to be gone", func() (bool, string, error) {
		ns, err := cl.Client.CoreV1().Namespaces().Get(ctx, srcNs, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, "", nil
		}
		if err != nil {
			return false, "", err
		}
		var held []string
		claims := &corev1.PersistentVolumeClaimList{}
		if err := s.c.List(ctx, claims, client.InNamespace(srcNs)); err == nil {
			for _, p := range claims.Items {
				held = append(held, fmt.Sprintf("claim %s finalizers %v", p.Name, p.Finalizers))
			}
		}
		pods := &corev1.PodList{}
		if err := s.c.List(ctx, pods, client.InNamespace(srcNs)); err == nil {
			for _, p := range pods.Items {
				held = append(held, fmt.Sprintf("pod %s %s finalizers %v", p.Name, p.Status.Phase, p.Finalizers))
			}
		}
		return false, fmt.Sprintf("namespace %s, conditions %+v, holding %v", ns.Status.Phase, ns.Status.Conditions, held), nil
	})
	t.Logf("namespace %s gone %s after its delete", srcNs, time.Since(begin).Round(time.Millisecond))

	// The clone does not claim a half-written copy: it waits, saying why. A
	// copy that was whole before its pods died may succeed, with every byte.
	var said cdiv1.DataVolumeCondition
	kit.Eventually(t, 2*time.Minute, 250*time.Millisecond, "the DataVolume to say its source is gone", func() (bool, string, error) {
		if err := s.c.Get(ctx, types.NamespacedName{Namespace: dstNs, Name: "orphan"}, dv); err != nil {
			return false, "", err
		}
		if dv.Status.Phase == cdiv1.Succeeded {
			return true, "", nil
		}
		said = runningCondition(dv)
		msg := said.Message + " " + kit.DataVolumeCondition(dv, cdiv1.DataVolumeBound).Message
		return strings.Contains(msg, srcNs) && (strings.Contains(msg, "not found") || strings.Contains(msg, "missing") || strings.Contains(msg, "gone")),
			fmt.Sprintf("phase %s, conditions %+v", dv.Status.Phase, dv.Status.Conditions), nil
	})
	if err := s.c.Get(ctx, types.NamespacedName{Namespace: dstNs, Name: "orphan"}, target); err != nil {
		t.Fatal(err)
	}
	if dv.Status.Phase == cdiv1.Succeeded {
		// The copy was whole before its pods died: then every byte is there.
		got := readClaims(t, dstNs, full, map[string]bool{"orphan": false})["orphan"]
		if got != fullSHA {
			t.Fatalf("the clone Succeeded after its source's namespace was deleted mid-copy, holding sha256 %s of its %d bytes, the source %s: a half-written copy claimed as success\n%s",
				got, full, fullSHA, s.describeClone(dstNs, "orphan", srcNs, dv))
		}
		t.Logf("the copy was whole before its pods died: the DataVolume Succeeded with the source's %d bytes", full)
	} else {
		t.Logf("the DataVolume after its source's namespace went: phase %s, Running %s: %s", dv.Status.Phase, said.Reason, said.Message)
		if target.Status.Phase == corev1.ClaimBound || target.Annotations[cdiv1.AnnPopulatedFor] != "" {
			t.Errorf("the target claim took the half-written copy: %s, populated for %q", target.Status.Phase, target.Annotations[cdiv1.AnnPopulatedFor])
		}
	}
	s.deletePods(t, dstNs, "read-")

	// Deleting the DataVolume leaves nothing: its finalizer and the clone's
	// are released with the source's namespace gone.
	if err := s.c.Delete(ctx, dv); err != nil {
		t.Fatal(err)
	}
	s.assertNothingLeft(t, src, dstNs, target.UID)
	if err := s.c.Get(ctx, types.NamespacedName{Name: src.volume}, &corev1.PersistentVolume{}); !apierrors.IsNotFound(err) {
		t.Logf("the source's volume %s after its namespace went: %v (its class's reclaim policy)", src.volume, err)
	}
}
