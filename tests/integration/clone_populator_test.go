package integration

import (
	"context"
	"crypto/x509"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/certs"
	"github.com/kubefill/kubefill/pkg/clone"
	"github.com/kubefill/kubefill/pkg/controller"
	"github.com/kubefill/kubefill/pkg/populators"
	"github.com/kubefill/kubefill/pkg/token"
	"github.com/kubefill/kubefill/tests/kit"
)

const cloneDriver = "hostpath.csi.kubefill.test"

// cloneClass is a CSI class whose StorageProfile asks for snapshot clones
// (spec.cloneStrategy), with no VolumeSnapshotClass for its driver: a clone
// must fall back to a host-assisted copy and say why.
func cloneClass(t *testing.T, name string) {
	t.Helper()
	mode := storagev1.VolumeBindingImmediate
	sc := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Provisioner: cloneDriver, VolumeBindingMode: &mode}
	mustCreate(t, k8sClient, sc)
	t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), sc) })
	putProfileSpec(t, name, cdiv1.StorageProfileSpec{
		ClaimPropertySets: []cdiv1.ClaimPropertySet{rwoFilesystem}, CloneStrategy: ptr.To(cdiv1.CloneStrategySnapshot)})
}

// fakeBind plays the provisioner and the PV controller: pvc gets a CSI
// volume of its request and is Bound to it.
func fakeBind(t *testing.T, pvc *corev1.PersistentVolumeClaim) *corev1.PersistentVolume {
	t.Helper()
	return fakeBindOn(t, k8sClient, pvc)
}

// fakeBindOn is fakeBind through c (a test's own control plane).
func fakeBindOn(t *testing.T, c client.Client, pvc *corev1.PersistentVolumeClaim) *corev1.PersistentVolume {
	t.Helper()
	ctx := context.Background()
	if err := c.Get(ctx, client.ObjectKeyFromObject(pvc), pvc); err != nil {
		t.Fatal(err)
	}
	size := pvc.Spec.Resources.Requests[corev1.ResourceStorage]
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "pv-" + string(pvc.UID)},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: size},
			AccessModes:                   pvc.Spec.AccessModes,
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
			StorageClassName:              ptr.Deref(pvc.Spec.StorageClassName, ""),
			PersistentVolumeSource:        corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: cloneDriver, VolumeHandle: string(pvc.UID)}},
			ClaimRef:                      &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: pvc.Namespace, Name: pvc.Name, UID: pvc.UID},
		},
	}
	mustCreate(t, c, pv)
	if c == k8sClient {
		t.Cleanup(func() { deletePV(t, pv.Name) })
	}
	pvc.Spec.VolumeName = pv.Name
	if err := c.Update(ctx, pvc); err != nil {
		t.Fatalf("binding %s: %v", pvc.Name, err)
	}
	pvc.Status.Phase = corev1.ClaimBound
	pvc.Status.Capacity = corev1.ResourceList{corev1.ResourceStorage: size}
	pvc.Status.AccessModes = pvc.Spec.AccessModes
	if err := c.Status().Update(ctx, pvc); err != nil {
		t.Fatalf("binding %s: %v", pvc.Name, err)
	}
	return pv
}

// setPodStatus plays the kubelet for a worker pod.
func setPodStatus(t *testing.T, ns, name string, phase corev1.PodPhase, ready bool) *corev1.Pod {
	t.Helper()
	return setPodStatusOn(t, k8sClient, ns, name, phase, ready)
}

