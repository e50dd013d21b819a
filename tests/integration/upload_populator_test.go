package integration

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/controller"
	"github.com/kubefill/kubefill/pkg/populators"
	"github.com/kubefill/kubefill/tests/kit"
)

func parseCert(t *testing.T, b []byte) *x509.Certificate {
	t.Helper()
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatalf("not PEM: %q", b)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func verifyChain(t *testing.T, what string, leaf, caPEM []byte, usage x509.ExtKeyUsage, dns string) {
	t.Helper()
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		t.Fatalf("%s: CA is not PEM", what)
	}
	if _, err := parseCert(t, leaf).Verify(x509.VerifyOptions{Roots: pool, DNSName: dns, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
		t.Errorf("%s does not verify: %v", what, err)
	}
}

// TestUploadPopulator follows a claim whose dataSourceRef names a
// VolumeUploadSource: prime, TLS material, Service and upload pod, and the
// pod's readiness mirrored on the claim for virtctl and the proxy.
func TestUploadPopulator(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	installNS := newNamespace(t)
	className := ns + "-csi"
	csiClass(t, className, "hostpath.csi.kubefill.test", storagev1.VolumeBindingImmediate, rwoFilesystem)
	startUploadManager(t, installNS)

	src := &cdiv1.VolumeUploadSource{ObjectMeta: metav1.ObjectMeta{Name: "up", Namespace: ns}, Spec: cdiv1.VolumeUploadSourceSpec{ContentType: cdiv1.DataVolumeArchive}}
	if err := k8sClient.Create(ctx, src); err != nil {
		t.Fatal(err)
	}
	target := kit.PVC(ns, "target", "1Gi", kit.Class(className), kit.SourceRef(cdiv1.VolumeUploadSourceRef, "up"))
	if err := k8sClient.Create(ctx, target); err != nil {
		t.Fatal(err)
	}
	prime := &corev1.PersistentVolumeClaim{}
	kit.Until(t, 20*time.Second, "the PVC-prime", func() bool {
		return k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: populators.PrimeName(target)}, prime) == nil
	})
	if _, ok := prime.Annotations[cdiv1.AnnUploadRequest]; !ok || prime.Annotations[cdiv1.AnnContentType] != "archive" {
		t.Errorf("prime annotations %v: want %s and contentType archive", prime.Annotations, cdiv1.AnnUploadRequest)
	}
	name := populators.UploadPodName(prime)
	pod := &corev1.Pod{}
	kit.Until(t, 20*time.Second, "the upload pod", func() bool {
		return k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, pod) == nil
	})
	c := pod.Spec.Containers[0]
	args := strings.Join(c.Args, " ")
	if strings.Join(c.Command, " ") != "kubefill uploadserver" || c.Image != "kubefill/kubefill:test" ||
		!strings.Contains(args, "--content-type archive") || !strings.Contains(args, "--client-name "+populators.UploadProxyClientName) ||
		!strings.Contains(args, "--owner-uid "+string(target.UID)) {
		t.Errorf("upload container: %v %v %s", c.Command, c.Args, c.Image)
	}
	if p := c.ReadinessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/healthz" || p.HTTPGet.Scheme != corev1.URISchemeHTTPS || p.HTTPGet.Port.IntValue() != 8443 {
		t.Errorf("readiness probe %+v, want HTTPS GET /healthz on 8443", c.ReadinessProbe)
	}
	mounts := map[string]string{}
	for _, m := range c.VolumeMounts {
		mounts[m.MountPath] = m.Name
	}
	vols := map[string]corev1.Volume{}
	for _, v := range pod.Spec.Volumes {
		vols[v.Name] = v
	}
	if v := vols[mounts["/data"]]; v.PersistentVolumeClaim == nil || v.PersistentVolumeClaim.ClaimName != prime.Name {
		t.Errorf("the prime is not mounted at /data: %+v", pod.Spec.Volumes)
	}
	// Every upload has a scratch claim, as in CDI: its format is known only
	// once its bytes arrive.
	scratchName := cdiv1.ScratchClaimName(prime.Name)
	if v := vols[mounts["/scratch"]]; v.PersistentVolumeClaim == nil || v.PersistentVolumeClaim.ClaimName != scratchName {
		t.Errorf("no scratch claim %s at /scratch: %+v", scratchName, pod.Spec.Volumes)
	}
	scratch := &corev1.PersistentVolumeClaim{}
	if err := k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: scratchName}, scratch); err != nil || !metav1.IsControlledBy(scratch, target) {
		t.Errorf("scratch claim %s: %v, owners %+v; want one owned by the target", scratchName, err, scratch.OwnerReferences)
	}
	if !metav1.IsControlledBy(pod, target) {
		t.Errorf("upload pod owners %+v, want the target", pod.OwnerReferences)
	}

	svc := &corev1.Service{}
	if err := k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, svc); err != nil {
		t.Fatalf("upload Service: %v", err)
	}
	if !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(pod.Labels)) || len(svc.Spec.Selector) == 0 ||
		svc.Spec.Ports[0].Port != 443 || svc.Spec.Ports[0].TargetPort.IntValue() != 8443 {
		t.Errorf("Service %s: selector %v ports %+v, pod labels %v", name, svc.Spec.Selector, svc.Spec.Ports, pod.Labels)
	}

	// TLS: the pod's serving certificate chains to the upload-server CA for
	// the Service's name; the proxy's client certificate to the client CA
	// the pod trusts.
	serving, serverCA, clientCA, proxy := &corev1.Secret{}, &corev1.Secret{}, &corev1.Secret{}, &corev1.Secret{}
	for key, s := range map[types.NamespacedName]*corev1.Secret{
		{Namespace: ns, Name: name}:                                        serving,
		{Namespace: installNS, Name: populators.UploadServerCASecret}:      serverCA,
		{Namespace: installNS, Name: populators.UploadProxyClientCASecret}: clientCA,
		{Namespace: installNS, Name: populators.UploadProxyClientSecret}:   proxy,
	} {
		if err := k8sClient.Get(ctx, key, s); err != nil {
			t.Fatalf("Secret %s: %v", key, err)
		}
	}
	verifyChain(t, "the upload pod's serving certificate", serving.Data["tls.crt"], serverCA.Data["tls.crt"], x509.ExtKeyUsageServerAuth, cdiv1.UploadServiceHost(ns, prime.Name))
	verifyChain(t, "the proxy's client certificate", proxy.Data["tls.crt"], serving.Data["client-ca.crt"], x509.ExtKeyUsageClientAuth, "")
	if string(proxy.Data["ca.crt"]) != string(serverCA.Data["tls.crt"]) || string(serving.Data["client-ca.crt"]) != string(clientCA.Data["tls.crt"]) {
		t.Error("the proxy's ca.crt is not the upload-server CA, or the pod's client CA is not the proxy's")
	}
	if cn := parseCert(t, proxy.Data["tls.crt"]).Subject.CommonName; cn != populators.UploadProxyClientName {
		t.Errorf("proxy client certificate CN %q", cn)
	}
	if !slices.ContainsFunc(pod.Spec.Volumes, func(v corev1.Volume) bool { return v.Secret != nil && v.Secret.SecretName == name }) {
		t.Errorf("the upload pod does not mount its Secret %s", name)
	}

	kit.Until(t, 20*time.Second, "storage.pod.ready=false while the pod is not ready", func() bool {
		_ = k8sClient.Get(ctx, client2Key(target), target)
		return target.Annotations[cdiv1.AnnPodReady] == "false" && target.Annotations[cdiv1.AnnPVCPrimeName] == prime.Name
	})
	// The kubelet reports the pod ready: the claim says so.
	pod.Status.Phase = corev1.PodRunning
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()}}
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: c.Name, Ready: true, Image: c.Image, ImageID: "x",
		State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}}}}
	if err := k8sClient.Status().Update(ctx, pod); err != nil {
		t.Fatal(err)
	}
	kit.Until(t, 20*time.Second, "storage.pod.ready=true on the target and the prime", func() bool {
		_ = k8sClient.Get(ctx, client2Key(target), target)
		_ = k8sClient.Get(ctx, client2Key(prime), prime)
		return target.Annotations[cdiv1.AnnPodReady] == "true" && target.Annotations[cdiv1.AnnPodPhase] == "Running" &&
			prime.Annotations[cdiv1.AnnPodReady] == "true"
	})
	// Nothing serves this pod's /metrics (it has no IP here): the claim
	// shows no progress rather than a made-up one.
	if p, ok := target.Annotations[cdiv1.AnnPopulatorProgress]; ok {
		t.Errorf("progress %q on the claim though the upload server was never read", p)
	}

	// The upload server stops after an async upload it could not write: a
	// new upload pod replaces it, and the claim counts the restart.
	_ = k8sClient.Get(ctx, client2Key(pod), pod)
	oldUID := pod.UID
	pod.Status.Phase = corev1.PodFailed
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse, LastTransitionTime: metav1.Now()}}
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: c.Name, Image: c.Image, ImageID: "x",
		State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, Reason: "Error",
			Message: `{"outcome":"Failed","message":"the upload was received but could not be written: qcow2 backing file refused"}`}}}}
	if err := k8sClient.Status().Update(ctx, pod); err != nil {
		t.Fatal(err)
	}
	// The failed attempt's scratch claim goes; with no kube-controller-manager
	// here, the test lifts its pvc-protection finalizer, as that controller
	// does once no pod uses the claim. The next attempt gets a fresh one.
	oldScratch := scratch.UID
	kit.Until(t, 20*time.Second, "the failed attempt's scratch claim to be deleted", func() bool {
		old := &corev1.PersistentVolumeClaim{}
		if err := k8sClient.Get(ctx, client2Key(scratch), old); err != nil || old.UID != oldScratch {
			return true
		}
		if old.DeletionTimestamp == nil {
			return false
		}
		old.Finalizers = nil
		_ = k8sClient.Update(ctx, old)
		return false
	})
	kit.Until(t, 20*time.Second, "a restart counted on the claim and a new upload pod", func() bool {
		_ = k8sClient.Get(ctx, client2Key(target), target)
		fresh := &corev1.Pod{}
		return target.Annotations[cdiv1.AnnPodRestarts] == "1" &&
			k8sClient.Get(ctx, client2Key(pod), fresh) == nil && fresh.UID != oldUID && fresh.DeletionTimestamp == nil
	})
	if err := k8sClient.Get(ctx, client2Key(scratch), scratch); err != nil || scratch.UID == oldScratch {
		t.Errorf("the new upload pod's scratch claim: %v, same as the failed attempt's: %v", err, scratch.UID == oldScratch)
	}
	// The new server has received nothing: the upload starts over from 0.
	if p := target.Annotations[cdiv1.AnnPopulatorProgress]; p != "0.00%" {
		t.Errorf("progress %q on the claim after the upload server was replaced, want 0.00%%", p)
	}
	t.Logf("after the upload server stopped: restarts %s, running %q", target.Annotations[cdiv1.AnnPodRestarts], target.Annotations[cdiv1.AnnRunningConditionMessage])
}

