package e2e

import (
	"context"
	"crypto/sha256"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/contract"
	"github.com/kubefill/kubefill/pkg/datapath/testimg"
	"github.com/kubefill/kubefill/tests/cluster"
	"github.com/kubefill/kubefill/tests/kit"
)

// throttledServer serves dir where pods can reach it, at about bytesPerSec,
// so that an import lasts long enough to watch.
func throttledServer(t *testing.T, dir string, bytesPerSec int) string {
	t.Helper()
	return serveDir(t, dir, bytesPerSec)
}

// serveDir serves dir over plain HTTP on the host, at the address pods
// reach it on (the node's), and nowhere else;
// bytesPerSec > 0 throttles responses.
func serveDir(t *testing.T, dir string, bytesPerSec int) string {
	t.Helper()
	gw, err := cl.GatewayAddress()
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(gw, "0"))
	if err != nil {
		t.Fatal(err)
	}
	var handler http.Handler = http.FileServer(http.Dir(dir))
	if bytesPerSec > 0 {
		files := handler
		handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			files.ServeHTTP(&slowWriter{ResponseWriter: w, perTick: bytesPerSec / 20}, r)
		})
	}
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "http://" + ln.Addr().String()
}

// slowWriter lets perTick bytes through every 50 ms.
type slowWriter struct {
	http.ResponseWriter
	perTick int
}

func (s *slowWriter) Write(p []byte) (int, error) {
	written := 0
	for len(p) > 0 {
		n := min(len(p), s.perTick)
		m, err := s.ResponseWriter.Write(p[:n])
		written += m
		if err != nil {
			return written, err
		}
		p = p[n:]
		time.Sleep(50 * time.Millisecond)
	}
	return written, nil
}

// rawImage writes a raw image of size bytes with data everywhere (so a
// throttled transfer takes size/rate) and returns its name.
func rawImage(t *testing.T, dir string, size int) string {
	t.Helper()
	buf := make([]byte, size)
	for i := range buf {
		buf[i] = byte(i*31 + i>>12)
	}
	if err := os.WriteFile(filepath.Join(dir, "disk.raw"), buf, 0o644); err != nil {
		t.Fatal(err)
	}
	return "disk.raw"
}

func httpDV(ns, name, url, class string) *cdiv1.DataVolume {
	return kit.DataVolume(ns, name, kit.HTTP(url), kit.WithPVC(kit.ClaimSpec("128Mi", kit.Class(class), kit.Mode(corev1.PersistentVolumeFilesystem))))
}

func runningCondition(dv *cdiv1.DataVolume) cdiv1.DataVolumeCondition {
	return kit.DataVolumeCondition(dv, cdiv1.DataVolumeRunning)
}

// TestDataVolumeWaitsForFirstConsumer: on a WaitForFirstConsumer class the DataVolume
// waits in PendingPopulation until a pod wants the claim; then it is filled
// on the chosen node and the consumer reads the image.
func TestDataVolumeWaitsForFirstConsumer(t *testing.T) {
	parallel(t)
	c := shared.c
	ns := newNamespace(t)
	dir := t.TempDir()
	name, virtualSize, want := testImage(t, dir)
	if err := c.Create(context.Background(), httpDV(ns, "wffc", imageServer(t, dir)+"/"+name, cluster.StorageClassWFFC)); err != nil {
		t.Fatal(err)
	}
	dv, _ := kit.WaitDataVolume(t, c, ns, "wffc", time.Minute, func(dv *cdiv1.DataVolume) bool { return dv.Status.Phase == cdiv1.PendingPopulation })
	time.Sleep(3 * time.Second) // nothing may start without a consumer
	if err := c.Get(context.Background(), client.ObjectKeyFromObject(dv), dv); err != nil {
		t.Fatal(err)
	}
	if dv.Status.Phase != cdiv1.PendingPopulation {
		t.Fatalf("without a consumer the DataVolume moved on to %s", dv.Status.Phase)
	}
	consumer := podWithClaim("consumer", "wffc", false, fmt.Sprintf("head -c %d /data/disk.img | sha256sum | cut -d' ' -f1 > /dev/termination-log", virtualSize))
	sum := strings.TrimSpace(runToCompletion(t, ns, consumer))
	dv, seen := kit.WaitDataVolume(t, c, ns, "wffc", time.Minute, func(dv *cdiv1.DataVolume) bool { return dv.Status.Phase == cdiv1.Succeeded })
	t.Logf("phases seen after the consumer came: %v", seen)
	if sum != want {
		t.Errorf("the consumer read sha256 %s, want %s", sum, want)
	}
	pvc := &corev1.PersistentVolumeClaim{}
	if err := c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: "wffc"}, pvc); err != nil {
		t.Fatal(err)
	}
	if pvc.Annotations[cdiv1.AnnSelectedNode] != cl.NodeName {
		t.Errorf("claim's selected node %q, want %q", pvc.Annotations[cdiv1.AnnSelectedNode], cl.NodeName)
	}
}