// setPodStatusOn is setPodStatus through c (a test's own control plane).
func setPodStatusOn(t *testing.T, c client.Client, ns, name string, phase corev1.PodPhase, ready bool) *corev1.Pod {
	t.Helper()
	pod := &corev1.Pod{}
	kit.Until(t, 30*time.Second, "pod "+ns+"/"+name, func() bool {
		return c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, pod) == nil
	})
	pod.Status.Phase = phase
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: status, LastTransitionTime: metav1.Now()}}
	if phase == corev1.PodRunning {
		// A running pod has an address (the clone source pod dials the upload pod's).
		pod.Status.PodIP = "10.244.9.7"
		pod.Status.PodIPs = []corev1.PodIP{{IP: pod.Status.PodIP}}
		pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: pod.Spec.Containers[0].Name, Ready: ready, Image: pod.Spec.Containers[0].Image, ImageID: "x",
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}}}}
	} else {
		pod.Status.ContainerStatuses = nil
	}
	if err := c.Status().Update(context.Background(), pod); err != nil {
		t.Fatalf("pod %s %s: %v", name, phase, err)
	}
	return pod
}

// cloneSourceClaim is a bound 1Gi source claim and a VolumeCloneSource
// naming it, both in ns.
func cloneSourceClaim(t *testing.T, ns, className string) *corev1.PersistentVolumeClaim {
	t.Helper()
	src := kit.PVC(ns, "golden", "1Gi", kit.Class(className))
	mustCreate(t, k8sClient, src)
	fakeBind(t, src)
	mustCreate(t, k8sClient, &cdiv1.VolumeCloneSource{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "vcs"},
		Spec: cdiv1.VolumeCloneSourceSpec{Source: corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: "golden"}}})
	return src
}

