package integration

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/clone"
	"github.com/kubefill/kubefill/pkg/controller"
	"github.com/kubefill/kubefill/pkg/token"
	"github.com/kubefill/kubefill/tests/kit"
)

// TestCloneQuotaRefusingTheTemporaryClaim: a cross-namespace clone's
// temporary claim tmp-pvc-<uid> lives next to its source and counts against
// the source namespace's quota. A ResourceQuota there with room for the
// source but not for the copy: the DataVolume says which quota refused which
// claim in which namespace (CDI's ErrExceededQuota, in Running and Bound), a
// Warning event says so, nothing is created beyond the user's claim and no
// worker starts; once the quota is raised the clone goes on by itself (the
// temporary claim, then the upload server that receives the copy; no node
// runs it here).
func TestCloneQuotaRefusingTheTemporaryClaim(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	nsSrc, nsTgt, installNS := newNamespace(t), newNamespace(t), newNamespace(t)
	className := nsSrc + "-csi"
	cloneClass(t, className)
	keys, err := token.EnsureSigningKeySecret(ctx, k8sClient, installNS, token.DefaultSigningKeySecretName)
	if err != nil {
		t.Fatal(err)
	}
	cloneSourceClaim(t, nsSrc, className)
	used := "1Gi"
	setQuota(t, nsSrc, "src-storage", "1536Mi", &used)
	sharedClusterControllers(t)
	runManager(t, controller.ManagerOptions{MetricsBindAddress: "0", HealthProbeBindAddress: "0",
		WorkerImage: "kubefill/kubefill:test", InstallNamespace: installNS,
		Namespaces: []string{nsSrc, nsTgt}})
	t.Cleanup(func() {
		// The DataVolume's finalizer needs the controllers: delete it first.
		_ = k8sClient.DeleteAllOf(context.Background(), &cdiv1.DataVolume{}, client.InNamespace(nsTgt))
		kit.Until(t, 30*time.Second, "the test's DataVolume to go", func() bool {
			list := &cdiv1.DataVolumeList{}
			return k8sClient.List(context.Background(), list, client.InNamespace(nsTgt)) == nil && len(list.Items) == 0
		})
	})

	short, err := token.NewGenerator(token.CloneTokenIssuer, keys.Private, 5*time.Minute).
		Generate(token.NewClonePayload(token.ResourcePVC, nsSrc, "golden", nsTgt, "copy"))
	if err != nil {
		t.Fatal(err)
	}
	dv := cloneDataVolume(nsTgt, "copy", className, pvcSource(nsSrc, "golden"), nil, map[string]string{cdiv1.AnnCloneToken: short})
	dv.Spec.Storage.Resources.Requests = corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}
	mustCreate(t, k8sClient, dv)

	claims := func(ns string) []string {
		list := &corev1.PersistentVolumeClaimList{}
		if err := k8sClient.List(ctx, list, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, c := range list.Items {
			out = append(out, c.Name)
		}
		sort.Strings(out)
		return out
	}
	describe := func(d *cdiv1.DataVolume) string {
		list := &corev1.EventList{}
		_ = k8sClient.List(ctx, list, client.InNamespace(nsTgt))
		var b strings.Builder
		fmt.Fprintf(&b, "phase %s, conditions %+v\n", d.Status.Phase, d.Status.Conditions)
		for _, e := range list.Items {
			fmt.Fprintf(&b, "event on %s %s: %s %s %q\n", e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Type, e.Reason, e.Message)
		}
		pods := &corev1.PodList{}
		_ = k8sClient.List(ctx, pods, client.InNamespace(nsSrc))
		var names []string
		for _, p := range pods.Items {
			names = append(names, p.Name)
		}
		return b.String() + fmt.Sprintf("claims: source namespace %v, target namespace %v; pods in the source namespace %v", claims(nsSrc), claims(nsTgt), names)
	}
	getDV := func() (*cdiv1.DataVolume, error) {
		d := &cdiv1.DataVolume{}
		return d, k8sClient.Get(ctx, types.NamespacedName{Namespace: nsTgt, Name: "copy"}, d)
	}
	got := kit.Await(t, 60*time.Second, 200*time.Millisecond, "the DataVolume's Running condition to name the source namespace's quota", getDV,
		func(d *cdiv1.DataVolume) bool {
			c := kit.DataVolumeCondition(d, cdiv1.DataVolumeRunning)
			return c.Reason == "ErrExceededQuota" && strings.Contains(c.Message, "exceeded quota: src-storage")
		}, describe)
	target := &corev1.PersistentVolumeClaim{}
	if err := k8sClient.Get(ctx, types.NamespacedName{Namespace: nsTgt, Name: "copy"}, target); err != nil {
		t.Fatal(err)
	}
	tmp := clone.TmpClaimName(target.UID)
	size := target.Spec.Resources.Requests[corev1.ResourceStorage] // 1Gi and the filesystem overhead
	running := kit.DataVolumeCondition(got, cdiv1.DataVolumeRunning)
	for _, want := range []string{
		"the ResourceQuota src-storage in namespace " + nsSrc, "temporary claim " + tmp, "requested requests.storage=" + size.String(),
		"used requests.storage=1Gi", "limited requests.storage=1536Mi", "next to the clone's source and counts against that namespace's quota",
		"Nothing was created", "goes on by itself",
	} {
		if !strings.Contains(running.Message, want) {
			t.Errorf("Running condition %q lacks %q", running.Message, want)
		}
	}
	if strings.Contains(running.Message, "is forbidden") {
		t.Errorf("Running condition is the API's raw text: %q", running.Message)
	}
	// KubeVirt reads a quota refusal in Bound, where CDI puts it; the target
	// itself is not bound while its copy cannot be made.
	if b := kit.DataVolumeCondition(got, cdiv1.DataVolumeBound); b.Reason != "ErrExceededQuota" || !strings.Contains(b.Message, "src-storage") {
		t.Errorf("Bound condition %+v", b)
	}
	if got.Status.Phase == cdiv1.Succeeded || got.Status.Phase == cdiv1.Failed {
		t.Errorf("phase %s while the quota refuses the temporary claim", got.Status.Phase)
	}
	ev := kit.Await(t, 30*time.Second, 200*time.Millisecond, "an ErrExceededQuota Warning event naming the quota",
		func() (*corev1.Event, error) {
			list := &corev1.EventList{}
			if err := k8sClient.List(ctx, list, client.InNamespace(nsTgt)); err != nil {
				return nil, err
			}
			for i, e := range list.Items {
				if e.Type == corev1.EventTypeWarning && e.Reason == "ErrExceededQuota" && strings.Contains(e.Message, "src-storage") && strings.Contains(e.Message, tmp) {
					return &list.Items[i], nil
				}
			}
			return nil, nil
		},
		func(e *corev1.Event) bool { return e != nil },
		func(*corev1.Event) string { return describe(got) })
	t.Logf("event on %s %s: %s", ev.InvolvedObject.Kind, ev.InvolvedObject.Name, ev.Message)
	kit.Await(t, 30*time.Second, 200*time.Millisecond, "the DataVolume's own Warning event naming the quota", getDV,
		func(d *cdiv1.DataVolume) bool {
			list := &corev1.EventList{}
			if err := k8sClient.List(ctx, list, client.InNamespace(nsTgt)); err != nil {
				return false
			}
			for _, e := range list.Items {
				if e.InvolvedObject.Kind == "DataVolume" && e.InvolvedObject.UID == d.UID && e.Type == corev1.EventTypeWarning &&
					e.Reason == "ErrExceededQuota" && strings.Contains(e.Message, "src-storage") {
					return true
				}
			}
			return false
		}, describe)
	t.Logf("while refused:\n%s", describe(got))

	// No storage beyond what the user asked for: the source and the target
	// claim alone, no worker pod in either namespace.
	if c := claims(nsSrc); len(c) != 1 || c[0] != "golden" {
		t.Errorf("claims in the source namespace: %v, want only the source", c)
	}
	if c := claims(nsTgt); len(c) != 1 || c[0] != "copy" {
		t.Errorf("claims in the target namespace: %v, want only the target", c)
	}
	for _, ns := range []string{nsSrc, nsTgt} {
		pods := &corev1.PodList{}
		if err := k8sClient.List(ctx, pods, client.InNamespace(ns)); err != nil || len(pods.Items) != 0 {
			t.Errorf("pods in %s while the temporary claim is refused: %d (%v)", ns, len(pods.Items), err)
		}
	}

	// Raised, the quota admits the temporary claim: the clone goes on by
	// itself, as far as it can without a node (the upload server that
	// receives the copy is created on the temporary claim).
	start := time.Now()
	setQuota(t, nsSrc, "src-storage", "5Gi", nil)
	prime := &corev1.PersistentVolumeClaim{}
	kit.Until(t, 60*time.Second, "the temporary claim "+tmp+" once the quota has room", func() bool {
		return k8sClient.Get(ctx, types.NamespacedName{Namespace: nsSrc, Name: tmp}, prime) == nil
	})
	if q := prime.Spec.Resources.Requests[corev1.ResourceStorage]; q.Cmp(size) != 0 {
		t.Errorf("the temporary claim requests %s, want the target's %s", q.String(), size.String())
	}
	kit.Await(t, 60*time.Second, 200*time.Millisecond, "the upload server on the temporary claim", getDV,
		func(*cdiv1.DataVolume) bool {
			return k8sClient.Get(ctx, types.NamespacedName{Namespace: nsSrc, Name: cdiv1.UploadPodName(tmp)}, &corev1.Pod{}) == nil
		}, describe)
	got = kit.Await(t, 30*time.Second, 200*time.Millisecond, "the DataVolume to leave ErrExceededQuota", getDV,
		func(d *cdiv1.DataVolume) bool {
			return kit.DataVolumeCondition(d, cdiv1.DataVolumeRunning).Reason != "ErrExceededQuota" &&
				kit.DataVolumeCondition(d, cdiv1.DataVolumeBound).Reason != "ErrExceededQuota"
		}, describe)
	t.Logf("temporary claim %s and its upload server made %s after the quota was raised; DataVolume %s, Running %+v",
		tmp, time.Since(start).Round(100*time.Millisecond), got.Status.Phase, kit.DataVolumeCondition(got, cdiv1.DataVolumeRunning))
}

