package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/clone"
	"github.com/kubefill/kubefill/pkg/controller"
	"github.com/kubefill/kubefill/tests/kit"
)

// A clone waiting for its source goes on as soon as the source appears,
// through watches, not at its next requeue (5 s for a DataVolume, 10 s for
// the populator). Each measurement starts a second after the wait was
// reported, so that the reconciles its own status update set off are over
// and the next requeue is still seconds away: only a watch makes it < 2 s.

// sourceStartLimit is how soon a clone must start once its source appears.
const sourceStartLimit = 2 * time.Second

// TestCloneDataVolumeWatchesItsSource: a cross-namespace clone DataVolume
// created before its source claim makes its claim within a second or two
// of the source's creation; one whose sourceRef names a DataSource not
// there yet goes on once the DataSource appears, and one whose DataSource
// names a claim not there yet goes on once the claim appears.
func TestCloneDataVolumeWatchesItsSource(t *testing.T) {
	src, tgt := newNamespace(t), newNamespace(t)
	class := src + "-csi"
	csiClass(t, class, "hostpath.csi.kubefill.test", storagev1.VolumeBindingImmediate, rwoFilesystem)
	k := newCloneKeys(t)
	startCloneDataVolumeController(t, k, src, tgt)

	// A source claim created late.
	short := k.short(t, src, "later", tgt, "early", time.Hour)
	mustCreate(t, k8sClient, cloneDataVolume(tgt, "early", class, pvcSource(src, "later"), nil, map[string]string{cdiv1.AnnCloneToken: short}))
	waitRunning(t, tgt, "early", "The source pvc later doesn't exist")
	time.Sleep(time.Second)
	begin := time.Now()
	boundSource(t, src, "later", class, "1Gi")
	took := claimWithin(t, tgt, "early", begin)
	t.Logf("claim made %s after its source claim was created", took.Round(time.Millisecond))

	// A DataSource created late, naming a claim that exists.
	ref := &cdiv1.DataVolumeSourceRef{Kind: cdiv1.DataVolumeDataSource, Name: "fedora"}
	mustCreate(t, k8sClient, cloneDataVolume(src, "from-ds", class, nil, ref, nil))
	waitRunning(t, src, "from-ds", "DataSource "+src+"/fedora named by spec.sourceRef doesn't exist")
	time.Sleep(time.Second)
	begin = time.Now()
	mustCreate(t, k8sClient, &cdiv1.DataSource{ObjectMeta: metav1.ObjectMeta{Namespace: src, Name: "fedora"},
		Spec: cdiv1.DataSourceSpec{Source: cdiv1.DataSourceSource{PVC: &cdiv1.DataVolumeSourcePVC{Namespace: src, Name: "later"}}}})
	took = claimWithin(t, src, "from-ds", begin)
	t.Logf("claim made %s after its DataSource was created", took.Round(time.Millisecond))

	// A DataSource whose claim is created late.
	mustCreate(t, k8sClient, &cdiv1.DataSource{ObjectMeta: metav1.ObjectMeta{Namespace: src, Name: "centos"},
		Spec: cdiv1.DataSourceSpec{Source: cdiv1.DataSourceSource{PVC: &cdiv1.DataVolumeSourcePVC{Namespace: src, Name: "golden"}}}})
	ref = &cdiv1.DataVolumeSourceRef{Kind: cdiv1.DataVolumeDataSource, Name: "centos"}
	mustCreate(t, k8sClient, cloneDataVolume(src, "from-ds-later", class, nil, ref, nil))
	waitRunning(t, src, "from-ds-later", "The source pvc golden doesn't exist")
	time.Sleep(time.Second)
	begin = time.Now()
	boundSource(t, src, "golden", class, "1Gi")
	took = claimWithin(t, src, "from-ds-later", begin)
	t.Logf("claim made %s after the claim behind its DataSource was created", took.Round(time.Millisecond))
}

// claimWithin waits for claim ns/name and fails unless it appeared within
// sourceStartLimit of begin; it returns how long it took.
func claimWithin(t *testing.T, ns, name string, begin time.Time) time.Duration {
	t.Helper()
	kit.Eventually(t, 30*time.Second, 20*time.Millisecond, "claim "+ns+"/"+name, func() (bool, string, error) {
		err := k8sClient.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, &corev1.PersistentVolumeClaim{})
		return err == nil, "not yet", client.IgnoreNotFound(err)
	})
	took := time.Since(begin)
	if took > sourceStartLimit {
		t.Errorf("claim %s/%s came %s after its source, more than %s: the clone waited for its requeue, not a watch", ns, name, took, sourceStartLimit)
	}
	return took
}

