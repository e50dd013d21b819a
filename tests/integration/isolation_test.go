package integration

import (
	"bytes"
	"context"
	"crypto/x509"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/certs"
	"github.com/kubefill/kubefill/pkg/clone"
	"github.com/kubefill/kubefill/pkg/contract"
	"github.com/kubefill/kubefill/pkg/controller"
	"github.com/kubefill/kubefill/pkg/populators"
	"github.com/kubefill/kubefill/pkg/token"
	"github.com/kubefill/kubefill/pkg/uploadproxy"
	"github.com/kubefill/kubefill/tests/kit"
)

// Tenant isolation: what a user who may edit one namespace's claims and
// temporary objects can make the controller issue, keep or show.

// noServiceAccountToken checks that a worker pod mounts no ServiceAccount
// token.
func noServiceAccountToken(t *testing.T, pod *corev1.Pod) {
	t.Helper()
	if a := pod.Spec.AutomountServiceAccountToken; a == nil || *a {
		t.Errorf("pod %s: automountServiceAccountToken %v, want false", pod.Name, a)
	}
}

// TestCloneClientNameNotFromPrime (H3): a host-assisted clone whose prime's
// cdi.kubevirt.io/uploadClientName is edited to the upload proxy's name as
// soon as the prime exists gets a source pod certificate naming the clone
// as the controller computes it, from the clone client signer, valid for
// hours; the clone's upload server requires that name and trusts only the
// clone signer; neither pod mounts a ServiceAccount token.
func TestCloneClientNameNotFromPrime(t *testing.T) {
	ctx := context.Background()
	ns, installNS := newNamespace(t), newNamespace(t)
	className := ns + "-csi"
	cloneClass(t, className)
	startUploadManager(t, installNS)
	waitProfile(t, className, "asks for snapshot clones", strategyIs(cdiv1.CloneStrategySnapshot))
	cloneSourceClaim(t, ns, className)

	target := kit.PVC(ns, "disk", "1Gi", kit.Class(className), kit.SourceRef(cdiv1.VolumeCloneSourceRef, "vcs"))
	mustCreate(t, k8sClient, target)
	primeName := clone.TmpClaimName(target.UID)
	want := ns + "/golden-" + ns + "/" + primeName
	prime := &corev1.PersistentVolumeClaim{}
	kit.Until(t, 30*time.Second, "the prime "+primeName, func() bool {
		return k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: primeName}, prime) == nil
	})
	// The tenant edits the prime, which sits in her namespace.
	patchAnnotations(t, k8sClient, prime, map[string]string{cdiv1.AnnUploadClientName: certs.UploadServerClientName})

	uploadName := cdiv1.UploadPodName(primeName)
	upload := setPodStatus(t, ns, uploadName, corev1.PodRunning, true)
	if args := strings.Join(upload.Spec.Containers[0].Args, " "); !strings.Contains(args, "--client-name "+want+" ") {
		t.Errorf("upload server args %q lack --client-name %s", args, want)
	}
	noServiceAccountToken(t, upload)
	sourcePod := &corev1.Pod{}
	kit.Until(t, 30*time.Second, "the clone source pod", func() bool {
		return k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: clone.SourcePodName(target.UID)}, sourcePod) == nil
	})
	noServiceAccountToken(t, sourcePod)

	secret, serving, cloneSigner, proxySigner := &corev1.Secret{}, &corev1.Secret{}, &corev1.Secret{}, &corev1.Secret{}
	for key, s := range map[types.NamespacedName]*corev1.Secret{
		{Namespace: ns, Name: sourcePod.Name}:                        secret,
		{Namespace: ns, Name: cdiv1.UploadServiceName(primeName)}:    serving,
		{Namespace: installNS, Name: certs.CloneClientSigner}:        cloneSigner,
		{Namespace: installNS, Name: certs.UploadServerClientSigner}: proxySigner,
	} {
		if err := k8sClient.Get(ctx, key, s); err != nil {
			t.Fatalf("Secret %s: %v", key, err)
		}
	}
	cert := parseCert(t, secret.Data[corev1.TLSCertKey])
	if cert.Subject.CommonName != want {
		t.Errorf("the source pod's certificate names %q, want %q (the prime said %q)", cert.Subject.CommonName, want, certs.UploadServerClientName)
	}
	if left := time.Until(cert.NotAfter); left > certs.CloneClientValidity+time.Minute {
		t.Errorf("the source pod's certificate is valid for %s more, want at most %s", left.Round(time.Minute), certs.CloneClientValidity)
	}
	verifyChain(t, "the source pod's certificate", secret.Data[corev1.TLSCertKey], cloneSigner.Data[corev1.TLSCertKey], x509.ExtKeyUsageClientAuth, "")
	if err := cert.CheckSignatureFrom(parseCert(t, proxySigner.Data[corev1.TLSCertKey])); err == nil {
		t.Error("the source pod's certificate is signed by the upload proxy's client signer")
	}
	// The clone's upload server trusts the clone signer's bundle alone.
	cm := &corev1.ConfigMap{}
	if err := k8sClient.Get(ctx, types.NamespacedName{Namespace: installNS, Name: certs.BundleName(certs.CloneClientSigner)}, cm); err != nil {
		t.Fatal(err)
	}
	trusted := serving.Data[populators.UploadClientCAKey]
	if !bytes.Equal(trusted, []byte(cm.Data[certs.BundleKey])) || bytes.Contains(trusted, proxySigner.Data[corev1.TLSCertKey]) {
		t.Errorf("the clone's upload server trusts %d bytes, not the clone signer's bundle alone", len(trusted))
	}
	proxy := &corev1.Secret{}
	if err := k8sClient.Get(ctx, types.NamespacedName{Namespace: installNS, Name: certs.UploadServerClientCert}, proxy); err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(trusted)
	if _, err := parseCert(t, proxy.Data[corev1.TLSCertKey]).Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err == nil {
		t.Error("the upload proxy's certificate verifies against the clone's upload server's trust")
	}
}

