package controller

import (
	"context"
	"crypto/rsa"
	"errors"
	"strings"
	"testing"
	"time"

	snapshotv1 "github.com/kubernetes-csi/external-snapshotter/client/v6/apis/volumesnapshot/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/token"
)

type cloneFixture struct {
	t      *testing.T
	c      client.Client
	r      *DataVolumeReconciler
	events *events.FakeRecorder
	key    *rsa.PrivateKey
}

var testKey *rsa.PrivateKey

func cloneTestKey(t *testing.T) *rsa.PrivateKey {
	if testKey == nil {
		k, err := token.GenerateKey()
		if err != nil {
			t.Fatal(err)
		}
		testKey = k
	}
	return testKey
}

func newCloneFixture(t *testing.T, objs ...client.Object) *cloneFixture {
	s := NewScheme()
	if err := snapshotv1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	fs := corev1.PersistentVolumeFilesystem
	objs = append(objs,
		&storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "csi"}, Provisioner: "csi.test"},
		&cdiv1.StorageProfile{ObjectMeta: metav1.ObjectMeta{Name: "csi"}, Status: cdiv1.StorageProfileStatus{ClaimPropertySets: []cdiv1.ClaimPropertySet{
			{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, VolumeMode: &fs}}}})
	uids := 0
	c := fake.NewClientBuilder().WithScheme(s).WithObjects(objs...).WithStatusSubresource(&cdiv1.DataVolume{}).
		WithInterceptorFuncs(interceptor.Funcs{Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if obj.GetUID() == "" {
				uids++
				obj.SetUID(types.UID("uid-" + string(rune('a'+uids))))
			}
			return c.Create(ctx, obj, opts...)
		}}).Build()
	key := cloneTestKey(t)
	rec := events.NewFakeRecorder(100)
	r := &DataVolumeReconciler{Client: c, Recorder: rec,
		CloneTokens:            token.NewValidator(token.CloneTokenIssuer, &key.PublicKey, token.DefaultCloneTokenLeeway),
		ExtendedTokens:         token.NewGenerator(token.ExtendedCloneTokenIssuer, key, token.DefaultExtendedCloneTokenLifetime),
		ExtendedTokenValidator: token.NewValidator(token.ExtendedCloneTokenIssuer, &key.PublicKey, token.DefaultCloneTokenLeeway),
	}
	return &cloneFixture{t: t, c: c, r: r, events: rec, key: key}
}

func (f *cloneFixture) reconcile(ns, name string) ctrl.Result {
	f.t.Helper()
	res, err := f.r.Reconcile(context.Background(), ctrl.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: name}})
	if err != nil {
		f.t.Fatalf("Reconcile: %v", err)
	}
	return res
}

func (f *cloneFixture) get(ns, name string, obj client.Object) bool {
	return f.c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, obj) == nil
}

func (f *cloneFixture) dv(ns, name string) *cdiv1.DataVolume {
	f.t.Helper()
	dv := &cdiv1.DataVolume{}
	if !f.get(ns, name, dv) {
		f.t.Fatalf("DataVolume %s/%s gone", ns, name)
	}
	return dv
}

func (f *cloneFixture) running(dv *cdiv1.DataVolume) cdiv1.DataVolumeCondition {
	for _, c := range dv.Status.Conditions {
		if c.Type == cdiv1.DataVolumeRunning {
			return c
		}
	}
	return cdiv1.DataVolumeCondition{}
}

func (f *cloneFixture) sawEvent(sub string) bool {
	for {
		select {
		case e := <-f.events.Events:
			if strings.Contains(e, sub) {
				return true
			}
		default:
			return false
		}
	}
}

func (f *cloneFixture) shortToken(srcNS, srcName, ns, name string, at time.Time) string {
	g := token.NewGeneratorAt(token.CloneTokenIssuer, f.key, token.DefaultCloneTokenLifetime, func() time.Time { return at })
	s, err := g.Generate(token.NewClonePayload(token.ResourcePVC, srcNS, srcName, ns, name))
	if err != nil {
		f.t.Fatal(err)
	}
	return s
}

func sourceClaim(ns, name, capacity string) *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.PersistentVolumeClaimSpec{Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(capacity)}},
			VolumeMode: ptr.To(corev1.PersistentVolumeFilesystem)},
		Status: corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimBound, Capacity: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(capacity)}},
	}
}