// TestHostileAndMissingSourcesFail: a 404 and a qcow2 whose backing file
// names a host path each end Failed with a message that says what to fix,
// an event, and no bound claim.
func TestHostileAndMissingSourcesFail(t *testing.T) {
	parallel(t)
	c := shared.c
	ns := newNamespace(t)
	dir := t.TempDir()
	testimg.QemuImg(t, "create", "-f", "qcow2", "-b", "/etc/hostname", "-F", "raw", filepath.Join(dir, "overlay.qcow2"), "64M")
	base := imageServer(t, dir)
	cases := []struct{ name, url, message string }{
		{"not-found", base + "/missing.qcow2", "404"},
		{"backing-file", base + "/overlay.qcow2", "backing"},
	}
	for _, tc := range cases {
		if err := c.Create(context.Background(), httpDV(ns, tc.name, tc.url, cluster.StorageClassImmediate)); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range cases {
		dv, seen := kit.WaitDataVolumeTerminal(t, c, ns, tc.name, 2*time.Minute)
		cond := runningCondition(dv)
		t.Logf("%s: phases %v; Running=%s %s: %s", tc.name, seen, cond.Status, cond.Reason, cond.Message)
		if dv.Status.Phase != cdiv1.Failed || !strings.Contains(strings.ToLower(cond.Message), tc.message) {
			t.Errorf("%s: ended %s with %q; want Failed mentioning %q", tc.name, dv.Status.Phase, cond.Message, tc.message)
		}
		pvc := &corev1.PersistentVolumeClaim{}
		if err := c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: tc.name}, pvc); err != nil {
			t.Fatal(err)
		}
		if pvc.Status.Phase == corev1.ClaimBound {
			t.Errorf("%s: the claim bound although the import failed", tc.name)
		}
		if ev := eventsFor(ns, tc.name); !strings.Contains(strings.ToLower(ev), tc.message) {
			t.Errorf("%s: no event mentions %q:\n%s", tc.name, tc.message, ev)
		}
	}
}

// TestProgressRisesMonotonically watches a throttled import: the
// DataVolume's progress takes at least three distinct values on the way,
// never goes down, and shows 100% only once it has succeeded.
func TestProgressRisesMonotonically(t *testing.T) {
	parallel(t)
	c := shared.c
	ns := newNamespace(t)
	dir := t.TempDir()
	name := rawImage(t, dir, 24<<20)
	if err := c.Create(context.Background(), httpDV(ns, "slow", throttledServer(t, dir, 2<<20)+"/"+name, cluster.StorageClassImmediate)); err != nil {
		t.Fatal(err)
	}
	var values []string
	dv, _ := kit.WaitDataVolume(t, c, ns, "slow", 3*time.Minute, func(dv *cdiv1.DataVolume) bool {
		p := string(dv.Status.Progress)
		if p != "" && p != "N/A" && (len(values) == 0 || values[len(values)-1] != p) {
			values = append(values, p)
			if p == "100.0%" && dv.Status.Phase != cdiv1.Succeeded {
				t.Errorf("progress shows 100%% in phase %s", dv.Status.Phase)
			}
		}
		return kit.Terminal(dv.Status.Phase)
	})
	t.Logf("progress values seen: %v", values)
	if dv.Status.Phase != cdiv1.Succeeded {
		t.Fatalf("ended %s", dv.Status.Phase)
	}
	var last float64 = -1
	for _, v := range values {
		var f float64
		if _, err := fmt.Sscanf(v, "%f%%", &f); err != nil {
			t.Fatalf("progress %q is not CDI's percentage form", v)
		}
		if f < last {
			t.Errorf("progress went down: %v", values)
		}
		last = f
	}
	if len(values) < 4 { // three distinct values on the way, then 100.0%
		t.Errorf("saw only %d progress values: %v", len(values), values)
	}
}