// TestCloneCopySameNamespace: a claim naming a VolumeCloneSource whose
// StorageProfile asks for snapshot clones, with no VolumeSnapshotClass,
// falls back to a host-assisted copy, pinned on the claim with the reason;
// the prime tmp-pvc-<uid> gets an upload server that accepts only this
// clone's client name, then a source pod reads the source read-only and
// streams to it. Once both are done the volume moves to the claim, the
// temporary objects go and so does the finalizer.
func TestCloneCopySameNamespace(t *testing.T) {
	ctx := context.Background()
	ns, installNS := newNamespace(t), newNamespace(t)
	className := ns + "-csi"
	cloneClass(t, className)
	startUploadManager(t, installNS)
	waitProfile(t, className, "asks for snapshot clones", strategyIs(cdiv1.CloneStrategySnapshot))
	src := cloneSourceClaim(t, ns, className)

	target := kit.PVC(ns, "disk", "1Gi", kit.Class(className), kit.SourceRef(cdiv1.VolumeCloneSourceRef, "vcs"))
	mustCreate(t, k8sClient, target)
	primeName := clone.TmpClaimName(target.UID)
	clientName := ns + "/golden-" + ns + "/" + primeName
	kit.Until(t, 30*time.Second, "the clone pinned to copy with its fallback reason", func() bool {
		_ = k8sClient.Get(ctx, client.ObjectKeyFromObject(target), target)
		return target.Annotations[cdiv1.AnnCloneType] == "copy" && target.Annotations[cdiv1.AnnClonePhase] == "HostClone"
	})
	if got := target.Annotations[cdiv1.AnnCloneFallbackReason]; got != cdiv1.FallbackMessageNoVolumeSnapshotClass {
		t.Errorf("fallback reason %q, want %q", got, cdiv1.FallbackMessageNoVolumeSnapshotClass)
	}
	if !controllerutil.ContainsFinalizer(target, cdiv1.FinalizerClonePopulator) {
		t.Errorf("target finalizers %v lack %s", target.Finalizers, cdiv1.FinalizerClonePopulator)
	}
	kit.Until(t, 20*time.Second, "a NoVolumeSnapshotClass Warning on the claim", func() bool {
		return eventReasons(t, ns, target.UID)[cdiv1.FallbackNoVolumeSnapshotClass]
	})

	// A StorageProfile edit mid-clone changes nothing: the strategy was chosen once.
	profile := &cdiv1.StorageProfile{}
	if err := k8sClient.Get(ctx, types.NamespacedName{Name: className}, profile); err != nil {
		t.Fatal(err)
	}
	profile.Spec.CloneStrategy = ptr.To(cdiv1.CloneStrategyCsiClone)
	if err := k8sClient.Update(ctx, profile); err != nil {
		t.Fatal(err)
	}
	waitProfile(t, className, "asks for CSI clones", strategyIs(cdiv1.CloneStrategyCsiClone))

	prime := &corev1.PersistentVolumeClaim{}
	kit.Until(t, 20*time.Second, "the prime "+primeName, func() bool {
		return k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: primeName}, prime) == nil
	})
	if got := prime.Annotations[cdiv1.AnnUploadClientName]; got != clientName {
		t.Errorf("prime %s = %q, want %q", cdiv1.AnnUploadClientName, got, clientName)
	}
	if prime.Labels[cdiv1.LabelOwnedByUID] != string(target.UID) {
		t.Errorf("prime labels %v", prime.Labels)
	}
	uploadName := cdiv1.UploadPodName(primeName)
	upload := setPodStatus(t, ns, uploadName, corev1.PodRunning, true)
	if args := strings.Join(upload.Spec.Containers[0].Args, " "); !strings.Contains(args, "--client-name "+clientName) {
		t.Errorf("upload server args %q lack --client-name %s", args, clientName)
	}

	sourcePod := &corev1.Pod{}
	kit.Until(t, 30*time.Second, "the clone source pod", func() bool {
		return k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: clone.SourcePodName(target.UID)}, sourcePod) == nil
	})
	c := sourcePod.Spec.Containers[0]
	if c.Name != "cdi-clone-source" || strings.Join(c.Command, " ") != "kubefill cloner" || c.Image != "kubefill/kubefill:test" {
		t.Errorf("source container %s %v %s", c.Name, c.Command, c.Image)
	}
	// The source pod dials the upload Service, which routes to the upload
	// pod as soon as it has an address, ready or not.
	svc := &corev1.Service{}
	if err := k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: uploadName}, svc); err != nil {
		t.Fatal(err)
	}
	if !svc.Spec.PublishNotReadyAddresses || svc.Spec.ClusterIP == "" {
		t.Errorf("upload Service %s: cluster IP %q, publishNotReadyAddresses %v; want an address, and true", uploadName, svc.Spec.ClusterIP, svc.Spec.PublishNotReadyAddresses)
	}
	for env, want := range map[string]string{
		"VOLUME_MODE": "filesystem", "MOUNT_POINT": "/var/run/cdi/clone/source", "OWNER_UID": string(target.UID),
		"UPLOAD_URL": "https://" + svc.Spec.ClusterIP + ":443/v1beta1/upload", "UPLOAD_SERVER_NAME": uploadName + "." + ns + ".svc", "PREALLOCATION": "false",
	} {
		if got := envValue(c, env); got != want {
			t.Errorf("source pod %s=%q, want %q", env, got, want)
		}
	}
	for _, e := range c.Env {
		if (e.Name == "CLIENT_CERT" || e.Name == "CLIENT_KEY" || e.Name == "SERVER_CA_CERT") &&
			(e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil || e.ValueFrom.SecretKeyRef.Name != sourcePod.Name) {
			t.Errorf("source pod env %s does not come from Secret %s: %+v", e.Name, sourcePod.Name, e)
		}
	}
	var dataVolume string
	for _, v := range sourcePod.Spec.Volumes {
		if v.PersistentVolumeClaim != nil {
			dataVolume = v.Name
			if v.PersistentVolumeClaim.ClaimName != src.Name || !v.PersistentVolumeClaim.ReadOnly {
				t.Errorf("source pod mounts claim %+v, want %s read-only", v.PersistentVolumeClaim, src.Name)
			}
		}
	}
	if len(c.VolumeMounts) != 2 || c.VolumeMounts[0].Name != dataVolume || c.VolumeMounts[0].MountPath != "/var/run/cdi/clone/source" || !c.VolumeMounts[0].ReadOnly ||
		c.VolumeMounts[1].MountPath != "/etc/kubefill/upload-address" || !c.VolumeMounts[1].ReadOnly {
		t.Errorf("source pod mounts %+v, want the source, read-only at /var/run/cdi/clone/source, and the upload address", c.VolumeMounts)
	}
	// The running upload pod's own address reaches the source pod (through
	// a downward API volume): the cloner need not wait for the Service proxy.
	if got := envValue(c, "UPLOAD_ADDRESS_FILE"); got != "/etc/kubefill/upload-address/address" {
		t.Errorf("source pod UPLOAD_ADDRESS_FILE=%q", got)
	}
	kit.Until(t, 30*time.Second, "the upload pod's address on the source pod", func() bool {
		_ = k8sClient.Get(ctx, client.ObjectKeyFromObject(sourcePod), sourcePod)
		return sourcePod.Annotations["kubefill.io/upload-address"] == upload.Status.PodIP+":8443"
	})
	secret, cloneCA, serving := &corev1.Secret{}, &corev1.Secret{}, &corev1.Secret{}
	if err := k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: sourcePod.Name}, secret); err != nil {
		t.Fatalf("client certificate Secret: %v", err)
	}
	if err := k8sClient.Get(ctx, types.NamespacedName{Namespace: installNS, Name: certs.CloneClientSigner}, cloneCA); err != nil {
		t.Fatal(err)
	}
	if err := k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: uploadName}, serving); err != nil {
		t.Fatal(err)
	}
	// The clone's source pod has a certificate of the clone signer, which
	// the clone's upload server trusts (and nothing else).
	verifyChain(t, "the source pod's client certificate", secret.Data["tls.crt"], cloneCA.Data["tls.crt"], x509.ExtKeyUsageClientAuth, "")
	verifyChain(t, "the source pod's client certificate", secret.Data["tls.crt"], serving.Data[populators.UploadClientCAKey], x509.ExtKeyUsageClientAuth, "")
	if cn := parseCert(t, secret.Data["tls.crt"]).Subject.CommonName; cn != clientName {
		t.Errorf("client certificate CN %q, want %q", cn, clientName)
	}
	_ = k8sClient.Get(ctx, client.ObjectKeyFromObject(target), target)
	if target.Annotations[cdiv1.AnnCloneType] != "copy" {
		t.Errorf("cloneType %q after the StorageProfile edit, want copy", target.Annotations[cdiv1.AnnCloneType])
	}

	// The copy ends: the source pod, then the upload server, succeed.
	pv := fakeBind(t, prime)
	setPodStatus(t, ns, sourcePod.Name, corev1.PodSucceeded, false)
	setPodStatus(t, ns, uploadName, corev1.PodSucceeded, false)
	bindTargetOnceRebound(t, pv, target, "the populator to point volume "+pv.Name+" at the claim")
	kit.Until(t, 30*time.Second, "the clone to finish: Succeeded, temporary objects and finalizer gone", func() bool {
		_ = k8sClient.Get(ctx, client.ObjectKeyFromObject(target), target)
		return target.Annotations[cdiv1.AnnClonePhase] == "Succeeded" && target.Annotations[cdiv1.AnnPopulatedFor] == target.Name &&
			!controllerutil.ContainsFinalizer(target, cdiv1.FinalizerClonePopulator) &&
			gone(ctx, &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: primeName}}) &&
			gone(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: sourcePod.Name}}) &&
			gone(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: uploadName}}) &&
			gone(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: sourcePod.Name}})
	})
	if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(src), src); err != nil || src.DeletionTimestamp != nil {
		t.Errorf("the source claim: %v (deleting %v)", err, src.DeletionTimestamp)
	}
}