func cloneDV(ns, name, srcNS, srcName string, ann map[string]string) *cdiv1.DataVolume {
	return &cdiv1.DataVolume{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("dv-" + name), Annotations: ann},
		Spec: cdiv1.DataVolumeSpec{
			Source:  &cdiv1.DataVolumeSource{PVC: &cdiv1.DataVolumeSourcePVC{Namespace: srcNS, Name: srcName}},
			Storage: &cdiv1.StorageSpec{StorageClassName: ptr.To("csi")},
		},
	}
}

func TestCloneSameNamespace(t *testing.T) {
	f := newCloneFixture(t, sourceClaim("ns", "golden", "2Gi"), cloneDV("ns", "disk", "ns", "golden", nil))
	f.r.CloneTokens, f.r.ExtendedTokens, f.r.ExtendedTokenValidator = nil, nil, nil // a same-namespace clone needs none
	f.reconcile("ns", "disk")
	dv := f.dv("ns", "disk")
	vcs := &cdiv1.VolumeCloneSource{}
	if !f.get("ns", "volume-clone-source-dv-disk", vcs) {
		t.Fatal("no VolumeCloneSource")
	}
	if !metav1.IsControlledBy(vcs, dv) || vcs.Spec.Source.Kind != "PersistentVolumeClaim" || vcs.Spec.Source.Name != "golden" {
		t.Errorf("VolumeCloneSource %+v", vcs)
	}
	pvc := &corev1.PersistentVolumeClaim{}
	if !f.get("ns", "disk", pvc) {
		t.Fatalf("no claim; Running %+v", f.running(dv))
	}
	ref := pvc.Spec.DataSourceRef
	if ref == nil || ptr.Deref(ref.APIGroup, "") != cdiv1.GroupName || ref.Kind != "VolumeCloneSource" || ref.Name != "volume-clone-source-dv-disk" || ref.Namespace != nil {
		t.Errorf("dataSourceRef %+v", ref)
	}
	if got := pvc.Spec.Resources.Requests[corev1.ResourceStorage]; got.Cmp(resource.MustParse("2Gi")) != 0 {
		t.Errorf("sizeless clone size %s", got.String())
	}
	if _, ok := pvc.Annotations[cdiv1.AnnDataSourceNamespace]; ok || controllerHasFinalizer(dv) {
		t.Errorf("same-namespace clone marked as cross-namespace: %v %v", pvc.Annotations, dv.Finalizers)
	}
	if dv.Status.Phase != cdiv1.CloneScheduled || !f.sawEvent("Cloning from ns/golden into ns/disk scheduled") {
		t.Errorf("phase %s", dv.Status.Phase)
	}
	// The populator's progress: cloneType copied to the DataVolume.
	if pvc.Annotations == nil {
		pvc.Annotations = map[string]string{}
	}
	pvc.Annotations[cdiv1.AnnCloneType] = "csi-clone"
	pvc.Annotations[cdiv1.AnnClonePhase] = "CSIClone"
	if err := f.c.Update(context.Background(), pvc); err != nil {
		t.Fatal(err)
	}
	f.reconcile("ns", "disk")
	dv = f.dv("ns", "disk")
	if dv.Annotations[cdiv1.AnnCloneType] != "csi-clone" || dv.Status.Phase != cdiv1.CSICloneInProgress || !f.sawEvent("CSI Volume clone in progress (for pvc ns/golden)") {
		t.Errorf("cloneType %q, phase %s", dv.Annotations[cdiv1.AnnCloneType], dv.Status.Phase)
	}
}

func controllerHasFinalizer(dv *cdiv1.DataVolume) bool {
	for _, f := range dv.Finalizers {
		if f == cdiv1.FinalizerDataVolume {
			return true
		}
	}
	return false
}

