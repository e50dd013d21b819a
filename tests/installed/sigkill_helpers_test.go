package installed

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	snapshotv1 "github.com/kubernetes-csi/external-snapshotter/client/v6/apis/volumesnapshot/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/controller"
	"github.com/kubefill/kubefill/tests/cluster"
	"github.com/kubefill/kubefill/tests/csi/hostpath"
	"github.com/kubefill/kubefill/tests/kit"
)

const (
	// controllerLease is the installed controller's leader-election lease
	// (cmd/kubefill/controller.go).
	controllerLease = "kubefill-controller.cdi.kubevirt.io"
	// sigkillExit is a container's exit code after SIGKILL (128+9).
	sigkillExit = 137
	// cloningProtection is external-provisioner's finalizer on a CSI clone's
	// source while a clone of it is provisioned.
	cloningProtection = "provisioner.storage.kubernetes.io/cloning-protection"
)

// snapClient is kc with the snapshot API in its scheme.
func snapClient(t *testing.T) client.WithWatch {
	t.Helper()
	// controller-runtime's client logs nothing the test needs.
	ctrllog.SetLogger(logr.Discard())
	scheme := controller.NewScheme()
	if err := snapshotv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	c, err := client.NewWithWatch(cl.Config, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func randomSuffix() string {
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// testNamespace creates a namespace deleted after the test.
func testNamespace(t *testing.T, prefix string) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: prefix + "-" + randomSuffix()}}
	if err := kc.Create(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = kc.Delete(context.Background(), ns) })
	return ns.Name
}

// controllerContainer is the installed controller's container as its pod's
// status shows it.
type controllerContainer struct {
	pod      string
	id       string
	restarts int32
	// lastExit is the exit code of the container's previous run (-1: none).
	lastExit int32
	ready    bool
}

// controllerPod reads the controller Deployment's one live pod.
func controllerPod(ctx context.Context) (controllerContainer, error) {
	pods := &corev1.PodList{}
	if err := kc.List(ctx, pods, client.InNamespace(installNS), client.MatchingLabels{
		"app.kubernetes.io/name": "kubefill", "app.kubernetes.io/component": "controller"}); err != nil {
		return controllerContainer{}, err
	}
	var live []corev1.Pod
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil {
			live = append(live, p)
		}
	}
	if len(live) != 1 {
		return controllerContainer{}, fmt.Errorf("%d live controller pods", len(live))
	}
	p := live[0]
	for _, s := range p.Status.ContainerStatuses {
		if s.Name != "controller" {
			continue
		}
		c := controllerContainer{pod: p.Name, id: s.ContainerID, restarts: s.RestartCount, lastExit: -1, ready: s.Ready && s.State.Running != nil}
		if term := s.LastTerminationState.Terminated; term != nil {
			c.lastExit = term.ExitCode
		}
		return c, nil
	}
	return controllerContainer{}, fmt.Errorf("pod %s has no controller container status", p.Name)
}

// leaseHolder is the controller lease's holder identity.
func leaseHolder(ctx context.Context) string {
	l := &coordinationv1.Lease{}
	if err := kc.Get(ctx, types.NamespacedName{Namespace: installNS, Name: controllerLease}, l); err != nil {
		return ""
	}
	return ptr.Deref(l.Spec.HolderIdentity, "")
}

// readyController waits until the controller's container runs, is ready
// and holds the lease, and returns it.
func readyController(t *testing.T) controllerContainer {
	t.Helper()
	var c controllerContainer
	kit.Eventually(t, 3*time.Minute, 250*time.Millisecond, "the installed controller to be ready and lead", func() (bool, string, error) {
		var err error
		if c, err = controllerPod(context.Background()); err != nil {
			return false, err.Error(), nil
		}
		return c.ready && leaseHolder(context.Background()) != "", fmt.Sprintf("%+v", c), nil
	})
	return c
}

