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
	"github.com/kubefill/kubefill/tests/kit"
)

// The provisioner's complaints about a PVC-prime, and a pending worker pod's
// warnings, reach the user's claim: these are objects the user did not make
// and rarely looks at. Each event is copied once, however often the
// populator reconciles.
func TestPrimeAndWorkerEventsReachTheClaim(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := newNamespace(t)
	className := ns + "-csi"
	csiClass(t, className, "hostpath.csi.kubefill.test", storagev1.VolumeBindingImmediate)
	startControllers(t, ns)
	dv := kit.DataVolume(ns, "disk", kit.HTTP("http://images.test/disk.qcow2"), kit.WithPVC(kit.ClaimSpec("1Gi", kit.Class(className))))
	if err := k8sClient.Create(ctx, dv); err != nil {
		t.Fatal(err)
	}
	target := claimNamingPrime(t, ns, "disk")
	prime := &corev1.PersistentVolumeClaim{}
	if err := k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: target.Annotations[cdiv1.AnnPVCPrimeName]}, prime); err != nil {
		t.Fatal(err)
	}
	// What the external-provisioner records when the storage backend refuses.
	const msg = `failed to provision volume with StorageClass "` + "x" + `": rpc error: code = ResourceExhausted desc = out of space`
	now := metav1.Now()
	event := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Name: prime.Name + ".provisioning", Namespace: ns},
		InvolvedObject: corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: ns, Name: prime.Name, UID: prime.UID},
		Type:           corev1.EventTypeWarning, Reason: "ProvisioningFailed", Message: msg,
		Source:         corev1.EventSource{Component: "hostpath.csi.kubefill.test_external-provisioner"},
		FirstTimestamp: now, LastTimestamp: now, Count: 1,
	}
	if err := k8sClient.Create(ctx, event); err != nil {
		t.Fatal(err)
	}
	copies := func() []corev1.Event {
		list := &corev1.EventList{}
		if err := k8sClient.List(ctx, list, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		var out []corev1.Event
		for _, e := range list.Items {
			if e.InvolvedObject.UID == target.UID && e.Reason == "ProvisioningFailed" {
				out = append(out, e)
			}
		}
		return out
	}
	kit.Await(t, 30*time.Second, 200*time.Millisecond, "the prime's ProvisioningFailed event to reach the claim",
		func() ([]corev1.Event, error) { return copies(), nil },
		func(c []corev1.Event) bool { return len(c) > 0 },
		func([]corev1.Event) string {
			list := &corev1.EventList{}
			_ = k8sClient.List(ctx, list, client.InNamespace(ns))
			var b strings.Builder
			for _, e := range list.Items {
				fmt.Fprintf(&b, "event on %s %s: %s %s %q\n", e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Type, e.Reason, e.Message)
			}
			return b.String()
		})
	got := copies()[0]
	if got.Type != corev1.EventTypeWarning || !strings.Contains(got.Message, prime.Name) || !strings.Contains(got.Message, "out of space") {
		t.Errorf("copied event: %s %s %q", got.Type, got.Reason, got.Message)
	}
	// A pending worker's warnings come too; its normal events do not.
	pod := &corev1.Pod{}
	kit.Until(t, 30*time.Second, "the importer pod", func() bool {
		pods := &corev1.PodList{}
		if err := k8sClient.List(ctx, pods, client.InNamespace(ns), client.MatchingLabels{cdiv1.LabelOwnedByUID: string(target.UID)}); err != nil || len(pods.Items) == 0 {
			return false
		}
		*pod = pods.Items[0]
		return true
	})
	for _, e := range []struct{ typ, reason, msg string }{
		{corev1.EventTypeWarning, "FailedScheduling", "0/3 nodes are available: 3 Insufficient memory"},
		{corev1.EventTypeNormal, "Scheduled", "Successfully assigned somewhere"},
	} {
		podEvent := &corev1.Event{
			ObjectMeta:     metav1.ObjectMeta{Name: pod.Name + "." + strings.ToLower(e.reason), Namespace: ns},
			InvolvedObject: corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: ns, Name: pod.Name, UID: pod.UID},
			Type:           e.typ, Reason: e.reason, Message: e.msg,
			Source:         corev1.EventSource{Component: "default-scheduler"},
			FirstTimestamp: now, LastTimestamp: now, Count: 1,
		}
		if err := k8sClient.Create(ctx, podEvent); err != nil {
			t.Fatal(err)
		}
	}
	onClaim := func(reason string) []corev1.Event {
		list := &corev1.EventList{}
		if err := k8sClient.List(ctx, list, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		var out []corev1.Event
		for _, e := range list.Items {
			if e.InvolvedObject.UID == target.UID && e.Reason == reason {
				out = append(out, e)
			}
		}
		return out
	}
	kit.Until(t, 30*time.Second, "the importer pod's FailedScheduling on the claim", func() bool { return len(onClaim("FailedScheduling")) > 0 })
	if m := onClaim("FailedScheduling")[0].Message; !strings.Contains(m, "pod "+pod.Name+": 0/3 nodes are available") {
		t.Errorf("copied pod warning: %q", m)
	}

	// More reconciles (the importer pod is polled) copy nothing twice.
	time.Sleep(5 * time.Second)
	if n := len(copies()); n != 1 {
		t.Errorf("the event was copied %d times", n)
	}
	for _, e := range copies() {
		if e.Count > 1 || (e.Series != nil && e.Series.Count > 1) {
			t.Errorf("the copied event repeats: count %d, series %+v", e.Count, e.Series)
		}
	}
	if n := len(onClaim("FailedScheduling")); n != 1 {
		t.Errorf("the pod's warning was copied %d times", n)
	}
	if n := len(onClaim("Scheduled")); n != 0 {
		t.Errorf("a pod's normal event was copied %d times", n)
	}
	t.Logf("claim events: %s %s %q; %q", got.Type, got.Reason, got.Message, onClaim("FailedScheduling")[0].Message)
}
