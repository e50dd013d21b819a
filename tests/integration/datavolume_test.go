package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/controller"
	"github.com/kubefill/kubefill/pkg/populators"
	"github.com/kubefill/kubefill/tests/kit"
)

// startControllers runs `kubefill controller`'s manager against the real
// apiserver for one test, limited to namespaces when they are given (a
// parallel test's; see parallel_test.go).
func startControllers(t *testing.T, namespaces ...string) {
	t.Helper()
	if len(namespaces) > 0 {
		sharedClusterControllers(t)
	}
	runManager(t, controller.ManagerOptions{MetricsBindAddress: "0", HealthProbeBindAddress: "0", WorkerImage: "kubefill/kubefill:test",
		Namespaces: namespaces})
}

// runManager starts a controller manager until the test ends.
func runManager(t *testing.T, opts controller.ManagerOptions) ctrl.Manager {
	t.Helper()
	opts.SkipNameValidation = true
	mgr, err := controller.NewManager(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	startUntilCleanup(t, mgr)
	return mgr
}

// startUntilCleanup runs mgr until the test ends, and fails the test if it
// stops with an error.
func startUntilCleanup(t *testing.T, mgr ctrl.Manager) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager stopped with: %v", err)
		}
	})
}

// csiClass creates a CSI StorageClass and its StorageProfile with the given
// claim property sets.
// rwoFilesystem is the claim property set most test classes have.
var rwoFilesystem = cdiv1.ClaimPropertySet{
	AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
	VolumeMode:  ptr.To(corev1.PersistentVolumeFilesystem),
}

func csiClass(t *testing.T, name, provisioner string, mode storagev1.VolumeBindingMode, sets ...cdiv1.ClaimPropertySet) {
	t.Helper()
	ctx := context.Background()
	sc := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Provisioner: provisioner, VolumeBindingMode: &mode}
	if err := k8sClient.Create(ctx, sc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), sc) })
	// The StorageProfile controller makes the profile; the sets go in its spec,
	// as an administrator would give them for a driver it does not know.
	putProfileSpec(t, name, cdiv1.StorageProfileSpec{ClaimPropertySets: sets})
}

// putProfileSpec gives the StorageProfile name spec, creating it or, when
// the StorageProfile controller (the one parallel tests share) made it
// first, updating it; the profile is deleted when the test ends.
func putProfileSpec(t *testing.T, name string, spec cdiv1.StorageProfileSpec) {
	t.Helper()
	ctx := context.Background()
	profile := &cdiv1.StorageProfile{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: spec}
	t.Cleanup(func() {
		_ = k8sClient.Delete(context.Background(), &cdiv1.StorageProfile{ObjectMeta: metav1.ObjectMeta{Name: name}})
	})
	err := k8sClient.Create(ctx, profile)
	if err == nil {
		return
	}
	if !apierrors.IsAlreadyExists(err) {
		t.Fatalf("creating StorageProfile %s: %v", name, err)
	}
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := k8sClient.Get(ctx, client.ObjectKey{Name: name}, profile); err != nil {
			return err
		}
		profile.Spec = spec
		return k8sClient.Update(ctx, profile)
	})
	if err != nil {
		t.Fatalf("setting the spec of StorageProfile %s: %v", name, err)
	}
}

// claimNamingPrime waits until the claim ns/name names its prime and returns it.
func claimNamingPrime(t *testing.T, ns, name string) *corev1.PersistentVolumeClaim {
	t.Helper()
	target := &corev1.PersistentVolumeClaim{}
	kit.Until(t, 30*time.Second, "claim "+ns+"/"+name+" to name its prime", func() bool {
		err := k8sClient.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, target)
		return err == nil && target.Annotations[cdiv1.AnnPVCPrimeName] != ""
	})
	return target
}

func envValue(c corev1.Container, name string) string {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value
		}
	}
	return ""
}