// freshController waits for the controller to be ready and returns it,
// first replacing its pod when the container has restarted: kubelet's
// crash-loop back-off (10 s, 20 s, 40 s, … for each restart in the same
// pod) would otherwise stretch the next kill's downtime, so each kill
// starts from a pod that never restarted. The Deployment makes the new pod.
func freshController(t *testing.T) controllerContainer {
	t.Helper()
	ctx := context.Background()
	old := readyController(t)
	if old.restarts == 0 {
		return old
	}
	began := time.Now()
	if err := kc.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: installNS, Name: old.pod}}); err != nil {
		t.Fatal(err)
	}
	var c controllerContainer
	kit.Eventually(t, 3*time.Minute, 250*time.Millisecond, "a new controller pod to be ready and lead", func() (bool, string, error) {
		var err error
		if c, err = controllerPod(ctx); err != nil {
			return false, err.Error(), nil
		}
		h := leaseHolder(ctx)
		return c.pod != old.pod && c.ready && strings.HasPrefix(h, c.pod+"_"), fmt.Sprintf("%+v, lease held by %q", c, h), nil
	})
	t.Logf("replaced controller pod %s (%d restarts) by %s, ready and leading after %s", old.pod, old.restarts, c.pod, time.Since(began).Round(100*time.Millisecond))
	return c
}

// killed is one SIGKILL of the controller and what followed.
type killed struct {
	before, after controllerContainer
	pid           int
	holderBefore  string
	holderAfter   string
	at            time.Time
	// running is how long kubelet took to run a new container, ready until
	// its readiness probe passed, leading until it held the lease.
	running, ready, leading time.Duration
}

func (k killed) String() string {
	return fmt.Sprintf("SIGKILL of pid %d (container %s) in pod %s: restartCount %d→%d, last exit %d, new container %s; new container running after %s, ready after %s, leading after %s",
		k.pid, shortID(k.before.id), k.before.pod, k.before.restarts, k.after.restarts, k.after.lastExit, shortID(k.after.id),
		k.running.Round(10*time.Millisecond), k.ready.Round(10*time.Millisecond), k.leading.Round(10*time.Millisecond))
}

func shortID(id string) string {
	id = strings.TrimPrefix(id, "containerd://")
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

// killController SIGKILLs the controller's process through containerd.
func killController(t *testing.T) *killed {
	t.Helper()
	ctx := context.Background()
	before, err := controllerPod(ctx)
	if err != nil {
		t.Fatal(err)
	}
	k := &killed{before: before, holderBefore: leaseHolder(ctx), at: time.Now()}
	if k.pid, err = cl.KillContainer(ctx, before.id, "SIGKILL"); err != nil {
		t.Fatalf("SIGKILL of the controller: %v", err)
	}
	return k
}

// waitBack waits until kubelet has run the killed controller's container
// again in the same pod (restartCount one more, another container ID, the
// last run ended by SIGKILL), it is ready, and a new identity holds the
// lease, and records how long each took.
func (k *killed) waitBack(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	kit.Eventually(t, 4*time.Minute, 100*time.Millisecond, "kubelet to restart the killed controller and it to lead again", func() (bool, string, error) {
		c, err := controllerPod(ctx)
		if err != nil {
			return false, err.Error(), nil
		}
		if c.pod != k.before.pod {
			t.Fatalf("the controller came back in another pod %s (killed in %s): the Deployment replaced the pod instead of kubelet restarting the container", c.pod, k.before.pod)
		}
		if c.id == k.before.id || c.restarts == k.before.restarts {
			return false, fmt.Sprintf("container %s restarts %d", shortID(c.id), c.restarts), nil
		}
		if k.running == 0 && c.id != "" {
			k.running = time.Since(k.at)
		}
		if !c.ready {
			return false, "new container not ready", nil
		}
		if k.ready == 0 {
			k.ready = time.Since(k.at)
		}
		h := leaseHolder(ctx)
		if h == "" || h == k.holderBefore {
			return false, "lease still held by " + h, nil
		}
		k.leading, k.after, k.holderAfter = time.Since(k.at), c, h
		return true, "", nil
	})
	if k.after.restarts != k.before.restarts+1 {
		t.Errorf("restartCount went %d→%d, want one more", k.before.restarts, k.after.restarts)
	}
	if k.after.lastExit != sigkillExit {
		t.Errorf("the killed container's last run exited %d, want %d (SIGKILL)", k.after.lastExit, sigkillExit)
	}
}

// throttledServer serves dir on the node's gateway (where pods reach the
// host) at about bytesPerSec.
func throttledServer(t *testing.T, dir string, bytesPerSec int) string {
	t.Helper()
	gw, err := cl.GatewayAddress()
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(gw, "0"))
	if err != nil {
		t.Fatal(err)
	}
	files := http.FileServer(http.Dir(dir))
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		files.ServeHTTP(&slowWriter{ResponseWriter: w, perTick: bytesPerSec / 20}, r)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "http://" + ln.Addr().String()
}

