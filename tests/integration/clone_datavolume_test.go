package integration

import (
	"context"
	"crypto/rsa"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/controller"
	"github.com/kubefill/kubefill/pkg/token"
	"github.com/kubefill/kubefill/tests/kit"
)

// The DataVolume side of clone against the real kube-apiserver: what the
// DataVolume controller renders for a clone (the VolumeCloneSource in the
// source namespace, the claim and its annotations), the extended clone token,
// sizeless clones and DataSource sourceRefs. The populator that fills the
// claim is not run here: these tests stop where it starts.

// cloneKeys is the test's token signing key.
type cloneKeys struct{ key *rsa.PrivateKey }

func newCloneKeys(t *testing.T) cloneKeys {
	t.Helper()
	k, err := token.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	return cloneKeys{key: k}
}

// short issues the webhook's short token for a clone of the PVC srcNS/src
// into ns/name, valid for lifetime from now.
func (k cloneKeys) short(t *testing.T, srcNS, src, ns, name string, lifetime time.Duration) string {
	t.Helper()
	s, err := token.NewGenerator(token.CloneTokenIssuer, k.key, lifetime).Generate(token.NewClonePayload(token.ResourcePVC, srcNS, src, ns, name))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func (k cloneKeys) extendedValidator() token.Validator {
	return token.NewValidator(token.ExtendedCloneTokenIssuer, &k.key.PublicKey, token.DefaultCloneTokenLeeway)
}

// startCloneDataVolumeController runs the DataVolume controller, with the
// test's keys, and the StorageProfile controller, until the test ends. The
// DataVolumes left in namespaces are deleted first, while the controller
// still runs to release their finalizers.
func startCloneDataVolumeController(t *testing.T, k cloneKeys, namespaces ...string) {
	t.Helper()
	startCloneDataVolumeControllerWith(t, k, nil, namespaces...)
}

// startCloneDataVolumeControllerWith is startCloneDataVolumeController with
// configure changing the reconciler (its token sources) before it starts.
func startCloneDataVolumeControllerWith(t *testing.T, k cloneKeys, configure func(*controller.DataVolumeReconciler), namespaces ...string) {
	t.Helper()
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 controller.NewScheme(),
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		t.Fatal(err)
	}
	profiles := &controller.StorageProfileReconciler{Client: mgr.GetClient(), Recorder: mgr.GetEventRecorder("storageprofile-controller")}
	if err := profiles.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	dvs := &controller.DataVolumeReconciler{
		Client:   mgr.GetClient(),
		Recorder: mgr.GetEventRecorder("datavolume-controller"),
		// No leeway: a token the test lets expire is expired at once.
		CloneTokens:            token.NewValidator(token.CloneTokenIssuer, &k.key.PublicKey, 0),
		ExtendedTokens:         token.NewGenerator(token.ExtendedCloneTokenIssuer, k.key, token.DefaultExtendedCloneTokenLifetime),
		ExtendedTokenValidator: k.extendedValidator(),
	}
	if configure != nil {
		configure(dvs)
	}
	if err := dvs.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	startUntilCleanup(t, mgr)
	t.Cleanup(func() {
		ctx := context.Background()
		for _, ns := range namespaces {
			if err := k8sClient.DeleteAllOf(ctx, &cdiv1.DataVolume{}, client.InNamespace(ns)); err != nil {
				t.Errorf("deleting the DataVolumes of %s: %v", ns, err)
			}
		}
		kit.Until(t, 30*time.Second, "the test's DataVolumes to go", func() bool {
			for _, ns := range namespaces {
				list := &cdiv1.DataVolumeList{}
				if err := k8sClient.List(ctx, list, client.InNamespace(ns)); err != nil || len(list.Items) > 0 {
					return false
				}
			}
			return true
		})
	})
}