// TestUploadTargetNamedLikeAnotherNamespace (H5): an in-place upload target
// in namespace a named victim.<b>.svc gets an upload Service whose name is
// a DNS-1035 label, and a serving certificate whose names are that
// Service's in a only: nothing it holds is valid for any name of namespace
// b. The upload proxy reaches and verifies it by the same name.
func TestUploadTargetNamedLikeAnotherNamespace(t *testing.T) {
	ctx := context.Background()
	nsA, nsB, installNS := newNamespace(t), newNamespace(t), newNamespace(t)
	className := nsA + "-csi"
	csiClass(t, className, "hostpath.csi.kubefill.test", storagev1.VolumeBindingImmediate, rwoFilesystem)
	startUploadManager(t, installNS)
	claim := "victim." + nsB + ".svc"
	pvc := kit.PVC(nsA, claim, "1Gi", kit.Class(className), kit.Annotate(map[string]string{cdiv1.AnnUploadRequest: ""}))
	mustCreate(t, k8sClient, pvc)

	svcName := cdiv1.UploadServiceName(claim)
	if errs := validation.IsDNS1035Label(svcName); len(errs) > 0 || strings.Contains(svcName, nsB) && strings.Contains(svcName, ".") {
		t.Fatalf("Service name %q: %v", svcName, errs)
	}
	pod := &corev1.Pod{}
	kit.Until(t, 30*time.Second, "the upload pod "+cdiv1.UploadPodName(claim), func() bool {
		return k8sClient.Get(ctx, types.NamespacedName{Namespace: nsA, Name: cdiv1.UploadPodName(claim)}, pod) == nil
	})
	noServiceAccountToken(t, pod)
	svc, secret := &corev1.Service{}, &corev1.Secret{}
	if err := k8sClient.Get(ctx, types.NamespacedName{Namespace: nsA, Name: svcName}, svc); err != nil {
		t.Fatalf("upload Service %s: %v", svcName, err)
	}
	if !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(pod.Labels)) {
		t.Errorf("Service selector %v does not select the upload pod (labels %v)", svc.Spec.Selector, pod.Labels)
	}
	if err := k8sClient.Get(ctx, types.NamespacedName{Namespace: nsA, Name: svcName}, secret); err != nil {
		t.Fatalf("serving Secret %s: %v", svcName, err)
	}
	if !slices.ContainsFunc(pod.Spec.Volumes, func(v corev1.Volume) bool { return v.Secret != nil && v.Secret.SecretName == svcName }) {
		t.Errorf("the upload pod does not mount Secret %s", svcName)
	}
	// Nothing is named after the claim's dotted name but the pod.
	for _, obj := range []client.Object{&corev1.Secret{}, &corev1.Service{}} {
		if err := k8sClient.Get(ctx, types.NamespacedName{Namespace: nsA, Name: "cdi-upload-" + claim}, obj); !apierrors.IsNotFound(err) {
			t.Errorf("%T cdi-upload-%s exists (err %v)", obj, claim, err)
		}
	}

	cert := parseCert(t, secret.Data[corev1.TLSCertKey])
	host := svcName + "." + nsA + ".svc"
	if cert.Subject.CommonName != host || !slices.Equal(cert.DNSNames, []string{host, host + ".cluster.local"}) || len(cert.IPAddresses) != 0 {
		t.Errorf("serving certificate CN %q names %v %v, want %s and %s.cluster.local only", cert.Subject.CommonName, cert.DNSNames, cert.IPAddresses, host, host)
	}
	for _, name := range []string{
		uploadproxy.ServiceHost(nsB, "victim"), // what the proxy verifies for b's claim victim
		"cdi-upload-victim." + nsB + ".svc", "cdi-upload-victim." + nsB + ".svc.cluster.local", "cdi-upload-" + claim,
		"victim." + nsB + ".svc", svcName + "." + nsB + ".svc",
	} {
		if err := cert.VerifyHostname(name); err == nil {
			t.Errorf("the certificate of %s/%s is valid for %s", nsA, claim, name)
		}
	}
	for _, n := range cert.DNSNames {
		if parts := strings.Split(n, "."); len(parts) < 3 || parts[1] != nsA || parts[2] != "svc" {
			t.Errorf("certificate name %s is not <service>.%s.svc…", n, nsA)
		}
	}
	// The proxy dials and verifies the Service by the same function.
	if err := cert.VerifyHostname(uploadproxy.ServiceHost(nsA, claim)); err != nil {
		t.Errorf("the proxy's name for %s/%s: %v", nsA, claim, err)
	}
	ep, err := uploadproxy.ServiceLocator{}.ResolveUploadServer(ctx, nsA, claim)
	if err != nil || ep.URL != "https://"+host {
		t.Errorf("the proxy resolves %s/%s to %+v (%v), want https://%s", nsA, claim, ep, err, host)
	}
	verifyCA := &corev1.Secret{}
	if err := k8sClient.Get(ctx, types.NamespacedName{Namespace: installNS, Name: certs.UploadServerSigner}, verifyCA); err != nil {
		t.Fatal(err)
	}
	verifyChain(t, "the serving certificate", secret.Data[corev1.TLSCertKey], verifyCA.Data[corev1.TLSCertKey], x509.ExtKeyUsageServerAuth, host)
}

