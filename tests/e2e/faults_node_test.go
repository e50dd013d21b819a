package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/datapath/testimg"
	"github.com/kubefill/kubefill/tests/cluster"
	"github.com/kubefill/kubefill/tests/kit"
)

// Faults of the real node's parts while an import runs: each import must
// end Succeeded with the source's bytes, with never more than one importer
// pod and one prime at once, and deleting the DataVolume afterwards must
// leave nothing behind.

// faultImageSize and faultRate make an import that lasts about 25 s (the
// throttle's 50 ms ticks let one 32 KiB write through each).
const (
	faultImageSize = 16 << 20
	faultRate      = 2 << 20
	faultDV        = "fault"
)

// TestKubeletRestartMidImport stops kubelet mid-import and starts it again
// with the same arguments: the importer container runs on under containerd
// and the import finishes.
func TestKubeletRestartMidImport(t *testing.T) {
	importThroughFault(t, func(t *testing.T, ctx context.Context, c client.Client, ns string) string {
		r, err := cl.Restart(ctx, "kubelet", 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return r.String()
	})
}

// TestContainerdRestartMidImport stops containerd mid-import and starts it
// again: the importer keeps running under its shim (or is restarted) and the
// import finishes.
func TestContainerdRestartMidImport(t *testing.T) {
	importThroughFault(t, func(t *testing.T, ctx context.Context, c client.Client, ns string) string {
		r, err := cl.Restart(ctx, "containerd", 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return r.String()
	})
}

// TestAPIServerRestartMidImport restarts kube-apiserver (same arguments,
// same etcd) mid-import: the controller's watches reconnect and the import
// finishes.
func TestAPIServerRestartMidImport(t *testing.T) {
	importThroughFault(t, func(t *testing.T, ctx context.Context, c client.Client, ns string) string {
		r, err := cl.Restart(ctx, "kube-apiserver", 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return r.String()
	})
}

// TestCSINodePluginRestartMidImport deletes the CSI driver's node plugin pod
// while the prime's volume is published to the importer; the DaemonSet makes
// a new one and the import finishes (and later unpublishes cleanly).
func TestCSINodePluginRestartMidImport(t *testing.T) {
	importThroughFault(t, func(t *testing.T, ctx context.Context, c client.Client, ns string) string {
		pod := runningImporter(t, c, ns)
		took, err := cl.RestartCSINodePlugin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got := runningImporter(t, c, ns); got.UID != pod.UID {
			t.Errorf("the importer pod changed from %s to %s while the node plugin restarted", pod.UID, got.UID)
		}
		return fmt.Sprintf("CSI node plugin restarted and registered again in %s while importer %s ran", took.Round(time.Millisecond), pod.Name)
	})
}

// TestImporterPodDeletedMidImport deletes the importer pod by hand: the
// controller makes a new one, which imports the whole image again.
func TestImporterPodDeletedMidImport(t *testing.T) {
	parallel(t)
	importThroughFault(t, func(t *testing.T, ctx context.Context, c client.Client, ns string) string {
		pod := runningImporter(t, c, ns)
		start := time.Now()
		if err := c.Delete(ctx, pod); err != nil {
			t.Fatal(err)
		}
		var next *corev1.Pod
		kit.Eventually(t, 2*time.Minute, 200*time.Millisecond, "a new importer pod after the delete", func() (bool, string, error) {
			pods := &corev1.PodList{}
			if err := c.List(ctx, pods, client.InNamespace(ns), client.MatchingLabels{cdiv1.LabelComponent: "importer"}); err != nil {
				return false, "", err
			}
			for i := range pods.Items {
				if p := &pods.Items[i]; p.UID != pod.UID && p.Status.Phase == corev1.PodRunning {
					next = p
					return true, "", nil
				}
			}
			return false, fmt.Sprintf("%d importer pods, none new and running", len(pods.Items)), nil
		})
		return fmt.Sprintf("importer %s (uid %s) deleted; new importer %s (uid %s) running %s later",
			pod.Name, pod.UID, next.Name, next.UID, time.Since(start).Round(time.Millisecond))
	})
}

// runningImporter waits for the namespace's one importer pod to run.
func runningImporter(t *testing.T, c client.Client, ns string) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	kit.Eventually(t, time.Minute, 200*time.Millisecond, "the importer pod to run", func() (bool, string, error) {
		pods := &corev1.PodList{}
		if err := c.List(context.Background(), pods, client.InNamespace(ns), client.MatchingLabels{cdiv1.LabelComponent: "importer"}); err != nil {
			return false, "", err
		}
		if len(pods.Items) != 1 || pods.Items[0].Status.Phase != corev1.PodRunning || pods.Items[0].DeletionTimestamp != nil {
			return false, fmt.Sprintf("%d importer pods", len(pods.Items)), nil
		}
		pod = &pods.Items[0]
		return true, "", nil
	})
	return pod
}

// importThroughFault starts a throttled import, injects a fault once it is
// in progress, and checks the import ends Succeeded with the right bytes,
// never ran two importers or two primes at once, and leaves nothing behind
// once the DataVolume is deleted.
func importThroughFault(t *testing.T, inject func(t *testing.T, ctx context.Context, c client.Client, ns string) string) {
	needRealNode(t)
	ctx := testContext(t, 8*time.Minute)
	c := shared.c
	ns := newNamespace(t)
	dir := t.TempDir()
	img := rawImage(t, dir, faultImageSize)
	want := testimg.FileSHA256(t, filepath.Join(dir, img))
	url := throttledServer(t, dir, faultRate) + "/" + img

	ww := watchWorkers(c, ns)
	defer ww.stop()
	created := time.Now()
	if err := c.Create(ctx, httpDV(ns, faultDV, url, cluster.StorageClassImmediate)); err != nil {
		t.Fatal(err)
	}
	dv, _ := kit.WaitDataVolume(t, c, ns, faultDV, 2*time.Minute, func(dv *cdiv1.DataVolume) bool { return dv.Status.Phase == cdiv1.ImportInProgress })
	faultAt := time.Now()
	t.Logf("import in progress %s after the create (progress %q); injecting the fault", faultAt.Sub(created).Round(time.Millisecond), dv.Status.Progress)
	t.Logf("fault: %s", inject(t, ctx, c, ns))
	injected := time.Since(faultAt)

	dv, seen := kit.WaitDataVolumeTerminal(t, c, ns, faultDV, 4*time.Minute)
	done := time.Now()
	ww.stop()
	cond := runningCondition(dv)
	w := ww.result()
	t.Logf("ended %s %s after the fault (fault itself took %s; import %s in all); phases %v; RestartCount %d; Running=%s %s: %q",
		dv.Status.Phase, done.Sub(faultAt).Round(time.Millisecond), injected.Round(time.Millisecond), done.Sub(created).Round(time.Millisecond),
		seen, dv.Status.RestartCount, cond.Status, cond.Reason, cond.Message)
	t.Logf("workers: importer pods seen %v; at most %d importer pods and %d primes at once; most importer container restarts %d; %d polls failed (API down)",
		w.podNames(), w.maxPods, w.maxPrimes, w.maxRestarts, w.errors)
	if dv.Status.Phase != cdiv1.Succeeded {
		t.Fatalf("the import ended %s after the fault: %s: %s\nevents:\n%s", dv.Status.Phase, cond.Reason, cond.Message, kit.Events(c, ns, faultDV))
	}
	if w.maxPods > 1 || w.maxPrimes > 1 {
		t.Errorf("duplicate workers at once: %d importer pods, %d primes", w.maxPods, w.maxPrimes)
	}
	// Every importer after the first, and every restart of its container,
	// is a restart the DataVolume counts; a replaced importer is explained.
	if want := int32(len(w.pods)-1) + w.maxRestarts; dv.Status.RestartCount != want {
		t.Errorf("RestartCount %d, but %d importer pods ran and their containers restarted %d times", dv.Status.RestartCount, len(w.pods), w.maxRestarts)
	}
	if ev := kit.Events(c, ns, faultDV); len(w.pods) > 1 && !strings.Contains(ev, "retrying") {
		t.Errorf("%d importer pods ran, but no event says the import is being retried:\n%s", len(w.pods), ev)
	}
	if got := claimSHA256(t, ns, faultDV, faultImageSize); got != want {
		t.Errorf("the claim holds sha256 %s, the source is %s", got, want)
	} else {
		t.Logf("sha256 of the claim's first %d bytes matches the source", faultImageSize)
	}
	// The reader pod holds the claim (pvc-protection) until it goes.
	reader := &corev1.Pod{}
	reader.Namespace, reader.Name = ns, "read-"+faultDV
	if err := c.Delete(ctx, reader); client.IgnoreNotFound(err) != nil {
		t.Fatal(err)
	}
	if ev := kit.Events(c, ns, faultDV); ev != "" {
		t.Logf("events of the DataVolume and its claim:\n%s", ev)
	}
	assertNoLeftovers(t, c, ns)
	deleteLeavesNothing(t, c, ns, faultDV, w.volumes)
}

// deleteLeavesNothing deletes a DataVolume and waits until nothing of it is
// left: no DataVolume (no finalizer holds it), claim, prime, pod, Service,
// Secret, PV bound to the namespace, or volume directory of the driver.
func deleteLeavesNothing(t *testing.T, c client.Client, ns, name string, volumes map[string]string) {
	t.Helper()
	ctx := context.Background()
	target := &corev1.PersistentVolumeClaim{}
	if err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, target); err != nil {
		t.Fatal(err)
	}
	pvs := map[string]string{}
	for pv, handle := range volumes {
		pvs[pv] = handle
	}
	if target.Spec.VolumeName != "" {
		pv := &corev1.PersistentVolume{}
		if err := c.Get(ctx, types.NamespacedName{Name: target.Spec.VolumeName}, pv); err != nil {
			t.Fatal(err)
		}
		if pv.Spec.CSI != nil {
			pvs[pv.Name] = pv.Spec.CSI.VolumeHandle
		}
	}
	dv := &cdiv1.DataVolume{}
	dv.Namespace, dv.Name = ns, name
	start := time.Now()
	if err := c.Delete(ctx, dv); err != nil {
		t.Fatal(err)
	}
	kit.Eventually(t, 2*time.Minute, 250*time.Millisecond, "nothing of the DataVolume left after its delete", func() (bool, string, error) {
		var left []string
		if err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, dv); err == nil {
			left = append(left, fmt.Sprintf("DataVolume (finalizers %v)", dv.Finalizers))
		} else if !apierrors.IsNotFound(err) {
			return false, "", err
		}
		claims := &corev1.PersistentVolumeClaimList{}
		pods := &corev1.PodList{}
		if err := c.List(ctx, claims, client.InNamespace(ns)); err != nil {
			return false, "", err
		}
		if err := c.List(ctx, pods, client.InNamespace(ns)); err != nil {
			return false, "", err
		}
		for _, p := range claims.Items {
			left = append(left, fmt.Sprintf("claim %s (finalizers %v)", p.Name, p.Finalizers))
		}
		for _, p := range pods.Items {
			left = append(left, fmt.Sprintf("pod %s %s", p.Name, p.Status.Phase))
		}
		services := &corev1.ServiceList{}
		secrets := &corev1.SecretList{}
		if err := c.List(ctx, services, client.InNamespace(ns)); err != nil {
			return false, "", err
		}
		if err := c.List(ctx, secrets, client.InNamespace(ns)); err != nil {
			return false, "", err
		}
		for _, s := range services.Items {
			left = append(left, "Service "+s.Name)
		}
		for _, s := range secrets.Items {
			left = append(left, "Secret "+s.Name)
		}
		all := &corev1.PersistentVolumeList{}
		if err := c.List(ctx, all); err != nil {
			return false, "", err
		}
		for _, pv := range all.Items {
			if _, ours := pvs[pv.Name]; ours || (pv.Spec.ClaimRef != nil && pv.Spec.ClaimRef.Namespace == ns) {
				left = append(left, fmt.Sprintf("PV %s %s (finalizers %v)", pv.Name, pv.Status.Phase, pv.Finalizers))
			}
		}
		for pv, handle := range pvs {
			if _, err := os.Stat(filepath.Join(cl.CSIDataDir(), "volumes", handle)); err == nil {
				left = append(left, "volume directory of "+pv)
			}
		}
		return len(left) == 0, fmt.Sprintf("left: %v", left), nil
	})
	t.Logf("deleted: DataVolume, claims, pods and %d PVs with their volumes gone %s after the delete (no Service or Secret either)", len(pvs), time.Since(start).Round(time.Millisecond))
}

