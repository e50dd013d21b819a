package integration

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	uploadv1 "github.com/kubefill/kubefill-api/upload/v1beta1"
	"github.com/kubefill/kubefill/pkg/apiserver"
	"github.com/kubefill/kubefill/pkg/apiserver/admission"
	"github.com/kubefill/kubefill/pkg/contract"
	"github.com/kubefill/kubefill/pkg/controller"
	"github.com/kubefill/kubefill/pkg/populators"
	"github.com/kubefill/kubefill/pkg/token"
	"github.com/kubefill/kubefill/pkg/uploadproxy"
	"github.com/kubefill/kubefill/tests/kit"
)

// The namespace and ServiceAccounts of manifests/install.
const (
	installNamespace = "kubefill-system"
	controllerSA     = "kubefill-controller"
	apiserverSA      = "kubefill-apiserver"
	uploadproxySA    = "kubefill-uploadproxy"
	// unboundSA has no binding at all: the negative control.
	unboundSA = "kubefill-unbound"
)

// rbacKinds are created for real; every other object of the install is only
// dry-run, so that webhooks pointing at a Service with no pods do not block
// the DataVolumes of the other tests sharing this control plane.
var rbacKinds = []string{"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}

// installObjects reads the objects of manifests/install in kustomization.yaml
// order (the CRDs are manifests/kustomization.yaml's; TestMain installed them).
func installObjects() ([]*unstructured.Unstructured, error) {
	dir := filepath.Join(repoRoot(), "manifests", "install")
	b, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		return nil, err
	}
	var k struct {
		Resources []string `json:"resources"`
	}
	if err := yaml.Unmarshal(b, &k); err != nil {
		return nil, fmt.Errorf("kustomization.yaml: %w", err)
	}
	var out []*unstructured.Unstructured
	for _, res := range k.Resources {
		data, err := os.ReadFile(filepath.Join(dir, res))
		if err != nil {
			return nil, err
		}
		dec := utilyaml.NewYAMLOrJSONDecoder(bufio.NewReader(bytes.NewReader(data)), 4096)
		for {
			u := &unstructured.Unstructured{}
			if err := dec.Decode(&u.Object); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				return nil, fmt.Errorf("%s: %w", res, err)
			}
			if len(u.Object) == 0 {
				continue
			}
			out = append(out, u)
		}
	}
	return out, nil
}

var installOnce struct {
	sync.Once
	err error
}

// applyInstall creates the Namespace, ServiceAccounts and RBAC of
// manifests/install (once per package run), and has kube-apiserver validate
// everything else with a server-side dry run.
func applyInstall(t *testing.T) {
	t.Helper()
	installOnce.Do(func() { installOnce.err = doApplyInstall() })
	if installOnce.err != nil {
		t.Fatal(installOnce.err)
	}
}

func doApplyInstall() error {
	ctx := context.Background()
	objs, err := installObjects()
	if err != nil {
		return fmt.Errorf("reading manifests/install: %w", err)
	}
	var kinds []string
	for _, o := range objs {
		real := slices.Contains(rbacKinds, o.GetKind())
		var opts []client.CreateOption
		if !real {
			opts = append(opts, client.DryRunAll)
		}
		err := k8sClient.Create(ctx, o.DeepCopy(), opts...)
		if apierrors.IsAlreadyExists(err) && real {
			cur := &unstructured.Unstructured{}
			cur.SetGroupVersionKind(o.GroupVersionKind())
			if err = k8sClient.Get(ctx, client.ObjectKeyFromObject(o), cur); err == nil {
				upd := o.DeepCopy()
				upd.SetResourceVersion(cur.GetResourceVersion())
				err = k8sClient.Update(ctx, upd)
			}
		}
		if err != nil {
			return fmt.Errorf("%s %s/%s (dry run %v): %w", o.GetKind(), o.GetNamespace(), o.GetName(), !real, err)
		}
		kinds = append(kinds, o.GetKind())
	}
	for _, want := range []string{"Deployment", "Service", "APIService", "ValidatingWebhookConfiguration", "MutatingWebhookConfiguration", "ClusterRoleBinding", "RoleBinding"} {
		if !slices.Contains(kinds, want) {
			return fmt.Errorf("manifests/install has no %s", want)
		}
	}
	return nil
}

// forbiddenLog records every request kube-apiserver refused with 403.
type forbiddenLog struct {
	// namespaces, when set, limits the record to requests in these
	// namespaces and cluster-scoped ones: the manager also reconciles what
	// other tests left in theirs, in whatever state those are.
	namespaces []string

	mu   sync.Mutex
	seen []string
}

