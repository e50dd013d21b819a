package integration

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/contract"
	"github.com/kubefill/kubefill/pkg/controller"
	"github.com/kubefill/kubefill/tests/kit"
)

// crossNamespaceGates are the kube-apiserver feature gates a cross-namespace
// dataSourceRef needs, among those this kube-apiserver still knows:
// AnyVolumeDataSource went GA and was removed (1.37 refuses it as unknown),
// so it is on by itself there.
func crossNamespaceGates(t *testing.T, assets string) string {
	t.Helper()
	out, _ := exec.Command(filepath.Join(assets, "kube-apiserver"), "--help").CombinedOutput()
	if !strings.Contains(string(out), "CrossNamespaceVolumeDataSource=") {
		t.Fatalf("kube-apiserver in %s lists no CrossNamespaceVolumeDataSource feature gate (--help: %d bytes): this test needs revisiting", assets, len(out))
	}
	gates := []string{"CrossNamespaceVolumeDataSource=true"}
	if strings.Contains(string(out), "AnyVolumeDataSource=") {
		gates = append(gates, "AnyVolumeDataSource=true")
	}
	return strings.Join(gates, ",")
}

// referenceGrant is a gateway.networking.k8s.io/v1beta1 ReferenceGrant in ns
// allowing PersistentVolumeClaims of fromNS to use the cdi.kubevirt.io kind
// named toName (every one of the kind when toName is empty).
func referenceGrant(ns, name, fromNS, kind, toName string) *unstructured.Unstructured {
	to := map[string]any{"group": cdiv1.GroupName, "kind": kind}
	if toName != "" {
		to["name"] = toName
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "gateway.networking.k8s.io/v1beta1",
		"kind":       "ReferenceGrant",
		"metadata":   map[string]any{"namespace": ns, "name": name},
		"spec": map[string]any{
			"from": []any{map[string]any{"group": "", "kind": "PersistentVolumeClaim", "namespace": fromNS}},
			"to":   []any{to},
		},
	}}
}