// workerWatch polls a namespace in the background and records the most
// importer pods and primes that existed at once, every importer pod seen and
// the primes' volumes.
type workerWatch struct {
	mu          sync.Mutex
	maxPods     int
	maxPrimes   int
	maxRestarts int32
	errors      int
	pods        map[types.UID]string
	volumes     map[string]string // PV name -> CSI volume handle
	once        sync.Once
	cancel      context.CancelFunc
	done        chan struct{}
}

func watchWorkers(c client.Client, ns string) *workerWatch {
	ctx, cancel := context.WithCancel(context.Background())
	w := &workerWatch{pods: map[types.UID]string{}, volumes: map[string]string{}, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for ctx.Err() == nil {
			w.poll(ctx, c, ns)
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	return w
}

func (w *workerWatch) poll(ctx context.Context, c client.Client, ns string) {
	pods := &corev1.PodList{}
	claims := &corev1.PersistentVolumeClaimList{}
	err := c.List(ctx, pods, client.InNamespace(ns), client.MatchingLabels{cdiv1.LabelComponent: "importer"})
	if err == nil {
		err = c.List(ctx, claims, client.InNamespace(ns))
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if err != nil {
		if ctx.Err() == nil {
			w.errors++
		}
		return
	}
	w.maxPods = max(w.maxPods, len(pods.Items))
	for _, p := range pods.Items {
		w.pods[p.UID] = p.Name
		for _, cs := range p.Status.ContainerStatuses {
			w.maxRestarts = max(w.maxRestarts, cs.RestartCount)
		}
	}
	primes := 0
	for _, p := range claims.Items {
		if !strings.HasPrefix(p.Name, "prime-") {
			continue
		}
		primes++
		if p.Spec.VolumeName == "" {
			continue
		}
		if _, known := w.volumes[p.Spec.VolumeName]; known {
			continue
		}
		pv := &corev1.PersistentVolume{}
		if err := c.Get(ctx, types.NamespacedName{Name: p.Spec.VolumeName}, pv); err == nil && pv.Spec.CSI != nil {
			w.volumes[pv.Name] = pv.Spec.CSI.VolumeHandle
		}
	}
	w.maxPrimes = max(w.maxPrimes, primes)
}

func (w *workerWatch) stop() {
	w.once.Do(func() {
		w.cancel()
		<-w.done
	})
}

// result returns a copy of what the watch recorded.
func (w *workerWatch) result() *workerWatch {
	w.mu.Lock()
	defer w.mu.Unlock()
	r := &workerWatch{maxPods: w.maxPods, maxPrimes: w.maxPrimes, maxRestarts: w.maxRestarts, errors: w.errors,
		pods: map[types.UID]string{}, volumes: map[string]string{}}
	for k, v := range w.pods {
		r.pods[k] = v
	}
	for k, v := range w.volumes {
		r.volumes[k] = v
	}
	return r
}

func (w *workerWatch) podNames() []string {
	var out []string
	for uid, name := range w.pods {
		out = append(out, name+" ("+string(uid)+")")
	}
	sort.Strings(out)
	return out
}