// watched says whether a request's namespace is one the log records.
func (l *forbiddenLog) watched(path string) bool {
	if len(l.namespaces) == 0 {
		return true
	}
	_, rest, ok := strings.Cut(path, "/namespaces/")
	if !ok {
		return true
	}
	ns, _, _ := strings.Cut(rest, "/")
	return slices.Contains(l.namespaces, ns)
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func (l *forbiddenLog) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		resp, err := rt.RoundTrip(r)
		if err != nil || resp.StatusCode != http.StatusForbidden || !l.watched(r.URL.Path) {
			return resp, err
		}
		body, rerr := io.ReadAll(resp.Body)
		resp.Body.Close()
		resp.Body = io.NopCloser(bytes.NewReader(body))
		if rerr != nil {
			return resp, nil
		}
		// JSON or protobuf, as the client asked.
		var status metav1.Status
		if obj, _, derr := clientgoscheme.Codecs.UniversalDeserializer().Decode(body, nil, nil); derr == nil {
			if st, ok := obj.(*metav1.Status); ok {
				status = *st
			}
		}
		if namespaceTerminating(status) || bytes.Contains(body, []byte("because it is being terminated")) {
			// Not RBAC: the namespace of an earlier test is being deleted
			// (envtest runs no namespace controller, so it stays so).
			return resp, nil
		}
		// The verb and the resource; list and watch options vary per call.
		what := r.Method + " " + r.URL.Path
		q := r.URL.Query()
		if q.Get("watch") == "true" {
			what += " (watch)"
		}
		if fs := q.Get("fieldSelector"); fs != "" {
			what += " (fieldSelector " + fs + ")"
		}
		l.mu.Lock()
		l.seen = append(l.seen, what+": "+status.Message)
		l.mu.Unlock()
		return resp, nil
	})
}

// namespaceTerminating: kube-apiserver's NamespaceLifecycle refusal, a 403
// that is no RBAC decision.
func namespaceTerminating(s metav1.Status) bool {
	if s.Details != nil {
		for _, c := range s.Details.Causes {
			if c.Type == corev1.NamespaceTerminatingCause {
				return true
			}
		}
	}
	return strings.Contains(s.Message, "because it is being terminated")
}

func (l *forbiddenLog) list() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.seen)
}

// impersonating is the test's admin config acting as ServiceAccount sa of
// the install namespace, as a pod running under it would; refusals go to rec.
func impersonating(sa string, rec *forbiddenLog) *rest.Config {
	c := rest.CopyConfig(cfg)
	c.Impersonate = rest.ImpersonationConfig{
		UserName: "system:serviceaccount:" + installNamespace + ":" + sa,
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + installNamespace, "system:authenticated"},
	}
	c.WrapTransport = rec.wrap
	return c
}

func assertNoForbidden(t *testing.T, who string, rec *forbiddenLog) {
	t.Helper()
	seen := rec.list()
	if len(seen) == 0 {
		return
	}
	count := map[string]int{}
	var distinct []string
	for _, s := range seen {
		if count[s] == 0 {
			distinct = append(distinct, s)
		}
		count[s]++
	}
	lines := make([]string, len(distinct))
	for i, s := range distinct {
		lines[i] = fmt.Sprintf("%s (%d×)", s, count[s])
	}
	t.Errorf("%s was refused %d requests; the manifests' RBAC misses:\n  %s", who, len(seen), strings.Join(lines, "\n  "))
}

