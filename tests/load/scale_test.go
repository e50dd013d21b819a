package load

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/controller"
	"github.com/kubefill/kubefill/pkg/populators"
	"github.com/kubefill/kubefill/tests/kit"
)

const (
	// maxScaleRSS is the goal for the controller's peak RSS on a control
	// plane holding the scale objects.
	maxScaleRSS = 200 << 20
	// scaleNamespaces is how many namespaces the scale objects spread over.
	scaleNamespaces = 10
	// unscheduled is a scheduler no one runs: the scale pods stay Pending
	// and nothing (scheduler, kubelet) works on them.
	unscheduled = "kubefill-load-unscheduled"
)

// TestScale fills the control plane with PVCs, pods and StorageClasses that
// are none of Kubefill's business, then starts the controller and checks its
// peak RSS once it has synced (goal < 200 MiB), that it goes quiet, and that
// it still fills a claim with a dataSourceRef among them all. After
// TestDataVolumeLoad, its DataVolumes are still there, done: the quiet
// check covers a controller starting among finished DataVolumes too.
func TestScale(t *testing.T) {
	ctx := context.Background()
	fast := fastClient(t)
	begin := time.Now()
	namespaces := make([]string, scaleNamespaces)
	for i := range namespaces {
		namespaces[i] = fmt.Sprintf("load-scale-%d", i)
		if _, err := fast.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespaces[i]}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	for _, ns := range namespaces {
		if err := cl.WaitServiceAccount(ctx, ns); err != nil {
			t.Fatal(err)
		}
	}
	parallel(t, "StorageClasses", counts.Classes, func(i int) error {
		_, err := fast.StorageV1().StorageClasses().Create(ctx, unrelatedClass(i), metav1.CreateOptions{})
		return err
	})
	parallel(t, "PVCs", counts.PVCs, func(i int) error {
		_, err := fast.CoreV1().PersistentVolumeClaims(namespaces[i%scaleNamespaces]).Create(ctx, unrelatedClaim(i), metav1.CreateOptions{})
		return err
	})
	parallel(t, "pods", counts.Pods, func(i int) error {
		_, err := fast.CoreV1().Pods(namespaces[i%scaleNamespaces]).Create(ctx, unrelatedPod(i), metav1.CreateOptions{})
		return err
	})
	fmt.Printf("load: scale: created %d PVCs, %d pods, %d StorageClasses in %s\n",
		counts.PVCs, counts.Pods, counts.Classes, time.Since(begin).Round(time.Second))

	ctrl := startController(t)
	kc := kubefillClient(t)
	// Synced: it made a StorageProfile for every class (it has listed them
	// all), and its informers have started.
	kit.Eventually(t, 5*time.Minute, time.Second, "a StorageProfile for every StorageClass", func() (bool, string, error) {
		ctrl.alive(t)
		list := &cdiv1.StorageProfileList{}
		if err := kc.List(ctx, list); err != nil {
			return false, "", err
		}
		return len(list.Items) >= counts.Classes, fmt.Sprintf("%d StorageProfiles", len(list.Items)), nil
	})
	synced := time.Since(ctrl.started)
	syncRSS, syncPeak := ctrl.memory(t)
	t.Logf("at sync: RSS %.1f MiB, peak %.1f MiB; Go %s", mib(syncRSS), mib(syncPeak), ctrl.heap(t))
	fmt.Printf("load: scale: controller synced (a StorageProfile for each of the %d classes) %s after it started\n", counts.Classes, synced.Round(time.Second))

	// The last change is its start: it has had a minute to sync and settle.
	rate := ctrl.assertQuiet(t, "scale", ctrl.started)
	rss, peak := ctrl.memory(t)
	fmt.Printf("load: scale: controller RSS %.1f MiB, peak %.1f MiB with %d PVCs, %d pods, %d StorageClasses (goal < %d MiB); idle %.3f req/s; Go %s\n",
		mib(rss), mib(peak), counts.PVCs, counts.Pods, counts.Classes, maxScaleRSS>>20, rate, ctrl.heap(t))
	if peak >= maxScaleRSS {
		t.Errorf("the controller's peak RSS is %.1f MiB with %d PVCs, %d pods and %d StorageClasses; want < %d MiB",
			mib(peak), counts.PVCs, counts.Pods, counts.Classes, maxScaleRSS>>20)
	}

	// Among them all it still sees a claim to fill: a DataVolume's claim
	// gets its prime (no node here: it goes no further).
	dv := kit.DataVolume(namespaces[0], "probe", kit.Blank(), kit.WithPVC(kit.ClaimSpec("16Mi", kit.Class(unrelatedClass(0).Name))))
	if err := kc.Create(ctx, dv); err != nil {
		t.Fatal(err)
	}
	pvc := &corev1.PersistentVolumeClaim{}
	kit.Eventually(t, 2*time.Minute, 200*time.Millisecond, "the probe DataVolume's claim and its prime", func() (bool, string, error) {
		if err := kc.Get(ctx, client.ObjectKey{Namespace: dv.Namespace, Name: dv.Name}, pvc); err != nil {
			return false, "no claim yet", client.IgnoreNotFound(err)
		}
		prime := &corev1.PersistentVolumeClaim{}
		err := kc.Get(ctx, client.ObjectKey{Namespace: pvc.Namespace, Name: populators.PrimeName(pvc)}, prime)
		return err == nil, fmt.Sprintf("claim %s, no prime yet", pvc.Status.Phase), client.IgnoreNotFound(err)
	})
	if err := kc.Delete(ctx, dv); err != nil {
		t.Errorf("delete the probe DataVolume: %v", err)
	}
}