func TestCloneCrossNamespaceTokens(t *testing.T) {
	f := newCloneFixture(t)
	short := f.shortToken("src", "golden", "tgt", "disk", time.Now())
	if err := f.c.Create(context.Background(), cloneDV("tgt", "disk", "src", "golden", map[string]string{cdiv1.AnnCloneToken: short})); err != nil {
		t.Fatal(err)
	}
	// First reconcile: the extended token, bound to the DataVolume, before the source is even looked for.
	f.reconcile("tgt", "disk")
	dv := f.dv("tgt", "disk")
	ext := dv.Annotations[cdiv1.AnnExtendedCloneToken]
	p, err := f.r.ExtendedTokenValidator.Validate(ext)
	if err != nil {
		t.Fatalf("extended token: %v", err)
	}
	if err := token.CheckExtendedClone(p, token.ResourcePVC, "src", "golden", "tgt", "disk", string(dv.UID)); err != nil {
		t.Error(err)
	}
	// The source does not exist: CloneWithoutSource, and a wait.
	res := f.reconcile("tgt", "disk")
	dv = f.dv("tgt", "disk")
	if res.RequeueAfter == 0 || !strings.Contains(f.running(dv).Message, "The source pvc golden doesn't exist") || !f.sawEvent("CloneWithoutSource The source pvc golden doesn't exist") {
		t.Errorf("missing source: %+v, %+v", res, f.running(dv))
	}
	// Much later the short token has expired: the extended one carries the clone.
	dv.Annotations[cdiv1.AnnCloneToken] = f.shortToken("src", "golden", "tgt", "disk", time.Now().Add(-time.Hour))
	if err := f.c.Update(context.Background(), dv); err != nil {
		t.Fatal(err)
	}
	if err := f.c.Create(context.Background(), sourceClaim("src", "golden", "1Gi")); err != nil {
		t.Fatal(err)
	}
	f.reconcile("tgt", "disk")
	dv = f.dv("tgt", "disk")
	pvc := &corev1.PersistentVolumeClaim{}
	if !f.get("tgt", "disk", pvc) {
		t.Fatalf("no claim: %+v", f.running(dv))
	}
	if _, short := pvc.Annotations[cdiv1.AnnCloneToken]; pvc.Annotations[cdiv1.AnnDataSourceNamespace] != "src" || pvc.Spec.DataSourceRef.Namespace != nil || short {
		t.Errorf("claim annotations %v, ref %+v", pvc.Annotations, pvc.Spec.DataSourceRef)
	}
	cp, err := f.r.ExtendedTokenValidator.Validate(pvc.Annotations[cdiv1.AnnExtendedCloneToken])
	if err != nil {
		t.Fatalf("claim's extended token: %v", err)
	}
	if err := token.CheckExtendedClone(cp, token.ResourcePVC, "src", "golden", "tgt", "disk", string(pvc.UID)); err != nil || pvc.UID == "" {
		t.Errorf("claim token not bound to the claim %q: %v", pvc.UID, err)
	}
	vcs := &cdiv1.VolumeCloneSource{}
	if !f.get("src", "volume-clone-source-dv-disk", vcs) || vcs.Annotations[cdiv1.AnnOwnedByDataVolume] != "tgt/disk" || len(vcs.OwnerReferences) != 0 {
		t.Errorf("VolumeCloneSource in the source namespace: %+v", vcs.ObjectMeta)
	}
	if !controllerHasFinalizer(dv) {
		t.Error("no DataVolume finalizer")
	}
	// The clone succeeds: the VolumeCloneSource goes, and the finalizer.
	pvc.Annotations[cdiv1.AnnClonePhase] = "Succeeded"
	if err := f.c.Update(context.Background(), pvc); err != nil {
		t.Fatal(err)
	}
	pvc.Status.Phase = corev1.ClaimBound
	if err := f.c.Status().Update(context.Background(), pvc); err != nil {
		t.Fatal(err)
	}
	f.reconcile("tgt", "disk")
	dv = f.dv("tgt", "disk")
	if f.get("src", "volume-clone-source-dv-disk", &cdiv1.VolumeCloneSource{}) || controllerHasFinalizer(dv) {
		t.Errorf("after success: VolumeCloneSource kept or finalizer %v", dv.Finalizers)
	}
	if dv.Status.Phase != cdiv1.Succeeded || !f.sawEvent("CloneSucceeded Successfully cloned from src/golden into tgt/disk") {
		t.Errorf("phase %s", dv.Status.Phase)
	}
}