// TestDataVolumeImportRendersClaimPrimeAndImporter follows an http import
// DataVolume through the controllers up to the importer pod; binding and the
// import itself need the local cluster (tests/e2e).
func TestDataVolumeImportRendersClaimPrimeAndImporter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := newNamespace(t)
	className := ns + "-csi"
	csiClass(t, className, "hostpath.csi.kubefill.test", storagev1.VolumeBindingImmediate, rwoFilesystem)
	priority := &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: ns + "-high"}, Value: 1000}
	if err := k8sClient.Create(ctx, priority); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), priority) })
	startControllers(t, ns)

	dv := &cdiv1.DataVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "fedora", Namespace: ns},
		Spec: cdiv1.DataVolumeSpec{
			Source: &cdiv1.DataVolumeSource{HTTP: &cdiv1.DataVolumeSourceHTTP{URL: "http://images.test/fedora.qcow2", Checksum: "sha256:abcd", ExtraHeaders: []string{"X-A: b"}}},
			Storage: &cdiv1.StorageSpec{
				StorageClassName: &className,
				Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
			},
			PriorityClassName: ns + "-high",
		},
	}
	if err := k8sClient.Create(ctx, dv); err != nil {
		t.Fatal(err)
	}

	pvc := &corev1.PersistentVolumeClaim{}
	kit.Until(t, 20*time.Second, "the DataVolume's claim", func() bool {
		return k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: "fedora"}, pvc) == nil
	})
	if err := k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: "fedora"}, dv); err != nil {
		t.Fatal(err)
	}
	ref := pvc.Spec.DataSourceRef
	if ref == nil || ptr.Deref(ref.APIGroup, "") != cdiv1.GroupName || ref.Kind != cdiv1.VolumeImportSourceRef || ref.Name != controller.ImportSourceName(dv) {
		t.Fatalf("claim's dataSourceRef = %+v", ref)
	}
	if got := pvc.Spec.Resources.Requests[corev1.ResourceStorage]; got.Cmp(resource.MustParse("1090Mi")) != 0 {
		t.Errorf("claim request %s, want 1090Mi (1Gi plus 6%% filesystem overhead)", got.String())
	}
	if pvc.Spec.AccessModes[0] != corev1.ReadWriteOnce || *pvc.Spec.VolumeMode != corev1.PersistentVolumeFilesystem || *pvc.Spec.StorageClassName != className {
		t.Errorf("claim not completed from the StorageProfile: %+v", pvc.Spec)
	}
	src := &cdiv1.VolumeImportSource{}
	if err := k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: ref.Name}, src); err != nil {
		t.Fatalf("reading the VolumeImportSource: %v", err)
	}
	if src.Spec.Source.HTTP.URL != "http://images.test/fedora.qcow2" || !metav1.IsControlledBy(src, dv) {
		t.Errorf("VolumeImportSource %+v", src)
	}

	prime := &corev1.PersistentVolumeClaim{}
	kit.Until(t, 20*time.Second, "the PVC-prime", func() bool {
		return k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: populators.PrimeName(pvc)}, prime) == nil
	})
	if !metav1.IsControlledBy(prime, pvc) || prime.Annotations[cdiv1.AnnEndpoint] != "http://images.test/fedora.qcow2" ||
		prime.Annotations[cdiv1.AnnSource] != "http" || prime.Annotations[cdiv1.AnnChecksum] != "sha256:abcd" {
		t.Errorf("prime %s: owners %+v annotations %v", prime.Name, prime.OwnerReferences, prime.Annotations)
	}
	pod := &corev1.Pod{}
	kit.Until(t, 20*time.Second, "the importer pod", func() bool {
		return k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: "importer-" + prime.Name}, pod) == nil
	})
	c := pod.Spec.Containers[0]
	if c.Image != "kubefill/kubefill:test" || strings.Join(c.Command, " ") != "kubefill importer" || pod.Spec.PriorityClassName != ns+"-high" {
		t.Errorf("importer pod: image %s command %v priority %q", c.Image, c.Command, pod.Spec.PriorityClassName)
	}
	for name, want := range map[string]string{
		"IMPORTER_SOURCE": "http", "IMPORTER_ENDPOINT": "http://images.test/fedora.qcow2", "IMPORTER_CHECKSUM": "sha256:abcd",
		"IMPORTER_IMAGE_SIZE": "1090Mi", "OWNER_UID": string(pvc.UID), "IMPORTER_EXTRA_HEADER_0": "X-A: b", "FILESYSTEM_OVERHEAD": "0.06",
	} {
		if got := envValue(c, name); got != want {
			t.Errorf("importer env %s = %q, want %q", name, got, want)
		}
	}
	if len(c.VolumeMounts) < 1 || c.VolumeMounts[0].MountPath != "/data" || pod.Spec.Volumes[0].PersistentVolumeClaim.ClaimName != prime.Name {
		t.Errorf("importer pod does not mount the prime at /data: %+v", pod.Spec.Volumes)
	}
	for _, m := range c.VolumeMounts {
		if m.MountPath == "/scratch" {
			// As in CDI, an http import gets scratch space (a claim) only
			// once its importer says the image needs it.
			t.Errorf("an http import's first importer has scratch space: %+v", pod.Spec.Volumes)
		}
	}

	kit.Until(t, 20*time.Second, "DataVolume phase ImportScheduled", func() bool {
		_ = k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: "fedora"}, dv)
		return dv.Status.Phase == cdiv1.ImportScheduled
	})
	if dv.Status.ClaimName != "fedora" || dv.Status.Progress != cdiv1.ProgressNotAvailable || len(dv.Status.Conditions) != 3 {
		t.Errorf("DataVolume status %+v", dv.Status)
	}
}

