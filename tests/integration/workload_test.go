package integration

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/clone"
	"github.com/kubefill/kubefill/pkg/controller"
	"github.com/kubefill/kubefill/pkg/populators"
	"github.com/kubefill/kubefill/tests/kit"
)

// TestWorkerPodsFollowTheCDIResourceAndCDIConfig: the CDI resource's
// spec.workload and CDIConfig's imagePullSecrets reach every pod the
// controllers create (importer, upload server, a host-assisted clone's
// upload and source pods) and the poller's CronJob and Job; a
// DataVolume's Multus and mesh annotations reach its claim, the prime and
// the worker pods, which stay out of the meshes where the user says
// nothing. A new workload reaches the poller's CronJob. The CDI resource
// is cluster-wide: the test has a control plane of its own.
func TestWorkerPodsFollowTheCDIResourceAndCDIConfig(t *testing.T) {
	t.Parallel()
	envCfg, c := startOwnControlPlane(t, ownEnvironment(t), "the workload placement control plane")
	ctx := context.Background()
	installNS, ns := "kubefill-system", "vms"
	for _, name := range []string{installNS, ns} {
		mustCreate(t, c, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}})
	}
	workload := cdiv1.NodePlacement{
		NodeSelector: map[string]string{"kubevirt.io/storage": "true"},
		Tolerations:  []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpEqual, Value: "virt", Effect: corev1.TaintEffectNoSchedule}},
		Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
			NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"a"}}}}}}}},
	}
	// spec.imagePullPolicy wins over the manager's WorkerPullPolicy (unset here).
	mustCreate(t, c, &cdiv1.CDI{ObjectMeta: metav1.ObjectMeta{Name: "cdi"}, Spec: cdiv1.CDISpec{Workloads: *workload.DeepCopy(), ImagePullPolicy: corev1.PullNever}})
	pull := []corev1.LocalObjectReference{{Name: "mirror-pull"}}
	mustCreate(t, c, &cdiv1.CDIConfig{ObjectMeta: metav1.ObjectMeta{Name: cdiv1.CDIConfigName}, Spec: cdiv1.CDIConfigSpec{ImagePullSecrets: pull}})
	className := "csi"
	mode := storagev1.VolumeBindingImmediate
	mustCreate(t, c, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: className}, Provisioner: cloneDriver, VolumeBindingMode: &mode})
	mustCreate(t, c, &cdiv1.StorageProfile{ObjectMeta: metav1.ObjectMeta{Name: className}, Spec: cdiv1.StorageProfileSpec{
		ClaimPropertySets: []cdiv1.ClaimPropertySet{rwoFilesystem}, CloneStrategy: ptr.To(cdiv1.CloneStrategyHostAssisted)}})

	mgr, err := controller.NewManager(envCfg, controller.ManagerOptions{MetricsBindAddress: "0", HealthProbeBindAddress: "0", SkipNameValidation: true,
		WorkerImage: "kubefill/kubefill:test", InstallNamespace: installNS})
	if err != nil {
		t.Fatal(err)
	}
	startUntilCleanup(t, mgr)
	kit.Until(t, 30*time.Second, "CDIConfig's status to carry the pull secrets and the profile its claim properties", func() bool {
		config, profile := &cdiv1.CDIConfig{}, &cdiv1.StorageProfile{}
		return c.Get(ctx, types.NamespacedName{Name: cdiv1.CDIConfigName}, config) == nil && len(config.Status.ImagePullSecrets) == 1 &&
			c.Get(ctx, types.NamespacedName{Name: className}, profile) == nil && len(profile.Status.ClaimPropertySets) > 0
	})

	// checkPod checks a pod the controllers made against the cluster's
	// settings and the mesh values the pod should carry.
	checkPod := func(what string, pod *corev1.PodSpec, ann map[string]string, want map[string]string) {
		t.Helper()
		got := cdiv1.NodePlacement{NodeSelector: pod.NodeSelector, Affinity: pod.Affinity, Tolerations: withoutDefaultTolerations(pod.Tolerations)}
		if !equality.Semantic.DeepEqual(got, workload) {
			t.Errorf("%s placement %+v, want the CDI resource's spec.workload %+v", what, got, workload)
		}
		for _, ctr := range append(slices.Clone(pod.InitContainers), pod.Containers...) {
			if ctr.ImagePullPolicy != corev1.PullNever {
				t.Errorf("%s container %s imagePullPolicy %q, want the CDI resource's Never", what, ctr.Name, ctr.ImagePullPolicy)
			}
		}
		if !equality.Semantic.DeepEqual(pod.ImagePullSecrets, pull) {
			t.Errorf("%s imagePullSecrets %v, want CDIConfig's %v", what, pod.ImagePullSecrets, pull)
		}
		for _, key := range populators.WorkerPodAnnotationKeys {
			if v, ok := ann[key]; v != want[key] || ok != (want[key] != "") {
				t.Errorf("%s annotation %s = %q, want %q", what, key, v, want[key])
			}
		}
	}
	getPod := func(name string) *corev1.Pod {
		t.Helper()
		pod := &corev1.Pod{}
		kit.Until(t, 30*time.Second, "pod "+ns+"/"+name, func() bool {
			return c.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, pod) == nil
		})
		return pod
	}
	primeOf := func(claimName string) *corev1.PersistentVolumeClaim {
		t.Helper()
		target, prime := &corev1.PersistentVolumeClaim{}, &corev1.PersistentVolumeClaim{}
		kit.Until(t, 30*time.Second, "the prime of "+claimName, func() bool {
			return c.Get(ctx, types.NamespacedName{Namespace: ns, Name: claimName}, target) == nil && target.Annotations[cdiv1.AnnPVCPrimeName] != "" &&
				c.Get(ctx, types.NamespacedName{Namespace: ns, Name: target.Annotations[cdiv1.AnnPVCPrimeName]}, prime) == nil
		})
		return prime
	}

	// An import on a secondary network, with an Istio sidecar asked for.
	imp := kit.DataVolume(ns, "imported", kit.HTTP("http://images.test/fedora.qcow2"), kit.WithStorage(className, "1Gi"))
	imp.Annotations = map[string]string{cdiv1.AnnPodNetwork: "storage-net", cdiv1.AnnPodMultusDefaultNetwork: "vms/fast", cdiv1.AnnPodSidecarInjectionIstio: "true"}
	mustCreate(t, c, imp)
	impWant := map[string]string{cdiv1.AnnPodNetwork: "storage-net", cdiv1.AnnPodMultusDefaultNetwork: "vms/fast",
		cdiv1.AnnPodSidecarInjectionIstio: "true", cdiv1.AnnPodSidecarInjectionLinkerd: "disabled"}
	prime := primeOf("imported")
	claim := &corev1.PersistentVolumeClaim{}
	if err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: "imported"}, claim); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{cdiv1.AnnPodNetwork, cdiv1.AnnPodMultusDefaultNetwork, cdiv1.AnnPodSidecarInjectionIstio} {
		if claim.Annotations[key] != imp.Annotations[key] || prime.Annotations[key] != imp.Annotations[key] {
			t.Errorf("%s: claim %q, prime %q, want the DataVolume's %q", key, claim.Annotations[key], prime.Annotations[key], imp.Annotations[key])
		}
	}
	importer := getPod("importer-" + prime.Name)
	checkPod("importer pod", &importer.Spec, importer.Annotations, impWant)

	// An upload, with nothing asked: out of both meshes.
	optOut := map[string]string{cdiv1.AnnPodSidecarInjectionIstio: "false", cdiv1.AnnPodSidecarInjectionLinkerd: "disabled"}
	mustCreate(t, c, kit.DataVolume(ns, "uploaded", kit.Upload(), kit.WithStorage(className, "1Gi")))
	upload := getPod(cdiv1.UploadPodName(primeOf("uploaded").Name))
	checkPod("upload pod", &upload.Spec, upload.Annotations, optOut)

	// A host-assisted clone: its upload pod, then, once that runs, its source pod.
	src := kit.PVC(ns, "golden", "1Gi", kit.Class(className))
	mustCreate(t, c, src)
	fakeBindOn(t, c, src)
	mustCreate(t, c, &cdiv1.VolumeCloneSource{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "vcs"},
		Spec: cdiv1.VolumeCloneSourceSpec{Source: corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: "golden"}}})
	target := kit.PVC(ns, "cloned", "1Gi", kit.Class(className), kit.SourceRef(cdiv1.VolumeCloneSourceRef, "vcs"),
		kit.Annotate(map[string]string{cdiv1.AnnPodSidecarInjectionLinkerd: "enabled"}))
	mustCreate(t, c, target)
	cloneWant := map[string]string{cdiv1.AnnPodSidecarInjectionIstio: "false", cdiv1.AnnPodSidecarInjectionLinkerd: "enabled"}
	cloneUpload := setPodStatusOn(t, c, ns, cdiv1.UploadPodName(clone.TmpClaimName(target.UID)), corev1.PodRunning, true)
	checkPod("clone upload pod", &cloneUpload.Spec, cloneUpload.Annotations, cloneWant)
	source := getPod(clone.SourcePodName(target.UID))
	checkPod("clone source pod", &source.Spec, source.Annotations, cloneWant)

	// The poller: its CronJob and initial Job; then a new workload reaches the CronJob.
	cron := registryCron(ns, "fedora", "docker://registry.test/os/fedora:40")
	mustCreate(t, c, cron)
	cjKey := types.NamespacedName{Namespace: installNS, Name: controller.CronJobName(cron)}
	cj, job := &batchv1.CronJob{}, &batchv1.Job{}
	kit.Until(t, 30*time.Second, "the poller's CronJob and Job", func() bool {
		return c.Get(ctx, cjKey, cj) == nil && c.Get(ctx, types.NamespacedName{Namespace: installNS, Name: controller.InitialJobName(cron)}, job) == nil
	})
	checkPod("poller CronJob pod", &cj.Spec.JobTemplate.Spec.Template.Spec, optOut, optOut)
	checkPod("poller Job pod", &job.Spec.Template.Spec, optOut, optOut)
	moved := map[string]string{"kubevirt.io/storage": "moved"}
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cr := &cdiv1.CDI{}
		if err := c.Get(ctx, client.ObjectKey{Name: "cdi"}, cr); err != nil {
			return err
		}
		cr.Spec.Workloads.NodeSelector = moved
		return c.Update(ctx, cr)
	})
	if err != nil {
		t.Fatalf("moving the CDI resource's workload: %v", err)
	}
	kit.Until(t, 30*time.Second, "the poller's CronJob on the new nodeSelector", func() bool {
		return c.Get(ctx, cjKey, cj) == nil && fmt.Sprint(cj.Spec.JobTemplate.Spec.Template.Spec.NodeSelector) == fmt.Sprint(moved)
	})
}

// withoutDefaultTolerations leaves out the tolerations the API server's
// DefaultTolerationSeconds admission adds to every pod.
func withoutDefaultTolerations(in []corev1.Toleration) []corev1.Toleration {
	var out []corev1.Toleration
	for _, tol := range in {
		if (tol.Key == corev1.TaintNodeNotReady || tol.Key == corev1.TaintNodeUnreachable) && tol.Effect == corev1.TaintEffectNoExecute {
			continue
		}
		out = append(out, tol)
	}
	return out
}