func TestCloneCrossNamespaceRefusals(t *testing.T) {
	f := newCloneFixture(t, sourceClaim("src", "golden", "1Gi"))
	ctx := context.Background()
	expired := f.shortToken("src", "golden", "tgt", "old", time.Now().Add(-time.Hour))
	other := f.shortToken("src", "golden", "tgt", "someone-else", time.Now())
	good := f.shortToken("src", "golden", "tgt", "a", time.Now())
	for _, dv := range []*cdiv1.DataVolume{
		cloneDV("tgt", "old", "src", "golden", map[string]string{cdiv1.AnnCloneToken: expired}),
		cloneDV("tgt", "moved", "src", "golden", map[string]string{cdiv1.AnnCloneToken: other}),
		cloneDV("tgt", "a", "src", "golden", map[string]string{cdiv1.AnnCloneToken: good}),
	} {
		if err := f.c.Create(ctx, dv); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"old", "moved"} {
		f.reconcile("tgt", name)
		dv := f.dv("tgt", name)
		if msg := f.running(dv).Message; !strings.Contains(msg, "the clone token is invalid or expired") || !strings.Contains(msg, "delete and re-create the DataVolume") {
			t.Errorf("%s: Running %q", name, msg)
		}
		if dv.Annotations[cdiv1.AnnExtendedCloneToken] != "" || f.get("tgt", name, &corev1.PersistentVolumeClaim{}) {
			t.Errorf("%s: refused clone got a token or a claim", name)
		}
	}
	// A's extended token copied onto another DataVolume (another UID) is refused there.
	f.reconcile("tgt", "a")
	a := f.dv("tgt", "a")
	b := cloneDV("tgt", "b", "src", "golden", map[string]string{cdiv1.AnnExtendedCloneToken: a.Annotations[cdiv1.AnnExtendedCloneToken]})
	if err := f.c.Create(ctx, b); err != nil {
		t.Fatal(err)
	}
	f.reconcile("tgt", "b")
	if b = f.dv("tgt", "b"); !strings.Contains(f.running(b).Message, "the clone token is invalid or expired") || f.get("tgt", "b", &corev1.PersistentVolumeClaim{}) {
		t.Errorf("copied extended token: Running %q", f.running(b).Message)
	}
	// No keys: a condition saying so; a same-namespace clone still works.
	f.r.CloneTokens, f.r.ExtendedTokens, f.r.ExtendedTokenValidator = nil, nil, nil
	if err := f.c.Create(ctx, cloneDV("tgt", "nokeys", "src", "golden", map[string]string{cdiv1.AnnCloneToken: good})); err != nil {
		t.Fatal(err)
	}
	f.reconcile("tgt", "nokeys")
	if msg := f.running(f.dv("tgt", "nokeys")).Message; !strings.Contains(msg, "no token keys") {
		t.Errorf("no keys: Running %q", msg)
	}
}

func TestCloneValidationAndDeletion(t *testing.T) {
	small := cloneDV("src", "small", "src", "golden", nil)
	small.Spec.Storage.Resources.Requests = corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}
	f := newCloneFixture(t, sourceClaim("src", "golden", "4Gi"), small)
	f.reconcile("src", "small")
	dv := f.dv("src", "small")
	if msg := f.running(dv).Message; !strings.Contains(msg, "The clone doesn't meet the validation requirements: target resources requests storage size is smaller than the source") ||
		!f.sawEvent("CloneValidationFailed") || f.get("src", "small", &corev1.PersistentVolumeClaim{}) {
		t.Errorf("too small: Running %q", msg)
	}

	// Deleting a cross-namespace clone removes its VolumeCloneSource.
	ctx := context.Background()
	if err := f.c.Create(ctx, cloneDV("tgt", "disk", "src", "golden", map[string]string{cdiv1.AnnCloneToken: f.shortToken("src", "golden", "tgt", "disk", time.Now())})); err != nil {
		t.Fatal(err)
	}
	f.reconcile("tgt", "disk")
	f.reconcile("tgt", "disk")
	if !f.get("src", "volume-clone-source-dv-disk", &cdiv1.VolumeCloneSource{}) {
		t.Fatalf("no VolumeCloneSource: %+v", f.running(f.dv("tgt", "disk")))
	}
	if err := f.c.Delete(ctx, f.dv("tgt", "disk")); err != nil {
		t.Fatal(err)
	}
	f.reconcile("tgt", "disk")
	if f.get("src", "volume-clone-source-dv-disk", &cdiv1.VolumeCloneSource{}) || f.get("tgt", "disk", &cdiv1.DataVolume{}) {
		t.Error("the VolumeCloneSource or the DataVolume outlived the deletion")
	}
}

