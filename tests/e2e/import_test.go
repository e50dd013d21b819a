package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/tests/cluster"
	"github.com/kubefill/kubefill/tests/kit"
)

// imageServer serves dir over plain HTTP where pods can reach it: on the
// host, at the pod network's gateway address.
func imageServer(t *testing.T, dir string) string {
	t.Helper()
	return serveDir(t, dir, 0)
}

// claimSHA256 reads the first n bytes of a Filesystem claim's disk.img
// through a pod and returns their sha256.
func claimSHA256(t *testing.T, ns, claim string, n int64) string {
	t.Helper()
	pod := podWithClaim("read-"+claim, claim, false, fmt.Sprintf("head -c %d /data/disk.img | sha256sum | cut -d' ' -f1 > /dev/termination-log", n))
	return strings.TrimSpace(runToCompletion(t, ns, pod))
}

// filesystemClaim is a ReadWriteOnce Filesystem claim of the Immediate class.
func filesystemClaim(size string) *corev1.PersistentVolumeClaimSpec {
	return kit.ClaimSpec(size, kit.Class(cluster.StorageClassImmediate), kit.Mode(corev1.PersistentVolumeFilesystem))
}

// TestDataVolumeImportsQcow2OverHTTP is the main job: a DataVolume imports a
// compressed qcow2 from an HTTP server; the claim ends Bound holding exactly
// what qemu-img converts the image to, and no prime or importer is left.
func TestDataVolumeImportsQcow2OverHTTP(t *testing.T) {
	parallel(t)
	c := shared.c
	ns := newNamespace(t)
	dir := t.TempDir()
	name, virtualSize, want := testImage(t, dir)
	url := imageServer(t, dir) + "/" + name

	dv := kit.DataVolume(ns, "fedora", kit.HTTP(url), kit.WithPVC(filesystemClaim("128Mi")))
	start := time.Now()
	if err := c.Create(context.Background(), dv); err != nil {
		t.Fatal(err)
	}
	dv, seen := kit.WaitDataVolumeTerminal(t, c, ns, "fedora", 4*time.Minute)
	t.Logf("import took %s; phases seen: %v", time.Since(start).Round(time.Millisecond), seen)
	if dv.Status.Phase != cdiv1.Succeeded || dv.Status.Progress != "100.0%" {
		t.Fatalf("DataVolume ended %s %s: %+v\nevents:\n%s", dv.Status.Phase, dv.Status.Progress, dv.Status.Conditions, eventsFor(ns, "fedora"))
	}
	pvc := &corev1.PersistentVolumeClaim{}
	if err := c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: "fedora"}, pvc); err != nil {
		t.Fatal(err)
	}
	if pvc.Status.Phase != corev1.ClaimBound {
		t.Fatalf("claim is %s after success", pvc.Status.Phase)
	}
	assertNoLeftovers(t, c, ns)
	if got := claimSHA256(t, ns, "fedora", virtualSize); got != want {
		t.Errorf("claim holds sha256 %s over %d bytes, qemu-img convert gives %s", got, virtualSize, want)
	}
}

// TestBarePVCWithVolumeImportSource fills a PVC that names a
// VolumeImportSource directly, without a DataVolume.
func TestBarePVCWithVolumeImportSource(t *testing.T) {
	parallel(t)
	c := shared.c
	ns := newNamespace(t)
	dir := t.TempDir()
	name, virtualSize, want := testImage(t, dir)
	src := &cdiv1.VolumeImportSource{
		ObjectMeta: metav1.ObjectMeta{Name: "from-http", Namespace: ns},
		Spec:       cdiv1.VolumeImportSourceSpec{Source: &cdiv1.ImportSourceType{HTTP: &cdiv1.DataVolumeSourceHTTP{URL: imageServer(t, dir) + "/" + name}}},
	}
	if err := c.Create(context.Background(), src); err != nil {
		t.Fatal(err)
	}
	pvc := kit.PVC(ns, "bare", "128Mi", kit.Class(cluster.StorageClassImmediate), kit.Mode(corev1.PersistentVolumeFilesystem),
		kit.SourceRef(cdiv1.VolumeImportSourceRef, "from-http"))
	if err := c.Create(context.Background(), pvc); err != nil {
		t.Fatal(err)
	}
	got := waitPVC(t, ns, "bare", 4*time.Minute, "Bound and populated", func(p *corev1.PersistentVolumeClaim) bool {
		return p.Status.Phase == corev1.ClaimBound && p.Annotations[cdiv1.AnnPopulatedFor] == "bare"
	})
	t.Logf("claim annotations: progress %s, pod phase %s, restarts %s",
		got.Annotations[cdiv1.AnnPopulatorProgress], got.Annotations[cdiv1.AnnPodPhase], got.Annotations[cdiv1.AnnPodRestarts])
	assertNoLeftovers(t, c, ns)
	if sum := claimSHA256(t, ns, "bare", virtualSize); sum != want {
		t.Errorf("claim holds sha256 %s, want %s", sum, want)
	}
}

