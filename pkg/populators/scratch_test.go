package populators

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/contract"
)

func TestRequiresScratch(t *testing.T) {
	forced := map[string]string{cdiv1.AnnRequiresScratch: "true"}
	cases := []struct {
		name string
		in   ScratchInput
		want bool
	}{
		{"http disk image", ScratchInput{Source: contract.SourceHTTP, ContentType: "kubevirt"}, false},
		{"s3 disk image", ScratchInput{Source: contract.SourceS3}, false},
		{"blank", ScratchInput{Source: contract.SourceNone}, false},
		{"registry", ScratchInput{Source: contract.SourceRegistry, ContentType: "kubevirt"}, true},
		{"http archive", ScratchInput{Source: contract.SourceHTTP, ContentType: "archive"}, true},
		{"upload", ScratchInput{Worker: ScratchUploadServer, ContentType: "kubevirt"}, true},
		{"forced on the target", ScratchInput{Source: contract.SourceHTTP, Annotations: []map[string]string{forced, nil}}, true},
		{"forced on the prime (the importer asked)", ScratchInput{Source: contract.SourceHTTP, Annotations: []map[string]string{nil, forced}}, true},
		{"ParseBool's forms count", ScratchInput{Source: contract.SourceHTTP, Annotations: []map[string]string{{cdiv1.AnnRequiresScratch: "1"}}}, true},
		{"false does not force", ScratchInput{Source: contract.SourceHTTP, Annotations: []map[string]string{{cdiv1.AnnRequiresScratch: "false"}}}, false},
		{"false does not take it away", ScratchInput{Source: contract.SourceRegistry, Annotations: []map[string]string{{cdiv1.AnnRequiresScratch: "false"}}}, true},
		{"garbage is not true", ScratchInput{Source: contract.SourceHTTP, Annotations: []map[string]string{{cdiv1.AnnRequiresScratch: "yes please"}}}, false},
	}
	for _, c := range cases {
		if got := RequiresScratch(c.in); got != c.want {
			t.Errorf("%s: RequiresScratch = %v, want %v", c.name, got, c.want)
		}
	}
}

func TestDecideScratch(t *testing.T) {
	registry := ScratchInput{Source: contract.SourceRegistry}
	prime := func(mode corev1.PersistentVolumeMode, class *string, size string) *corev1.PersistentVolumeClaim {
		return &corev1.PersistentVolumeClaim{Spec: corev1.PersistentVolumeClaimSpec{VolumeMode: &mode, StorageClassName: class,
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)}}}}
	}
	config := func(scratchClass string, overhead map[string]cdiv1.Percent) *cdiv1.CDIConfig {
		c := &cdiv1.CDIConfig{Status: cdiv1.CDIConfigStatus{ScratchSpaceStorageClass: scratchClass}}
		if overhead != nil {
			c.Status.FilesystemOverhead = &cdiv1.FilesystemOverhead{Global: cdiv1.DefaultFilesystemOverhead, StorageClass: overhead}
		}
		return c
	}
	fs, block := corev1.PersistentVolumeFilesystem, corev1.PersistentVolumeBlock
	cases := []struct {
		name      string
		in        ScratchInput
		prime     *corev1.PersistentVolumeClaim
		config    *cdiv1.CDIConfig
		want      bool
		class     string
		size      string
		wantError bool
	}{
		{"not needed", ScratchInput{Source: contract.SourceHTTP}, prime(fs, ptr.To("fast"), "2Gi"), config("scratchy", nil), false, "", "0", false},
		// 2Gi less 6% is 1932Mi usable; 1932Mi plus 6% rounds up to 2048Mi.
		{"CDIConfig's class, same overhead", registry, prime(fs, ptr.To("fast"), "2Gi"), config("scratchy", nil), true, "scratchy", "2Gi", false},
		{"no scratch class: the prime's", registry, prime(fs, ptr.To("fast"), "2Gi"), config("", nil), true, "fast", "2Gi", false},
		{"no class at all: the cluster's default", registry, prime(fs, nil, "2Gi"), config("", nil), true, "", "2Gi", false},
		// A Block prime has no overhead: all 2Gi are the image, plus 6% is 2170.88Mi, 2171Mi.
		{"block prime", registry, prime(block, ptr.To("fast"), "2Gi"), config("", nil), true, "fast", "2171Mi", false},
		// 1932Mi plus the scratch class's 10% is 2125.2Mi, 2126Mi.
		{"the scratch class's own overhead", registry, prime(fs, ptr.To("fast"), "2Gi"), config("scratchy", map[string]cdiv1.Percent{"scratchy": "0.1"}), true, "scratchy", "2126Mi", false},
		// The prime's class keeps nothing back: 2Gi usable, plus 6%.
		{"the prime's class's own overhead", registry, prime(fs, ptr.To("fast"), "2Gi"), config("scratchy", map[string]cdiv1.Percent{"fast": "0"}), true, "scratchy", "2171Mi", false},
		// CDI's rounding: the usable space is whole MiB, rounded down
		// (953.67Mi to 953Mi), as the importer sizes the image.
		{"an odd size is whole MiB", registry, prime(fs, ptr.To("fast"), "1000000000"), config("", map[string]cdiv1.Percent{"fast": "0"}), true, "fast", "953Mi", false},
		{"a broken overhead is an error", registry, prime(fs, ptr.To("fast"), "2Gi"), config("", map[string]cdiv1.Percent{"fast": "lots"}), false, "", "0", true},
	}
	for _, c := range cases {
		d, err := DecideScratch(c.in, c.prime, c.config)
		if (err != nil) != c.wantError {
			t.Errorf("%s: error %v, want error %v", c.name, err, c.wantError)
			continue
		}
		if d.Needed != c.want || d.StorageClass != c.class || d.Size.Cmp(resource.MustParse(c.size)) != 0 {
			t.Errorf("%s: DecideScratch = %+v (%s), want needed %v class %q size %s", c.name, d, d.Size.String(), c.want, c.class, c.size)
		}
	}
}

