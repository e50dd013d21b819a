package populators

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

func claim(ref *corev1.TypedObjectReference, ann map[string]string) *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "disk", Namespace: "vms", UID: "u-1", Annotations: ann},
		Spec: corev1.PersistentVolumeClaimSpec{
			DataSourceRef:    ref,
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			VolumeMode:       ptr.To(corev1.PersistentVolumeBlock),
			StorageClassName: ptr.To("fast"),
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("2Gi")}},
		},
	}
}

func TestHandles(t *testing.T) {
	cases := []struct {
		name string
		ref  *corev1.TypedObjectReference
		want bool
	}{
		{"no ref", nil, false},
		{"ours", &corev1.TypedObjectReference{APIGroup: ptr.To("cdi.kubevirt.io"), Kind: "VolumeImportSource", Name: "s"}, true},
		{"other kind of ours", &corev1.TypedObjectReference{APIGroup: ptr.To("cdi.kubevirt.io"), Kind: "VolumeUploadSource", Name: "s"}, false},
		{"same kind, other group", &corev1.TypedObjectReference{APIGroup: ptr.To("example.com"), Kind: "VolumeImportSource", Name: "s"}, false},
		{"core PVC clone", &corev1.TypedObjectReference{Kind: "PersistentVolumeClaim", Name: "s"}, false},
	}
	for _, c := range cases {
		if got := Handles(claim(c.ref, nil), "VolumeImportSource"); got != c.want {
			t.Errorf("%s: Handles = %v, want %v", c.name, got, c.want)
		}
	}
}

func TestUnsupportedClass(t *testing.T) {
	cases := map[string]bool{
		"hostpath.csi.kubefill.test":   false,
		"ebs.csi.aws.com":              false,
		"kubernetes.io/aws-ebs":        true,
		"kubernetes.io/no-provisioner": true,
	}
	for prov, unsupported := range cases {
		msg := UnsupportedClass(&storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "c"}, Provisioner: prov})
		if (msg != "") != unsupported {
			t.Errorf("%s: message %q, want unsupported=%v", prov, msg, unsupported)
		}
	}
}

func TestWaitsForConsumer(t *testing.T) {
	wffc := &storagev1.StorageClass{VolumeBindingMode: ptr.To(storagev1.VolumeBindingWaitForFirstConsumer)}
	immediate := &storagev1.StorageClass{VolumeBindingMode: ptr.To(storagev1.VolumeBindingImmediate)}
	cases := []struct {
		name  string
		sc    *storagev1.StorageClass
		ann   map[string]string
		honor bool
		want  bool
	}{
		{"immediate class", immediate, nil, true, false},
		{"unset mode is immediate", &storagev1.StorageClass{}, nil, true, false},
		{"wffc, no node", wffc, nil, true, true},
		{"wffc, node chosen", wffc, map[string]string{cdiv1.AnnSelectedNode: "node-1"}, true, false},
		{"wffc, immediate requested", wffc, map[string]string{cdiv1.AnnImmediateBinding: "true"}, true, false},
		{"wffc, immediate requested with no value (virtctl --force-bind)", wffc, map[string]string{cdiv1.AnnImmediateBinding: ""}, true, false},
		{"wffc, immediate requested with false: presence counts", wffc, map[string]string{cdiv1.AnnImmediateBinding: "false"}, true, false},
		{"wffc, HonorWaitForFirstConsumer gate off", wffc, nil, false, false},
		{"immediate class, gate off", immediate, nil, false, false},
	}
	for _, c := range cases {
		if got := WaitsForConsumer(claim(nil, c.ann), c.sc, c.honor); got != c.want {
			t.Errorf("%s: WaitsForConsumer = %v, want %v", c.name, got, c.want)
		}
	}
}

func TestNewPrime(t *testing.T) {
	target := claim(nil, map[string]string{cdiv1.AnnSelectedNode: "node-1", "unrelated": "x"})
	prime := NewPrime(target, "VolumeImportSource")
	if prime.Name != "prime-u-1" || prime.Namespace != "vms" {
		t.Errorf("prime is %s/%s", prime.Namespace, prime.Name)
	}
	if *prime.Spec.VolumeMode != corev1.PersistentVolumeBlock || *prime.Spec.StorageClassName != "fast" ||
		prime.Spec.AccessModes[0] != corev1.ReadWriteOnce || prime.Spec.Resources.Requests.Storage().String() != "2Gi" {
		t.Errorf("prime spec not copied from target: %+v", prime.Spec)
	}
	if prime.Annotations[cdiv1.AnnSelectedNode] != "node-1" || prime.Annotations["unrelated"] != "" {
		t.Errorf("prime annotations %v", prime.Annotations)
	}
	if prime.Spec.DataSourceRef != nil {
		t.Error("prime must not name a data source, or a populator would act on it")
	}
	own := prime.OwnerReferences
	if len(own) != 1 || own[0].UID != "u-1" || !*own[0].Controller {
		t.Errorf("prime owner references %+v", own)
	}
}