// TestWrongChecksumFailsClearly imports an image whose checksum does not
// match: the DataVolume fails with the importer's message and an event, and
// its claim never binds to the bad data.
func TestWrongChecksumFailsClearly(t *testing.T) {
	parallel(t)
	c := shared.c
	ns := newNamespace(t)
	dir := t.TempDir()
	name, _, _ := testImage(t, dir)
	dv := &cdiv1.DataVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "bad-sum", Namespace: ns},
		Spec: cdiv1.DataVolumeSpec{
			Source: &cdiv1.DataVolumeSource{HTTP: &cdiv1.DataVolumeSourceHTTP{
				URL: imageServer(t, dir) + "/" + name, Checksum: "sha256:" + strings.Repeat("0", 64)}},
			PVC: filesystemClaim("128Mi"),
		},
	}
	if err := c.Create(context.Background(), dv); err != nil {
		t.Fatal(err)
	}
	dv, seen := kit.WaitDataVolumeTerminal(t, c, ns, "bad-sum", 4*time.Minute)
	t.Logf("phases seen: %v", seen)
	if dv.Status.Phase != cdiv1.Failed {
		t.Fatalf("a wrong checksum ended %s", dv.Status.Phase)
	}
	running := kit.DataVolumeCondition(dv, cdiv1.DataVolumeRunning)
	t.Logf("Running=%s %s: %s", running.Status, running.Reason, running.Message)
	if running.Status != corev1.ConditionFalse || !strings.Contains(strings.ToLower(running.Message), "checksum") {
		t.Errorf("Running condition does not explain the checksum failure: %+v", running)
	}
	pvc := &corev1.PersistentVolumeClaim{}
	if err := c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: "bad-sum"}, pvc); err != nil {
		t.Fatal(err)
	}
	if pvc.Status.Phase == corev1.ClaimBound {
		t.Errorf("the claim bound to data that failed its checksum")
	}
	if ev := eventsFor(ns, "bad-sum"); !strings.Contains(strings.ToLower(ev), "checksum") {
		t.Errorf("no event tells of the checksum failure; events:\n%s", ev)
	}
	// Deleting the DataVolume takes the claim, the prime and the importer with it.
	if err := c.Delete(context.Background(), dv); err != nil {
		t.Fatal(err)
	}
	kit.Eventually(t, time.Minute, 500*time.Millisecond, "the claims to go after deleting the DataVolume", func() (bool, string, error) {
		claims := &corev1.PersistentVolumeClaimList{}
		if err := c.List(context.Background(), claims, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		if len(claims.Items) == 0 {
			return true, "", nil
		}
		p := claims.Items[0]
		pods := &corev1.PodList{}
		_ = c.List(context.Background(), pods, client.InNamespace(ns))
		var podStates []string
		for _, pod := range pods.Items {
			podStates = append(podStates, fmt.Sprintf("%s %s deleting=%v", pod.Name, pod.Status.Phase, pod.DeletionTimestamp != nil))
		}
		return false, fmt.Sprintf("claims left: %s deleting=%v finalizers=%v owners=%v; pods: %v",
			p.Name, p.DeletionTimestamp, p.Finalizers, p.OwnerReferences, podStates), nil
	})
}

// assertNoLeftovers checks a finished population removed its prime, its
// scratch claim and its importer.
func assertNoLeftovers(t *testing.T, c client.Client, ns string) {
	t.Helper()
	kit.Eventually(t, 30*time.Second, 500*time.Millisecond, "the prime and the importer to go after success", func() (bool, string, error) {
		claims := &corev1.PersistentVolumeClaimList{}
		pods := &corev1.PodList{}
		if err := c.List(context.Background(), claims, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		if err := c.List(context.Background(), pods, client.InNamespace(ns), client.MatchingLabels{cdiv1.LabelComponent: "importer"}); err != nil {
			t.Fatal(err)
		}
		left := []string{}
		for _, p := range claims.Items {
			if strings.HasPrefix(p.Name, "prime-") || strings.HasSuffix(p.Name, "-scratch") {
				left = append(left, "claim "+p.Name)
			}
		}
		for _, p := range pods.Items {
			left = append(left, fmt.Sprintf("pod %s (%s, deleting=%v, owners=%v)", p.Name, p.Status.Phase, p.DeletionTimestamp, p.OwnerReferences))
		}
		return len(left) == 0, fmt.Sprintf("left behind after success: %v", left), nil
	})
}
