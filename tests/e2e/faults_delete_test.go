package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"

	"github.com/kubefill/kubefill/pkg/datapath/testimg"
	"github.com/kubefill/kubefill/tests/cluster"
	"github.com/kubefill/kubefill/tests/kit"
)

// Deleted mid-flow on the real node: the target claim of an import (a bare
// claim naming a VolumeImportSource, and a DataVolume's own claim), and the
// source claim's namespace of a cross-namespace copy. The DataVolume deleted
// mid-clone is TestCloneDataVolumes/DeleteMidClone, mid-import
// TestDeleteMidImportLeaksNothing.

// importInFlight waits until the importer of target ns/name streams (its
// pod Running, its prime bound to a volume) and returns the prime's name
// and volume.
func importInFlight(t *testing.T, c client.Client, ns, name string) (prime, volume string) {
	t.Helper()
	ctx := context.Background()
	kit.Eventually(t, 2*time.Minute, 200*time.Millisecond, "the import of "+name+" to be streaming", func() (bool, string, error) {
		target := &corev1.PersistentVolumeClaim{}
		if err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, target); err != nil {
			return false, fmt.Sprint(err), nil
		}
		if target.Annotations[cdiv1.AnnPopulatedFor] != "" {
			t.Fatalf("the import of %s finished before the test saw it in flight", name)
		}
		prime = target.Annotations[cdiv1.AnnPVCPrimeName]
		p := &corev1.PersistentVolumeClaim{}
		if prime == "" || c.Get(ctx, types.NamespacedName{Namespace: ns, Name: prime}, p) != nil {
			return false, "no prime yet", nil
		}
		volume = p.Spec.VolumeName
		return volume != "" && target.Annotations[cdiv1.AnnPodPhase] == string(corev1.PodRunning),
			fmt.Sprintf("prime %s volume %q, importer %s, progress %s", prime, volume, target.Annotations[cdiv1.AnnPodPhase], target.Annotations[cdiv1.AnnPopulatorProgress]), nil
	})
	return prime, volume
}

// waitGoneAfterDelete waits until prime, the importer pods of ns and
// volume are gone, and the claims of ns are only keep (by name, with a UID
// other than old's), and returns how long that took.
func waitGoneAfterDelete(t *testing.T, c client.Client, ns, prime, volume string, old types.UID, keep ...string) time.Duration {
	t.Helper()
	ctx := context.Background()
	start := time.Now()
	kit.Eventually(t, 2*time.Minute, 250*time.Millisecond, "the deleted claim's prime, importer and volume to go", func() (bool, string, error) {
		var left []string
		pods := &corev1.PodList{}
		if err := c.List(ctx, pods, client.InNamespace(ns), client.MatchingLabels{cdiv1.LabelComponent: "importer"}); err != nil {
			return false, "", err
		}
		for _, p := range pods.Items {
			if p.Labels[cdiv1.LabelOwnedByUID] == string(old) || p.Labels[cdiv1.LabelOwnedByUID] == "" {
				left = append(left, fmt.Sprintf("importer %s (%s)", p.Name, p.Status.Phase))
			}
		}
		claims := &corev1.PersistentVolumeClaimList{}
		if err := c.List(ctx, claims, client.InNamespace(ns)); err != nil {
			return false, "", err
		}
		for _, p := range claims.Items {
			switch {
			case p.UID == old:
				left = append(left, fmt.Sprintf("the deleted claim %s (finalizers %v)", p.Name, p.Finalizers))
			case p.Name == prime:
				left = append(left, fmt.Sprintf("its prime %s (finalizers %v)", p.Name, p.Finalizers))
			case !slices.Contains(keep, p.Name) && !strings.HasPrefix(p.Name, "prime-"):
				left = append(left, "claim "+p.Name)
			}
		}
		if err := c.Get(ctx, types.NamespacedName{Name: volume}, &corev1.PersistentVolume{}); !apierrors.IsNotFound(err) {
			left = append(left, "volume "+volume)
		}
		return len(left) == 0, fmt.Sprintf("left %s after the delete: %v", time.Since(start).Round(time.Millisecond), left), nil
	})
	return time.Since(start)
}