// slowWriter lets perTick bytes through every 50 ms.
type slowWriter struct {
	http.ResponseWriter
	perTick, budget int
	began           bool
}

func (s *slowWriter) Write(p []byte) (int, error) {
	written := 0
	for len(p) > 0 {
		if !s.began {
			s.began, s.budget = true, s.perTick
		}
		if s.budget == 0 {
			time.Sleep(50 * time.Millisecond)
			s.budget = s.perTick
		}
		n := min(len(p), s.budget)
		m, err := s.ResponseWriter.Write(p[:n])
		written += m
		s.budget -= m
		if err != nil {
			return written, err
		}
		p = p[n:]
	}
	return written, nil
}

// slowReader gives data at about perTick bytes every 50 ms and counts
// what it gave.
type slowReader struct {
	data    []byte
	perTick int
	budget  int
	sent    atomic.Int64
}

func (r *slowReader) Read(p []byte) (int, error) {
	off := int(r.sent.Load())
	if off >= len(r.data) {
		return 0, io.EOF
	}
	if off == 0 {
		r.budget = r.perTick
	}
	if r.budget == 0 {
		time.Sleep(50 * time.Millisecond)
		r.budget = r.perTick
	}
	n := copy(p[:min(len(p), r.budget)], r.data[off:])
	r.budget -= n
	r.sent.Add(int64(n))
	return n, nil
}

// randomData is size bytes with 64 KiB random in every MiB (the rest
// zeros, as a sparse disk image has) and its sha256.
func randomData(size int) ([]byte, string) {
	b := make([]byte, size)
	for off := 0; off < size; off += 1 << 20 {
		_, _ = rand.Read(b[off:min(size, off+64<<10)])
	}
	sum := sha256.Sum256(b)
	return b, hex.EncodeToString(sum[:])
}

// tempTracker records every claim, pod and VolumeSnapshot appearing and
// going (kit.Tracker), and every DataVolume phase, in some namespaces.
type tempTracker struct {
	*kit.Tracker
	mu     sync.Mutex
	phases map[string][]cdiv1.DataVolumePhase
	// steps are each DataVolume's phase and progress changes, with the
	// time since the tracker started.
	steps map[string][]string
	began time.Time
}

// track starts watching namespaces until the test ends.
func track(t *testing.T, c client.WithWatch, namespaces ...string) *tempTracker {
	t.Helper()
	tr := &tempTracker{phases: map[string][]cdiv1.DataVolumePhase{}, steps: map[string][]string{}, began: time.Now()}
	tr.Tracker = kit.Track(t, c, tr.record, namespaces...)
	return tr
}

// record keeps a DataVolume's phase and progress changes.
func (tr *tempTracker) record(typ watch.EventType, dv *cdiv1.DataVolume) {
	if typ == watch.Deleted {
		return
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	key := dv.Namespace + "/" + dv.Name
	if p := tr.phases[key]; len(p) == 0 || p[len(p)-1] != dv.Status.Phase {
		tr.phases[key] = append(p, dv.Status.Phase)
	}
	step := fmt.Sprintf("%s %s", dv.Status.Phase, dv.Status.Progress)
	if st := tr.steps[key]; len(st) == 0 || !strings.HasSuffix(st[len(st)-1], " "+step) {
		tr.steps[key] = append(st, fmt.Sprintf("+%.1fs %s", time.Since(tr.began).Seconds(), step))
	}
}

// stepsOf are a DataVolume's phase and progress changes seen.
func (tr *tempTracker) stepsOf(ns, name string) []string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return slices.Clone(tr.steps[ns+"/"+name])
}

// checkProgress fails the test when a DataVolume's progress, where it
// is a percentage, ever went down (a new controller starting over from 0%
// or losing the worker's figure).
func (tr *tempTracker) checkProgress(t *testing.T, ns, name string) {
	t.Helper()
	last, lastStep := -1.0, ""
	for _, step := range tr.stepsOf(ns, name) {
		f := strings.Fields(step)
		if len(f) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSuffix(f[len(f)-1], "%"), 64)
		if err != nil || !strings.HasSuffix(f[len(f)-1], "%") {
			continue
		}
		if v < last {
			t.Errorf("DataVolume %s/%s progress went down: %s after %s", ns, name, step, lastStep)
		}
		last, lastStep = v, step
	}
}