// TestControllerRestartMidImport stops the controller while an import runs
// and starts a new one: the import finishes, with one importer pod and one
// prime, never two. The controller is the test's own, limited to its own
// namespace, which the shared one leaves alone.
func TestControllerRestartMidImport(t *testing.T) {
	parallel(t)
	ns := createOwnNamespace(t, ownNamespaces(t.Name())[0], nil)
	dir := t.TempDir()
	name := rawImage(t, dir, 16<<20)
	url := throttledServer(t, dir, 2<<20) + "/" + name

	first, stopFirst := startManager(t, inNamespaces(ns))
	if err := first.Create(context.Background(), httpDV(ns, "restart", url, cluster.StorageClassImmediate)); err != nil {
		t.Fatal(err)
	}
	kit.WaitDataVolume(t, first, ns, "restart", 2*time.Minute, func(dv *cdiv1.DataVolume) bool { return dv.Status.Phase == cdiv1.ImportInProgress })
	stopFirst()
	t.Log("controller stopped mid-import; starting a new one")
	second, _ := startManager(t, inNamespaces(ns))

	var maxPods, maxPrimes int
	dv, seen := kit.WaitDataVolume(t, second, ns, "restart", 3*time.Minute, func(dv *cdiv1.DataVolume) bool {
		pods, primes := countWorkers(t, second, ns)
		maxPods, maxPrimes = max(maxPods, pods), max(maxPrimes, primes)
		return kit.Terminal(dv.Status.Phase)
	})
	t.Logf("phases %v; at most %d importer pods and %d primes at once", seen, maxPods, maxPrimes)
	if dv.Status.Phase != cdiv1.Succeeded || dv.Status.RestartCount != 0 {
		t.Errorf("ended %s with %d restarts", dv.Status.Phase, dv.Status.RestartCount)
	}
	if maxPods > 1 || maxPrimes > 1 {
		t.Errorf("duplicate workers: %d pods, %d primes", maxPods, maxPrimes)
	}
}

// TestTwentyDataVolumesInParallel imports twenty images at once and prints
// the wall time and this process's peak memory (controllers included).
func TestTwentyDataVolumesInParallel(t *testing.T) {
	parallel(t)
	c := shared.c
	ns := newNamespace(t)
	dir := t.TempDir()
	name, _, _ := testImage(t, dir)
	url := imageServer(t, dir) + "/" + name
	start := time.Now()
	for i := range 20 {
		if err := c.Create(context.Background(), httpDV(ns, fmt.Sprintf("dv-%02d", i), url, cluster.StorageClassImmediate)); err != nil {
			t.Fatal(err)
		}
	}
	dvs := make([]*cdiv1.DataVolume, 20)
	kit.Eventually(t, 5*time.Minute, 500*time.Millisecond, "all 20 DataVolumes to end", func() (bool, string, error) {
		var running []string
		for i := range dvs {
			dv := &cdiv1.DataVolume{}
			if err := c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: fmt.Sprintf("dv-%02d", i)}, dv); err != nil {
				return false, "", err
			}
			dvs[i] = dv
			if !kit.Terminal(dv.Status.Phase) {
				running = append(running, fmt.Sprintf("%s %s (%s)", dv.Name, dv.Status.Phase, runningCondition(dv).Message))
			}
		}
		return len(running) == 0, fmt.Sprintf("not ended: %v", running), nil
	})
	for _, dv := range dvs {
		if dv.Status.Phase != cdiv1.Succeeded {
			t.Errorf("%s ended %s (%s)", dv.Name, dv.Status.Phase, runningCondition(dv).Message)
		}
	}
	t.Logf("20 DataVolumes imported in %s; test process (controllers in it) peak RSS %s", time.Since(start).Round(time.Millisecond), peakRSS())
}