// completeFill plays kube-controller-manager and the kubelet: the prime's
// volume is provisioned and bound, and the worker pod succeeds. The populator
// must then point the volume at the target; the test binds the target.
func completeFill(t *testing.T, target *corev1.PersistentVolumeClaim, workerPod string) *corev1.PersistentVolume {
	t.Helper()
	ctx := context.Background()
	prime := &corev1.PersistentVolumeClaim{}
	if err := k8sClient.Get(ctx, types.NamespacedName{Namespace: target.Namespace, Name: populators.PrimeName(target)}, prime); err != nil {
		t.Fatal(err)
	}
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "pv-" + string(prime.UID)},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: prime.Spec.Resources.Requests[corev1.ResourceStorage]},
			AccessModes:                   prime.Spec.AccessModes,
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
			StorageClassName:              ptr.Deref(prime.Spec.StorageClassName, ""),
			PersistentVolumeSource:        corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: "hostpath.csi.kubefill.test", VolumeHandle: string(prime.UID)}},
			ClaimRef:                      &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: prime.Namespace, Name: prime.Name, UID: prime.UID},
		},
	}
	if err := k8sClient.Create(ctx, pv); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deletePV(t, pv.Name) })
	// The populator writes the prime's annotations meanwhile: bind it as
	// the PV controller would, again on a conflict.
	key := client.ObjectKeyFromObject(prime)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := k8sClient.Get(ctx, key, prime); err != nil {
			return err
		}
		prime.Spec.VolumeName = pv.Name
		return k8sClient.Update(ctx, prime)
	})
	if err == nil {
		err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
			if err := k8sClient.Get(ctx, key, prime); err != nil {
				return err
			}
			prime.Status.Phase = corev1.ClaimBound
			return k8sClient.Status().Update(ctx, prime)
		})
	}
	if err != nil {
		t.Fatalf("binding the prime: %v", err)
	}
	pod := &corev1.Pod{}
	if err := k8sClient.Get(ctx, types.NamespacedName{Namespace: target.Namespace, Name: workerPod}, pod); err != nil {
		t.Fatal(err)
	}
	pod.Status.Phase = corev1.PodSucceeded
	pod.Status.Conditions = nil
	if err := k8sClient.Status().Update(ctx, pod); err != nil {
		t.Fatalf("pod %s succeeded: %v", workerPod, err)
	}
	kit.Until(t, 30*time.Second, "the populator to point volume "+pv.Name+" at the claim", func() bool {
		_ = k8sClient.Get(ctx, types.NamespacedName{Name: pv.Name}, pv)
		return pv.Spec.ClaimRef != nil && pv.Spec.ClaimRef.UID == target.UID
	})
	// The populator annotates the claim meanwhile: retry on a conflict.
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(target), target); err != nil {
			return err
		}
		target.Spec.VolumeName = pv.Name
		return k8sClient.Update(ctx, target)
	}); err != nil {
		t.Fatalf("binding the claim: %v", err)
	}
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(target), target); err != nil {
			return err
		}
		target.Status.Phase = corev1.ClaimBound
		target.Status.Capacity = pv.Spec.Capacity
		return k8sClient.Status().Update(ctx, target)
	}); err != nil {
		t.Fatalf("binding the claim: %v", err)
	}
	kit.Until(t, 30*time.Second, "the populator to finish (prime deleted, claim marked populated)", func() bool {
		p := &corev1.PersistentVolumeClaim{}
		err := k8sClient.Get(ctx, client.ObjectKeyFromObject(prime), p)
		gone := apierrors.IsNotFound(err) || (err == nil && p.DeletionTimestamp != nil)
		_ = k8sClient.Get(ctx, client.ObjectKeyFromObject(target), target)
		return gone && target.Annotations[cdiv1.AnnPopulatedFor] == target.Name
	})
	return pv
}

// gone is true once obj does not exist or is being deleted.
func gone(ctx context.Context, obj client.Object) bool {
	err := k8sClient.Get(ctx, client.ObjectKeyFromObject(obj), obj)
	return apierrors.IsNotFound(err) || (err == nil && obj.GetDeletionTimestamp() != nil)
}

func eventReasons(t *testing.T, ns string, uid types.UID) map[string]bool {
	t.Helper()
	list := &corev1.EventList{}
	if err := k8sClient.List(context.Background(), list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, e := range list.Items {
		if e.InvolvedObject.UID == uid {
			out[e.Reason] = true
		}
	}
	return out
}

// TestInstallControllerRBAC runs the real controller manager as the
// kubefill-controller ServiceAccount of manifests/install and drives an import
// and an upload DataVolume to the end, so that every kind of read and write
// the controller does happens; kube-apiserver must refuse none of them. The
// upload proxy's resolver then runs as kubefill-uploadproxy against the
// upload's claim. A ServiceAccount without bindings must fail both.
func TestInstallControllerRBAC(t *testing.T) {
	applyInstall(t)
	// The snapshot CRDs are not installed here: TestStorageProfileWithoutSnapshotCRDs
	// needs a control plane without them. The next test serves them.
	runControllerRBAC(t, true)
}

// snapshotCRDPaths are the snapshot.storage.k8s.io CRD files of
// snapshotCRDModule, located with go mod download.
func snapshotCRDPaths(t *testing.T) []string {
	t.Helper()
	cmd := exec.Command("go", "mod", "download", "-json", snapshotCRDModule)
	cmd.Dir = repoRoot()
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("locating %s with go mod download: %v", snapshotCRDModule, err)
	}
	var mod struct{ Dir string }
	if err := json.Unmarshal(out, &mod); err != nil || mod.Dir == "" {
		t.Fatalf("reading go mod download output %q: %v", out, err)
	}
	var paths []string
	for _, kind := range []string{"volumesnapshotclasses", "volumesnapshotcontents", "volumesnapshots"} {
		paths = append(paths, filepath.Join(mod.Dir, "config", "crd", "snapshot.storage.k8s.io_"+kind+".yaml"))
	}
	return paths
}

// TestInstallControllerRBACOwnerReferencesEnforced repeats the controller's
// flows on the hardened control plane, with the
// OwnerReferencesPermissionEnforcement admission plugin (on in OpenShift and
// other hardened clusters): there, setting blockOwnerDeletion on an owner
// reference needs update on the owner's finalizers subresource, which the
// shared control plane never checks. It also serves the snapshot CRDs, so
// that the StorageProfile controller watches VolumeSnapshotClasses under the
// install's RBAC.
func TestInstallControllerRBACOwnerReferencesEnforced(t *testing.T) {
	useHardenedControlPlane(t)
	if err := doApplyInstall(); err != nil {
		t.Fatal(err)
	}
	runControllerRBAC(t, false)
}