func TestNewScratchClaim(t *testing.T) {
	target := claim(nil, nil)
	prime := NewPrime(target, "VolumeImportSource")
	prime.Annotations[cdiv1.AnnSelectedNode] = "node-1"
	d := ScratchDecision{Needed: true, StorageClass: "scratchy", Size: resource.MustParse("2171Mi")}
	got := NewScratchClaim(target, prime, "importer", d, 3)
	if got.Name != "prime-u-1-scratch" || got.Namespace != "vms" {
		t.Errorf("name %s/%s", got.Namespace, got.Name)
	}
	if !metav1.IsControlledBy(got, target) || got.Annotations[annTargetName] != "disk" {
		t.Errorf("owners %+v annotations %v: want the target", got.OwnerReferences, got.Annotations)
	}
	if got.Labels[cdiv1.LabelOwnedByUID] != "u-1" || got.Labels[cdiv1.LabelExcludeFromVeleroBackup] != "true" || got.Labels[cdiv1.LabelApp] != cdiv1.LabelAppValue {
		t.Errorf("labels %v", got.Labels)
	}
	if got.Annotations[cdiv1.AnnSelectedNode] != "node-1" || scratchAttempt(got) != 3 {
		t.Errorf("annotations %v: want the prime's node and attempt 3", got.Annotations)
	}
	s := got.Spec
	if ptr.Deref(s.StorageClassName, "") != "scratchy" || ptr.Deref(s.VolumeMode, "") != corev1.PersistentVolumeFilesystem ||
		len(s.AccessModes) != 1 || s.AccessModes[0] != corev1.ReadWriteOnce || s.Resources.Requests.Storage().String() != "2171Mi" || s.DataSourceRef != nil {
		t.Errorf("spec %+v", s)
	}
	for key := range got.Annotations {
		if key == cdiv1.AnnPopulatorKind || strings.HasPrefix(key, "cdi.kubevirt.io/storage.import") {
			t.Errorf("the scratch claim carries %s: another controller would fill it", key)
		}
	}
	if NewScratchClaim(target, prime, "importer", ScratchDecision{Needed: true, Size: d.Size}, 1).Spec.StorageClassName != nil {
		t.Error("no class decided should leave the class to the cluster's default")
	}
}

func TestScratchClaimNameIsShortened(t *testing.T) {
	long := strings.Repeat("a", 250)
	if n := cdiv1.ScratchClaimName(long); len(n) > 253 || !strings.HasSuffix(n, "-scratch") {
		t.Errorf("ScratchClaimName of a 250-character claim = %q (%d)", n, len(n))
	}
}