// TestWorkerPodsKeepProxyInSecret (U4): with CDIConfig's import proxy set
// (credentials in its URL), the importer pod mounts no ServiceAccount
// token and carries no proxy value in its spec: it reads them from a Secret
// in the claim's namespace owned by the claim, which goes with the worker.
func TestWorkerPodsKeepProxyInSecret(t *testing.T) {
	ctx := context.Background()
	ns, installNS := newNamespace(t), newNamespace(t)
	className := ns + "-csi"
	csiClass(t, className, "hostpath.csi.kubefill.test", storagev1.VolumeBindingImmediate, rwoFilesystem)
	const proxyURL = "http://squid-user:hunter2@proxy.test:3128"
	config := &cdiv1.CDIConfig{ObjectMeta: metav1.ObjectMeta{Name: cdiv1.CDIConfigName}}
	if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(config), config); apierrors.IsNotFound(err) {
		mustCreate(t, k8sClient, config)
	} else if err != nil {
		t.Fatal(err)
	}
	old := config.Spec.ImportProxy
	config.Spec.ImportProxy = &cdiv1.ImportProxy{HTTPProxy: ptr.To(proxyURL), HTTPSProxy: ptr.To(proxyURL), NoProxy: ptr.To(".svc")}
	if err := k8sClient.Update(ctx, config); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c := &cdiv1.CDIConfig{}
		if err := k8sClient.Get(context.Background(), client.ObjectKeyFromObject(config), c); err == nil {
			c.Spec.ImportProxy = old
			_ = k8sClient.Update(context.Background(), c)
		}
	})
	startUploadManager(t, installNS)
	kit.Until(t, 30*time.Second, "CDIConfig's status to show the import proxy", func() bool {
		_ = k8sClient.Get(ctx, client.ObjectKeyFromObject(config), config)
		p := config.Status.ImportProxy
		return p != nil && ptr.Deref(p.HTTPSProxy, "") == proxyURL
	})
	mustCreate(t, k8sClient, &cdiv1.VolumeImportSource{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "src"},
		Spec: cdiv1.VolumeImportSourceSpec{Source: &cdiv1.ImportSourceType{HTTP: &cdiv1.DataVolumeSourceHTTP{URL: "http://images.test/disk.qcow2"}}}})
	target := kit.PVC(ns, "disk", "1Gi", kit.Class(className), kit.SourceRef(cdiv1.VolumeImportSourceRef, "src"))
	mustCreate(t, k8sClient, target)
	podName := cdiv1.ImporterPodName(cdiv1.PrimeName(string(target.UID)))
	pod := &corev1.Pod{}
	kit.Until(t, 30*time.Second, "the importer pod", func() bool {
		return k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: podName}, pod) == nil
	})
	noServiceAccountToken(t, pod)
	secretName := populators.WorkerSecretName(podName)
	for _, c := range pod.Spec.Containers {
		for _, e := range c.Env {
			if strings.Contains(e.Value, "hunter2") || strings.Contains(e.Value, "proxy.test") {
				t.Errorf("importer env %s=%q shows the proxy in the pod's spec", e.Name, e.Value)
			}
		}
		for _, env := range []string{contract.EnvHTTPProxy, contract.EnvHTTPSProxy, contract.EnvNoProxy} {
			i := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == env })
			if i < 0 || c.Env[i].ValueFrom == nil || c.Env[i].ValueFrom.SecretKeyRef == nil || c.Env[i].ValueFrom.SecretKeyRef.Name != secretName {
				t.Errorf("importer env %s does not come from Secret %s: %+v", env, secretName, c.Env)
			}
		}
	}
	secret := &corev1.Secret{}
	if err := k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: secretName}, secret); err != nil {
		t.Fatalf("the importer's Secret: %v", err)
	}
	if string(secret.Data[contract.EnvHTTPSProxy]) != proxyURL || !metav1.IsControlledBy(secret, target) {
		t.Errorf("Secret %s: data %v, owners %v; want the proxy, owned by the claim", secretName, secret.Data, secret.OwnerReferences)
	}
	// The import ends: the worker and its Secret go.
	completeFill(t, target, podName)
	kit.Until(t, 30*time.Second, "the importer's Secret removed with the worker", func() bool {
		return gone(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: secretName}})
	})
}