// TestDataVolumeUpload: a DataVolume with source upload renders a claim on a
// VolumeUploadSource it owns, and goes UploadScheduled, then UploadReady
// once the upload pod is ready.
func TestDataVolumeUpload(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	installNS := newNamespace(t)
	className := ns + "-csi"
	csiClass(t, className, "hostpath.csi.kubefill.test", storagev1.VolumeBindingWaitForFirstConsumer, rwoFilesystem)
	startUploadManager(t, installNS)
	dv := kit.DataVolume(ns, "laptop-disk", kit.Upload(), kit.WithStorage(className, "1Gi"))
	if err := k8sClient.Create(ctx, dv); err != nil {
		t.Fatal(err)
	}
	pvc := &corev1.PersistentVolumeClaim{}
	kit.Until(t, 20*time.Second, "the DataVolume's claim", func() bool {
		return k8sClient.Get(ctx, client2Key(dv), pvc) == nil
	})
	_ = k8sClient.Get(ctx, client2Key(dv), dv)
	ref := pvc.Spec.DataSourceRef
	if ref == nil || ref.Kind != cdiv1.VolumeUploadSourceRef || ref.Name != controller.UploadSourceName(dv) || pvc.Annotations[cdiv1.AnnImmediateBinding] != "true" {
		t.Fatalf("claim dataSourceRef %+v annotations %v", ref, pvc.Annotations)
	}
	src := &cdiv1.VolumeUploadSource{}
	if err := k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: ref.Name}, src); err != nil || !metav1.IsControlledBy(src, dv) {
		t.Fatalf("VolumeUploadSource %s: %v owners %+v", ref.Name, err, src.OwnerReferences)
	}
	kit.Until(t, 20*time.Second, "phase UploadScheduled", func() bool {
		_ = k8sClient.Get(ctx, client2Key(dv), dv)
		return dv.Status.Phase == cdiv1.UploadScheduled
	})
	_ = k8sClient.Get(ctx, client2Key(pvc), pvc)
	pod := &corev1.Pod{}
	podKey := types.NamespacedName{Namespace: ns, Name: "cdi-upload-" + populators.PrimeName(pvc)}
	kit.Until(t, 20*time.Second, "the upload pod", func() bool { return k8sClient.Get(ctx, podKey, pod) == nil })
	pod.Status.Phase = corev1.PodRunning
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()}}
	if err := k8sClient.Status().Update(ctx, pod); err != nil {
		t.Fatal(err)
	}
	kit.Until(t, 20*time.Second, "phase UploadReady", func() bool {
		_ = k8sClient.Get(ctx, client2Key(dv), dv)
		return dv.Status.Phase == cdiv1.UploadReady
	})
	if dv.Annotations[cdiv1.AnnUsePopulator] != "true" {
		t.Errorf("DataVolume annotations %v: want %s=true", dv.Annotations, cdiv1.AnnUsePopulator)
	}
}