// boundSource creates a claim to clone from, reported Bound with capacity.
func boundSource(t *testing.T, ns, name, class, capacity string) *corev1.PersistentVolumeClaim {
	t.Helper()
	ctx := context.Background()
	pvc := kit.PVC(ns, name, capacity, kit.Class(class))
	if err := k8sClient.Create(ctx, pvc); err != nil {
		t.Fatal(err)
	}
	pvc.Status.Phase = corev1.ClaimBound
	pvc.Status.AccessModes = pvc.Spec.AccessModes
	pvc.Status.Capacity = corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(capacity)}
	if err := k8sClient.Status().Update(ctx, pvc); err != nil {
		t.Fatal(err)
	}
	return pvc
}

func cloneDataVolume(ns, name, class string, src *cdiv1.DataVolumeSource, ref *cdiv1.DataVolumeSourceRef, ann map[string]string) *cdiv1.DataVolume {
	return &cdiv1.DataVolume{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: ann},
		Spec:       cdiv1.DataVolumeSpec{Source: src, SourceRef: ref, Storage: &cdiv1.StorageSpec{StorageClassName: &class}},
	}
}

func pvcSource(ns, name string) *cdiv1.DataVolumeSource {
	return &cdiv1.DataVolumeSource{PVC: &cdiv1.DataVolumeSourcePVC{Namespace: ns, Name: name}}
}

// waitRunning waits until the DataVolume's Running condition says want.
func waitRunning(t *testing.T, ns, name, want string) *cdiv1.DataVolume {
	t.Helper()
	dv := &cdiv1.DataVolume{}
	kit.Until(t, 30*time.Second, "DataVolume "+ns+"/"+name+" Running to say "+want, func() bool {
		return k8sClient.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, dv) == nil &&
			strings.Contains(kit.DataVolumeCondition(dv, cdiv1.DataVolumeRunning).Message, want)
	})
	return dv
}

// waitClaim waits for the DataVolume's claim.
func waitClaim(t *testing.T, ns, name string, done func(*corev1.PersistentVolumeClaim) bool) *corev1.PersistentVolumeClaim {
	t.Helper()
	pvc := &corev1.PersistentVolumeClaim{}
	kit.Until(t, 30*time.Second, "claim "+ns+"/"+name, func() bool {
		return k8sClient.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, pvc) == nil && (done == nil || done(pvc))
	})
	return pvc
}

func checkCloneRef(t *testing.T, pvc *corev1.PersistentVolumeClaim, dv *cdiv1.DataVolume) {
	t.Helper()
	ref := pvc.Spec.DataSourceRef
	if ref == nil || ptr.Deref(ref.APIGroup, "") != cdiv1.GroupName || ref.Kind != cdiv1.VolumeCloneSourceRef ||
		ref.Name != "volume-clone-source-"+string(dv.UID) || ref.Namespace != nil {
		t.Errorf("claim dataSourceRef %+v", ref)
	}
	if !metav1.IsControlledBy(pvc, dv) {
		t.Errorf("claim owners %+v", pvc.OwnerReferences)
	}
}