// earlyPhases come before a DataVolume's work starts.
var earlyPhases = map[cdiv1.DataVolumePhase]bool{
	cdiv1.PhaseUnset: true, cdiv1.Pending: true, cdiv1.PVCBound: true, cdiv1.ImportScheduled: true,
	cdiv1.CloneScheduled: true, cdiv1.UploadScheduled: true, cdiv1.PendingPopulation: true, cdiv1.WaitForFirstConsumer: true,
}

// checkPhases checks the phases a DataVolume went through: never Failed,
// Unknown or Paused, through inFlight, never back to a phase before the
// work once inFlight was seen, and ending Succeeded (once). It returns them.
func (tr *tempTracker) checkPhases(t *testing.T, ns, name string, inFlight cdiv1.DataVolumePhase) []cdiv1.DataVolumePhase {
	t.Helper()
	tr.mu.Lock()
	phases := slices.Clone(tr.phases[ns+"/"+name])
	tr.mu.Unlock()
	if len(phases) == 0 || phases[len(phases)-1] != cdiv1.Succeeded {
		t.Errorf("DataVolume %s/%s phases %v do not end Succeeded", ns, name, phases)
	}
	working := false
	for i, p := range phases {
		switch {
		case p == cdiv1.Failed || p == cdiv1.Unknown || p == cdiv1.Paused:
			t.Errorf("DataVolume %s/%s was %s (phases %v)", ns, name, p, phases)
		case p == cdiv1.Succeeded && i != len(phases)-1:
			t.Errorf("DataVolume %s/%s left Succeeded (phases %v)", ns, name, phases)
		case working && earlyPhases[p]:
			t.Errorf("DataVolume %s/%s went back to %s after %s (phases %v)", ns, name, p, inFlight, phases)
		}
		if p == inFlight {
			working = true
		}
	}
	if !working {
		t.Errorf("DataVolume %s/%s never was %s (phases %v)", ns, name, inFlight, phases)
	}
	return phases
}

// assertNothingLeft waits until the namespaces hold no claim but keep
// (Bound to its volume, with no finalizer but pvc-protection and
// external-provisioner's cloning protection), no pod but the test's
// readers and writers, no snapshot (but ones deleted and held by
// external-provisioner), VolumeCloneSource or DataVolume, no PV or
// VolumeSnapshotContent is left for them but keep's volume, and no object
// has Kubefill's finalizers.
func assertNothingLeft(t *testing.T, c client.Client, namespaces []string, keep map[string]string) {
	t.Helper()
	ctx := context.Background()
	held := map[string]bool{}
	kit.Eventually(t, 2*time.Minute, 500*time.Millisecond, "nothing of the deleted DataVolumes to be left", func() (bool, string, error) {
		var left []string
		keptVolumes := map[string]bool{}
		for _, ns := range namespaces {
			claims := &corev1.PersistentVolumeClaimList{}
			pods := &corev1.PodList{}
			snaps := &snapshotv1.VolumeSnapshotList{}
			vcs := &cdiv1.VolumeCloneSourceList{}
			dvs := &cdiv1.DataVolumeList{}
			for _, l := range []client.ObjectList{claims, pods, snaps, vcs, dvs} {
				if err := c.List(ctx, l, client.InNamespace(ns)); err != nil {
					return false, "", err
				}
			}
			for _, p := range claims.Items {
				if keep[ns] == p.Name {
					keptVolumes[p.Spec.VolumeName] = true
					if p.Status.Phase != corev1.ClaimBound || slices.ContainsFunc(p.Finalizers, func(f string) bool {
						return f != "kubernetes.io/pvc-protection" && f != cloningProtection
					}) {
						left = append(left, fmt.Sprintf("source claim %s/%s changed: %s finalizers %v", ns, p.Name, p.Status.Phase, p.Finalizers))
					}
					continue
				}
				left = append(left, fmt.Sprintf("claim %s/%s (%s, finalizers %v)", ns, p.Name, p.Status.Phase, p.Finalizers))
			}
			for _, p := range pods.Items {
				if strings.HasPrefix(p.Name, "write-") || strings.HasPrefix(p.Name, "read-") {
					continue
				}
				left = append(left, fmt.Sprintf("pod %s/%s (%s)", ns, p.Name, p.Status.Phase))
			}
			for _, sn := range snaps.Items {
				if sn.DeletionTimestamp != nil && kit.OnlyProvisionerFinalizers(sn.Finalizers) {
					// Deleted; external-provisioner's source protection holds
					// it until its next resync.
					if !held[sn.Name] {
						held[sn.Name] = true
						t.Logf("snapshot %s/%s deleted, held by %v", ns, sn.Name, sn.Finalizers)
					}
					continue
				}
				left = append(left, fmt.Sprintf("snapshot %s/%s (finalizers %v)", ns, sn.Name, sn.Finalizers))
			}
			for _, v := range vcs.Items {
				left = append(left, "VolumeCloneSource "+ns+"/"+v.Name)
			}
			for _, d := range dvs.Items {
				left = append(left, fmt.Sprintf("DataVolume %s/%s (finalizers %v)", ns, d.Name, d.Finalizers))
			}
		}
		pvs := &corev1.PersistentVolumeList{}
		if err := c.List(ctx, pvs); err != nil {
			return false, "", err
		}
		for _, pv := range pvs.Items {
			ref := pv.Spec.ClaimRef
			if keptVolumes[pv.Name] || ref == nil || !slices.Contains(namespaces, ref.Namespace) {
				continue
			}
			left = append(left, fmt.Sprintf("PV %s (%s, for %s/%s)", pv.Name, pv.Status.Phase, ref.Namespace, ref.Name))
		}
		contents := &snapshotv1.VolumeSnapshotContentList{}
		if err := c.List(ctx, contents); err != nil {
			return false, "", err
		}
		for _, vc := range contents.Items {
			if r := vc.Spec.VolumeSnapshotRef; slices.Contains(namespaces, r.Namespace) && !held[r.Name] {
				left = append(left, fmt.Sprintf("VolumeSnapshotContent %s (for %s/%s)", vc.Name, r.Namespace, r.Name))
			}
		}
		return len(left) == 0, fmt.Sprintf("left: %v", left), nil
	})
}

