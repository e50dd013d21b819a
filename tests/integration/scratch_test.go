package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/contract"
	"github.com/kubefill/kubefill/pkg/populators"
	"github.com/kubefill/kubefill/tests/kit"
)

// registryDV is a DataVolume that imports a registry image into size of class.
func registryDV(ns, name, size, class string, ann map[string]string) *cdiv1.DataVolume {
	dv := kit.DataVolume(ns, name, &cdiv1.DataVolumeSource{Registry: &cdiv1.DataVolumeSourceRegistry{URL: ptr.To("docker://registry.test/disk:1")}},
		kit.WithPVC(kit.ClaimSpec(size, kit.Class(class))))
	dv.Annotations = ann
	return dv
}

// TestScratchClaimBeforeTheImporter: an import that needs scratch space (an
// http import forced by requiresScratch on the DataVolume, as CDI's
// annotation forces it; a registry import by its source) gets the scratch
// claim <prime>-scratch, owned by the claim, before its importer pod, which
// mounts it at /scratch; with no provisioner here it stays Pending, and the
// DataVolume says the importer waits for it.
func TestScratchClaimBeforeTheImporter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := newNamespace(t)
	className := ns + "-csi"
	csiClass(t, className, "hostpath.csi.kubefill.test", storagev1.VolumeBindingImmediate, rwoFilesystem)
	startControllers(t, ns)
	for _, dv := range []*cdiv1.DataVolume{
		kit.DataVolume(ns, "forced", kit.HTTP("http://images.test/disk.qcow2"), kit.WithPVC(kit.ClaimSpec("1Gi", kit.Class(className)))),
		registryDV(ns, "registry", "1Gi", className, nil),
	} {
		if dv.Name == "forced" {
			dv.Annotations = map[string]string{cdiv1.AnnRequiresScratch: "true"}
		}
		if err := k8sClient.Create(ctx, dv); err != nil {
			t.Fatal(err)
		}
	}
	// An http import not forced has no scratch space until its importer
	// asks for it, as in CDI.
	plain := kit.DataVolume(ns, "plain", kit.HTTP("http://images.test/disk.qcow2"), kit.WithPVC(kit.ClaimSpec("1Gi", kit.Class(className))))
	if err := k8sClient.Create(ctx, plain); err != nil {
		t.Fatal(err)
	}

	for _, name := range []string{"forced", "registry", "plain"} {
		target := &corev1.PersistentVolumeClaim{}
		kit.Until(t, 30*time.Second, "claim "+name, func() bool {
			return k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, target) == nil && target.UID != ""
		})
		prime := populators.PrimeName(target)
		pod := &corev1.Pod{}
		kit.Until(t, 30*time.Second, "the importer pod of "+name, func() bool {
			return k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: cdiv1.ImporterPodName(prime)}, pod) == nil
		})
		var scratchVolume *corev1.Volume
		for i, v := range pod.Spec.Volumes {
			if v.Name == contract.ScratchVolumeName {
				scratchVolume = &pod.Spec.Volumes[i]
			}
		}
		scratchName := cdiv1.ScratchClaimName(prime)
		scratch := &corev1.PersistentVolumeClaim{}
		err := k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: scratchName}, scratch)
		if name == "plain" {
			if scratchVolume != nil || err == nil {
				t.Errorf("%s: an http import has scratch space before it asked (volume %+v, claim error %v)", name, scratchVolume, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: scratch claim %s: %v", name, scratchName, err)
		}
		if scratchVolume == nil || scratchVolume.PersistentVolumeClaim == nil || scratchVolume.PersistentVolumeClaim.ClaimName != scratchName {
			t.Errorf("%s: the importer's scratch volume %+v, want claim %s", name, scratchVolume, scratchName)
		}
		if !metav1.IsControlledBy(scratch, target) || scratch.Labels[cdiv1.LabelOwnedByUID] != string(target.UID) {
			t.Errorf("%s: scratch owners %+v labels %v: want the claim", name, scratch.OwnerReferences, scratch.Labels)
		}
		config := &cdiv1.CDIConfig{}
		if err := k8sClient.Get(ctx, types.NamespacedName{Name: cdiv1.CDIConfigName}, config); client.IgnoreNotFound(err) != nil {
			t.Fatal(err)
		}
		wantClass := config.Status.ScratchSpaceStorageClass
		if wantClass == "" {
			wantClass = className
		}
		s := scratch.Spec
		if ptr.Deref(s.StorageClassName, "") != wantClass || ptr.Deref(s.VolumeMode, "") != corev1.PersistentVolumeFilesystem ||
			len(s.AccessModes) != 1 || s.AccessModes[0] != corev1.ReadWriteOnce || s.DataSourceRef != nil {
			t.Errorf("%s: scratch spec %+v, want class %s, Filesystem, ReadWriteOnce", name, s, wantClass)
		}
		if populators.FilesystemOverhead(config, wantClass) == populators.FilesystemOverhead(config, className) &&
			s.Resources.Requests.Storage().Cmp(resource.MustParse("1Gi")) != 0 {
			t.Errorf("%s: scratch size %s, want 1Gi (the prime's usable space plus the same overhead)", name, s.Resources.Requests.Storage())
		}
		kit.WaitDataVolume(t, k8sClient, ns, name, 30*time.Second, func(dv *cdiv1.DataVolume) bool {
			c := kit.DataVolumeCondition(dv, cdiv1.DataVolumeRunning)
			return c.Reason == populators.ReasonCreatingScratch && strings.Contains(c.Message, "scratch claim "+ns+"/"+scratchName)
		})
	}
}

