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
	"sigs.k8s.io/controller-runtime/pkg/client"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/tests/kit"
)

// setQuota sets a ResourceQuota's hard requests.storage in its spec and,
// with no kube-controller-manager here to compute it, in its status, which
// is what kube-apiserver's ResourceQuota admission checks (and where it
// adds each claim it admits to the usage).
func setQuota(t *testing.T, ns, name, hard string, used *string) {
	t.Helper()
	ctx := context.Background()
	q := &corev1.ResourceQuota{}
	err := k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, q)
	if err != nil {
		q = &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{corev1.ResourceRequestsStorage: resource.MustParse(hard)}}}
		if err := k8sClient.Create(ctx, q); err != nil {
			t.Fatal(err)
		}
	} else {
		q.Spec.Hard = corev1.ResourceList{corev1.ResourceRequestsStorage: resource.MustParse(hard)}
		if err := k8sClient.Update(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	q.Status.Hard = corev1.ResourceList{corev1.ResourceRequestsStorage: resource.MustParse(hard)}
	if used != nil {
		q.Status.Used = corev1.ResourceList{corev1.ResourceRequestsStorage: resource.MustParse(*used)}
	}
	if err := k8sClient.Status().Update(ctx, q); err != nil {
		t.Fatal(err)
	}
}

// A ResourceQuota that has room for the user's claim but not for its
// PVC-prime: the claim and the DataVolume say which quota and by how much
// (CDI's ErrExceededQuota), nothing else is created, and once the quota is
// raised the import goes on by itself.
func TestQuotaRefusingThePrime(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := newNamespace(t)
	className := ns + "-csi"
	csiClass(t, className, "hostpath.csi.kubefill.test", storagev1.VolumeBindingImmediate)
	zero := "0"
	setQuota(t, ns, "storage", "3Gi", &zero)
	startControllers(t, ns)
	dv := kit.DataVolume(ns, "disk", kit.HTTP("http://images.test/disk.qcow2"), kit.WithPVC(kit.ClaimSpec("2Gi", kit.Class(className))))
	if err := k8sClient.Create(ctx, dv); err != nil {
		t.Fatal(err)
	}
	claims := func() []string {
		list := &corev1.PersistentVolumeClaimList{}
		if err := k8sClient.List(ctx, list, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, c := range list.Items {
			out = append(out, c.Name)
		}
		return out
	}
	quotaEvent := func() *corev1.Event {
		list := &corev1.EventList{}
		if err := k8sClient.List(ctx, list, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		for i, e := range list.Items {
			if e.InvolvedObject.Kind == "PersistentVolumeClaim" && e.InvolvedObject.Name == "disk" && e.Reason == "ErrExceededQuota" {
				return &list.Items[i]
			}
		}
		return nil
	}
	ev := kit.Await(t, 60*time.Second, 200*time.Millisecond, "an ErrExceededQuota event on the claim",
		func() (*corev1.Event, error) { return quotaEvent(), nil },
		func(e *corev1.Event) bool { return e != nil },
		func(*corev1.Event) string {
			list := &corev1.EventList{}
			_ = k8sClient.List(ctx, list, client.InNamespace(ns))
			var b strings.Builder
			for _, e := range list.Items {
				fmt.Fprintf(&b, "event on %s %s: %s %s %q\n", e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Type, e.Reason, e.Message)
			}
			return b.String() + fmt.Sprintf("claims: %v", claims())
		})
	for _, want := range []string{"exceeded quota: storage", "ResourceQuota storage in namespace " + ns, "requested requests.storage=2Gi", "used requests.storage=2Gi", "limited requests.storage=3Gi", "Nothing was created"} {
		if !strings.Contains(ev.Message, want) {
			t.Errorf("event message %q lacks %q", ev.Message, want)
		}
	}
	if ev.Type != corev1.EventTypeWarning {
		t.Errorf("event type %s", ev.Type)
	}
	// The DataVolume says so too, in CDI's reason.
	got := kit.Await(t, 30*time.Second, 200*time.Millisecond, "the DataVolume's Running condition to name the quota",
		func() (*cdiv1.DataVolume, error) {
			d := &cdiv1.DataVolume{}
			return d, k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: "disk"}, d)
		},
		func(d *cdiv1.DataVolume) bool {
			c := kit.DataVolumeCondition(d, cdiv1.DataVolumeRunning)
			return c.Reason == "ErrExceededQuota" && strings.Contains(c.Message, "exceeded quota: storage")
		},
		func(d *cdiv1.DataVolume) string {
			return fmt.Sprintf("phase %s, conditions %+v", d.Status.Phase, d.Status.Conditions)
		})
	// KubeVirt's VM controller reads the refusal in Bound, as CDI puts it.
	if b := kit.DataVolumeCondition(got, cdiv1.DataVolumeBound); b.Reason != "ErrExceededQuota" || !strings.Contains(b.Message, "exceeded quota: storage") {
		t.Errorf("Bound condition %+v", b)
	}
	if got.Status.Phase == cdiv1.Succeeded || got.Status.Phase == cdiv1.Failed {
		t.Errorf("phase %s while the quota refuses the prime", got.Status.Phase)
	}
	// No storage beyond what the user asked for: the claim alone, and no
	// worker pod.
	if c := claims(); len(c) != 1 || c[0] != "disk" {
		t.Fatalf("claims in the namespace: %v, want only the user's", c)
	}
	pods := &corev1.PodList{}
	if err := k8sClient.List(ctx, pods, client.InNamespace(ns)); err != nil || len(pods.Items) != 0 {
		t.Fatalf("pods while the prime is refused: %d (%v)", len(pods.Items), err)
	}

	// Raised, the quota admits the prime: the import goes on by itself.
	start := time.Now()
	setQuota(t, ns, "storage", "5Gi", nil)
	target := claimNamingPrime(t, ns, "disk")
	prime := &corev1.PersistentVolumeClaim{}
	if err := k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: target.Annotations[cdiv1.AnnPVCPrimeName]}, prime); err != nil {
		t.Fatal(err)
	}
	if q := prime.Spec.Resources.Requests[corev1.ResourceStorage]; q.Cmp(resource.MustParse("2Gi")) != 0 {
		t.Errorf("prime requests %s", q.String())
	}
	kit.Await(t, 30*time.Second, 200*time.Millisecond, "the DataVolume to leave ErrExceededQuota",
		func() (*cdiv1.DataVolume, error) {
			d := &cdiv1.DataVolume{}
			return d, k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: "disk"}, d)
		},
		func(d *cdiv1.DataVolume) bool {
			return kit.DataVolumeCondition(d, cdiv1.DataVolumeRunning).Reason != "ErrExceededQuota"
		},
		func(d *cdiv1.DataVolume) string { return fmt.Sprintf("conditions %+v", d.Status.Conditions) })
	t.Logf("refused: %q; prime %s made %s after the quota was raised", ev.Message, prime.Name, time.Since(start).Round(100*time.Millisecond))
}

