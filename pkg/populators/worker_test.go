package populators

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/contract"
)

func testScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(cdiv1.AddToScheme(s))
	return s
}

// testWorkload is the CDI resource's spec.workload of testFlow.
var testWorkload = cdiv1.NodePlacement{
	NodeSelector: map[string]string{"kubevirt.io/storage": "true"},
	Tolerations:  []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpEqual, Value: "virt", Effect: corev1.TaintEffectNoSchedule}},
	Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
		NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"a"}}}}}}}},
}

// testFlow is a target, its prime and a source in one namespace, with a
// CDIConfig that sets worker resources and pull secrets, a CDI resource
// with a workload placement, and a target on a Multus network.
func testFlow(t *testing.T, mode corev1.PersistentVolumeMode, source client.Object) (*Flow, client.Client) {
	t.Helper()
	target := claim(nil, map[string]string{cdiv1.AnnPriorityClassName: "high", cdiv1.AnnPodNetwork: "storage-net"})
	target.Spec.VolumeMode = &mode
	prime := NewPrime(target, "test")
	prime.UID = "p-1"
	config := &cdiv1.CDIConfig{ObjectMeta: metav1.ObjectMeta{Name: cdiv1.CDIConfigName}, Status: cdiv1.CDIConfigStatus{
		DefaultPodResourceRequirements: &corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("600M")}},
		ImagePullSecrets:               []corev1.LocalObjectReference{{Name: "mirror-pull"}}}}
	cdi := &cdiv1.CDI{ObjectMeta: metav1.ObjectMeta{Name: "cdi"}, Spec: cdiv1.CDISpec{Workloads: *testWorkload.DeepCopy()}}
	c := fake.NewClientBuilder().WithScheme(testScheme()).WithObjects(target, prime, config, cdi).Build()
	return &Flow{Target: target, Prime: prime, Source: source, Client: c, Kind: "test"}, c
}

func TestWorkerPodOfTheImporter(t *testing.T) {
	src := &cdiv1.VolumeImportSource{Spec: cdiv1.VolumeImportSourceSpec{Source: &cdiv1.ImportSourceType{HTTP: &cdiv1.DataVolumeSourceHTTP{
		URL: "https://x/disk.qcow2", CertConfigMap: "ca", SecretExtraHeaders: []string{"hdr"}}}}}
	for _, mode := range []corev1.PersistentVolumeMode{corev1.PersistentVolumeFilesystem, corev1.PersistentVolumeBlock} {
		f, c := testFlow(t, mode, src)
		kind := &ImportKind{Client: c, Image: "img:1", MetricsPort: 8443}
		w := kind.Plan()[1].(*WorkerPhase)
		res, err := w.Reconcile(context.Background(), f)
		if err != nil || res.Pod == nil || res.Pod.Phase != corev1.PodPending {
			t.Fatalf("%s: Reconcile = %+v, %v", mode, res, err)
		}
		pod := &corev1.Pod{}
		if err := c.Get(context.Background(), client.ObjectKey{Namespace: "vms", Name: "importer-prime-u-1"}, pod); err != nil {
			t.Fatalf("%s: importer pod: %v", mode, err)
		}
		// An http import has no scratch space until its importer asks for it.
		checkWorkerPod(t, pod, f, "importer", "importer", mode, "")
		env := map[string]string{}
		for _, e := range pod.Spec.Containers[0].Env {
			env[e.Name] = e.Value
		}
		if env[contract.EnvSource] != "http" || env[contract.EnvEndpoint] != "https://x/disk.qcow2" || env[contract.EnvOwnerUID] != "u-1" ||
			env[contract.EnvCertDir] != contract.CertDir || env[contract.EnvSecretExtraHeadersDir] != contract.SecretHeadersDir || env[contract.EnvImageSize] != "2Gi" {
			t.Errorf("%s: importer env %v", mode, env)
		}
		if a := strings.Join(pod.Spec.Containers[0].Args, " "); a != "--metrics-addr :8443" {
			t.Errorf("importer args %q", a)
		}
		mounts := mountsOf(pod)
		if mounts[contract.CertDir] != contract.CertVolumeName || mounts[contract.SecretHeadersDir+"/secret-0"] == "" {
			t.Errorf("%s: importer mounts %v", mode, mounts)
		}
		if got := parsePrimeState(f.Prime.Annotations).Attempts; got != 1 {
			t.Errorf("attempts %d after the first pod, want 1", got)
		}
	}
}