// TestCrossNamespaceImportNeedsReferenceGrant: on a control plane with the
// CrossNamespaceVolumeDataSource gate on and the ReferenceGrant CRD
// installed, a claim in namespace A whose dataSourceRef names a
// VolumeImportSource in namespace B is refused, with an event and the
// running condition naming the missing grant, and nothing is made in either
// namespace; grants that do not match (another source's name, or a grant in
// the claim's own namespace) change nothing. Once a ReferenceGrant in B
// allows claims of A to use the source, the import runs with B's endpoint
// and the claim is filled. The controller runs as the kubefill-controller
// ServiceAccount of manifests/install, so its RBAC must let it list the
// grants.
func TestCrossNamespaceImportNeedsReferenceGrant(t *testing.T) {
	ctx := context.Background()
	// The ReferenceGrant CRD and the cross-namespace data source gate.
	useHardenedControlPlane(t)
	if err := doApplyInstall(); err != nil {
		t.Fatal(err)
	}

	nsA, nsB := newNamespace(t), newNamespace(t)
	className := nsA + "-csi"
	csiClass(t, className, "hostpath.csi.kubefill.test", storagev1.VolumeBindingImmediate)
	url := "http://images.test/" + nsB + "/private.qcow2"
	src := &cdiv1.VolumeImportSource{
		ObjectMeta: metav1.ObjectMeta{Namespace: nsB, Name: "src"},
		Spec:       cdiv1.VolumeImportSourceSpec{Source: &cdiv1.ImportSourceType{HTTP: &cdiv1.DataVolumeSourceHTTP{URL: url}}},
	}
	if err := k8sClient.Create(ctx, src); err != nil {
		t.Fatal(err)
	}
	// Near misses: B allows another source's name; A (the claim's own
	// namespace) allows everything, but grants count only in the source's.
	for _, g := range []*unstructured.Unstructured{
		referenceGrant(nsB, "other-source", nsA, cdiv1.VolumeImportSourceRef, "other"),
		referenceGrant(nsA, "wrong-namespace", nsA, cdiv1.VolumeImportSourceRef, ""),
	} {
		if err := k8sClient.Create(ctx, g); err != nil {
			t.Fatalf("creating ReferenceGrant %s/%s: %v", g.GetNamespace(), g.GetName(), err)
		}
	}

	rec := &forbiddenLog{namespaces: []string{nsA, nsB, installNamespace}}
	mgr, err := controller.NewManager(impersonating(controllerSA, rec), controller.ManagerOptions{
		MetricsBindAddress: "0", HealthProbeBindAddress: "0", WorkerImage: "kubefill/kubefill:test", SkipNameValidation: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	startUntilCleanup(t, mgr)
	t.Cleanup(func() { assertNoForbidden(t, "the controller's ServiceAccount", rec) })

	target := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: nsA, Name: "x"},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: &className,
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
			DataSourceRef: &corev1.TypedObjectReference{
				APIGroup: ptr.To(cdiv1.GroupName), Kind: cdiv1.VolumeImportSourceRef, Name: "src", Namespace: ptr.To(nsB),
			},
		},
	}
	if err := k8sClient.Create(ctx, target); err != nil {
		t.Fatal(err)
	}
	if ref := target.Spec.DataSourceRef; ref == nil || ptr.Deref(ref.Namespace, "") != nsB {
		t.Fatalf("kube-apiserver dropped the dataSourceRef's namespace (is CrossNamespaceVolumeDataSource on?): %+v", ref)
	}
	primeName := cdiv1.PrimeName(string(target.UID))
	podName := cdiv1.ImporterPodName(primeName)

	// Refused: the running condition and an event name the missing grant.
	kit.Until(t, 30*time.Second, "the claim's running condition to refuse the cross-namespace source", func() bool {
		_ = k8sClient.Get(ctx, client.ObjectKeyFromObject(target), target)
		return strings.Contains(target.Annotations[cdiv1.AnnRunningConditionMessage], "ReferenceGrant")
	})
	reason, msg := target.Annotations[cdiv1.AnnRunningConditionReason], target.Annotations[cdiv1.AnnRunningConditionMessage]
	t.Logf("refused: reason %q, message %q", reason, msg)
	if target.Annotations[cdiv1.AnnRunningCondition] != "false" || reason == "" {
		t.Errorf("running condition %q, reason %q: want false with a reason", target.Annotations[cdiv1.AnnRunningCondition], reason)
	}
	for _, want := range []string{
		"PersistentVolumeClaim " + nsA + "/x may not use VolumeImportSource " + nsB + "/src",
		"no ReferenceGrant in namespace " + nsB + " allows PersistentVolumeClaims from namespace " + nsA,
		"gateway.networking.k8s.io",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("running condition message %q lacks %q", msg, want)
		}
	}
	var refusal *corev1.Event
	kit.Until(t, 20*time.Second, "a Warning event on the claim naming the missing ReferenceGrant", func() bool {
		list := &corev1.EventList{}
		if err := k8sClient.List(ctx, list, client.InNamespace(nsA)); err != nil {
			t.Fatal(err)
		}
		for i, e := range list.Items {
			if e.InvolvedObject.UID == target.UID && e.Type == corev1.EventTypeWarning && strings.Contains(e.Message, "ReferenceGrant") {
				refusal = &list.Items[i]
				return true
			}
		}
		return false
	})
	t.Logf("event: %s %s %q", refusal.Type, refusal.Reason, refusal.Message)
	if refusal.Reason != reason || !strings.Contains(refusal.Message, nsB+"/src") {
		t.Errorf("event %s %q: want reason %q (the running condition's) and a message naming %s/src", refusal.Reason, refusal.Message, reason, nsB)
	}

	// Nothing is made, in either namespace, and nothing of B's source shows.
	nothingMade := func(what string) {
		t.Helper()
		for _, ns := range []string{nsA, nsB} {
			if err := k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: primeName}, &corev1.PersistentVolumeClaim{}); !apierrors.IsNotFound(err) {
				t.Fatalf("%s: prime %s/%s exists (err %v)", what, ns, primeName, err)
			}
			pods := &corev1.PodList{}
			if err := k8sClient.List(ctx, pods, client.InNamespace(ns)); err != nil {
				t.Fatal(err)
			}
			if len(pods.Items) > 0 {
				t.Fatalf("%s: pod %s/%s exists", what, ns, pods.Items[0].Name)
			}
		}
		_ = k8sClient.Get(ctx, client.ObjectKeyFromObject(target), target)
		for k, v := range target.Annotations {
			if k == cdiv1.AnnPVCPrimeName || strings.Contains(v, url) {
				t.Fatalf("%s: the claim carries %s=%q", what, k, v)
			}
		}
	}
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		nothingMade("refused")
	}
	list := &corev1.EventList{}
	if err := k8sClient.List(ctx, list, client.InNamespace(nsA)); err != nil {
		t.Fatal(err)
	}
	for _, e := range list.Items {
		if e.InvolvedObject.UID == target.UID && (e.Reason == "PrimeCreated" || strings.Contains(e.Message, url)) {
			t.Errorf("refused claim has event %s %q", e.Reason, e.Message)
		}
	}

	// Allowed: a grant in B for claims of A and this source. Nothing touches
	// the claim: the populator must come back to it by itself.
	if err := k8sClient.Create(ctx, referenceGrant(nsB, "allow-"+nsA, nsA, cdiv1.VolumeImportSourceRef, "src")); err != nil {
		t.Fatal(err)
	}
	prime := &corev1.PersistentVolumeClaim{}
	kit.Until(t, 90*time.Second, "the prime, once a ReferenceGrant allows the claim", func() bool {
		return k8sClient.Get(ctx, types.NamespacedName{Namespace: nsA, Name: primeName}, prime) == nil
	})
	if got := prime.Annotations[cdiv1.AnnEndpoint]; got != url {
		t.Errorf("prime endpoint %q, want the source's %q", got, url)
	}
	pod := &corev1.Pod{}
	kit.Until(t, 30*time.Second, "the importer pod", func() bool {
		return k8sClient.Get(ctx, types.NamespacedName{Namespace: nsA, Name: podName}, pod) == nil
	})
	c := pod.Spec.Containers[0]
	if envValue(c, contract.EnvSource) != "http" || envValue(c, contract.EnvEndpoint) != url {
		t.Errorf("importer env %s=%q %s=%q, want http and %q", contract.EnvSource, envValue(c, contract.EnvSource), contract.EnvEndpoint, envValue(c, contract.EnvEndpoint), url)
	}
	pods := &corev1.PodList{}
	if err := k8sClient.List(ctx, pods, client.InNamespace(nsB)); err != nil || len(pods.Items) > 0 {
		t.Errorf("pods in the source's namespace: %d (err %v)", len(pods.Items), err)
	}

	// Filled: the fake provisioner and kubelet finish, the volume moves to
	// the claim.
	completeFill(t, target, podName)
	_ = k8sClient.Get(ctx, client.ObjectKeyFromObject(target), target)
	if r := target.Annotations[cdiv1.AnnRunningConditionReason]; r == reason {
		t.Errorf("the filled claim still carries the refusal's reason %q", r)
	}
	reasons := eventReasons(t, nsA, target.UID)
	for _, want := range []string{"PrimeCreated", "Populated"} {
		if !reasons[want] {
			t.Errorf("no %s event on the claim (events: %v)", want, reasons)
		}
	}
}
