package populators

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

// fakePhase is done or not as told, and counts its runs.
type fakePhase struct {
	name string
	res  Result
	runs int
}

func (p *fakePhase) Name() string { return p.name }
func (p *fakePhase) Reconcile(context.Context, *Flow) (Result, error) {
	p.runs++
	return p.res, nil
}

func TestRunPlanStopsAtTheFirstPhaseNotDone(t *testing.T) {
	a := &fakePhase{name: "a", res: Result{Done: true}}
	b := &fakePhase{name: "b", res: Result{Pod: &PodStatus{Phase: corev1.PodRunning}, Reason: "TransferRunning", RetryAfter: time.Second}}
	c := &fakePhase{name: "c", res: Result{Done: true}}
	s, err := runPlan(context.Background(), &Flow{}, []Phase{a, b, c})
	if err != nil || s.phase != "b" || s.result.Done || s.pod == nil || s.podResult.Reason != "TransferRunning" {
		t.Fatalf("runPlan = %+v, %v; want stopped at b with its pod", s, err)
	}
	if a.runs != 1 || b.runs != 1 || c.runs != 0 {
		t.Errorf("runs a=%d b=%d c=%d; want 1 1 0", a.runs, b.runs, c.runs)
	}
	b.res = Result{Done: true, Pod: &PodStatus{Phase: corev1.PodSucceeded}}
	if s, _ := runPlan(context.Background(), &Flow{}, []Phase{a, b, c}); !s.result.Done || s.phase != "c" || s.pod.Phase != corev1.PodSucceeded {
		t.Errorf("all done: %+v", s)
	}
}

// recordingKind is an import kind that counts source reads and may
// authorise sources itself.
type recordingKind struct {
	*ImportKind
	reads int
}

func (k *recordingKind) GetSource(ctx context.Context, key types.NamespacedName) (client.Object, error) {
	k.reads++
	return k.ImportKind.GetSource(ctx, key)
}

type authorizingKind struct{ *recordingKind }

func (k authorizingKind) AuthorizeSource(context.Context, *corev1.PersistentVolumeClaim) (SourceVerdict, error) {
	return SourceVerdict{Allowed: true}, nil
}

// populatorFixture is a CSI class, a blank VolumeImportSource in namespace
// "other" and a claim in "vms" naming it.
func populatorFixture(t *testing.T) (client.Client, *corev1.PersistentVolumeClaim) {
	t.Helper()
	sc := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "fast"}, Provisioner: "hostpath.csi.kubefill.test"}
	src := &cdiv1.VolumeImportSource{ObjectMeta: metav1.ObjectMeta{Name: "src", Namespace: "other"},
		Spec: cdiv1.VolumeImportSourceSpec{Source: &cdiv1.ImportSourceType{Blank: &cdiv1.DataVolumeBlankImage{}}}}
	target := claim(&corev1.TypedObjectReference{APIGroup: ptr.To(cdiv1.GroupName), Kind: cdiv1.VolumeImportSourceRef, Name: "src", Namespace: ptr.To("other")}, nil)
	c := fake.NewClientBuilder().WithScheme(testScheme()).WithObjects(sc, src, target).Build()
	return c, target
}

func TestCrossNamespaceSourceRefusedWithoutAGrant(t *testing.T) {
	c, target := populatorFixture(t)
	kind := &recordingKind{ImportKind: &ImportKind{Client: c}}
	r := &Reconciler{Client: c, Kind: kind}
	res, err := r.Reconcile(context.Background(), ctrl.Request{NamespacedName: client.ObjectKeyFromObject(target)})
	if err != nil || res.RequeueAfter != sourceAuthPoll {
		t.Fatalf("Reconcile = %+v, %v; want a retry after %s", res, err, sourceAuthPoll)
	}
	if kind.reads != 0 {
		t.Error("the source in the other namespace was read")
	}
	_ = c.Get(context.Background(), client.ObjectKeyFromObject(target), target)
	if target.Annotations[cdiv1.AnnRunningConditionReason] != "SourceNotAuthorized" ||
		!strings.Contains(target.Annotations[cdiv1.AnnRunningConditionMessage], "ReferenceGrant") {
		t.Errorf("claim annotations %v", target.Annotations)
	}
	primes := &corev1.PersistentVolumeClaimList{}
	if err := c.List(context.Background(), primes); err != nil || len(primes.Items) != 1 {
		t.Errorf("claims %d (%v): want only the target, no prime", len(primes.Items), err)
	}
}

func TestCrossNamespaceSourceAuthorisedByTheKind(t *testing.T) {
	c, target := populatorFixture(t)
	kind := authorizingKind{&recordingKind{ImportKind: &ImportKind{Client: c}}}
	r := &Reconciler{Client: c, Kind: kind}
	if _, err := r.Reconcile(context.Background(), ctrl.Request{NamespacedName: client.ObjectKeyFromObject(target)}); err != nil {
		t.Fatal(err)
	}
	if kind.reads != 1 {
		t.Errorf("source reads %d, want 1", kind.reads)
	}
	prime := &corev1.PersistentVolumeClaim{}
	if err := c.Get(context.Background(), types.NamespacedName{Namespace: "vms", Name: PrimeName(target)}, prime); err != nil {
		t.Fatalf("prime: %v", err)
	}
	if err := c.Get(context.Background(), types.NamespacedName{Namespace: "vms", Name: "importer-" + prime.Name}, &corev1.Pod{}); err != nil {
		t.Fatalf("importer pod: %v", err)
	}
	_ = c.Get(context.Background(), client.ObjectKeyFromObject(target), target)
	if target.Annotations[annPhase] != "worker" || target.Annotations[cdiv1.AnnPVCPrimeName] != prime.Name || target.Annotations[cdiv1.AnnPodPhase] != "Pending" {
		t.Errorf("claim annotations %v: want phase worker, the prime's name, pod Pending", target.Annotations)
	}
}

func TestTargetOf(t *testing.T) {
	for ann, want := range map[string]types.NamespacedName{
		"disk":     {Namespace: "vms", Name: "disk"},
		"ns2/disk": {Namespace: "ns2", Name: "disk"},
	} {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "vms", Annotations: map[string]string{annTargetName: ann}}}
		if got := targetOf(pod); len(got) != 1 || got[0].NamespacedName != want {
			t.Errorf("%s: %v, want %v", ann, got, want)
		}
	}
}

// TestPrimeInAnotherNamespace: owner references cannot cross namespaces, so
// such a prime names its target in an annotation and keeps the UID label.
func TestPrimeInAnotherNamespace(t *testing.T) {
	target := claim(nil, nil)
	prime := newPrimeIn(target, cdiv1.VolumeCloneSourceRef, "golden")
	if prime.Namespace != "golden" || len(prime.OwnerReferences) != 0 || prime.Annotations[annTargetName] != "vms/disk" ||
		prime.Labels[cdiv1.LabelOwnedByUID] != "u-1" {
		t.Errorf("prime %s/%s owners %v annotations %v labels %v", prime.Namespace, prime.Name, prime.OwnerReferences, prime.Annotations, prime.Labels)
	}
	if got := targetOf(prime); len(got) != 1 || got[0].NamespacedName != client.ObjectKeyFromObject(target) {
		t.Errorf("targetOf(prime) = %v", got)
	}
	if same := newPrimeIn(target, cdiv1.VolumeImportSourceRef, "vms"); len(same.OwnerReferences) != 1 || same.Annotations[annTargetName] != "" {
		t.Errorf("a prime next to its target: owners %v annotations %v", same.OwnerReferences, same.Annotations)
	}
}