func TestWorkerPodOfTheUploadServer(t *testing.T) {
	f, c := testFlow(t, corev1.PersistentVolumeFilesystem, &cdiv1.VolumeUploadSource{})
	kind := &UploadKind{Client: c, Namespace: "kubefill", Image: "img:1"}
	if _, err := kind.worker().Reconcile(context.Background(), f); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{}
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: "vms", Name: "cdi-upload-prime-u-1"}, pod); err != nil {
		t.Fatalf("upload pod: %v", err)
	}
	checkWorkerPod(t, pod, f, "cdi-upload-server", "upload-server", corev1.PersistentVolumeFilesystem, "prime-u-1-scratch")
	if pod.Labels[LabelUploadTarget] != f.Prime.Name {
		t.Errorf("upload pod labels %v: want %s=%s for its Service", pod.Labels, LabelUploadTarget, f.Prime.Name)
	}
	if mountsOf(pod)[contract.UploadTLSDir] != contract.UploadTLSVolume {
		t.Errorf("upload pod mounts %v", mountsOf(pod))
	}
	if p := pod.Spec.Containers[0].ReadinessProbe; p == nil || p.HTTPGet.Path != "/healthz" {
		t.Errorf("readiness probe %+v", p)
	}
}

func mountsOf(pod *corev1.Pod) map[string]string {
	m := map[string]string{}
	for _, v := range pod.Spec.Containers[0].VolumeMounts {
		m[v.MountPath] = v.Name
	}
	return m
}

// checkWorkerPod checks what every worker pod shares, and that it mounts
// the scratch claim named scratch ("": no scratch space).
func checkWorkerPod(t *testing.T, pod *corev1.Pod, f *Flow, container, component string, mode corev1.PersistentVolumeMode, scratch string) {
	t.Helper()
	c := pod.Spec.Containers[0]
	if c.Name != container || c.Image != "img:1" || c.Command[0] != "kubefill" || c.Resources.Limits.Memory().String() != "600M" ||
		c.TerminationMessagePolicy != corev1.TerminationMessageReadFile {
		t.Errorf("container %s image %s command %v resources %v", c.Name, c.Image, c.Command, c.Resources)
	}
	mounts := mountsOf(pod)
	if mode == corev1.PersistentVolumeBlock {
		if len(c.VolumeDevices) != 1 || c.VolumeDevices[0].DevicePath != contract.BlockPath || mounts[contract.DataDir] != "" {
			t.Errorf("block data volume: devices %+v mounts %v", c.VolumeDevices, mounts)
		}
	} else if mounts[contract.DataDir] != contract.DataVolumeName || len(c.VolumeDevices) != 0 {
		t.Errorf("filesystem data volume: mounts %v", mounts)
	}
	if got := mounts[contract.ScratchDir]; (scratch != "") != (got == contract.ScratchVolumeName) {
		t.Errorf("scratch mount %q in %v, want scratch claim %q", got, mounts, scratch)
	}
	vols := map[string]corev1.Volume{}
	for _, v := range pod.Spec.Volumes {
		vols[v.Name] = v
	}
	if v := vols[contract.DataVolumeName]; v.PersistentVolumeClaim == nil || v.PersistentVolumeClaim.ClaimName != f.Prime.Name {
		t.Errorf("data volume %+v", v)
	}
	if v, ok := vols[contract.ScratchVolumeName]; ok != (scratch != "") || (ok && (v.PersistentVolumeClaim == nil || v.PersistentVolumeClaim.ClaimName != scratch)) {
		t.Errorf("scratch volume %+v, want claim %q", v, scratch)
	}
	if pod.Labels[cdiv1.LabelComponent] != component || pod.Labels[cdiv1.LabelOwnedByUID] != "u-1" || pod.Labels[cdiv1.LabelApp] != cdiv1.LabelAppValue ||
		pod.Labels[cdiv1.LabelAllowAccessClusterServices] != "true" {
		t.Errorf("labels %v", pod.Labels)
	}
	if !metav1.IsControlledBy(pod, f.Target) || pod.Annotations[annTargetName] != f.Target.Name {
		t.Errorf("owners %+v annotations %v: want the target", pod.OwnerReferences, pod.Annotations)
	}
	if pod.Spec.RestartPolicy != corev1.RestartPolicyNever || pod.Spec.PriorityClassName != "high" {
		t.Errorf("restart policy %s priority class %q", pod.Spec.RestartPolicy, pod.Spec.PriorityClassName)
	}
	if a := pod.Spec.AutomountServiceAccountToken; a == nil || *a {
		t.Errorf("automountServiceAccountToken %v, want false: a worker carries no ServiceAccount token", a)
	}
	got := cdiv1.NodePlacement{NodeSelector: pod.Spec.NodeSelector, Affinity: pod.Spec.Affinity, Tolerations: pod.Spec.Tolerations}
	if !equality.Semantic.DeepEqual(got, testWorkload) {
		t.Errorf("placement %+v, want the CDI resource's spec.workload %+v", got, testWorkload)
	}
	if len(pod.Spec.ImagePullSecrets) != 1 || pod.Spec.ImagePullSecrets[0].Name != "mirror-pull" {
		t.Errorf("imagePullSecrets %v, want CDIConfig's mirror-pull", pod.Spec.ImagePullSecrets)
	}
	if pod.Annotations[cdiv1.AnnPodNetwork] != "storage-net" || pod.Annotations[cdiv1.AnnPodSidecarInjectionIstio] != "false" ||
		pod.Annotations[cdiv1.AnnPodSidecarInjectionLinkerd] != "disabled" {
		t.Errorf("annotations %v: want the claim's network and the mesh opt-outs", pod.Annotations)
	}
}