// TestCloneCrossNamespaceToken: a claim in one namespace cloning from
// another (cdi.kubevirt.io/dataSourceNamespace) is refused without a clone
// token, with the DataVolume webhook's short token (valid or not: on a
// claim only the controller's extended token counts), with an extended
// token bound to another claim or issued for another target, and with an
// expired one, and nothing is made in the source's namespace; an extended
// token bound to the claim starts the clone there. Deleting the claim
// mid-clone removes the temporary objects in the source's namespace and
// then the finalizer.
func TestCloneCrossNamespaceToken(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	nsSrc, nsTgt, installNS := newNamespace(t), newNamespace(t), newNamespace(t)
	className := nsSrc + "-csi"
	cloneClass(t, className)
	keys, err := token.EnsureSigningKeySecret(ctx, k8sClient, installNS, token.DefaultSigningKeySecretName)
	if err != nil {
		t.Fatal(err)
	}
	// The controller's own key for extended tokens, which it would make at first use.
	extKeys, err := token.EnsureSigningKeySecret(ctx, k8sClient, installNS, controller.DefaultExtendedTokenKeySecret)
	if err != nil {
		t.Fatal(err)
	}
	sharedClusterControllers(t)
	runManager(t, controller.ManagerOptions{MetricsBindAddress: "0", HealthProbeBindAddress: "0",
		WorkerImage: "kubefill/kubefill:test", InstallNamespace: installNS,
		Namespaces: []string{nsSrc, nsTgt}})
	cloneSourceClaim(t, nsSrc, className)

	target := kit.PVC(nsTgt, "disk", "1Gi", kit.Class(className), kit.SourceRef(cdiv1.VolumeCloneSourceRef, "vcs"),
		kit.Annotate(map[string]string{cdiv1.AnnDataSourceNamespace: nsSrc}))
	mustCreate(t, k8sClient, target)
	primeKey := types.NamespacedName{Namespace: nsSrc, Name: clone.TmpClaimName(target.UID)}
	refused := func(want string) {
		t.Helper()
		kit.Until(t, 40*time.Second, "the clone refused: "+want, func() bool {
			_ = k8sClient.Get(ctx, client.ObjectKeyFromObject(target), target)
			return target.Annotations[cdiv1.AnnRunningConditionReason] == "SourceNotAuthorized" &&
				strings.Contains(target.Annotations[cdiv1.AnnRunningConditionMessage], want)
		})
		if err := k8sClient.Get(ctx, primeKey, &corev1.PersistentVolumeClaim{}); !apierrors.IsNotFound(err) {
			t.Fatalf("refused (%s): prime %s exists (err %v)", want, primeKey, err)
		}
		if _, ok := target.Annotations[cdiv1.AnnCloneType]; ok {
			t.Errorf("refused (%s): the clone was planned: %v", want, target.Annotations)
		}
	}
	refused("no extended clone token")
	if !eventReasons(t, nsTgt, target.UID)["SourceNotAuthorized"] {
		t.Error("no SourceNotAuthorized event on the refused claim")
	}

	sign := func(gen token.Generator, targetName, uid string) string {
		p := token.NewClonePayload(token.ResourcePVC, nsSrc, "golden", nsTgt, targetName)
		if uid != "" {
			p = token.WithUID(p, uid)
		}
		s, err := gen.Generate(p)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	setToken := func(key, v string) {
		t.Helper()
		patchAnnotations(t, k8sClient, target, map[string]string{key: v})
	}
	// The webhook's short token, valid for this very claim, is not enough
	// (U5: it is readable wherever the DataVolume is, and was replayable).
	short := token.NewGenerator(token.CloneTokenIssuer, keys.Private, 5*time.Minute)
	setToken(cdiv1.AnnCloneToken, sign(short, "disk", ""))
	refused("is not accepted on a claim")
	// A short token in the extended annotation: another issuer.
	setToken(cdiv1.AnnExtendedCloneToken, sign(short, "disk", string(target.UID)))
	refused("not valid")
	ext := token.NewGenerator(token.ExtendedCloneTokenIssuer, extKeys.Private, token.DefaultExtendedCloneTokenLifetime)
	setToken(cdiv1.AnnExtendedCloneToken, sign(ext, "disk", "another-claims-uid"))
	refused("issued for another target (UID another-claims-uid")
	setToken(cdiv1.AnnExtendedCloneToken, sign(ext, "other", string(target.UID)))
	refused("issued for another target")
	past := time.Now().Add(-time.Hour)
	setToken(cdiv1.AnnExtendedCloneToken, sign(token.NewGeneratorAt(token.ExtendedCloneTokenIssuer, extKeys.Private, 5*time.Minute, func() time.Time { return past }), "disk", string(target.UID)))
	refused("expired")

	setToken(cdiv1.AnnExtendedCloneToken, sign(ext, "disk", string(target.UID)))
	prime := &corev1.PersistentVolumeClaim{}
	kit.Until(t, 40*time.Second, "the prime in the source's namespace, once the token is valid", func() bool {
		return k8sClient.Get(ctx, primeKey, prime) == nil
	})
	if len(prime.OwnerReferences) != 0 || prime.Labels[cdiv1.LabelOwnedByUID] != string(target.UID) {
		t.Errorf("prime across namespaces: owners %v labels %v", prime.OwnerReferences, prime.Labels)
	}
	uploadName := cdiv1.UploadPodName(primeKey.Name)
	setPodStatus(t, nsSrc, uploadName, corev1.PodRunning, true)
	sourcePodKey := types.NamespacedName{Namespace: nsSrc, Name: clone.SourcePodName(target.UID)}
	kit.Until(t, 30*time.Second, "the clone source pod in the source's namespace", func() bool {
		return k8sClient.Get(ctx, sourcePodKey, &corev1.Pod{}) == nil
	})

	// Deleted mid-clone: the temporary objects in the source's namespace go,
	// then the finalizer.
	if err := k8sClient.Delete(ctx, target); err != nil {
		t.Fatal(err)
	}
	kit.Until(t, 30*time.Second, "the temporary objects gone and the clone finalizer removed", func() bool {
		err := k8sClient.Get(ctx, client.ObjectKeyFromObject(target), target)
		released := apierrors.IsNotFound(err) || (err == nil && !controllerutil.ContainsFinalizer(target, cdiv1.FinalizerClonePopulator))
		return released && gone(ctx, &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: nsSrc, Name: primeKey.Name}}) &&
			gone(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: nsSrc, Name: uploadName}}) &&
			gone(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: nsSrc, Name: sourcePodKey.Name}}) &&
			gone(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: nsSrc, Name: sourcePodKey.Name}}) &&
			gone(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: nsSrc, Name: uploadName}})
	})
	src := &corev1.PersistentVolumeClaim{}
	if err := k8sClient.Get(ctx, types.NamespacedName{Namespace: nsSrc, Name: "golden"}, src); err != nil || src.DeletionTimestamp != nil {
		t.Errorf("the source claim: %v (deleting %v)", err, src.DeletionTimestamp)
	}
}