// startUploadManager runs a controller manager whose install namespace is
// installNS until the test ends.
func startUploadManager(t *testing.T, installNS string) {
	t.Helper()
	runManager(t, controller.ManagerOptions{MetricsBindAddress: "0", HealthProbeBindAddress: "0",
		WorkerImage: "kubefill/kubefill:test", InstallNamespace: installNS})
}

func client2Key(o metav1.Object) types.NamespacedName {
	return types.NamespacedName{Namespace: o.GetNamespace(), Name: o.GetName()}
}

// TestUploadWithoutInstallNamespace: a controller that does not know its
// install namespace says so on the claim instead of failing silently.
func TestUploadWithoutInstallNamespace(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	className := ns + "-csi"
	csiClass(t, className, "hostpath.csi.kubefill.test", storagev1.VolumeBindingImmediate, rwoFilesystem)
	t.Setenv("POD_NAMESPACE", "")
	startUploadManager(t, "")
	if err := k8sClient.Create(ctx, &cdiv1.VolumeUploadSource{ObjectMeta: metav1.ObjectMeta{Name: "up", Namespace: ns}}); err != nil {
		t.Fatal(err)
	}
	target := kit.PVC(ns, "target", "1Gi", kit.Class(className), kit.SourceRef(cdiv1.VolumeUploadSourceRef, "up"))
	if err := k8sClient.Create(ctx, target); err != nil {
		t.Fatal(err)
	}
	kit.Until(t, 20*time.Second, "the claim to explain the missing install namespace", func() bool {
		_ = k8sClient.Get(ctx, client2Key(target), target)
		return target.Annotations[cdiv1.AnnRunningConditionReason] == "UploadNotConfigured" &&
			strings.Contains(target.Annotations[cdiv1.AnnRunningConditionMessage], "POD_NAMESPACE")
	})
}