// TestImporterProxyFromSecret: CDIConfig's import proxy reaches the
// importer through the worker's Secret (owned by the claim), never as a
// value in the pod's spec; a later pod without a proxy leaves no Secret,
// and the cleanup removes it.
func TestImporterProxyFromSecret(t *testing.T) {
	ctx := context.Background()
	src := &cdiv1.VolumeImportSource{Spec: cdiv1.VolumeImportSourceSpec{Source: &cdiv1.ImportSourceType{HTTP: &cdiv1.DataVolumeSourceHTTP{URL: "https://x/disk.qcow2"}}}}
	f, c := testFlow(t, corev1.PersistentVolumeFilesystem, src)
	config := &cdiv1.CDIConfig{}
	if err := c.Get(ctx, client.ObjectKey{Name: cdiv1.CDIConfigName}, config); err != nil {
		t.Fatal(err)
	}
	config.Status.ImportProxy = &cdiv1.ImportProxy{HTTPProxy: ptr.To("http://user:secret@proxy:3128"), HTTPSProxy: ptr.To("http://user:secret@proxy:3128"),
		NoProxy: ptr.To(".cluster.local"), TrustedCAProxy: ptr.To("")}
	if err := c.Update(ctx, config); err != nil {
		t.Fatal(err)
	}
	kind := &ImportKind{Client: c, Image: "img:1"}
	w := kind.Plan()[1].(*WorkerPhase)
	if _, err := w.Reconcile(ctx, f); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: "vms", Name: "importer-prime-u-1"}, pod); err != nil {
		t.Fatal(err)
	}
	secretName := WorkerSecretName(pod.Name)
	if secretName != "importer-prime-u-1-env" {
		t.Errorf("worker Secret %q", secretName)
	}
	refs := map[string]string{}
	for _, e := range pod.Spec.Containers[0].Env {
		if strings.Contains(e.Value, "secret") || strings.Contains(e.Value, "proxy:3128") {
			t.Errorf("env %s holds the proxy in the pod's spec: %q", e.Name, e.Value)
		}
		if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil && e.ValueFrom.SecretKeyRef.Name == secretName {
			refs[e.Name] = e.ValueFrom.SecretKeyRef.Key
		}
	}
	for _, env := range []string{contract.EnvHTTPProxy, contract.EnvHTTPSProxy, contract.EnvNoProxy} {
		if refs[env] != env {
			t.Errorf("env %s from %v, want key %s of Secret %s", env, refs, env, secretName)
		}
	}
	secret := &corev1.Secret{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: "vms", Name: secretName}, secret); err != nil {
		t.Fatal(err)
	}
	if string(secret.Data[contract.EnvHTTPSProxy]) != "http://user:secret@proxy:3128" || string(secret.Data[contract.EnvNoProxy]) != ".cluster.local" || len(secret.Data) != 3 {
		t.Errorf("Secret data %v", secret.Data)
	}
	if !metav1.IsControlledBy(secret, f.Target) || secret.Labels[cdiv1.LabelOwnedByUID] != "u-1" {
		t.Errorf("Secret owners %v labels %v, want the claim", secret.OwnerReferences, secret.Labels)
	}

	// The proxy is removed from CDIConfig; the next pod has none, and
	// neither does the Secret (it goes).
	config.Status.ImportProxy = &cdiv1.ImportProxy{HTTPProxy: ptr.To(""), HTTPSProxy: ptr.To(""), NoProxy: ptr.To("")}
	if err := c.Update(ctx, config); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, pod); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Reconcile(ctx, f); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, client.ObjectKey{Namespace: "vms", Name: secretName}, &corev1.Secret{}); !apierrors.IsNotFound(err) {
		t.Errorf("the worker Secret after the proxy was removed: %v, want it gone", err)
	}
	// A proxy again, then the cleanup: pod and Secret go.
	config.Status.ImportProxy = &cdiv1.ImportProxy{HTTPSProxy: ptr.To("http://p:1")}
	if err := c.Update(ctx, config); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "vms", Name: pod.Name}}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Reconcile(ctx, f); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, client.ObjectKey{Namespace: "vms", Name: secretName}, secret); err != nil || len(secret.Data) != 1 {
		t.Fatalf("the worker Secret with one proxy: %v %v", err, secret.Data)
	}
	// Another proxy for the next attempt: the Secret's data is replaced.
	config.Status.ImportProxy = &cdiv1.ImportProxy{HTTPProxy: ptr.To("http://q:2")}
	if err := c.Update(ctx, config); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "vms", Name: pod.Name}}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Reconcile(ctx, f); err != nil {
		t.Fatal(err)
	}
	secret = &corev1.Secret{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: "vms", Name: secretName}, secret); err != nil || len(secret.Data) != 1 || string(secret.Data[contract.EnvHTTPProxy]) != "http://q:2" {
		t.Fatalf("the worker Secret after the proxy changed: %v %v", err, secret.Data)
	}
	if err := w.Cleanup(ctx, f, false); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, client.ObjectKey{Namespace: "vms", Name: secretName}, &corev1.Secret{}); !apierrors.IsNotFound(err) {
		t.Errorf("the worker Secret after the cleanup: %v, want it gone", err)
	}
}