func countWorkers(t *testing.T, c client.Client, ns string) (pods, primes int) {
	t.Helper()
	podList := &corev1.PodList{}
	if err := c.List(context.Background(), podList, client.InNamespace(ns), client.MatchingLabels{cdiv1.LabelComponent: "importer"}); err != nil {
		t.Fatal(err)
	}
	claims := &corev1.PersistentVolumeClaimList{}
	if err := c.List(context.Background(), claims, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	for _, p := range claims.Items {
		if strings.HasPrefix(p.Name, "prime-") {
			primes++
		}
	}
	return len(podList.Items), primes
}

// peakRSS reads this process's peak resident set size (VmHWM).
func peakRSS() string {
	if v := processPeakRSS(os.Getpid()); v > 0 {
		return fmt.Sprintf("%.1f MiB", float64(v)/(1<<20))
	}
	return "unknown"
}

// TestStorageSpecCompletedFromProfile: a blank DataVolume that gives only a
// size gets its access modes and volume mode from the class's
// StorageProfile, and its request grows by the filesystem overhead.
func TestStorageSpecCompletedFromProfile(t *testing.T) {
	parallel(t)
	c := shared.c
	ns := newNamespace(t)
	dv := kit.DataVolume(ns, "blank", kit.Blank(), kit.WithStorage(cluster.StorageClassImmediate, "64Mi"))
	if err := c.Create(context.Background(), dv); err != nil {
		t.Fatal(err)
	}
	dv, seen := kit.WaitDataVolumeTerminal(t, c, ns, "blank", 2*time.Minute)
	t.Logf("phases %v", seen)
	if dv.Status.Phase != cdiv1.Succeeded {
		t.Fatalf("blank DataVolume ended %s: %+v", dv.Status.Phase, runningCondition(dv))
	}
	pvc := &corev1.PersistentVolumeClaim{}
	if err := c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: "blank"}, pvc); err != nil {
		t.Fatal(err)
	}
	req := pvc.Spec.Resources.Requests[corev1.ResourceStorage]
	t.Logf("claim: %v %s %s", pvc.Spec.AccessModes, *pvc.Spec.VolumeMode, req.String())
	if len(pvc.Spec.AccessModes) != 1 || pvc.Spec.AccessModes[0] != corev1.ReadWriteOnce || *pvc.Spec.VolumeMode != corev1.PersistentVolumeFilesystem {
		t.Errorf("claim not completed from the profile: %v %s", pvc.Spec.AccessModes, *pvc.Spec.VolumeMode)
	}
	if req.Value() <= 64<<20 {
		t.Errorf("request %s was not grown by the filesystem overhead", req.String())
	}
	size := strings.TrimSpace(runToCompletion(t, ns, podWithClaim("size", "blank", false, "stat -c %s /data/disk.img > /dev/termination-log")))
	t.Logf("blank disk.img is %s bytes", size)
	if size == "0" || size == "" {
		t.Errorf("blank image has size %q", size)
	}
}

// TestVmdkImportThroughScratch imports a vmdk, which goes through the
// importer's scratch space and qemu-img, and checks the bytes.
func TestVmdkImportThroughScratch(t *testing.T) {
	parallel(t)
	c := shared.c
	ns := newNamespace(t)
	dir := t.TempDir()
	name, virtualSize, want := testImage(t, dir)
	testimg.QemuImg(t, "convert", "-f", "qcow2", "-O", "vmdk", filepath.Join(dir, name), filepath.Join(dir, "disk.vmdk"))
	if err := c.Create(context.Background(), httpDV(ns, "vmdk", imageServer(t, dir)+"/disk.vmdk", cluster.StorageClassImmediate)); err != nil {
		t.Fatal(err)
	}
	dv, seen := kit.WaitDataVolumeTerminal(t, c, ns, "vmdk", 3*time.Minute)
	t.Logf("phases %v", seen)
	if dv.Status.Phase != cdiv1.Succeeded {
		t.Fatalf("vmdk import ended %s: %+v", dv.Status.Phase, runningCondition(dv))
	}
	if got := claimSHA256(t, ns, "vmdk", virtualSize); got != want {
		t.Errorf("claim holds sha256 %s, qemu-img convert gives %s", got, want)
	}
}