// TestClonePopulatorWatchesItsSource: a claim naming a VolumeCloneSource
// whose source claim does not exist yet waits saying so; once the source
// is created (and bound) the clone is planned within a second or two.
func TestClonePopulatorWatchesItsSource(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns, installNS := newNamespace(t), newNamespace(t)
	className := ns + "-csi"
	cloneClass(t, className)
	sharedClusterControllers(t)
	runManager(t, controller.ManagerOptions{MetricsBindAddress: "0", HealthProbeBindAddress: "0",
		WorkerImage: "kubefill/kubefill:test", InstallNamespace: installNS,
		Namespaces: []string{ns}})
	waitProfile(t, className, "asks for snapshot clones", strategyIs(cdiv1.CloneStrategySnapshot))
	mustCreate(t, k8sClient, &cdiv1.VolumeCloneSource{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "vcs"},
		Spec: cdiv1.VolumeCloneSourceSpec{Source: corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: "golden"}}})
	target := kit.PVC(ns, "disk", "1Gi", kit.Class(className), kit.SourceRef(cdiv1.VolumeCloneSourceRef, "vcs"))
	mustCreate(t, k8sClient, target)
	kit.Until(t, 30*time.Second, "the clone to wait for its source", func() bool {
		_ = k8sClient.Get(ctx, client.ObjectKeyFromObject(target), target)
		return target.Annotations[cdiv1.AnnRunningConditionReason] == "CloneWithoutSource" &&
			strings.Contains(target.Annotations[cdiv1.AnnRunningConditionMessage], "doesn't exist")
	})
	if reasons := eventReasons(t, ns, target.UID); !reasons["CloneWithoutSource"] {
		t.Errorf("no CloneWithoutSource event on the waiting claim: %v", reasons)
	}
	time.Sleep(time.Second)
	begin := time.Now()
	src := kit.PVC(ns, "golden", "1Gi", kit.Class(className))
	mustCreate(t, k8sClient, src)
	fakeBind(t, src)
	bound := time.Since(begin)
	took := kit.Eventually(t, 30*time.Second, 20*time.Millisecond, "the clone to be planned", func() (bool, string, error) {
		if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(target), target); err != nil {
			return false, "", err
		}
		return target.Annotations[cdiv1.AnnCloneType] != "", target.Annotations[cdiv1.AnnRunningConditionMessage], nil
	})
	took += bound
	t.Logf("clone planned (%s) %s after its source was created (bound after %s)", target.Annotations[cdiv1.AnnCloneType], took.Round(time.Millisecond), bound.Round(time.Millisecond))
	if took > sourceStartLimit {
		t.Errorf("the clone was planned %s after its source appeared, more than %s: it waited for its requeue, not a watch", took, sourceStartLimit)
	}
}

// TestCloneSourceInUseEndsWithThePod: a host-assisted clone whose source a
// pod mounts writable waits saying which pod; once that pod is gone the
// source pod starts within a second or two, not at the wait's 5 s requeue.
func TestCloneSourceInUseEndsWithThePod(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns, installNS := newNamespace(t), newNamespace(t)
	className := ns + "-csi"
	cloneClass(t, className)
	sharedClusterControllers(t)
	runManager(t, controller.ManagerOptions{MetricsBindAddress: "0", HealthProbeBindAddress: "0",
		WorkerImage: "kubefill/kubefill:test", InstallNamespace: installNS,
		Namespaces: []string{ns}})
	waitProfile(t, className, "asks for snapshot clones", strategyIs(cdiv1.CloneStrategySnapshot))
	cloneSourceClaim(t, ns, className)
	vm := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "virt-launcher-golden"}, Spec: corev1.PodSpec{
		Containers: []corev1.Container{{Name: "compute", Image: "busybox", VolumeMounts: []corev1.VolumeMount{{Name: "disk", MountPath: "/disk"}}}},
		Volumes:    []corev1.Volume{{Name: "disk", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "golden"}}}},
	}}
	mustCreate(t, k8sClient, vm)
	target := kit.PVC(ns, "disk", "1Gi", kit.Class(className), kit.SourceRef(cdiv1.VolumeCloneSourceRef, "vcs"))
	mustCreate(t, k8sClient, target)
	setPodStatus(t, ns, cdiv1.UploadPodName(clone.TmpClaimName(target.UID)), corev1.PodRunning, true)
	kit.Until(t, 30*time.Second, "the clone to wait for the pod using its source", func() bool {
		_ = k8sClient.Get(ctx, client.ObjectKeyFromObject(target), target)
		return target.Annotations[cdiv1.AnnRunningConditionReason] == "CloneSourceInUse" &&
			strings.Contains(target.Annotations[cdiv1.AnnRunningConditionMessage], ns+"/virt-launcher-golden")
	})
	time.Sleep(time.Second)
	begin := time.Now()
	if err := k8sClient.Delete(ctx, vm, client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	kit.Eventually(t, 30*time.Second, 20*time.Millisecond, "the source pod", func() (bool, string, error) {
		err := k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: clone.SourcePodName(target.UID)}, &corev1.Pod{})
		return err == nil, "not yet", client.IgnoreNotFound(err)
	})
	took := time.Since(begin)
	t.Logf("source pod made %s after the pod using the source was deleted", took.Round(time.Millisecond))
	if took > sourceStartLimit {
		t.Errorf("the source pod came %s after the source was free, more than %s: the clone waited for its requeue, not a watch", took, sourceStartLimit)
	}
}