// deleteDataVolume deletes a DataVolume and the test's reader pods of
// its namespace (the claim's protection waits for no pod).
func deleteDataVolume(t *testing.T, c client.Client, ns, name string) {
	t.Helper()
	ctx := context.Background()
	pods := &corev1.PodList{}
	if err := c.List(ctx, pods, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	for i := range pods.Items {
		if strings.HasPrefix(pods.Items[i].Name, "read-") || strings.HasPrefix(pods.Items[i].Name, "write-") {
			_ = c.Delete(ctx, &pods.Items[i])
		}
	}
	if err := c.Delete(ctx, &cdiv1.DataVolume{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}); err != nil {
		t.Fatal(err)
	}
}

// cloneClass creates an Immediate StorageClass of the test driver whose
// StorageProfile forces strategy (and snapshotClass), CreateVolume of
// clones and restores taking delay when given, and waits until the
// installed controller's profile status says so.
func cloneClass(t *testing.T, c client.Client, strategy cdiv1.CDICloneStrategy, snapshotClass, delay string) string {
	t.Helper()
	ctx := context.Background()
	name := fmt.Sprintf("sigkill-%s-%s", strategy, randomSuffix())
	immediate, del := storagev1.VolumeBindingImmediate, corev1.PersistentVolumeReclaimDelete
	sc := &storagev1.StorageClass{
		ObjectMeta:  metav1.ObjectMeta{Name: name},
		Provisioner: cluster.DriverName, ReclaimPolicy: &del, VolumeBindingMode: &immediate,
		AllowVolumeExpansion: ptr.To(true),
	}
	if delay != "" {
		sc.Parameters = map[string]string{hostpath.DelayParameter: delay}
	}
	if err := c.Create(ctx, sc); err != nil {
		t.Fatalf("create StorageClass %s: %v", name, err)
	}
	t.Cleanup(func() {
		_ = c.Delete(context.Background(), sc)
		_ = c.Delete(context.Background(), &cdiv1.StorageProfile{ObjectMeta: metav1.ObjectMeta{Name: name}})
	})
	kit.Eventually(t, time.Minute, 200*time.Millisecond, "StorageProfile "+name+" to force clone strategy "+string(strategy), func() (bool, string, error) {
		p := &cdiv1.StorageProfile{}
		if err := c.Get(ctx, types.NamespacedName{Name: name}, p); err != nil {
			return false, err.Error(), nil
		}
		if ptr.Deref(p.Spec.CloneStrategy, "") != strategy || (snapshotClass != "" && ptr.Deref(p.Spec.SnapshotClass, "") != snapshotClass) {
			p.Spec.CloneStrategy = ptr.To(strategy)
			if snapshotClass != "" {
				p.Spec.SnapshotClass = ptr.To(snapshotClass)
			}
			if err := c.Update(ctx, p); err != nil {
				return false, err.Error(), nil
			}
			return false, "spec being set", nil
		}
		done := ptr.Deref(p.Status.CloneStrategy, "") == strategy && (snapshotClass == "" || ptr.Deref(p.Status.SnapshotClass, "") == snapshotClass)
		return done, fmt.Sprintf("status %+v", p.Status), nil
	})
	return name
}

// slowSnapshotClass creates a VolumeSnapshotClass of the test driver whose
// CreateSnapshot takes delay; it is not the default.
func slowSnapshotClass(t *testing.T, c client.Client, delay string) string {
	t.Helper()
	vsc := &snapshotv1.VolumeSnapshotClass{
		ObjectMeta:     metav1.ObjectMeta{Name: "sigkill-slow-snap-" + randomSuffix()},
		Driver:         cluster.DriverName,
		DeletionPolicy: snapshotv1.VolumeSnapshotContentDelete,
		Parameters:     map[string]string{hostpath.DelayParameter: delay},
	}
	if err := c.Create(context.Background(), vsc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), vsc) })
	return vsc.Name
}