// TestCloneByCSIClone: a class whose StorageProfile asks for CSI clones
// clones the source by a claim with dataSource PersistentVolumeClaim, but
// not while a pod has the source mounted writable: the claim names the pod
// and waits. Once the pod is gone the prime is made at the source's
// capacity and its volume moves to the claim.
func TestCloneByCSIClone(t *testing.T) {
	ctx := context.Background()
	ns, installNS := newNamespace(t), newNamespace(t)
	className := ns + "-csi"
	cloneClass(t, className)
	profile := &cdiv1.StorageProfile{}
	if err := k8sClient.Get(ctx, types.NamespacedName{Name: className}, profile); err != nil {
		t.Fatal(err)
	}
	profile.Spec.CloneStrategy = ptr.To(cdiv1.CloneStrategyCsiClone)
	if err := k8sClient.Update(ctx, profile); err != nil {
		t.Fatal(err)
	}
	startUploadManager(t, installNS)
	waitProfile(t, className, "asks for CSI clones", strategyIs(cdiv1.CloneStrategyCsiClone))
	src := cloneSourceClaim(t, ns, className)
	vm := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "vm"}, Spec: corev1.PodSpec{
		Containers: []corev1.Container{{Name: "vm", Image: "vm", VolumeMounts: []corev1.VolumeMount{{Name: "disk", MountPath: "/disk"}}}},
		Volumes:    []corev1.Volume{{Name: "disk", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: src.Name}}}},
	}}
	mustCreate(t, k8sClient, vm)

	target := kit.PVC(ns, "disk", "1Gi", kit.Class(className), kit.SourceRef(cdiv1.VolumeCloneSourceRef, "vcs"))
	mustCreate(t, k8sClient, target)
	kit.Until(t, 30*time.Second, "the clone waiting for the pod using its source", func() bool {
		_ = k8sClient.Get(ctx, client.ObjectKeyFromObject(target), target)
		return target.Annotations[cdiv1.AnnCloneType] == "csi-clone" && target.Annotations[cdiv1.AnnClonePhase] == "CSIClone" &&
			target.Annotations[cdiv1.AnnRunningConditionReason] == "CloneSourceInUse" &&
			strings.Contains(target.Annotations[cdiv1.AnnRunningConditionMessage], "pod "+ns+"/vm using PersistentVolumeClaim golden")
	})
	kit.Until(t, 20*time.Second, "a CloneSourceInUse Warning on the claim", func() bool {
		return eventReasons(t, ns, target.UID)["CloneSourceInUse"]
	})
	primeKey := types.NamespacedName{Namespace: ns, Name: clone.TmpClaimName(target.UID)}
	if err := k8sClient.Get(ctx, primeKey, &corev1.PersistentVolumeClaim{}); !apierrors.IsNotFound(err) {
		t.Fatalf("prime made while the source is in use (err %v)", err)
	}
	if err := k8sClient.Delete(ctx, vm, client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	prime := &corev1.PersistentVolumeClaim{}
	kit.Until(t, 30*time.Second, "the CSI clone's prime once the pod is gone", func() bool {
		return k8sClient.Get(ctx, primeKey, prime) == nil
	})
	if ds := prime.Spec.DataSource; ds == nil || ds.Kind != "PersistentVolumeClaim" || ds.Name != src.Name {
		t.Errorf("prime dataSource %+v, want claim %s", ds, src.Name)
	}
	pv := fakeBind(t, prime)
	kit.Until(t, 30*time.Second, "the volume pointed at the claim", func() bool {
		_ = k8sClient.Get(ctx, types.NamespacedName{Name: pv.Name}, pv)
		return pv.Spec.ClaimRef != nil && pv.Spec.ClaimRef.UID == target.UID
	})
	pods := &corev1.PodList{}
	if err := k8sClient.List(ctx, pods, client.InNamespace(ns)); err != nil || len(pods.Items) != 0 {
		t.Errorf("a CSI clone ran %d pods (err %v)", len(pods.Items), err)
	}
}