// runControllerRBAC is the body of the controller tests; negative runs the
// unbound ServiceAccount's control too.
func runControllerRBAC(t *testing.T, negative bool) {
	ctx := context.Background()
	if _, err := envtest.InstallCRDs(cfg, envtest.CRDInstallOptions{CRDs: []*apiextensionsv1.CustomResourceDefinition{volumePopulatorCRD()}}); err != nil {
		t.Fatalf("installing the VolumePopulator CRD: %v", err)
	}
	// What the controller makes once per cluster goes first, so that this
	// test sees it made under the ServiceAccount.
	vpGVR := schema.GroupVersionResource{Group: "populator.storage.k8s.io", Version: "v1beta1", Resource: "volumepopulators"}
	dyn := dynamic.NewForConfigOrDie(cfg)
	// The kinds the controller runs, and so registers.
	kinds := []string{cdiv1.VolumeImportSourceRef, cdiv1.VolumeUploadSourceRef}
	for _, kind := range kinds {
		if err := dyn.Resource(vpGVR).Delete(ctx, populators.VolumePopulatorName(kind), metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
	}
	for _, name := range []string{populators.UploadServerCASecret, populators.UploadProxyClientCASecret, populators.UploadProxyClientSecret} {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: installNamespace, Name: name}}
		if err := k8sClient.Delete(ctx, s); err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
	}

	// The CDIConfig singleton too: the controller must create it.
	deleteConfig(t)
	t.Cleanup(func() { deleteConfig(t) }) // after the manager has stopped

	ns := newNamespace(t)
	className := ns + "-csi"
	csiClass(t, className, "hostpath.csi.kubefill.test", storagev1.VolumeBindingImmediate, rwoFilesystem)
	// A class without a profile: the controller must create one.
	bare := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: ns + "-bare"}, Provisioner: "bare.csi.kubefill.test"}
	if err := k8sClient.Create(ctx, bare); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = k8sClient.Delete(context.Background(), bare)
		_ = k8sClient.Delete(context.Background(), &cdiv1.StorageProfile{ObjectMeta: metav1.ObjectMeta{Name: bare.Name}})
	})

	// The negative control first: the same manager with no RBAC creates nothing.
	t.Run("unbound ServiceAccount is refused", func(t *testing.T) {
		if !negative {
			t.Skip("run by TestInstallControllerRBAC")
		}
		rec := &forbiddenLog{}
		mgr, err := controller.NewManager(impersonating(unboundSA, rec), controller.ManagerOptions{
			MetricsBindAddress: "0", HealthProbeBindAddress: "0", WorkerImage: "kubefill/kubefill:latest",
			InstallNamespace: installNamespace, SkipNameValidation: true,
		})
		if err != nil {
			t.Fatal(err)
		}
		mctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- mgr.Start(mctx) }()
		defer func() { cancel(); <-done }()
		dv := kit.DataVolume(ns, "refused", kit.HTTP("http://images.test/refused.qcow2"), kit.WithStorage(className, "1Gi"))
		if err := k8sClient.Create(ctx, dv); err != nil {
			t.Fatal(err)
		}
		kit.Until(t, 20*time.Second, "kube-apiserver to refuse the unbound ServiceAccount", func() bool { return len(rec.list()) > 0 })
		time.Sleep(5 * time.Second)
		if err := k8sClient.Get(ctx, client2Key(dv), &corev1.PersistentVolumeClaim{}); !apierrors.IsNotFound(err) {
			t.Errorf("a manager without RBAC made the claim (err %v): the test could not detect missing RBAC", err)
		}
		if _, err := dyn.Resource(vpGVR).Get(ctx, populators.VolumePopulatorName(cdiv1.VolumeImportSourceRef), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("a manager without RBAC registered VolumePopulators (err %v)", err)
		}
		t.Logf("refused %d requests, e.g. %s", len(rec.list()), rec.list()[0])
		if err := k8sClient.Delete(ctx, dv); err != nil {
			t.Fatal(err)
		}
	})
	if t.Failed() {
		return
	}

	rec := &forbiddenLog{namespaces: []string{ns, installNamespace}}
	leaseID := "kubefill-install-test-" + ns
	proxyURL := "upload." + ns + ".example.test"
	mgr, err := controller.NewManager(impersonating(controllerSA, rec), controller.ManagerOptions{
		MetricsBindAddress: "0", HealthProbeBindAddress: "0",
		WorkerImage: "kubefill/kubefill:latest", WorkerPullPolicy: corev1.PullIfNotPresent,
		LeaderElection: true, LeaderElectionID: leaseID, LeaderElectionNS: installNamespace,
		InstallNamespace: installNamespace, UploadProxyURL: proxyURL, SkipNameValidation: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	startUntilCleanup(t, mgr)
	// Checked last, after every flow below has run.
	t.Cleanup(func() { assertNoForbidden(t, "the controller's ServiceAccount", rec) })

	lease := &coordinationv1.Lease{}
	kit.Until(t, 30*time.Second, "the leader-election lease", func() bool {
		return k8sClient.Get(ctx, types.NamespacedName{Namespace: installNamespace, Name: leaseID}, lease) == nil &&
			ptr.Deref(lease.Spec.HolderIdentity, "") != ""
	})
	for _, kind := range kinds {
		kit.Until(t, 20*time.Second, "VolumePopulator for "+kind, func() bool {
			_, err := dyn.Resource(vpGVR).Get(ctx, populators.VolumePopulatorName(kind), metav1.GetOptions{})
			return err == nil
		})
	}
	profile := &cdiv1.StorageProfile{}
	kit.Until(t, 20*time.Second, "the StorageProfile of a new class, with status", func() bool {
		return k8sClient.Get(ctx, types.NamespacedName{Name: bare.Name}, profile) == nil && ptr.Deref(profile.Status.Provisioner, "") == bare.Provisioner
	})
	kit.Until(t, 20*time.Second, "CDIConfig created, status.uploadProxyURL from --uploadproxy-url", func() bool {
		c := &cdiv1.CDIConfig{}
		return k8sClient.Get(ctx, types.NamespacedName{Name: cdiv1.CDIConfigName}, c) == nil &&
			ptr.Deref(c.Status.UploadProxyURL, "") == proxyURL
	})
	for _, name := range []string{populators.UploadServerCASecret, populators.UploadProxyClientCASecret, populators.UploadProxyClientSecret} {
		kit.Until(t, 30*time.Second, "Secret "+installNamespace+"/"+name+" made at start", func() bool {
			return k8sClient.Get(ctx, types.NamespacedName{Namespace: installNamespace, Name: name}, &corev1.Secret{}) == nil
		})
	}

	t.Run("import", func(t *testing.T) {
		dv := kit.DataVolume(ns, "imported", kit.HTTP("http://images.test/disk.qcow2"), kit.WithStorage(className, "1Gi"))
		if err := k8sClient.Create(ctx, dv); err != nil {
			t.Fatal(err)
		}
		target := claimNamingPrime(t, ns, dv.Name)
		if err := k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: controller.ImportSourceName(dv)}, &cdiv1.VolumeImportSource{}); err != nil {
			t.Fatalf("VolumeImportSource: %v", err)
		}
		primeName := populators.PrimeName(target)
		prime := &corev1.PersistentVolumeClaim{}
		if err := k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: primeName}, prime); err != nil {
			t.Fatalf("prime: %v", err)
		}
		podName := "importer-" + primeName
		kit.Until(t, 30*time.Second, "the importer pod", func() bool {
			return k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: podName}, &corev1.Pod{}) == nil
		})
		kit.Until(t, 30*time.Second, "DataVolume status ImportScheduled", func() bool {
			_ = k8sClient.Get(ctx, client2Key(dv), dv)
			return dv.Status.Phase == cdiv1.ImportScheduled
		})
		// A provisioner's complaint about the prime is copied to the claim:
		// the populator lists the prime's events.
		now := metav1.Now()
		ev := &corev1.Event{
			ObjectMeta:     metav1.ObjectMeta{Name: primeName + ".install-test", Namespace: ns},
			InvolvedObject: corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: ns, Name: primeName, UID: prime.UID},
			Type:           corev1.EventTypeWarning, Reason: "ProvisioningFailed", Message: "out of space",
			Source:         corev1.EventSource{Component: "hostpath.csi.kubefill.test_external-provisioner"},
			FirstTimestamp: now, LastTimestamp: now, Count: 1,
		}
		if err := k8sClient.Create(ctx, ev); err != nil {
			t.Fatal(err)
		}
		kit.Until(t, 40*time.Second, "the prime's event copied to the claim", func() bool {
			return eventReasons(t, ns, target.UID)["ProvisioningFailed"]
		})
		completeFill(t, target, podName)
		kit.Until(t, 20*time.Second, "the importer pod removed", func() bool {
			return gone(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: podName}})
		})
		kit.Until(t, 30*time.Second, "DataVolume status Succeeded", func() bool {
			_ = k8sClient.Get(ctx, client2Key(dv), dv)
			return dv.Status.Phase == cdiv1.Succeeded
		})
		reasons := eventReasons(t, ns, target.UID)
		for _, want := range []string{"PrimeCreated", "Rebind", "Populated"} {
			if !reasons[want] {
				t.Errorf("no %s event on the claim (events: %v)", want, reasons)
			}
		}
	})

	t.Run("upload", func(t *testing.T) {
		dv := kit.DataVolume(ns, "uploaded", kit.Upload(), kit.WithStorage(className, "1Gi"))
		if err := k8sClient.Create(ctx, dv); err != nil {
			t.Fatal(err)
		}
		target := claimNamingPrime(t, ns, dv.Name)
		if err := k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: controller.UploadSourceName(dv)}, &cdiv1.VolumeUploadSource{}); err != nil {
			t.Fatalf("VolumeUploadSource: %v", err)
		}
		primeName := populators.PrimeName(target)
		serving := types.NamespacedName{Namespace: ns, Name: "cdi-upload-" + primeName}
		pod := &corev1.Pod{}
		kit.Until(t, 30*time.Second, "the upload pod", func() bool { return k8sClient.Get(ctx, serving, pod) == nil })
		for _, obj := range []client.Object{&corev1.Service{}, &corev1.Secret{}} {
			if err := k8sClient.Get(ctx, serving, obj); err != nil {
				t.Fatalf("upload pod's %T: %v", obj, err)
			}
		}
		pod.Status.Phase = corev1.PodRunning
		pod.Status.PodIP = "127.0.0.1"
		pod.Status.PodIPs = []corev1.PodIP{{IP: "127.0.0.1"}}
		pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()}}
		if err := k8sClient.Status().Update(ctx, pod); err != nil {
			t.Fatal(err)
		}
		kit.Until(t, 30*time.Second, "DataVolume status UploadReady", func() bool {
			_ = k8sClient.Get(ctx, client2Key(dv), dv)
			return dv.Status.Phase == cdiv1.UploadReady
		})

		// The upload proxy finds the upload pod through the claim and its prime.
		resolve := func(sa string, rec *forbiddenLog) (uploadproxy.Endpoint, error) {
			kube := kubernetes.NewForConfigOrDie(impersonating(sa, rec))
			r := &uploadproxy.KubeResolver{Client: kube, Locator: uploadproxy.PodIPLocator{Client: kube, Port: contract.UploadServerPort}, Wait: 5 * time.Second}
			return r.Resolve(ctx, ns, target.Name)
		}
		proxyRec := &forbiddenLog{}
		ep, err := resolve(uploadproxySA, proxyRec)
		if err != nil {
			t.Errorf("resolver as %s: %v", uploadproxySA, err)
		} else if ep.URL != "https://127.0.0.1:8443" {
			t.Errorf("resolver as %s: endpoint %+v, want https://127.0.0.1:8443", uploadproxySA, ep)
		}
		assertNoForbidden(t, "the upload proxy's ServiceAccount", proxyRec)
		unboundRec := &forbiddenLog{}
		if _, err := resolve(unboundSA, unboundRec); !apierrors.IsForbidden(errors.Unwrap(err)) && !strings.Contains(fmt.Sprint(err), "forbidden") {
			t.Errorf("resolver without RBAC: error %v, want forbidden", err)
		}
		if len(unboundRec.list()) == 0 {
			t.Error("resolver without RBAC: kube-apiserver refused nothing")
		}

		completeFill(t, target, serving.Name)
		for _, obj := range []client.Object{&corev1.Pod{}, &corev1.Service{}, &corev1.Secret{}} {
			obj.SetNamespace(serving.Namespace)
			obj.SetName(serving.Name)
			kit.Until(t, 20*time.Second, fmt.Sprintf("the upload %T removed", obj), func() bool { return gone(ctx, obj) })
		}
		kit.Until(t, 30*time.Second, "DataVolume status Succeeded", func() bool {
			_ = k8sClient.Get(ctx, client2Key(dv), dv)
			return dv.Status.Phase == cdiv1.Succeeded
		})
	})

	// CDI's older flow (virtctl image-upload pvc): a bare annotated claim is
	// filled in place by an upload pod, then the pod and its Service and
	// Secret go.
	t.Run("upload target claim", func(t *testing.T) {
		pvc := kit.PVC(ns, "bare-upload", "1Gi", kit.Class(className), kit.Annotate(map[string]string{cdiv1.AnnUploadRequest: ""}))
		if err := k8sClient.Create(ctx, pvc); err != nil {
			t.Fatal(err)
		}
		serving := types.NamespacedName{Namespace: ns, Name: "cdi-upload-" + pvc.Name}
		pod := &corev1.Pod{}
		kit.Until(t, 30*time.Second, "the claim's upload pod", func() bool { return k8sClient.Get(ctx, serving, pod) == nil })
		for _, obj := range []client.Object{&corev1.Service{}, &corev1.Secret{}} {
			if err := k8sClient.Get(ctx, serving, obj); err != nil {
				t.Fatalf("upload pod's %T: %v", obj, err)
			}
		}
		pod.Status.Phase = corev1.PodSucceeded
		if err := k8sClient.Status().Update(ctx, pod); err != nil {
			t.Fatal(err)
		}
		for _, obj := range []client.Object{&corev1.Pod{}, &corev1.Service{}, &corev1.Secret{}} {
			obj.SetNamespace(serving.Namespace)
			obj.SetName(serving.Name)
			kit.Until(t, 20*time.Second, fmt.Sprintf("the upload %T removed", obj), func() bool { return gone(ctx, obj) })
		}
		kit.Until(t, 20*time.Second, "the claim marked Succeeded with an UploadSucceeded event", func() bool {
			_ = k8sClient.Get(ctx, client.ObjectKeyFromObject(pvc), pvc)
			return pvc.Annotations[cdiv1.AnnPodPhase] == string(corev1.PodSucceeded) && eventReasons(t, ns, pvc.UID)["UploadSucceeded"]
		})
	})
}

