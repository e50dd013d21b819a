package integration

import (
	"context"
	"fmt"
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
	"github.com/kubefill/kubefill/pkg/token"
	"github.com/kubefill/kubefill/tests/kit"
)

// Clone waits that must never be silent, against the real kube-apiserver.

// TestCloneTokenNotMintedIsVisible: the DataVolume controller cannot sign
// a cross-namespace clone's extended token, its key Secret missing (and
// not creatable): the DataVolume's Running condition and a Warning event
// say so and where the key lives; once the Secret exists the clone goes on
// by itself.
func TestCloneTokenNotMintedIsVisible(t *testing.T) {
	ctx := context.Background()
	src, tgt, installNS := newNamespace(t), newNamespace(t), newNamespace(t)
	class := src + "-csi"
	csiClass(t, class, "hostpath.csi.kubefill.test", storagev1.VolumeBindingImmediate, rwoFilesystem)
	k := newCloneKeys(t)
	const keySecret = "kubefill-extended-clone-token-key"
	keys := &token.SecretKeySource{Client: k8sClient, Namespace: installNS, Name: keySecret, Refresh: time.Second}
	startCloneDataVolumeControllerWith(t, k, func(dvs *controller.DataVolumeReconciler) {
		dvs.ExtendedTokens = token.NewDynamicGenerator(token.ExtendedCloneTokenIssuer, keys.PrivateKey, token.DefaultExtendedCloneTokenLifetime)
		dvs.ExtendedTokenValidator = token.NewMultiKeyValidator(token.ExtendedCloneTokenIssuer, keys.PublicKeys, token.DefaultCloneTokenLeeway)
	}, tgt)
	boundSource(t, src, "golden", class, "1Gi")
	short := k.short(t, src, "golden", tgt, "disk", time.Hour)
	mustCreate(t, k8sClient, cloneDataVolume(tgt, "disk", class, pvcSource(src, "golden"), nil, map[string]string{cdiv1.AnnCloneToken: short}))
	dv := waitRunning(t, tgt, "disk", "cannot sign the DataVolume's extended clone token")
	running := kit.DataVolumeCondition(dv, cdiv1.DataVolumeRunning)
	t.Logf("Running: %s: %s", running.Reason, running.Message)
	if running.Reason != "CloneTokenNotMinted" || !strings.Contains(running.Message, keySecret) || !strings.Contains(running.Message, "not found") {
		t.Errorf("Running %+v does not name the reason, the Secret and the error", running)
	}
	kit.Until(t, 20*time.Second, "a CloneTokenNotMinted Warning event", func() bool {
		return eventReasons(t, tgt, dv.UID)["CloneTokenNotMinted"]
	})
	if err := k8sClient.Get(ctx, types.NamespacedName{Namespace: tgt, Name: "disk"}, &corev1.PersistentVolumeClaim{}); err == nil {
		t.Error("a claim was made without an extended token")
	}

	if _, err := token.EnsureSigningKeySecret(ctx, k8sClient, installNS, keySecret); err != nil {
		t.Fatal(err)
	}
	took := kit.Eventually(t, 30*time.Second, 100*time.Millisecond, "the claim, with its extended token, once the key Secret exists", func() (bool, string, error) {
		pvc := &corev1.PersistentVolumeClaim{}
		if err := k8sClient.Get(ctx, types.NamespacedName{Namespace: tgt, Name: "disk"}, pvc); err == nil {
			return pvc.Annotations[cdiv1.AnnExtendedCloneToken] != "", "claim without its token", nil
		}
		if err := k8sClient.Get(ctx, types.NamespacedName{Namespace: tgt, Name: "disk"}, dv); err != nil {
			return false, "", err
		}
		return false, fmt.Sprintf("no claim; DataVolume %s %+v", dv.Status.Phase, kit.DataVolumeCondition(dv, cdiv1.DataVolumeRunning)), nil
	})
	t.Logf("claim made %s after the key Secret was created", took.Round(time.Millisecond))
}

// TestCloneSourcePodFailureStaysVisible: a host-assisted clone's source pod
// fails; while the next one is held off, the DataVolume's Running condition
// keeps saying what failed and that it is retried, and a Warning event on
// the claim says it too.
func TestCloneSourcePodFailureStaysVisible(t *testing.T) {
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
	boundSource(t, ns, "golden", className, "1Gi")
	mustCreate(t, k8sClient, kit.DataVolume(ns, "disk", &cdiv1.DataVolumeSource{PVC: &cdiv1.DataVolumeSourcePVC{Namespace: ns, Name: "golden"}},
		kit.WithPVC(kit.ClaimSpec("1Gi", kit.Class(className)))))
	t.Cleanup(func() {
		_ = k8sClient.Delete(context.Background(), &cdiv1.DataVolume{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "disk"}})
	})
	target := waitClaim(t, ns, "disk", nil)
	primeName := clone.TmpClaimName(target.UID)
	setPodStatus(t, ns, cdiv1.UploadPodName(primeName), corev1.PodRunning, true)
	sourceName := clone.SourcePodName(target.UID)
	pod := setPodStatus(t, ns, sourceName, corev1.PodRunning, false)
	const failure = "streaming to the upload server: connection reset by peer"
	pod.Status.Phase = corev1.PodFailed
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: pod.Spec.Containers[0].Name, Image: pod.Spec.Containers[0].Image, ImageID: "x",
		State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, Reason: "Error", Message: failure}}}}
	if err := k8sClient.Status().Update(ctx, pod); err != nil {
		t.Fatal(err)
	}
	dv := &cdiv1.DataVolume{}
	kit.Eventually(t, 30*time.Second, 100*time.Millisecond, "the DataVolume's Running to say the source pod failed", func() (bool, string, error) {
		if err := k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: "disk"}, dv); err != nil {
			return false, "", err
		}
		_ = k8sClient.Get(ctx, client.ObjectKeyFromObject(target), target)
		running := kit.DataVolumeCondition(dv, cdiv1.DataVolumeRunning)
		return strings.Contains(running.Message, failure), fmt.Sprintf("Running %+v; claim phase %s running %q %q pod %s",
			running, target.Annotations[cdiv1.AnnClonePhase], target.Annotations[cdiv1.AnnRunningConditionReason],
			target.Annotations[cdiv1.AnnRunningConditionMessage], target.Annotations[cdiv1.AnnPodPhase]), nil
	})
	t.Logf("Running after the failure: %+v", kit.DataVolumeCondition(dv, cdiv1.DataVolumeRunning))
	kit.Until(t, 20*time.Second, "the failed source pod to be removed", func() bool {
		return gone(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: sourceName}})
	})
	// Between the attempts (10 s of backoff) the failure stays shown.
	for end := time.Now().Add(4 * time.Second); time.Now().Before(end); time.Sleep(250 * time.Millisecond) {
		if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(dv), dv); err != nil {
			t.Fatal(err)
		}
		if msg := kit.DataVolumeCondition(dv, cdiv1.DataVolumeRunning).Message; !strings.Contains(msg, failure) || !strings.Contains(msg, "retrying") {
			t.Fatalf("between attempts the DataVolume's Running says %q, not the failure and its retry", msg)
		}
	}
	if !eventReasons(t, ns, target.UID)["Retrying"] {
		t.Error("no Retrying Warning event on the claim")
	}
}