func registryFlow(t *testing.T) (*Flow, *WorkerPhase) {
	t.Helper()
	src := &cdiv1.VolumeImportSource{Spec: cdiv1.VolumeImportSourceSpec{Source: &cdiv1.ImportSourceType{Registry: &cdiv1.DataVolumeSourceRegistry{
		URL: ptr.To("docker://registry.example/disk:1")}}}}
	f, c := testFlow(t, corev1.PersistentVolumeFilesystem, src)
	kind := &ImportKind{Client: c, Image: "img:1", MaxRetries: 3, Backoff: 10 * time.Second}
	return f, kind.Plan()[1].(*WorkerPhase)
}

func scratchOf(t *testing.T, c client.Client) (*corev1.PersistentVolumeClaim, error) {
	t.Helper()
	pvc := &corev1.PersistentVolumeClaim{}
	return pvc, c.Get(context.Background(), client.ObjectKey{Namespace: "vms", Name: "prime-u-1-scratch"}, pvc)
}

// TestScratchClaimLifecycle: a registry import's scratch claim is made
// before the pod, named, sized and mounted; the target says it waits for
// it while it is Pending; a failed attempt's claim goes with it and the
// next attempt gets a fresh one; the end of the population removes it.
func TestScratchClaimLifecycle(t *testing.T) {
	f, w := registryFlow(t)
	ctx := context.Background()
	res, err := w.Reconcile(ctx, f)
	if err != nil {
		t.Fatal(err)
	}
	scratch, err := scratchOf(t, f.Client)
	if err != nil {
		t.Fatalf("no scratch claim: %v", err)
	}
	if scratch.Spec.Resources.Requests.Storage().String() != "2Gi" || scratchAttempt(scratch) != 1 {
		t.Errorf("scratch claim %+v: want the prime's 2Gi (same overhead), attempt 1", scratch.Spec)
	}
	if res.Reason != ReasonCreatingScratch || !strings.Contains(res.Message, "scratch claim vms/prime-u-1-scratch (2Gi, StorageClass fast) to be bound; it is Pending") {
		t.Errorf("result %+v: want the wait for the scratch claim", res)
	}
	pod := &corev1.Pod{}
	if err := f.Client.Get(ctx, client.ObjectKey{Namespace: "vms", Name: "importer-prime-u-1"}, pod); err != nil {
		t.Fatal(err)
	}
	if podScratchClaim(pod) != "prime-u-1-scratch" {
		t.Errorf("the importer mounts %q as scratch", podScratchClaim(pod))
	}

	// Still pending on the next look: the reason stays.
	pod.Status.Phase = corev1.PodPending
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: "Unschedulable", Message: "unbound immediate PersistentVolumeClaims"}}
	if err := f.Client.Status().Update(ctx, pod); err != nil {
		t.Fatal(err)
	}
	if res, err = w.Reconcile(ctx, f); err != nil || res.Reason != ReasonCreatingScratch {
		t.Errorf("pending pod: %+v, %v; want %s", res, err, ReasonCreatingScratch)
	}
	scratch.Status.Phase = corev1.ClaimBound
	if err := f.Client.Status().Update(ctx, scratch); err != nil {
		t.Fatal(err)
	}
	if res, err = w.Reconcile(ctx, f); err != nil || res.Reason != "Unschedulable" {
		t.Errorf("bound scratch: %+v, %v; want the pod's own reason", res, err)
	}

	// The attempt fails and is retried: the claim goes with it.
	pod.Status.Phase = corev1.PodFailed
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "importer", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
		ExitCode: 1, Message: `{"outcome":"Failed","message":"connection reset"}`}}}}
	if err := f.Client.Status().Update(ctx, pod); err != nil {
		t.Fatal(err)
	}
	if res, err = w.Reconcile(ctx, f); err != nil || res.Reason != ReasonRetrying {
		t.Fatalf("failed pod: %+v, %v", res, err)
	}
	if _, err := scratchOf(t, f.Client); !apierrors.IsNotFound(err) {
		t.Errorf("the failed attempt's scratch claim is still there: %v", err)
	}

	// An earlier attempt's claim left behind (its pod lost) is not reused.
	stale := NewScratchClaim(f.Target, f.Prime, "importer", ScratchDecision{Needed: true, Size: resource.MustParse("1Gi")}, 1)
	if err := f.Client.Create(ctx, stale); err != nil {
		t.Fatal(err)
	}
	st := parsePrimeState(f.Prime.Annotations)
	st.RetryNotBefore = time.Now().Add(-time.Second)
	if err := savePrimeState(ctx, f.Client, f.Prime, st); err != nil {
		t.Fatal(err)
	}
	if res, err = w.Reconcile(ctx, f); err != nil || res.Reason != ReasonCreatingScratch || !strings.Contains(res.Message, "previous attempt") {
		t.Errorf("stale claim: %+v, %v; want a wait for it to go", res, err)
	}
	if err := f.Client.Get(ctx, client.ObjectKey{Namespace: "vms", Name: "importer-prime-u-1"}, &corev1.Pod{}); !apierrors.IsNotFound(err) {
		t.Errorf("a pod started on a stale scratch claim: %v", err)
	}
	if _, err = w.Reconcile(ctx, f); err != nil {
		t.Fatal(err)
	}
	fresh, err := scratchOf(t, f.Client)
	if err != nil || scratchAttempt(fresh) != 2 {
		t.Fatalf("attempt 2's scratch claim: %+v, %v", fresh.Annotations, err)
	}

	if err := w.Cleanup(ctx, f, true); err != nil {
		t.Fatal(err)
	}
	if _, err := scratchOf(t, f.Client); !apierrors.IsNotFound(err) {
		t.Errorf("the scratch claim outlives the population (even with a retained pod): %v", err)
	}
}