// TestCloneQuotaRefusingTheSnapshotRestore: a host-assisted clone of a
// VolumeSnapshot first restores it into tmp-source-pvc-<uid> for the copy
// to read. A quota with room for the target but not for that restore: the
// claim says which quota refused which temporary claim (ErrExceededQuota,
// not the API's text), with a Warning event; nothing but the target is
// created; once the quota is raised the restore is made.
func TestCloneQuotaRefusingTheSnapshotRestore(t *testing.T) {
	ctx := context.Background()
	sc := useSnapshotControlPlane(t)
	ns, installNS := newNamespace(t), newNamespace(t)
	_, tgtClass := copyTargetClasses(t, ns)
	zero := "0"
	setQuota(t, ns, "restores", "1536Mi", &zero)
	runManager(t, controller.ManagerOptions{MetricsBindAddress: "0", HealthProbeBindAddress: "0",
		WorkerImage: "kubefill/kubefill:test", InstallNamespace: installNS})

	readySnapshotCloneSource(t, sc, ns, "vcs")

	target := kit.PVC(ns, "disk", "1Gi", kit.Class(tgtClass), kit.SourceRef(cdiv1.VolumeCloneSourceRef, "vcs"))
	mustCreate(t, k8sClient, target)
	restoreName := clone.TmpSourceClaimName(target.UID)
	describe := func(p *corev1.PersistentVolumeClaim) string {
		list := &corev1.EventList{}
		_ = k8sClient.List(ctx, list, client.InNamespace(ns))
		var b strings.Builder
		fmt.Fprintf(&b, "target annotations %v\n", p.Annotations)
		for _, e := range list.Items {
			fmt.Fprintf(&b, "event on %s %s: %s %s %q\n", e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Type, e.Reason, e.Message)
		}
		return b.String()
	}
	getTarget := func() (*corev1.PersistentVolumeClaim, error) {
		p := &corev1.PersistentVolumeClaim{}
		return p, k8sClient.Get(ctx, client.ObjectKeyFromObject(target), p)
	}
	got := kit.Await(t, 60*time.Second, 200*time.Millisecond, "the claim to name the quota refusing the restore", getTarget,
		func(p *corev1.PersistentVolumeClaim) bool {
			return p.Annotations[cdiv1.AnnRunningConditionReason] == "ErrExceededQuota" && strings.Contains(p.Annotations[cdiv1.AnnRunningConditionMessage], restoreName)
		}, describe)
	msg := got.Annotations[cdiv1.AnnRunningConditionMessage]
	for _, want := range []string{"exceeded quota: restores", "the ResourceQuota restores in namespace " + ns, "temporary PersistentVolumeClaim " + restoreName,
		"restores the source snapshot for the copy to disk", "requested requests.storage=1Gi", "used requests.storage=1Gi", "limited requests.storage=1536Mi",
		"Nothing was created beyond what was asked", "goes on by itself"} {
		if !strings.Contains(msg, want) {
			t.Errorf("running condition %q lacks %q", msg, want)
		}
	}
	if strings.Contains(msg, "is forbidden") {
		t.Errorf("running condition is the API's raw text: %q", msg)
	}
	kit.Until(t, 30*time.Second, "an ErrExceededQuota Warning event on the claim", func() bool {
		list := &corev1.EventList{}
		if err := k8sClient.List(ctx, list, client.InNamespace(ns)); err != nil {
			return false
		}
		for _, e := range list.Items {
			if e.InvolvedObject.Name == "disk" && e.Type == corev1.EventTypeWarning && e.Reason == "ErrExceededQuota" && strings.Contains(e.Message, restoreName) {
				return true
			}
		}
		return false
	})
	claims := &corev1.PersistentVolumeClaimList{}
	if err := k8sClient.List(ctx, claims, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	if len(claims.Items) != 1 {
		var names []string
		for _, c := range claims.Items {
			names = append(names, c.Name)
		}
		t.Errorf("claims while the restore is refused: %v, want only the target", names)
	}

	setQuota(t, ns, "restores", "5Gi", nil)
	kit.Until(t, 60*time.Second, "the restore "+restoreName+" once the quota has room", func() bool {
		return k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: restoreName}, &corev1.PersistentVolumeClaim{}) == nil
	})
	t.Logf("refused: %q; restore made once the quota was raised", msg)
}