// TestCrossNamespaceCloneIgnoresRetainAndPriority (U3): a clone from
// another namespace whose target asks to retain its pods and for a
// priority class makes a prime in the source's namespace with neither, and
// says so on the claim.
func TestCrossNamespaceCloneIgnoresRetainAndPriority(t *testing.T) {
	ctx := context.Background()
	nsSrc, nsTgt, installNS := newNamespace(t), newNamespace(t), newNamespace(t)
	className := nsSrc + "-csi"
	cloneClass(t, className)
	// The controller's own key for extended tokens: a claim takes only an
	// extended token bound to its UID, as a DataVolume's controller adds.
	extKeys, err := token.EnsureSigningKeySecret(ctx, k8sClient, installNS, controller.DefaultExtendedTokenKeySecret)
	if err != nil {
		t.Fatal(err)
	}
	startUploadManager(t, installNS)
	waitProfile(t, className, "asks for snapshot clones", strategyIs(cdiv1.CloneStrategySnapshot))
	cloneSourceClaim(t, nsSrc, className)
	target := kit.PVC(nsTgt, "disk", "1Gi", kit.Class(className), kit.SourceRef(cdiv1.VolumeCloneSourceRef, "vcs"),
		kit.Annotate(map[string]string{cdiv1.AnnDataSourceNamespace: nsSrc, cdiv1.AnnPodRetainAfterCompletion: "true", cdiv1.AnnPriorityClassName: "tenant-high"}))
	mustCreate(t, k8sClient, target)
	ext, err := token.NewGenerator(token.ExtendedCloneTokenIssuer, extKeys.Private, token.DefaultExtendedCloneTokenLifetime).
		Generate(token.WithUID(token.NewClonePayload(token.ResourcePVC, nsSrc, "golden", nsTgt, "disk"), string(target.UID)))
	if err != nil {
		t.Fatal(err)
	}
	patchAnnotations(t, k8sClient, target, map[string]string{cdiv1.AnnExtendedCloneToken: ext})
	prime := &corev1.PersistentVolumeClaim{}
	primeKey := types.NamespacedName{Namespace: nsSrc, Name: clone.TmpClaimName(target.UID)}
	kit.Until(t, 40*time.Second, "the prime in the source's namespace", func() bool { return k8sClient.Get(ctx, primeKey, prime) == nil })
	for _, key := range []string{cdiv1.AnnPodRetainAfterCompletion, cdiv1.AnnPriorityClassName} {
		if v, ok := prime.Annotations[key]; ok {
			t.Errorf("the prime in %s carries %s=%q", nsSrc, key, v)
		}
	}
	kit.Until(t, 20*time.Second, "an IgnoredInSourceNamespace Warning on the claim", func() bool {
		return eventReasons(t, nsTgt, target.UID)[populators.ReasonIgnoredAcrossNamespaces]
	})
	upload := setPodStatus(t, nsSrc, cdiv1.UploadPodName(primeKey.Name), corev1.PodRunning, true)
	if upload.Spec.PriorityClassName != "" {
		t.Errorf("the upload pod in %s runs at priority class %q", nsSrc, upload.Spec.PriorityClassName)
	}
}