func TestCloneDataVolumeRendersSourceAndClaim(t *testing.T) {
	ctx := context.Background()
	src, tgt := newNamespace(t), newNamespace(t)
	class := src + "-csi"
	csiClass(t, class, "hostpath.csi.kubefill.test", storagev1.VolumeBindingImmediate, rwoFilesystem)
	boundSource(t, src, "golden", class, "2Gi")
	k := newCloneKeys(t)
	startCloneDataVolumeController(t, k, src, tgt)

	// Same namespace: no token, the VolumeCloneSource owned by the DataVolume, a sizeless claim of the source's capacity.
	same := cloneDataVolume(src, "same", class, pvcSource(src, "golden"), nil, nil)
	same.Spec.Preallocation = ptr.To(true)
	if err := k8sClient.Create(ctx, same); err != nil {
		t.Fatal(err)
	}
	pvc := waitClaim(t, src, "same", nil)
	checkCloneRef(t, pvc, same)
	if got := pvc.Spec.Resources.Requests[corev1.ResourceStorage]; got.Cmp(resource.MustParse("2Gi")) != 0 {
		t.Errorf("sizeless clone of a 2Gi claim asks for %s", got.String())
	}
	if _, ok := pvc.Annotations[cdiv1.AnnDataSourceNamespace]; ok {
		t.Errorf("same-namespace claim annotated %v", pvc.Annotations)
	}
	vcs := &cdiv1.VolumeCloneSource{}
	if err := k8sClient.Get(ctx, types.NamespacedName{Namespace: src, Name: "volume-clone-source-" + string(same.UID)}, vcs); err != nil {
		t.Fatal(err)
	}
	if !metav1.IsControlledBy(vcs, same) || vcs.Spec.Source.Kind != "PersistentVolumeClaim" || vcs.Spec.Source.Name != "golden" || !ptr.Deref(vcs.Spec.Preallocation, false) {
		t.Errorf("same-namespace VolumeCloneSource %+v", vcs)
	}
	kit.Until(t, 20*time.Second, "DataVolume phase CloneScheduled and its event", func() bool {
		_ = k8sClient.Get(ctx, client.ObjectKeyFromObject(same), same)
		return same.Status.Phase == cdiv1.CloneScheduled && eventReasons(t, src, same.UID)["CloneScheduled"]
	})

	// Another namespace: the extended token bound to the DataVolume, then the claim's own.
	cross := cloneDataVolume(tgt, "cross", class, pvcSource(src, "golden"), nil,
		map[string]string{cdiv1.AnnCloneToken: k.short(t, src, "golden", tgt, "cross", 5*time.Minute)})
	if err := k8sClient.Create(ctx, cross); err != nil {
		t.Fatal(err)
	}
	pvc = waitClaim(t, tgt, "cross", func(p *corev1.PersistentVolumeClaim) bool { return p.Annotations[cdiv1.AnnExtendedCloneToken] != "" })
	if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(cross), cross); err != nil {
		t.Fatal(err)
	}
	checkCloneRef(t, pvc, cross)
	v := k.extendedValidator()
	dvTok, err := v.Validate(cross.Annotations[cdiv1.AnnExtendedCloneToken])
	if err != nil {
		t.Fatalf("the DataVolume's extended token: %v", err)
	}
	if err := token.CheckExtendedClone(dvTok, token.ResourcePVC, src, "golden", tgt, "cross", string(cross.UID)); err != nil {
		t.Errorf("the DataVolume's extended token: %v", err)
	}
	claimTok, err := v.Validate(pvc.Annotations[cdiv1.AnnExtendedCloneToken])
	if err != nil {
		t.Fatalf("the claim's extended token: %v", err)
	}
	if err := token.CheckExtendedClone(claimTok, token.ResourcePVC, src, "golden", tgt, "cross", string(pvc.UID)); err != nil {
		t.Errorf("the claim's extended token: %v", err)
	}
	// The short token stays on the DataVolume: on a claim only the claim's
	// own extended token counts.
	if _, short := pvc.Annotations[cdiv1.AnnCloneToken]; pvc.Annotations[cdiv1.AnnDataSourceNamespace] != src || short {
		t.Errorf("cross-namespace claim annotations %v", pvc.Annotations)
	}
	vcs = &cdiv1.VolumeCloneSource{}
	key := types.NamespacedName{Namespace: src, Name: "volume-clone-source-" + string(cross.UID)}
	if err := k8sClient.Get(ctx, key, vcs); err != nil {
		t.Fatal(err)
	}
	if vcs.Annotations[cdiv1.AnnOwnedByDataVolume] != tgt+"/cross" || len(vcs.OwnerReferences) != 0 {
		t.Errorf("cross-namespace VolumeCloneSource %+v", vcs.ObjectMeta)
	}
	found := false
	for _, f := range cross.Finalizers {
		found = found || f == cdiv1.FinalizerDataVolume
	}
	if !found {
		t.Errorf("DataVolume finalizers %v", cross.Finalizers)
	}

	// Deleting it removes the VolumeCloneSource in the source namespace.
	if err := k8sClient.Delete(ctx, cross); err != nil {
		t.Fatal(err)
	}
	kit.Until(t, 30*time.Second, "the DataVolume and its VolumeCloneSource gone", func() bool {
		return gone(ctx, &cdiv1.VolumeCloneSource{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}) &&
			gone(ctx, &cdiv1.DataVolume{ObjectMeta: metav1.ObjectMeta{Namespace: tgt, Name: "cross"}})
	})

	// A target smaller than the source is refused on the DataVolume.
	small := cloneDataVolume(src, "small", class, pvcSource(src, "golden"), nil, nil)
	small.Spec.Storage.Resources.Requests = corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}
	if err := k8sClient.Create(ctx, small); err != nil {
		t.Fatal(err)
	}
	small = waitRunning(t, src, "small", "target resources requests storage size is smaller than the source")
	if reasons := eventReasons(t, src, small.UID); !reasons["CloneValidationFailed"] {
		t.Errorf("no CloneValidationFailed event: %v", reasons)
	}
}