// fastClient is an admin clientset without client-side throttling, for
// creating the scale objects quickly.
func fastClient(t *testing.T) kubernetes.Interface {
	t.Helper()
	cfg := *cl.Config
	cfg.QPS, cfg.Burst = -1, 0
	c, err := kubernetes.NewForConfig(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// kubefillClient is an admin client that knows Kubefill's types.
func kubefillClient(t *testing.T) client.Client {
	t.Helper()
	c, err := client.New(cl.Config, client.Options{Scheme: controller.NewScheme()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// parallel runs create(0..n-1) over 16 workers and fails the test on the
// first error (AlreadyExists is fine: a rerun on a kept cluster).
func parallel(t *testing.T, what string, n int, create func(i int) error) {
	t.Helper()
	begin := time.Now()
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if err := create(i); err != nil && !apierrors.IsAlreadyExists(err) {
					errs <- fmt.Errorf("create %s #%d: %w", what, i, err)
					next.Store(int64(n)) // stop the others
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	t.Logf("created %d %s in %s", n, what, time.Since(begin).Round(time.Millisecond))
}

// unrelatedClass is a StorageClass of a provisioner no one runs.
func unrelatedClass(i int) *storagev1.StorageClass {
	return &storagev1.StorageClass{
		ObjectMeta:        metav1.ObjectMeta{Name: fmt.Sprintf("load-unrelated-%03d", i), Labels: map[string]string{"tier": fmt.Sprint(i % 4)}},
		Provisioner:       fmt.Sprintf("unrelated-%d.example.com", i%20),
		Parameters:        map[string]string{"type": "ssd", "replicas": fmt.Sprint(1 + i%3)},
		ReclaimPolicy:     ptr.To(corev1.PersistentVolumeReclaimDelete),
		VolumeBindingMode: ptr.To(storagev1.VolumeBindingImmediate),
	}
}

// unrelatedClaim is a claim bound to a PV that does not exist: it stays
// Pending and the PV controller only notes that, with no events to write.
func unrelatedClaim(i int) *corev1.PersistentVolumeClaim {
	pvc := kit.PVC("", fmt.Sprintf("data-%05d", i), "1Gi", kit.Class(fmt.Sprintf("load-unrelated-%03d", i%max(counts.Classes, 1))))
	pvc.Labels = map[string]string{"app": fmt.Sprintf("app-%d", i%50), "release": "load"}
	pvc.Annotations = map[string]string{"example.com/owner": "team-" + fmt.Sprint(i%7)}
	pvc.Spec.VolumeName = fmt.Sprintf("load-missing-%05d", i)
	return pvc
}

// unrelatedPod is a pod for a scheduler no one runs, mounting one of the
// unrelated claims of its namespace.
func unrelatedPod(i int) *corev1.Pod {
	claim := fmt.Sprintf("data-%05d", i%max(counts.PVCs, 1))
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:        fmt.Sprintf("app-%05d", i),
			Labels:      map[string]string{"app": fmt.Sprintf("app-%d", i%50), "release": "load", "pod-template-hash": "5d8f9c7b6"},
			Annotations: map[string]string{"example.com/revision": fmt.Sprint(i % 11)},
		},
		Spec: corev1.PodSpec{
			SchedulerName: unscheduled,
			Containers: []corev1.Container{{
				Name:    "app",
				Image:   "registry.example.com/team/app:1.2.3",
				Command: []string{"/app", "--serve", "--port=8080"},
				Env: []corev1.EnvVar{
					{Name: "MODE", Value: "production"},
					{Name: "REPLICA", Value: fmt.Sprint(i)},
					{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
				},
				Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}},
				Resources: corev1.ResourceRequirements{
					Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("16Mi")},
				},
				VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}},
			}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}},
		},
	}
}