// TestDataVolumeRefusals checks the user is told, on the DataVolume, why it
// cannot proceed: a snapshot source in a cluster without the VolumeSnapshot API, an
// incomplete profile, an in-tree class.
func TestDataVolumeRefusals(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	bare := ns + "-bare"
	csiClass(t, bare, "unknown.csi.example.test", storagev1.VolumeBindingImmediate)
	intree := ns + "-intree"
	csiClass(t, intree, "kubernetes.io/aws-ebs", storagev1.VolumeBindingImmediate, rwoFilesystem)
	fsClass := ns + "-fs"
	csiClass(t, fsClass, "hostpath.csi.kubefill.test", storagev1.VolumeBindingImmediate, rwoFilesystem)
	startControllers(t)

	size := corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}
	cases := []struct {
		name    string
		spec    cdiv1.DataVolumeSpec
		message string
		onClaim bool
	}{
		{"snapshot", cdiv1.DataVolumeSpec{Source: &cdiv1.DataVolumeSource{Snapshot: &cdiv1.DataVolumeSourceSnapshot{Namespace: ns, Name: "snap"}}, Storage: &cdiv1.StorageSpec{Resources: size}},
			"the VolumeSnapshot API (snapshot.storage.k8s.io/v1) is not installed in this cluster", false},
		{"no-claim-properties", cdiv1.DataVolumeSpec{Source: &cdiv1.DataVolumeSource{Blank: &cdiv1.DataVolumeBlankImage{}}, Storage: &cdiv1.StorageSpec{StorageClassName: &bare, Resources: size}},
			"has no claimPropertySets", false},
		{"missing-priority-class", cdiv1.DataVolumeSpec{Source: &cdiv1.DataVolumeSource{Blank: &cdiv1.DataVolumeBlankImage{}}, PriorityClassName: "no-such-class",
			PVC: &corev1.PersistentVolumeClaimSpec{StorageClassName: &fsClass, AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, Resources: size}},
			"no PriorityClass with name no-such-class", true},
		{"in-tree", cdiv1.DataVolumeSpec{Source: &cdiv1.DataVolumeSource{Blank: &cdiv1.DataVolumeBlankImage{}}, Storage: &cdiv1.StorageSpec{StorageClassName: &intree, Resources: size}},
			"uses the in-tree provisioner kubernetes.io/aws-ebs", true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dv := &cdiv1.DataVolume{ObjectMeta: metav1.ObjectMeta{Name: c.name, Namespace: ns}, Spec: c.spec}
			if err := k8sClient.Create(ctx, dv); err != nil {
				t.Fatal(err)
			}
			running := func() cdiv1.DataVolumeCondition {
				for _, cond := range dv.Status.Conditions {
					if cond.Type == cdiv1.DataVolumeRunning {
						return cond
					}
				}
				return cdiv1.DataVolumeCondition{}
			}
			kit.Until(t, 20*time.Second, "the Running condition to explain the refusal", func() bool {
				_ = k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: c.name}, dv)
				return strings.Contains(running().Message, c.message)
			})
			t.Logf("phase %s, Running: %s: %s", dv.Status.Phase, running().Reason, running().Message)
			if dv.Status.Phase == cdiv1.Succeeded || running().Status != corev1.ConditionFalse {
				t.Errorf("refused DataVolume reports %s / Running=%s", dv.Status.Phase, running().Status)
			}
			if c.onClaim {
				return // refused by the populator or its pod: the claim exists, by design
			}
			claims := &corev1.PersistentVolumeClaimList{}
			if err := k8sClient.List(ctx, claims, client.InNamespace(ns)); err != nil {
				t.Fatal(err)
			}
			for _, p := range claims.Items {
				if p.Name == c.name || strings.HasPrefix(p.Name, "prime-") {
					t.Errorf("claim %s was created for a DataVolume refused before rendering", p.Name)
				}
			}
		})
	}
}