// TestVmdkImportThroughScratchClaim: a vmdk larger than the importer's
// ephemeral-storage limit (a LimitRange in the namespace gives every
// container 16Mi) is imported with the right bytes: the importer reports
// that the image needs scratch space, starts again with a scratch claim
// <prime>-scratch, which takes the spooled copy off the node's ephemeral
// storage, and the claim is gone afterwards with the prime and the
// importer. A pod spooling as much to an emptyDir under the same limit is
// evicted: that is what the scratch claim spares the import.
func TestVmdkImportThroughScratchClaim(t *testing.T) {
	parallel(t)
	c := shared.c
	ctx := context.Background()
	ns := newNamespace(t)
	const imageSize = 48 << 20
	limit := resource.MustParse("16Mi")
	lr := &corev1.LimitRange{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "small-ephemeral"}, Spec: corev1.LimitRangeSpec{
		Limits: []corev1.LimitRangeItem{{Type: corev1.LimitTypeContainer,
			Default: corev1.ResourceList{corev1.ResourceEphemeralStorage: limit}, DefaultRequest: corev1.ResourceList{corev1.ResourceEphemeralStorage: limit}}}}}
	if err := c.Create(ctx, lr); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	raw := rawImage(t, dir, imageSize)
	testimg.QemuImg(t, "convert", "-f", "raw", "-O", "vmdk", filepath.Join(dir, raw), filepath.Join(dir, "disk.vmdk"))
	rawBytes, err := os.ReadFile(filepath.Join(dir, raw))
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("%x", sha256.Sum256(rawBytes))
	tracker := trackTemporaries(t, c, ns)
	// About 20 s of spooling: long enough for the kubelet's eviction
	// manager to see an emptyDir over the limit.
	url := throttledServer(t, dir, 2<<20) + "/disk.vmdk"
	if err := c.Create(ctx, httpDV(ns, "vmdk", url, cluster.StorageClassImmediate)); err != nil {
		t.Fatal(err)
	}

	// The control: the same bytes, at the same pace, into an emptyDir.
	control := podWithClaim("emptydir-spool", "unused", false, fmt.Sprintf("wget -q -O - %s > /spool/disk.vmdk; sleep 30", url))
	control.Spec.Volumes = []corev1.Volume{{Name: "vol", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	control.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "vol", MountPath: "/spool"}}
	createPod(t, ns, control)

	dv, seen := kit.WaitDataVolumeTerminal(t, c, ns, "vmdk", 5*time.Minute)
	t.Logf("phases %v", seen)
	if dv.Status.Phase != cdiv1.Succeeded {
		t.Fatalf("vmdk import ended %s: %+v; events: %s", dv.Status.Phase, runningCondition(dv), kit.Events(c, ns, "vmdk"))
	}
	if got := claimSHA256(t, ns, "vmdk", imageSize); got != want {
		t.Errorf("claim holds sha256 %s, the raw image has %s", got, want)
	}
	assertNoLeftovers(t, c, ns)

	target := &corev1.PersistentVolumeClaim{}
	if err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: "vmdk"}, target); err != nil {
		t.Fatal(err)
	}
	scratchSeen := false
	for _, tmp := range kit.Temporaries(tracker.Events(), target.UID) {
		t.Logf("temporary %s: made %d, at most %d at once", tmp.Role, tmp.Made, tmp.MostAtOnce)
		if tmp.Role == "claim prime-<uid>-scratch" {
			scratchSeen = tmp.Made == 1
		}
	}
	if !scratchSeen {
		t.Errorf("no single scratch claim prime-<uid>-scratch was seen; events: %s", kit.Events(c, ns, "vmdk"))
	}
	if ev := kit.Events(c, ns, "vmdk"); !strings.Contains(ev, "ScratchSpaceCreated") {
		t.Errorf("no ScratchSpaceCreated event on the claim: %s", ev)
	}

	evicted := waitPod(t, ns, "emptydir-spool", 2*time.Minute, "the emptyDir control pod to be evicted", func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded
	})
	if evicted.Status.Reason != "Evicted" {
		t.Errorf("the control pod that spooled %d bytes to an emptyDir under a %s limit ended %s (%s: %s), not evicted",
			imageSize, limit.String(), evicted.Status.Phase, evicted.Status.Reason, evicted.Status.Message)
	}
}

// deleteBound is how long deleting a DataVolume mid-import may take until
// its claim, prime, importer pod and volume are all gone. The importer stops
// on SIGTERM in milliseconds, so this is API and controller latency only;
// the importer waiting out its 30 s grace period would exceed it.
const deleteBound = 20 * time.Second