// failingGenerator is an extended token signer whose key cannot be read.
type failingGenerator struct{}

func (failingGenerator) Generate(*token.Payload) (string, error) {
	return "", errors.New(`reading Secret kubefill/kubefill-extended-clone-token-key: secrets "kubefill-extended-clone-token-key" is forbidden`)
}

// A token the controller cannot sign is a wait the user sees, in the
// Running condition and a Warning event naming the key's Secret, retried:
// not an error the controller only logs.
func TestCloneTokenNotMintedIsShown(t *testing.T) {
	f := newCloneFixture(t)
	f.r.ExtendedTokens = failingGenerator{}
	short := f.shortToken("src", "golden", "tgt", "disk", time.Now())
	if err := f.c.Create(context.Background(), cloneDV("tgt", "disk", "src", "golden", map[string]string{cdiv1.AnnCloneToken: short})); err != nil {
		t.Fatal(err)
	}
	res := f.reconcile("tgt", "disk")
	dv := f.dv("tgt", "disk")
	run := f.running(dv)
	if res.RequeueAfter == 0 || run.Reason != reasonCloneTokenNotMinted {
		t.Fatalf("requeue %s, Running %+v", res.RequeueAfter, run)
	}
	for _, want := range []string{"cannot sign the DataVolume's extended clone token", "forbidden", DefaultExtendedTokenKeySecret, "goes on by itself"} {
		if !strings.Contains(run.Message, want) {
			t.Errorf("Running message %q does not say %q", run.Message, want)
		}
	}
	if !f.sawEvent("Warning " + reasonCloneTokenNotMinted) {
		t.Error("no Warning event")
	}
	if dv.Annotations[cdiv1.AnnExtendedCloneToken] != "" {
		t.Error("an extended token appeared")
	}
	// Once the key can be read, the clone goes on.
	f.r.ExtendedTokens = token.NewGenerator(token.ExtendedCloneTokenIssuer, f.key, token.DefaultExtendedCloneTokenLifetime)
	f.reconcile("tgt", "disk")
	if dv = f.dv("tgt", "disk"); dv.Annotations[cdiv1.AnnExtendedCloneToken] == "" {
		t.Errorf("no extended token once the key is there: %+v", f.running(dv))
	}
}

func TestWithConsumerWait(t *testing.T) {
	claim := func(ann map[string]string) *corev1.PersistentVolumeClaim {
		return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "disk", Annotations: ann},
			Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: ptr.To("wffc")}}
	}
	for _, tc := range []struct {
		name string
		view ClaimView
		want string // ProblemReason
	}{
		{"waits, nothing started", ClaimView{Claim: claim(nil), WaitsForConsumer: true}, reasonWaitForFirstConsumer},
		{"no claim yet", ClaimView{WaitsForConsumer: true}, ""},
		{"immediate class", ClaimView{Claim: claim(nil)}, ""},
		{"the populator has begun", ClaimView{Claim: claim(map[string]string{cdiv1.AnnClonePhase: "Pending"}), WaitsForConsumer: true}, ""},
		{"the populator explains", ClaimView{Claim: claim(map[string]string{cdiv1.AnnRunningConditionReason: "SourceNotAuthorized"}), WaitsForConsumer: true}, ""},
		{"another wait", ClaimView{Claim: claim(nil), WaitsForConsumer: true, Problem: "x", ProblemReason: "Other"}, "Other"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := withConsumerWait(tc.view)
			if got.ProblemReason != tc.want {
				t.Fatalf("reason %q, want %q", got.ProblemReason, tc.want)
			}
			if tc.want == reasonWaitForFirstConsumer {
				for _, s := range []string{"first consumer", "StorageClass wffc", "pod that uses PVC disk", "Immediate"} {
					if !strings.Contains(got.Problem, s) {
						t.Errorf("%q does not say %q", got.Problem, s)
					}
				}
				st := ComputeStatus(&cdiv1.DataVolume{ObjectMeta: metav1.ObjectMeta{Name: "disk"},
					Spec: cdiv1.DataVolumeSpec{Source: &cdiv1.DataVolumeSource{PVC: &cdiv1.DataVolumeSourcePVC{Namespace: "src", Name: "golden"}}}}, got)
				if st.Phase != cdiv1.PendingPopulation {
					t.Errorf("phase %s", st.Phase)
				}
				for _, c := range st.Conditions {
					if c.Type == cdiv1.DataVolumeRunning && c.Reason != reasonWaitForFirstConsumer {
						t.Errorf("Running %+v", c)
					}
				}
			}
		})
	}
}