// TestQuotaRefusingTheScratchClaim: a storage quota with room for the claim
// and its prime but not for the scratch claim is reported as a refused
// prime is (CDI's ErrExceededQuota, naming the scratch claim), no importer
// starts, and once the quota is raised the importer starts by itself.
func TestQuotaRefusingTheScratchClaim(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := newNamespace(t)
	className := ns + "-csi"
	csiClass(t, className, "hostpath.csi.kubefill.test", storagev1.VolumeBindingImmediate, rwoFilesystem)
	zero := "0"
	setQuota(t, ns, "storage", "2560Mi", &zero)
	startControllers(t, ns)
	if err := k8sClient.Create(ctx, registryDV(ns, "disk", "1Gi", className, nil)); err != nil {
		t.Fatal(err)
	}
	dv := kit.Await(t, 60*time.Second, 200*time.Millisecond, "the DataVolume's Running condition to name the quota",
		func() (*cdiv1.DataVolume, error) {
			d := &cdiv1.DataVolume{}
			return d, k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: "disk"}, d)
		},
		func(d *cdiv1.DataVolume) bool {
			return kit.DataVolumeCondition(d, cdiv1.DataVolumeRunning).Reason == populators.ReasonExceededQuota
		},
		func(d *cdiv1.DataVolume) string {
			return fmt.Sprintf("phase %s, conditions %+v", d.Status.Phase, d.Status.Conditions)
		})
	msg := kit.DataVolumeCondition(dv, cdiv1.DataVolumeRunning).Message
	for _, want := range []string{"exceeded quota: storage", "ResourceQuota storage in namespace " + ns, "scratch claim", "limited requests.storage=2560Mi", "Nothing was started"} {
		if !strings.Contains(msg, want) {
			t.Errorf("message %q lacks %q", msg, want)
		}
	}
	pods := &corev1.PodList{}
	if err := k8sClient.List(ctx, pods, client.InNamespace(ns)); err != nil || len(pods.Items) != 0 {
		t.Fatalf("pods while the scratch claim is refused: %d (%v)", len(pods.Items), err)
	}
	setQuota(t, ns, "storage", "4Gi", nil)
	kit.Until(t, 60*time.Second, "the importer pod once the quota has room", func() bool {
		list := &corev1.PodList{}
		return k8sClient.List(ctx, list, client.InNamespace(ns)) == nil && len(list.Items) == 1
	})
}