// writeSource creates a claim of class and size and writes a disk.img of
// dataMiB MiB of random data into it; it returns the data's sha256.
func writeSource(t *testing.T, c client.Client, ns, name, class, size string, dataMiB int) string {
	t.Helper()
	ctx := context.Background()
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, StorageClassName: ptr.To(class),
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)}},
		},
	}
	if err := c.Create(ctx, pvc); err != nil {
		t.Fatal(err)
	}
	script := fmt.Sprintf("dd if=/dev/urandom of=/data/disk.img bs=1M count=%d iflag=fullblock 2>/dev/null && sync && sha256sum /data/disk.img | cut -d' ' -f1 > /dev/termination-log", dataMiB)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "write-" + name},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{Name: "write", Image: shellImage, ImagePullPolicy: corev1.PullNever,
				Command:      []string{"sh", "-c", script},
				VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: name}}}},
		},
	}
	if err := c.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	sum := podReport(t, c, pod, 3*time.Minute, 500*time.Millisecond, "to write the source")
	if len(sum) != 64 {
		t.Fatalf("writer of %s/%s reported %q", ns, name, sum)
	}
	// The source must not be in use by a pod when cloned.
	if err := c.Delete(ctx, pod); err != nil {
		t.Fatal(err)
	}
	kit.Eventually(t, time.Minute, 250*time.Millisecond, "writer pod "+pod.Name+" to go", func() (bool, string, error) {
		err := c.Get(ctx, client.ObjectKeyFromObject(pod), &corev1.Pod{})
		return client.IgnoreNotFound(err) == nil && err != nil, "", nil
	})
	return sum
}

// describeDataVolume is what a failure shows: the status, the claim's
// annotations about populating, events in the namespaces, and pods.
func describeDataVolume(c client.Client, ns, name string, namespaces ...string) string {
	ctx := context.Background()
	var b strings.Builder
	dv := &cdiv1.DataVolume{}
	if err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, dv); err == nil {
		fmt.Fprintf(&b, "DataVolume %s/%s status: %+v\n", ns, name, dv.Status)
	}
	pvc := &corev1.PersistentVolumeClaim{}
	if err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, pvc); err == nil {
		fmt.Fprintf(&b, "claim %s phase=%s volume=%q finalizers=%v\n", name, pvc.Status.Phase, pvc.Spec.VolumeName, pvc.Finalizers)
		for k, v := range pvc.Annotations {
			if strings.Contains(k, "token") {
				v = "(token)"
			}
			if strings.Contains(k, "cdi.kubevirt.io") {
				fmt.Fprintf(&b, "  %s=%s\n", k, v)
			}
		}
	}
	for _, n := range append([]string{ns}, namespaces...) {
		list := &corev1.EventList{}
		if err := c.List(ctx, list, client.InNamespace(n)); err == nil {
			fmt.Fprintf(&b, "events in %s:\n%s", n, kit.FormatEvents(list.Items))
		}
		pods := &corev1.PodList{}
		if err := c.List(ctx, pods, client.InNamespace(n)); err == nil {
			for _, p := range pods.Items {
				fmt.Fprintf(&b, "pod %s/%s %s\n", n, p.Name, p.Status.Phase)
			}
		}
	}
	return b.String()
}