// TestScratchClaimGoesOnPermanentFailure: a failure that is not retried
// leaves the pod for the user, not its scratch claim.
func TestScratchClaimGoesOnPermanentFailure(t *testing.T) {
	f, w := registryFlow(t)
	ctx := context.Background()
	if _, err := w.Reconcile(ctx, f); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{}
	if err := f.Client.Get(ctx, client.ObjectKey{Namespace: "vms", Name: "importer-prime-u-1"}, pod); err != nil {
		t.Fatal(err)
	}
	pod.Status.Phase = corev1.PodFailed
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "importer", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
		ExitCode: 1, Message: `{"outcome":"Failed","message":"manifest unknown","permanent":true}`}}}}
	if err := f.Client.Status().Update(ctx, pod); err != nil {
		t.Fatal(err)
	}
	res, err := w.Reconcile(ctx, f)
	if err != nil || !res.Permanent {
		t.Fatalf("%+v, %v: want a permanent failure", res, err)
	}
	if _, err := scratchOf(t, f.Client); !apierrors.IsNotFound(err) {
		t.Errorf("the scratch claim of a failed population is still there: %v", err)
	}
	if err := f.Client.Get(ctx, client.ObjectKey{Namespace: "vms", Name: "importer-prime-u-1"}, &corev1.Pod{}); err != nil {
		t.Errorf("the failed pod should stay for the user: %v", err)
	}
}