func TestCloneSourceKeys(t *testing.T) {
	dv := func(src *cdiv1.DataVolumeSource, ref *cdiv1.DataVolumeSourceRef) *cdiv1.DataVolume {
		return &cdiv1.DataVolume{ObjectMeta: metav1.ObjectMeta{Namespace: "tgt", Name: "disk"}, Spec: cdiv1.DataVolumeSpec{Source: src, SourceRef: ref}}
	}
	for _, tc := range []struct {
		name string
		dv   *cdiv1.DataVolume
		want string
	}{
		{"pvc", dv(&cdiv1.DataVolumeSource{PVC: &cdiv1.DataVolumeSourcePVC{Namespace: "src", Name: "golden"}}, nil), "PersistentVolumeClaim/src/golden"},
		{"pvc in its own namespace", dv(&cdiv1.DataVolumeSource{PVC: &cdiv1.DataVolumeSourcePVC{Name: "golden"}}, nil), "PersistentVolumeClaim/tgt/golden"},
		{"snapshot", dv(&cdiv1.DataVolumeSource{Snapshot: &cdiv1.DataVolumeSourceSnapshot{Namespace: "src", Name: "snap"}}, nil), "VolumeSnapshot/src/snap"},
		{"DataSource", dv(nil, &cdiv1.DataVolumeSourceRef{Kind: cdiv1.DataVolumeDataSource, Namespace: ptr.To("os"), Name: "fedora"}), "DataSource/os/fedora"},
		{"DataSource here", dv(nil, &cdiv1.DataVolumeSourceRef{Kind: cdiv1.DataVolumeDataSource, Name: "fedora"}), "DataSource/tgt/fedora"},
		{"an import", dv(&cdiv1.DataVolumeSource{Blank: &cdiv1.DataVolumeBlankImage{}}, nil), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := strings.Join(cloneSourceKeys(tc.dv), ",")
			if got != tc.want {
				t.Errorf("keys %q, want %q", got, tc.want)
			}
		})
	}
	ds := &cdiv1.DataSource{ObjectMeta: metav1.ObjectMeta{Namespace: "os", Name: "fedora"},
		Spec: cdiv1.DataSourceSpec{Source: cdiv1.DataSourceSource{PVC: &cdiv1.DataVolumeSourcePVC{Name: "golden"}}}}
	if !dataSourceNames(ds, "PersistentVolumeClaim", "os", "golden") || dataSourceNames(ds, "VolumeSnapshot", "os", "golden") || dataSourceNames(ds, "PersistentVolumeClaim", "src", "golden") {
		t.Error("dataSourceNames")
	}
}

func TestStatusChanged(t *testing.T) {
	pending := &corev1.PersistentVolumeClaim{Status: corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimPending}}
	bound := &corev1.PersistentVolumeClaim{Status: corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimBound}}
	annotated := pending.DeepCopy()
	annotated.Annotations = map[string]string{"x": "y"}
	if !statusChanged(pending, bound) || statusChanged(pending, annotated) {
		t.Error("claims: a phase change passes, an annotation does not")
	}
	notReady := &snapshotv1.VolumeSnapshot{Status: &snapshotv1.VolumeSnapshotStatus{ReadyToUse: ptr.To(false)}}
	ready := &snapshotv1.VolumeSnapshot{Status: &snapshotv1.VolumeSnapshotStatus{ReadyToUse: ptr.To(true)}}
	if !statusChanged(notReady, ready) || statusChanged(ready, ready.DeepCopy()) {
		t.Error("snapshots: becoming ready passes, nothing new does not")
	}
}