// TestCrossNamespaceImportGrantRevoked (U1): an import from another
// namespace that a ReferenceGrant allowed loses its worker and its prime,
// with the data it held, when the grant is deleted mid-import, and the
// claim says why; a grant given again starts over with a new prime.
func TestCrossNamespaceImportGrantRevoked(t *testing.T) {
	ctx := context.Background()
	// The ReferenceGrant CRD and the cross-namespace data source gate.
	useHardenedControlPlane(t)
	if err := doApplyInstall(); err != nil {
		t.Fatal(err)
	}
	nsA, nsB := newNamespace(t), newNamespace(t)
	className := nsA + "-csi"
	csiClass(t, className, "hostpath.csi.kubefill.test", storagev1.VolumeBindingImmediate)
	mustCreate(t, k8sClient, &cdiv1.VolumeImportSource{ObjectMeta: metav1.ObjectMeta{Namespace: nsB, Name: "src"},
		Spec: cdiv1.VolumeImportSourceSpec{Source: &cdiv1.ImportSourceType{HTTP: &cdiv1.DataVolumeSourceHTTP{URL: "http://images.test/" + nsB + "/private.qcow2"}}}})
	grant := referenceGrant(nsB, "allow-"+nsA, nsA, cdiv1.VolumeImportSourceRef, "src")
	mustCreate(t, k8sClient, grant)

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
			DataSourceRef:    &corev1.TypedObjectReference{APIGroup: ptr.To(cdiv1.GroupName), Kind: cdiv1.VolumeImportSourceRef, Name: "src", Namespace: ptr.To(nsB)},
		},
	}
	mustCreate(t, k8sClient, target)
	primeKey := types.NamespacedName{Namespace: nsA, Name: cdiv1.PrimeName(string(target.UID))}
	podKey := types.NamespacedName{Namespace: nsA, Name: cdiv1.ImporterPodName(primeKey.Name)}
	prime := &corev1.PersistentVolumeClaim{}
	kit.Until(t, 60*time.Second, "the prime and the importer pod, under the grant", func() bool {
		return k8sClient.Get(ctx, primeKey, prime) == nil && k8sClient.Get(ctx, podKey, &corev1.Pod{}) == nil
	})
	firstUID := prime.UID
	setPodStatus(t, nsA, podKey.Name, corev1.PodRunning, false) // mid-import

	// Revoked.
	if err := k8sClient.Delete(ctx, grant); err != nil {
		t.Fatal(err)
	}
	kit.Until(t, 60*time.Second, "the worker deleted and the prime being deleted", func() bool {
		return gone(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: nsA, Name: podKey.Name}}) &&
			gone(ctx, &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: nsA, Name: primeKey.Name}})
	})
	kit.Until(t, 20*time.Second, "a SourceAccessRevoked Warning and the refusal on the claim", func() bool {
		_ = k8sClient.Get(ctx, client.ObjectKeyFromObject(target), target)
		return eventReasons(t, nsA, target.UID)[populators.ReasonSourceRevoked] &&
			target.Annotations[cdiv1.AnnRunningConditionReason] == "SourceNotAuthorized" && target.Annotations[cdiv1.AnnPodReady] != "true"
	})
	t.Logf("after the revocation: %s", target.Annotations[cdiv1.AnnRunningConditionMessage])
	// The PV controller's part (no kube-controller-manager here): the
	// prime's protection goes once no pod uses it.
	kit.Until(t, 20*time.Second, "the prime gone", func() bool {
		p := &corev1.PersistentVolumeClaim{}
		if err := k8sClient.Get(ctx, primeKey, p); apierrors.IsNotFound(err) {
			return true
		} else if err != nil || p.UID != firstUID {
			return err == nil
		}
		p.Finalizers = nil
		_ = k8sClient.Update(ctx, p)
		return false
	})
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		if err := k8sClient.Get(ctx, primeKey, &corev1.PersistentVolumeClaim{}); !apierrors.IsNotFound(err) {
			t.Fatalf("a prime made while the source is refused (err %v)", err)
		}
	}

	// Granted again: a new prime and worker, from the start.
	mustCreate(t, k8sClient, referenceGrant(nsB, "allow-again-"+nsA, nsA, cdiv1.VolumeImportSourceRef, "src"))
	// The prime counts its worker pods once the pod exists: wait for the count too.
	kit.Until(t, 60*time.Second, "a new prime, its importer pod and the prime's attempt count", func() bool {
		return k8sClient.Get(ctx, primeKey, prime) == nil && prime.UID != firstUID && k8sClient.Get(ctx, podKey, &corev1.Pod{}) == nil &&
			prime.Annotations["kubefill.io/attempts"] != ""
	})
	if got := prime.Annotations["kubefill.io/attempts"]; got != "1" {
		t.Errorf("the new prime's attempts %q, want 1 (a fresh start)", got)
	}
}