// TestDeleteMidImportLeaksNothing deletes a DataVolume while its import
// runs: the claim, the prime, the importer pod and the prime's volume all go,
// promptly, and the interrupted importer reports failure, not success.
func TestDeleteMidImportLeaksNothing(t *testing.T) {
	parallel(t)
	c := shared.c
	ns := newNamespace(t)
	dir := t.TempDir()
	name := rawImage(t, dir, 16<<20)
	dv := httpDV(ns, "doomed", throttledServer(t, dir, 1<<20)+"/"+name, cluster.StorageClassImmediate)
	if err := c.Create(context.Background(), dv); err != nil {
		t.Fatal(err)
	}
	kit.WaitDataVolume(t, c, ns, "doomed", 2*time.Minute, func(dv *cdiv1.DataVolume) bool { return dv.Status.Phase == cdiv1.ImportInProgress })
	target := &corev1.PersistentVolumeClaim{}
	if err := c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: "doomed"}, target); err != nil {
		t.Fatal(err)
	}
	prime := &corev1.PersistentVolumeClaim{}
	if err := c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: target.Annotations[cdiv1.AnnPVCPrimeName]}, prime); err != nil {
		t.Fatalf("reading the prime mid-import: %v", err)
	}
	volume := prime.Spec.VolumeName
	if volume == "" {
		t.Fatal("the prime has no volume mid-import")
	}
	// kubelet publishes the importer's final status before the pod is
	// removed; a watch sees it.
	w, err := cl.Client.CoreV1().Pods(ns).Watch(context.Background(), metav1.ListOptions{LabelSelector: cdiv1.LabelComponent + "=importer"})
	if err != nil {
		t.Fatal(err)
	}
	var final *corev1.ContainerStateTerminated
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for ev := range w.ResultChan() {
			if pod, ok := ev.Object.(*corev1.Pod); ok {
				for _, st := range pod.Status.ContainerStatuses {
					if st.Name == "importer" && st.State.Terminated != nil {
						final = st.State.Terminated
					}
				}
			}
		}
	}()

	if err := c.Delete(context.Background(), dv); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	// Each piece is logged when it goes, so a slow delete shows which
	// piece held it up.
	gone := map[string]time.Duration{}
	note := func(what string, present bool) {
		if _, seen := gone[what]; !seen && !present {
			gone[what] = time.Since(start).Round(time.Millisecond)
			t.Logf("%s gone %s after the delete", what, gone[what])
		}
	}
	kit.Eventually(t, 2*time.Minute, 250*time.Millisecond, "the claim, prime, importer and volume to go after the delete", func() (bool, string, error) {
		pods, primes := countWorkers(t, c, ns)
		claims := &corev1.PersistentVolumeClaimList{}
		if err := c.List(context.Background(), claims, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		pv := &corev1.PersistentVolume{}
		pvErr := c.Get(context.Background(), types.NamespacedName{Name: volume}, pv)
		note("importer pod", pods > 0)
		note("prime", primes > 0)
		note("claims", len(claims.Items) > 0)
		note("volume "+volume, pvErr == nil)
		return pods == 0 && primes == 0 && len(claims.Items) == 0 && apierrors.IsNotFound(pvErr),
			fmt.Sprintf("left after deleting mid-import: %d pods, %d primes, %d claims, volume %s present=%v", pods, primes, len(claims.Items), volume, pvErr == nil), nil
	})
	took := time.Since(start)
	t.Logf("claim, prime, importer and volume %s gone %s after the delete", volume, took.Round(time.Millisecond))
	if took > deleteBound {
		t.Errorf("deleting mid-import took %s, more than %s", took.Round(time.Millisecond), deleteBound)
	}

	w.Stop()
	<-watched
	switch {
	case final == nil:
		t.Log("the importer's final status was not seen before its pod went")
	case final.ExitCode == 0 || strings.Contains(final.Message, contract.OutcomeSucceeded) || strings.Contains(final.Message, contract.MessageImportComplete):
		t.Errorf("the interrupted importer ended as a success: exit %d, %q", final.ExitCode, final.Message)
	default:
		t.Logf("the importer exited %d: %s", final.ExitCode, final.Message)
	}
}