// TestDeleteTargetClaimMidImport: the claim being filled is deleted while
// its importer streams. A bare claim naming a VolumeImportSource takes its
// prime, importer and half-written volume with it. A DataVolume's claim is
// made again by the DataVolume, whose import starts over on a new prime and
// ends with the image's bytes; nothing of the first attempt is left.
func TestDeleteTargetClaimMidImport(t *testing.T) {
	parallel(t)
	c := shared.c
	dir := t.TempDir()
	name := rawImage(t, dir, 24<<20)
	want := testimg.FileSHA256(t, dir+"/"+name)
	url := throttledServer(t, dir, 2<<20) + "/" + name
	ctx := context.Background()

	t.Run("BarePVC", func(t *testing.T) {
		ns := newNamespace(t)
		if err := c.Create(ctx, &cdiv1.VolumeImportSource{
			ObjectMeta: metav1.ObjectMeta{Name: "from-http", Namespace: ns},
			Spec:       cdiv1.VolumeImportSourceSpec{Source: &cdiv1.ImportSourceType{HTTP: &cdiv1.DataVolumeSourceHTTP{URL: url}}},
		}); err != nil {
			t.Fatal(err)
		}
		pvc := kit.PVC(ns, "bare", "128Mi", kit.Class(cluster.StorageClassImmediate), kit.Mode(corev1.PersistentVolumeFilesystem),
			kit.SourceRef(cdiv1.VolumeImportSourceRef, "from-http"))
		if err := c.Create(ctx, pvc); err != nil {
			t.Fatal(err)
		}
		prime, volume := importInFlight(t, c, ns, "bare")
		if err := c.Delete(ctx, pvc); err != nil {
			t.Fatal(err)
		}
		took := waitGoneAfterDelete(t, c, ns, prime, volume, pvc.UID)
		t.Logf("bare claim deleted mid-import: claim, prime %s, importer and volume %s gone %s after", prime, volume, took.Round(time.Millisecond))
		if took > deleteBound {
			t.Errorf("deleting the claim mid-import took %s, more than %s", took.Round(time.Millisecond), deleteBound)
		}
		if err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: "from-http"}, &cdiv1.VolumeImportSource{}); err != nil {
			t.Errorf("the user's VolumeImportSource went with the claim: %v", err)
		}
	})

	t.Run("DataVolumeClaim", func(t *testing.T) {
		ns := newNamespace(t)
		dv := httpDV(ns, "renewed", url, cluster.StorageClassImmediate)
		if err := c.Create(ctx, dv); err != nil {
			t.Fatal(err)
		}
		prime, volume := importInFlight(t, c, ns, "renewed")
		old := &corev1.PersistentVolumeClaim{}
		if err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: "renewed"}, old); err != nil {
			t.Fatal(err)
		}
		if err := c.Delete(ctx, old); err != nil {
			t.Fatal(err)
		}
		took := waitGoneAfterDelete(t, c, ns, prime, volume, old.UID, "renewed")
		t.Logf("the DataVolume's claim deleted mid-import: the old claim, prime %s, importer and volume %s gone %s after", prime, volume, took.Round(time.Millisecond))
		got, seen := kit.WaitDataVolumeTerminal(t, c, ns, "renewed", 4*time.Minute)
		t.Logf("the DataVolume's phases after its claim was deleted: %v", seen)
		if got.Status.Phase != cdiv1.Succeeded {
			t.Fatalf("the DataVolume ended %s after its claim was deleted: %+v\nevents:\n%s", got.Status.Phase, got.Status.Conditions, eventsFor(ns, "renewed"))
		}
		fresh := &corev1.PersistentVolumeClaim{}
		if err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: "renewed"}, fresh); err != nil {
			t.Fatal(err)
		}
		if fresh.UID == old.UID || fresh.Spec.VolumeName == volume || !metav1.IsControlledBy(fresh, got) {
			t.Errorf("the DataVolume's claim after the delete: uid %s (old %s), volume %s (old %s), owners %v", fresh.UID, old.UID, fresh.Spec.VolumeName, volume, fresh.OwnerReferences)
		}
		assertNoLeftovers(t, c, ns)
		if sum := claimSHA256(t, ns, "renewed", 24<<20); sum != want {
			t.Errorf("the renewed claim holds sha256 %s, the image is %s", sum, want)
		}
	})
}