// bindTargetOnceRebound waits until the populator points pv's claimRef at
// target, then does what the PV controller would: binds target to pv.
func bindTargetOnceRebound(t *testing.T, pv *corev1.PersistentVolume, target *corev1.PersistentVolumeClaim, what string) {
	t.Helper()
	ctx := context.Background()
	kit.Until(t, 30*time.Second, what, func() bool {
		_ = k8sClient.Get(ctx, types.NamespacedName{Name: pv.Name}, pv)
		return pv.Spec.ClaimRef != nil && pv.Spec.ClaimRef.UID == target.UID
	})
	// The controller annotates the target meanwhile (its clone phase), as
	// kube-controller-manager would meet too: retry on a conflict.
	bind := func(update func() error, change func()) error {
		return retry.RetryOnConflict(retry.DefaultRetry, func() error {
			if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(target), target); err != nil {
				return err
			}
			change()
			return update()
		})
	}
	if err := bind(func() error { return k8sClient.Update(ctx, target) }, func() { target.Spec.VolumeName = pv.Name }); err != nil {
		t.Fatal(err)
	}
	if err := bind(func() error { return k8sClient.Status().Update(ctx, target) }, func() {
		target.Status.Phase, target.Status.Capacity = corev1.ClaimBound, pv.Spec.Capacity
	}); err != nil {
		t.Fatal(err)
	}
}
