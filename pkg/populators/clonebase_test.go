package populators

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/contract"
)

// What the base offers a clone: the source namespace from CDI's annotation,
// a worker reading another claim read-only, and attempts kept per worker.

func TestSourceNamespace(t *testing.T) {
	clone := func(refNS *string, ann map[string]string) *corev1.PersistentVolumeClaim {
		return claim(&corev1.TypedObjectReference{APIGroup: ptr.To(cdiv1.GroupName), Kind: cdiv1.VolumeCloneSourceRef, Name: "vcs", Namespace: refNS}, ann)
	}
	imp := claim(&corev1.TypedObjectReference{APIGroup: ptr.To(cdiv1.GroupName), Kind: cdiv1.VolumeImportSourceRef, Name: "src"},
		map[string]string{cdiv1.AnnDataSourceNamespace: "golden"})
	cases := []struct {
		name    string
		target  *corev1.PersistentVolumeClaim
		want    string
		cross   bool
		viaAnno bool
	}{
		{"same namespace", clone(nil, nil), "vms", false, false},
		{"CDI's annotation", clone(nil, map[string]string{cdiv1.AnnDataSourceNamespace: "golden"}), "golden", true, true},
		{"the annotation wins over the ref", clone(ptr.To("other"), map[string]string{cdiv1.AnnDataSourceNamespace: "golden"}), "golden", true, true},
		{"the ref's namespace", clone(ptr.To("other"), nil), "other", true, false},
		{"the annotation naming the claim's own", clone(nil, map[string]string{cdiv1.AnnDataSourceNamespace: "vms"}), "vms", false, true},
		{"only clones read the annotation", imp, "vms", false, false},
	}
	for _, c := range cases {
		if got := SourceNamespace(c.target); got != c.want {
			t.Errorf("%s: SourceNamespace = %q, want %q", c.name, got, c.want)
		}
		if got := IsCrossNamespace(c.target); got != c.cross {
			t.Errorf("%s: IsCrossNamespace = %v", c.name, got)
		}
		if got := AnnotatedSourceNamespace(c.target) != ""; got != c.viaAnno {
			t.Errorf("%s: AnnotatedSourceNamespace set = %v", c.name, got)
		}
	}
}

// readerWorker mounts another claim, read-only, with no scratch.
type readerWorker struct{ block bool }

func (readerWorker) PodName(*corev1.PersistentVolumeClaim) string { return "reader" }
func (w readerWorker) WorkerSpec(context.Context, *Flow, *cdiv1.CDIConfig) (WorkerSpec, error) {
	return WorkerSpec{Component: "reader", Noun: "reader pod", Container: corev1.Container{Name: "r"},
		Data: &DataClaim{Name: "golden", Block: w.block, MountPath: "/src", ReadOnly: true}}, nil
}
func (readerWorker) Observe(context.Context, *Flow, *corev1.Pod, *Result) error { return nil }

func TestWorkerReadingAnotherClaim(t *testing.T) {
	for _, block := range []bool{false, true} {
		f, c := testFlow(t, corev1.PersistentVolumeFilesystem, nil)
		w := &WorkerPhase{Client: c, Worker: readerWorker{block: block}, StateKey: "reader"}
		if _, err := w.Reconcile(context.Background(), f); err != nil {
			t.Fatal(err)
		}
		pod := &corev1.Pod{}
		if err := c.Get(context.Background(), client.ObjectKey{Namespace: "vms", Name: "reader"}, pod); err != nil {
			t.Fatal(err)
		}
		if len(pod.Spec.Volumes) != 1 || pod.Spec.Volumes[0].PersistentVolumeClaim == nil ||
			pod.Spec.Volumes[0].PersistentVolumeClaim.ClaimName != "golden" || !pod.Spec.Volumes[0].PersistentVolumeClaim.ReadOnly {
			t.Errorf("block=%v: volumes %+v, want only claim golden, read-only", block, pod.Spec.Volumes)
		}
		ctr := pod.Spec.Containers[0]
		switch {
		case block && (len(ctr.VolumeDevices) != 1 || ctr.VolumeDevices[0].DevicePath != contract.BlockPath || len(ctr.VolumeMounts) != 0):
			t.Errorf("block: devices %+v mounts %+v", ctr.VolumeDevices, ctr.VolumeMounts)
		case !block && (len(ctr.VolumeMounts) != 1 || ctr.VolumeMounts[0].MountPath != "/src" || !ctr.VolumeMounts[0].ReadOnly || len(ctr.VolumeDevices) != 0):
			t.Errorf("filesystem: mounts %+v devices %+v", ctr.VolumeMounts, ctr.VolumeDevices)
		}
		_ = c.Get(context.Background(), client.ObjectKeyFromObject(f.Prime), f.Prime)
		if got := parsePrimeStateFor(f.Prime.Annotations, "reader").Attempts; got != 1 {
			t.Errorf("reader attempts %d, want 1", got)
		}
		if _, ok := f.Prime.Annotations[annAttempts]; ok {
			t.Errorf("the reader counted its attempt as the prime's one worker's: %v", f.Prime.Annotations)
		}
	}
}