func TestNextRebindStep(t *testing.T) {
	target := claim(nil, nil)
	prime := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "prime-u-1", Namespace: "vms", UID: "p-1"}}
	pv := func(ref *corev1.ObjectReference) *corev1.PersistentVolume {
		return &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv-1"}, Spec: corev1.PersistentVolumeSpec{ClaimRef: ref}}
	}
	toPrime := &corev1.ObjectReference{Namespace: "vms", Name: "prime-u-1", UID: "p-1"}
	toTarget := &corev1.ObjectReference{Namespace: "vms", Name: "disk", UID: "u-1"}
	bound := claim(nil, nil)
	bound.Spec.VolumeName = "pv-1"
	bound.Status.Phase = corev1.ClaimBound
	boundElsewhere := claim(nil, nil)
	boundElsewhere.Spec.VolumeName = "pv-other"
	boundElsewhere.Status.Phase = corev1.ClaimBound

	cases := []struct {
		name   string
		target *corev1.PersistentVolumeClaim
		pv     *corev1.PersistentVolume
		want   RebindStep
	}{
		{"no volume yet", target, nil, RebindWait},
		{"volume holds prime", target, pv(toPrime), RebindPatchClaimRef},
		{"claimRef moved, not bound yet", target, pv(toTarget), RebindWaitForBind},
		{"target bound to the volume", bound, pv(toTarget), RebindDone},
		{"claimRef names target, target not yet bound to it", boundElsewhere, pv(toTarget), RebindWaitForBind},
		{"volume of a stranger", target, pv(&corev1.ObjectReference{Namespace: "x", Name: "y", UID: "z"}), RebindConflict},
		{"volume with no claimRef", target, pv(nil), RebindConflict},
	}
	for _, c := range cases {
		if got := NextRebindStep(c.target, prime, c.pv); got != c.want {
			t.Errorf("%s: step %d, want %d", c.name, got, c.want)
		}
	}
}

// TestNextRebindStepAcrossNamespaces: a clone's prime lives in the source's
// namespace; its volume is rebound to the target all the same, and a claim
// of the same name and UID elsewhere is a stranger.
func TestNextRebindStepAcrossNamespaces(t *testing.T) {
	target := claim(nil, nil)
	prime := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "prime-u-1", Namespace: "golden", UID: "p-1"}}
	pv := func(ns, name string, uid types.UID) *corev1.PersistentVolume {
		return &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv-1"}, Spec: corev1.PersistentVolumeSpec{
			ClaimRef: &corev1.ObjectReference{Namespace: ns, Name: name, UID: uid}}}
	}
	for _, c := range []struct {
		name string
		pv   *corev1.PersistentVolume
		want RebindStep
	}{
		{"volume holds the prime in the source namespace", pv("golden", "prime-u-1", "p-1"), RebindPatchClaimRef},
		{"claimRef moved to the target's namespace", pv("vms", "disk", "u-1"), RebindWaitForBind},
		{"prime's name and UID in the target's namespace", pv("vms", "prime-u-1", "p-1"), RebindConflict},
		{"target's name and UID in the source namespace", pv("golden", "disk", "u-1"), RebindConflict},
	} {
		if got := NextRebindStep(target, prime, c.pv); got != c.want {
			t.Errorf("%s: step %d, want %d", c.name, got, c.want)
		}
	}
}

func TestFormatProgress(t *testing.T) {
	cases := []struct {
		pct  float64
		done bool
		want string
	}{
		{0, false, "0.00%"},
		{45.2, false, "45.20%"},
		{100, false, "99.99%"},
		{120, false, "99.99%"},
		{-3, false, "0.00%"},
		{50, true, "100.0%"},
	}
	for _, c := range cases {
		if got := FormatProgress(c.pct, c.done); got != c.want {
			t.Errorf("FormatProgress(%v, %v) = %q, want %q", c.pct, c.done, got, c.want)
		}
	}
}

func TestHandedOver(t *testing.T) {
	now := metav1.Now()
	fresh := func() (*corev1.PersistentVolumeClaim, *corev1.PersistentVolumeClaim) {
		return claim(nil, nil), &corev1.PersistentVolumeClaim{Status: corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimBound}}
	}
	cases := []struct {
		name string
		edit func(target, prime *corev1.PersistentVolumeClaim)
		want bool
	}{
		{"filling", func(_, _ *corev1.PersistentVolumeClaim) {}, false},
		{"prime being deleted", func(_, p *corev1.PersistentVolumeClaim) { p.DeletionTimestamp = &now }, true},
		{"prime lost its volume", func(_, p *corev1.PersistentVolumeClaim) { p.Status.Phase = corev1.ClaimLost }, true},
		{"target names the volume", func(tg, _ *corev1.PersistentVolumeClaim) { tg.Spec.VolumeName = "pv-1" }, true},
		{"target bound", func(tg, _ *corev1.PersistentVolumeClaim) { tg.Status.Phase = corev1.ClaimBound }, true},
	}
	for _, c := range cases {
		target, prime := fresh()
		c.edit(target, prime)
		if got := HandedOver(target, prime); got != c.want {
			t.Errorf("%s: HandedOver = %v, want %v", c.name, got, c.want)
		}
	}
}