// TestImporterAsksForScratch: an http importer that found an image it must
// spool (a vmdk) and had no scratch space is started again, as the same
// attempt, with a scratch claim; the prime remembers it.
func TestImporterAsksForScratch(t *testing.T) {
	src := &cdiv1.VolumeImportSource{Spec: cdiv1.VolumeImportSourceSpec{Source: &cdiv1.ImportSourceType{HTTP: &cdiv1.DataVolumeSourceHTTP{URL: "https://x/disk.vmdk"}}}}
	f, c := testFlow(t, corev1.PersistentVolumeFilesystem, src)
	w := (&ImportKind{Client: c, Image: "img:1", MaxRetries: 0}).Plan()[1].(*WorkerPhase)
	ctx := context.Background()
	if _, err := w.Reconcile(ctx, f); err != nil {
		t.Fatal(err)
	}
	if _, err := scratchOf(t, c); !apierrors.IsNotFound(err) {
		t.Fatalf("an http import has scratch before it asked: %v", err)
	}
	pod := &corev1.Pod{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: "vms", Name: "importer-prime-u-1"}, pod); err != nil {
		t.Fatal(err)
	}
	pod.Status.Phase = corev1.PodFailed
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "importer", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
		ExitCode: 1, Message: `{"outcome":"Failed","message":"scratch space required and none found: vmdk images need scratch space to be converted","scratchSpaceRequired":true}`}}}}
	if err := c.Status().Update(ctx, pod); err != nil {
		t.Fatal(err)
	}
	res, err := w.Reconcile(ctx, f)
	if err != nil || res.Reason != ReasonScratchRequired || res.Permanent || res.Pod.Restarts != 0 {
		t.Fatalf("%+v, %v: want a restart with scratch, no retry used (MaxRetries is 0)", res, err)
	}
	if f.Prime.Annotations[cdiv1.AnnRequiresScratch] != "true" {
		t.Errorf("prime annotations %v: want requiresScratch", f.Prime.Annotations)
	}
	if res, err = w.Reconcile(ctx, f); err != nil || res.Reason == ReasonRetrying {
		t.Fatalf("the new pod: %+v, %v", res, err)
	}
	if err := c.Get(ctx, client.ObjectKey{Namespace: "vms", Name: "importer-prime-u-1"}, pod); err != nil || podScratchClaim(pod) != "prime-u-1-scratch" {
		t.Fatalf("the new importer mounts %q as scratch (%v)", podScratchClaim(pod), err)
	}
	if got := parsePrimeState(f.Prime.Annotations).Attempts; got != 1 {
		t.Errorf("attempts %d: the restart with scratch is the same attempt", got)
	}

	// With scratch space it says so again: an ordinary failure now.
	pod.Status.Phase = corev1.PodFailed
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "importer", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
		ExitCode: 1, Message: `{"outcome":"Failed","message":"scratch space required and none found","scratchSpaceRequired":true}`}}}}
	if err := c.Status().Update(ctx, pod); err != nil {
		t.Fatal(err)
	}
	if res, err = w.Reconcile(ctx, f); err != nil || res.Reason == ReasonScratchRequired || !res.Permanent {
		t.Errorf("%+v, %v: with scratch mounted the importer gives up as any failure does", res, err)
	}
}

// TestScratchClaimRefusedByQuota: a storage quota that has no room for
// the scratch claim says so, as a refused prime does; no pod starts.
func TestScratchClaimRefusedByQuota(t *testing.T) {
	f, w := registryFlow(t)
	base := f.Client
	refused := errors.New("exceeded quota: storage, requested: requests.storage=2171Mi, used: requests.storage=2Gi, limited: requests.storage=3Gi")
	f.Client = interceptor.NewClient(base.(client.WithWatch), interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if _, ok := obj.(*corev1.PersistentVolumeClaim); ok {
				return apierrors.NewForbidden(schema.GroupResource{Resource: "persistentvolumeclaims"}, obj.GetName(), refused)
			}
			return c.Create(ctx, obj, opts...)
		}})
	w.Client = f.Client
	res, err := w.Reconcile(context.Background(), f)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"exceeded quota: storage", "has no room for the scratch claim prime-u-1-scratch that the importer pod of disk spools the image to",
		"(requested requests.storage=2171Mi, used requests.storage=2Gi, limited requests.storage=3Gi)", "Nothing was started"} {
		if !strings.Contains(res.Message, want) {
			t.Errorf("message %q lacks %q", res.Message, want)
		}
	}
	if res.Reason != ReasonExceededQuota || res.Event != corev1.EventTypeWarning || res.RetryAfter != QuotaRetry || res.Permanent || res.Pod == nil {
		t.Errorf("result %+v: want ErrExceededQuota, a Warning event, a retried wait", res)
	}
	if err := base.Get(context.Background(), client.ObjectKey{Namespace: "vms", Name: "importer-prime-u-1"}, &corev1.Pod{}); !apierrors.IsNotFound(err) {
		t.Errorf("a pod started without its scratch claim: %v", err)
	}
}

// TestScratchClaimNotOurs: a claim by the scratch claim's name that this
// population did not make is neither used nor deleted.
func TestScratchClaimNotOurs(t *testing.T) {
	f, w := registryFlow(t)
	ctx := context.Background()
	foreign := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "prime-u-1-scratch", Namespace: "vms"}}
	if err := f.Client.Create(ctx, foreign); err != nil {
		t.Fatal(err)
	}
	res, err := w.Reconcile(ctx, f)
	if err != nil || res.Reason != ReasonErrCreatingScratch || !strings.Contains(res.Message, "does not belong to disk") {
		t.Errorf("%+v, %v", res, err)
	}
	if err := w.Cleanup(ctx, f, false); err != nil {
		t.Fatal(err)
	}
	if _, err := scratchOf(t, f.Client); err != nil {
		t.Errorf("a foreign claim was deleted: %v", err)
	}
}