// TestWorkerRetries runs a worker through a failure, the backoff, a second
// pod and a permanent failure, as the kubelet would report them.
func TestWorkerRetries(t *testing.T) {
	ctx := context.Background()
	f, c := testFlow(t, corev1.PersistentVolumeFilesystem, &cdiv1.VolumeImportSource{Spec: cdiv1.VolumeImportSourceSpec{
		Source: &cdiv1.ImportSourceType{Blank: &cdiv1.DataVolumeBlankImage{}}}})
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	kind := &ImportKind{Client: c, MaxRetries: 3, Backoff: 10 * time.Second, Now: func() time.Time { return now }}
	w := kind.Plan()[1].(*WorkerPhase)
	key := client.ObjectKey{Namespace: "vms", Name: "importer-prime-u-1"}
	fail := func(msg string) {
		t.Helper()
		pod := &corev1.Pod{}
		if err := c.Get(ctx, key, pod); err != nil {
			t.Fatal(err)
		}
		pod.Status = terminated(1, msg).Status
		if err := c.Status().Update(ctx, pod); err != nil {
			t.Fatal(err)
		}
	}
	step := func(want string) Result {
		t.Helper()
		res, err := w.Reconcile(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		if got := res.Reason + ": " + res.Message; !strings.Contains(got, want) {
			t.Errorf("result %q (restarts %d), want %q", got, res.Pod.Restarts, want)
		}
		return res
	}
	step("Pending")
	fail(`{"outcome":"Failed","message":"connection reset"}`)
	if res := step("Retrying: attempt 1 failed: connection reset; retrying in 10s"); res.Pod.Restarts != 1 || res.RetryAfter != 10*time.Second {
		t.Errorf("retry: restarts %d, after %s", res.Pod.Restarts, res.RetryAfter)
	}
	if err := c.Get(ctx, key, &corev1.Pod{}); err == nil {
		t.Error("the failed pod was not removed")
	}
	if res := step("Backoff"); res.Pod.Restarts != 1 || res.RetryAfter != 10*time.Second {
		t.Errorf("backoff: restarts %d, after %s", res.Pod.Restarts, res.RetryAfter)
	}
	now = now.Add(11 * time.Second)
	if res := step("Pending"); res.Pod.Restarts != 1 {
		t.Errorf("second pod: restarts %d", res.Pod.Restarts)
	}
	fail(`{"outcome":"Failed","message":"checksum mismatch","permanent":true}`)
	if res := step("checksum mismatch"); !res.Permanent || res.Pod.Phase != corev1.PodFailed {
		t.Errorf("permanent failure: %+v", res)
	}
	if err := c.Get(ctx, key, &corev1.Pod{}); err != nil {
		t.Errorf("a permanently failed pod is kept for the user to read: %v", err)
	}
}

// TestWorkerPodLost: a worker pod deleted or evicted before any reconcile
// saw it fail is replaced, and the new attempt says why; a pod this phase
// replaced itself, with or without a backoff, is not called lost.
func TestWorkerPodLost(t *testing.T) {
	for _, backoff := range []time.Duration{0, 10 * time.Second} {
		ctx := context.Background()
		f, c := testFlow(t, corev1.PersistentVolumeFilesystem, &cdiv1.VolumeImportSource{Spec: cdiv1.VolumeImportSourceSpec{
			Source: &cdiv1.ImportSourceType{Blank: &cdiv1.DataVolumeBlankImage{}}}})
		now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
		kind := &ImportKind{Client: c, MaxRetries: 3, Backoff: backoff, Now: func() time.Time { return now }}
		w := kind.Plan()[1].(*WorkerPhase)
		key := client.ObjectKey{Namespace: "vms", Name: "importer-prime-u-1"}
		reconcile := func() Result {
			t.Helper()
			res, err := w.Reconcile(ctx, f)
			if err != nil {
				t.Fatal(err)
			}
			return res
		}
		if res := reconcile(); res.Reason != "Pending" || res.Event != "" {
			t.Fatalf("backoff %s: first pod: %+v", backoff, res)
		}
		if err := c.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}); err != nil {
			t.Fatal(err)
		}
		res := reconcile()
		want := "the importer pod of attempt 1 is gone before it finished (deleted or evicted); retrying with attempt 2"
		if res.Reason != ReasonRetrying || res.Message != want || res.Event != corev1.EventTypeWarning || res.Pod.Restarts != 1 {
			t.Errorf("backoff %s: after the delete: %+v (pod %+v), want Retrying %q, a Warning event, 1 restart", backoff, res, res.Pod, want)
		}
		if err := c.Get(ctx, key, &corev1.Pod{}); err != nil {
			t.Fatalf("backoff %s: no new pod: %v", backoff, err)
		}

		pod := &corev1.Pod{}
		if err := c.Get(ctx, key, pod); err != nil {
			t.Fatal(err)
		}
		pod.Status = terminated(1, `{"outcome":"Failed","message":"connection reset"}`).Status
		if err := c.Status().Update(ctx, pod); err != nil {
			t.Fatal(err)
		}
		if res := reconcile(); res.Reason != ReasonRetrying || !strings.Contains(res.Message, "attempt 2 failed: connection reset") {
			t.Errorf("backoff %s: failed pod: %s: %s", backoff, res.Reason, res.Message)
		}
		now = now.Add(time.Minute)
		if res := reconcile(); res.Reason != "Pending" || res.Event != "" || res.Pod.Restarts != 2 {
			t.Errorf("backoff %s: the pod this phase replaced was called %s: %q (event %q, restarts %d)", backoff, res.Reason, res.Message, res.Event, res.Pod.Restarts)
		}
	}
}