// TestCloneDataVolumeOutlivesItsShortToken is CDI issue #2777: a clone from
// another namespace created before its source proceeds when the source
// appears after the short token expired.
func TestCloneDataVolumeOutlivesItsShortToken(t *testing.T) {
	ctx := context.Background()
	src, tgt := newNamespace(t), newNamespace(t)
	class := src + "-csi"
	csiClass(t, class, "hostpath.csi.kubefill.test", storagev1.VolumeBindingImmediate, rwoFilesystem)
	k := newCloneKeys(t)
	startCloneDataVolumeController(t, k, src, tgt)

	short := k.short(t, src, "later", tgt, "early", 3*time.Second)
	dv := cloneDataVolume(tgt, "early", class, pvcSource(src, "later"), nil, map[string]string{cdiv1.AnnCloneToken: short})
	if err := k8sClient.Create(ctx, dv); err != nil {
		t.Fatal(err)
	}
	dv = waitRunning(t, tgt, "early", "The source pvc later doesn't exist")
	if dv.Annotations[cdiv1.AnnExtendedCloneToken] == "" {
		t.Fatal("waiting for its source without an extended token")
	}
	if reasons := eventReasons(t, tgt, dv.UID); !reasons["CloneWithoutSource"] {
		t.Errorf("no CloneWithoutSource event: %v", reasons)
	}
	shortValidator := token.NewValidator(token.CloneTokenIssuer, &k.key.PublicKey, 0)
	kit.Until(t, 20*time.Second, "the short token to expire", func() bool {
		_, err := shortValidator.Validate(short)
		return err != nil
	})
	boundSource(t, src, "later", class, "1Gi")
	pvc := waitClaim(t, tgt, "early", func(p *corev1.PersistentVolumeClaim) bool { return p.Annotations[cdiv1.AnnExtendedCloneToken] != "" })
	p, err := k.extendedValidator().Validate(pvc.Annotations[cdiv1.AnnExtendedCloneToken])
	if err != nil {
		t.Fatal(err)
	}
	if err := token.CheckExtendedClone(p, token.ResourcePVC, src, "later", tgt, "early", string(pvc.UID)); err != nil {
		t.Error(err)
	}

	// An expired short token and no extended token: refused, with what to do.
	late := cloneDataVolume(tgt, "late", class, pvcSource(src, "later"), nil, map[string]string{cdiv1.AnnCloneToken: short})
	if err := k8sClient.Create(ctx, late); err != nil {
		t.Fatal(err)
	}
	late = waitRunning(t, tgt, "late", "the clone token is invalid or expired")
	if msg := kit.DataVolumeCondition(late, cdiv1.DataVolumeRunning).Message; !strings.Contains(msg, "delete and re-create the DataVolume") {
		t.Errorf("Running %q", msg)
	}
	if gone(ctx, &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: tgt, Name: "late"}}) == false {
		t.Error("a claim was made for a clone without a valid token")
	}
}