// TestInstallAPIServerRBAC runs apiserver.Run as the kubefill-apiserver
// ServiceAccount: it must read the authentication ConfigMap, make and rotate
// its signing key Secret, and serve the webhooks (a clone DataVolume through
// a DataSource: DataSource read, SubjectAccessReviews, the claim read).
func TestInstallAPIServerRBAC(t *testing.T) {
	applyInstall(t)
	ctx := context.Background()
	if err := k8sClient.Delete(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: installNamespace, Name: token.DefaultSigningKeySecretName}}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	t.Run("unbound ServiceAccount is refused", func(t *testing.T) {
		rec := &forbiddenLog{}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		stop, done := runAPIServerAs(unboundSA, rec, ln, "")
		select {
		case err := <-done:
			if err == nil {
				t.Error("apiserver.Run without RBAC returned nil")
			} else {
				t.Logf("apiserver.Run without RBAC: %v", err)
			}
		case <-time.After(30 * time.Second):
			_ = stop()
			t.Error("apiserver.Run without RBAC kept running for 30s")
		}
		if len(rec.list()) == 0 {
			t.Error("kube-apiserver refused nothing to the unbound ServiceAccount")
		}
	})
	if t.Failed() {
		return
	}

	rec := &forbiddenLog{}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hc, _ := startAPIServerAs(t, apiserverSA, rec, ln)
	base := "https://" + ln.Addr().String()
	secret := &corev1.Secret{}
	kit.Until(t, 30*time.Second, "the signing key rotated (Secret updated)", func() bool {
		return k8sClient.Get(ctx, types.NamespacedName{Namespace: installNamespace, Name: token.DefaultSigningKeySecretName}, secret) == nil &&
			len(secret.Data[token.SecretPreviousPublicKey]) > 0
	})

	// A clone through a DataSource, sent as kube-apiserver would send it.
	ns := newNamespace(t)
	src := kit.PVC(ns, "golden", "1Gi")
	ds := &cdiv1.DataSource{ObjectMeta: metav1.ObjectMeta{Name: "golden", Namespace: ns},
		Spec: cdiv1.DataSourceSpec{Source: cdiv1.DataSourceSource{PVC: &cdiv1.DataVolumeSourcePVC{Namespace: ns, Name: "golden"}}}}
	for _, o := range []client.Object{src, ds} {
		if err := k8sClient.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	dv := &cdiv1.DataVolume{
		TypeMeta:   metav1.TypeMeta{APIVersion: cdiv1.SchemeGroupVersion.String(), Kind: "DataVolume"},
		ObjectMeta: metav1.ObjectMeta{Name: "copy", Namespace: ns},
		Spec: cdiv1.DataVolumeSpec{
			SourceRef: &cdiv1.DataVolumeSourceRef{Kind: cdiv1.DataVolumeDataSource, Name: "golden"},
			Storage:   &cdiv1.StorageSpec{Resources: kit.Size("1Gi")},
		},
	}
	raw, err := json.Marshal(dv)
	if err != nil {
		t.Fatal(err)
	}
	review := func(path string) *admissionv1.AdmissionResponse {
		t.Helper()
		body, err := json.Marshal(admissionv1.AdmissionReview{
			TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
			Request: &admissionv1.AdmissionRequest{
				UID:       types.UID("install-test-" + strings.TrimPrefix(path, "/")),
				Kind:      metav1.GroupVersionKind{Group: cdiv1.GroupName, Version: "v1beta1", Kind: "DataVolume"},
				Resource:  metav1.GroupVersionResource{Group: cdiv1.GroupName, Version: "v1beta1", Resource: "datavolumes"},
				Namespace: ns, Name: dv.Name, Operation: admissionv1.Create,
				UserInfo: authenticationv1.UserInfo{Username: "kubefill-install-test-admin", Groups: []string{"system:masters", "system:authenticated"}},
				Object:   runtime.RawExtension{Raw: raw},
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		resp, err := hc.Post(base+path, "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatalf("POST %s: %v", path, err)
		}
		defer resp.Body.Close()
		var out admissionv1.AdmissionReview
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || out.Response == nil {
			t.Fatalf("POST %s: status %d, %v", path, resp.StatusCode, err)
		}
		return out.Response
	}
	if r := review(admission.PathDataVolumeMutate); !r.Allowed || len(r.Patch) == 0 || !strings.Contains(string(r.Patch), cdiv1.AnnCloneToken) {
		t.Errorf("mutating webhook: allowed %v, result %+v, patch %s; want the clone token added", r.Allowed, r.Result, r.Patch)
	}
	if r := review(admission.PathDataVolumeValidate); !r.Allowed {
		t.Errorf("validating webhook refused the clone: %+v", r.Result)
	}
	assertNoForbidden(t, "the apiserver's ServiceAccount", rec)
}

// runAPIServerAs runs apiserver.Run as ServiceAccount sa on ln, with a
// generated serving certificate whose CA goes to caFile (if set).
func runAPIServerAs(sa string, rec *forbiddenLog, ln net.Listener, caFile string) (stop func() error, done <-chan error) {
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan error, 1)
	go func() {
		ch <- apiserver.Run(ctx, impersonating(sa, rec), apiserver.RunOptions{
			Options:          apiserver.Options{Listener: ln, GeneratedHosts: []string{"127.0.0.1"}, GeneratedCAFile: caFile},
			InstallNamespace: installNamespace,
			SigningKeySecret: token.DefaultSigningKeySecretName,
			// Short lifetimes so that the key is rotated within the test.
			UploadTokenTTL: time.Second, CloneTokenTTL: time.Second, TokenLeeway: 0,
			SigningKeyMaxAge:  2 * time.Second,
			AuthConfigTimeout: 5 * time.Second,
		})
	}()
	return func() error {
		cancel()
		select {
		case err := <-ch:
			return err
		case <-time.After(10 * time.Second):
			return errors.New("apiserver.Run did not stop within 10s")
		}
	}, ch
}

// startAPIServerAs runs apiserver.Run as sa until the test ends and waits
// for /readyz; it returns a client trusting the CA written through
// --generated-ca-file, and that CA.
func startAPIServerAs(t *testing.T, sa string, rec *forbiddenLog, ln net.Listener) (*http.Client, []byte) {
	t.Helper()
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	stop, done := runAPIServerAs(sa, rec, ln, caFile)
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("apiserver.Run returned: %v", err)
		}
	})
	// --generated-ca-file is written before the server listens.
	var hc *http.Client
	var caPEM []byte
	kit.Until(t, 30*time.Second, "the generated CA file", func() bool {
		pem, err := os.ReadFile(caFile)
		if err != nil || len(pem) == 0 {
			return false
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return false
		}
		caPEM = pem
		hc = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"}}}
		return true
	})
	base := "https://" + ln.Addr().String()
	kit.Until(t, 60*time.Second, "/readyz (authentication ConfigMap and signing key loaded)", func() bool {
		select {
		case err := <-done:
			t.Fatalf("apiserver.Run exited: %v", err)
		default:
		}
		resp, err := hc.Get(base + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return hc, caPEM
}

// TestInstallAPIServerRBACTokenEndpoint: an UploadTokenRequest through the
// front proxy, served by apiserver.Run as kubefill-apiserver, on a control
// plane set up for aggregation (front-proxy CA): the caller is authorised by
// a SubjectAccessReview and the claim is read under the install's RBAC.
func TestInstallAPIServerRBACTokenEndpoint(t *testing.T) {
	e := startAggEnv(t)
	// The helpers reach the control plane through cfg and k8sClient.
	sharedCfg, sharedClient := cfg, k8sClient
	cfg, k8sClient = e.cfg, e.client
	t.Cleanup(func() { cfg, k8sClient = sharedCfg, sharedClient })
	if err := doApplyInstall(); err != nil {
		t.Fatal(err)
	}
	rec := &forbiddenLog{}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, caPEM := startAPIServerAs(t, apiserverSA, rec, ln)
	rs := &runningServer{addr: ln.Addr().String(), caPEM: caPEM, namespace: installNamespace, secret: token.DefaultSigningKeySecretName}

	ctx := context.Background()
	ns := e.namespace(t, "install-upload-")
	if err := e.client.Create(ctx, newClaim(ns, "target", map[string]string{cdiv1.AnnUploadRequest: ""})); err != nil {
		t.Fatal(err)
	}
	grantRole(t, e, ns, "alice", rbacv1.PolicyRule{APIGroups: []string{uploadv1.GroupName}, Resources: []string{"uploadtokenrequests"}, Verbs: []string{"create"}})
	as := map[string][]string{"X-Remote-User": {"alice"}, "X-Remote-Group": {"system:authenticated"}}
	if res := postToken(t, rs, &e.proxyCert, as, ns, "target"); res.status != http.StatusCreated {
		t.Errorf("UploadTokenRequest as alice: status %d: %s", res.status, res.body)
	}
	// Bob has no grant: the SubjectAccessReview the server makes says no.
	bob := map[string][]string{"X-Remote-User": {"bob"}, "X-Remote-Group": {"system:authenticated"}}
	if res := postToken(t, rs, &e.proxyCert, bob, ns, "target"); res.status != http.StatusForbidden {
		t.Errorf("UploadTokenRequest as bob: status %d, want 403: %s", res.status, res.body)
	}
	assertNoForbidden(t, "the apiserver's ServiceAccount", rec)
}