// A quota without room for the user's claim itself: the DataVolume says
// which quota (CDI's ErrExceededQuota, in Bound and Running), and creates
// the claim once the quota is raised.
func TestQuotaRefusingTheClaim(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := newNamespace(t)
	className := ns + "-csi"
	csiClass(t, className, "hostpath.csi.kubefill.test", storagev1.VolumeBindingImmediate)
	zero := "0"
	setQuota(t, ns, "small", "1Gi", &zero)
	startControllers(t, ns)
	dv := kit.DataVolume(ns, "disk", kit.HTTP("http://images.test/disk.qcow2"), kit.WithPVC(kit.ClaimSpec("2Gi", kit.Class(className))))
	if err := k8sClient.Create(ctx, dv); err != nil {
		t.Fatal(err)
	}
	get := func() (*cdiv1.DataVolume, error) {
		d := &cdiv1.DataVolume{}
		return d, k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: "disk"}, d)
	}
	describe := func(d *cdiv1.DataVolume) string {
		return fmt.Sprintf("phase %s, conditions %+v", d.Status.Phase, d.Status.Conditions)
	}
	got := kit.Await(t, 60*time.Second, 200*time.Millisecond, "the DataVolume to name the quota", get,
		func(d *cdiv1.DataVolume) bool {
			b := kit.DataVolumeCondition(d, cdiv1.DataVolumeBound)
			return b.Reason == "ErrExceededQuota" && strings.Contains(b.Message, "exceeded quota: small")
		}, describe)
	if r := kit.DataVolumeCondition(got, cdiv1.DataVolumeRunning); r.Reason != "ErrExceededQuota" || got.Status.Phase != cdiv1.Pending {
		t.Errorf("running %+v, phase %s", r, got.Status.Phase)
	}
	list := &corev1.EventList{}
	if err := k8sClient.List(ctx, list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, e := range list.Items {
		found = found || (e.InvolvedObject.Kind == "DataVolume" && e.Reason == "ErrExceededQuota" && strings.Contains(e.Message, "requests.storage=2Gi"))
	}
	if !found {
		t.Error("no ErrExceededQuota event on the DataVolume")
	}
	setQuota(t, ns, "small", "10Gi", nil)
	claimNamingPrime(t, ns, "disk")
	kit.Await(t, 30*time.Second, 200*time.Millisecond, "the DataVolume to leave ErrExceededQuota", get,
		func(d *cdiv1.DataVolume) bool {
			return kit.DataVolumeCondition(d, cdiv1.DataVolumeBound).Reason != "ErrExceededQuota"
		}, describe)
}