func TestCloneDataVolumeFromDataSource(t *testing.T) {
	ctx := context.Background()
	src, tgt := newNamespace(t), newNamespace(t)
	class := src + "-csi"
	csiClass(t, class, "hostpath.csi.kubefill.test", storagev1.VolumeBindingImmediate, rwoFilesystem)
	boundSource(t, src, "golden", class, "3Gi")
	k := newCloneKeys(t)
	startCloneDataVolumeController(t, k, src, tgt)

	// The DataSource does not exist yet.
	ref := &cdiv1.DataVolumeSourceRef{Kind: cdiv1.DataVolumeDataSource, Namespace: &src, Name: "fedora"}
	dv := cloneDataVolume(tgt, "from-ds", class, nil, ref, map[string]string{cdiv1.AnnCloneToken: k.short(t, src, "golden", tgt, "from-ds", 5*time.Minute)})
	if err := k8sClient.Create(ctx, dv); err != nil {
		t.Fatal(err)
	}
	waitRunning(t, tgt, "from-ds", "DataSource "+src+"/fedora named by spec.sourceRef doesn't exist")

	// It exists but is not Ready. It names its source only once the status
	// says so: the status cannot be set at creation, and a DataSource with
	// no Ready condition yet is used as its spec says.
	ds := &cdiv1.DataSource{ObjectMeta: metav1.ObjectMeta{Namespace: src, Name: "fedora"}}
	if err := k8sClient.Create(ctx, ds); err != nil {
		t.Fatal(err)
	}
	ds.Status.Conditions = []cdiv1.DataSourceCondition{{Type: cdiv1.DataSourceReady,
		ConditionState: cdiv1.ConditionState{Status: corev1.ConditionFalse, Reason: "NotFound", Message: "the source is being imported", LastTransitionTime: metav1.Now()}}}
	if err := k8sClient.Status().Update(ctx, ds); err != nil {
		t.Fatal(err)
	}
	ds.Spec.Source.PVC = &cdiv1.DataVolumeSourcePVC{Namespace: src, Name: "golden"}
	if err := k8sClient.Update(ctx, ds); err != nil {
		t.Fatal(err)
	}
	waitRunning(t, tgt, "from-ds", "DataSource "+src+"/fedora is not ready")
	if err := k8sClient.Get(ctx, types.NamespacedName{Namespace: tgt, Name: "from-ds"}, &corev1.PersistentVolumeClaim{}); err == nil {
		t.Fatal("a claim was made while the DataSource is not ready")
	}

	// Ready: the claim follows, from the DataSource's pvc, at its size.
	ds.Status.Conditions[0].Status, ds.Status.Conditions[0].Reason, ds.Status.Conditions[0].Message = corev1.ConditionTrue, "Ready", ""
	if err := k8sClient.Status().Update(ctx, ds); err != nil {
		t.Fatal(err)
	}
	pvc := waitClaim(t, tgt, "from-ds", func(p *corev1.PersistentVolumeClaim) bool { return p.Annotations[cdiv1.AnnExtendedCloneToken] != "" })
	if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(dv), dv); err != nil {
		t.Fatal(err)
	}
	checkCloneRef(t, pvc, dv)
	if got := pvc.Spec.Resources.Requests[corev1.ResourceStorage]; got.Cmp(resource.MustParse("3Gi")) != 0 {
		t.Errorf("sizeless clone of the DataSource's 3Gi claim asks for %s", got.String())
	}
	vcs := &cdiv1.VolumeCloneSource{}
	if err := k8sClient.Get(ctx, types.NamespacedName{Namespace: src, Name: "volume-clone-source-" + string(dv.UID)}, vcs); err != nil {
		t.Fatal(err)
	}
	if vcs.Spec.Source.Name != "golden" || pvc.Annotations[cdiv1.AnnDataSourceNamespace] != src {
		t.Errorf("VolumeCloneSource %+v, claim annotations %v", vcs.Spec, pvc.Annotations)
	}
}
