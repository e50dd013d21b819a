package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/tests/csi/hostpath"
	"github.com/kubefill/kubefill/tests/kit"
)

// TestCloneBenchmark is `make bench-clone` (KUBEFILL_BENCH_CLONE=1): on the
// local cluster, in one run,
//
//  1. a host-assisted clone of a Filesystem volume whose disk.img is 2 GiB
//     virtual with 1 GiB of data (half random, half text), DataVolume
//     created → Succeeded, against `cp --sparse=always` (then fsync) of the
//     same disk.img on the same disk; then the same data in a 20 GiB-virtual
//     disk.img, whose time should grow by less than 1.3×, since only data
//     travels;
//  2. snapshot and CSI clones of 1 GiB and 8 GiB volumes (half data):
//     Kubefill's own time, the total minus what the CSI driver spent in its
//     CreateSnapshot and CreateVolume calls (from its call log), should stay
//     flat (within 1.3×);
//  3. the cloner's and the upload server's peak RSS during the host-assisted
//     clones (goal under 64 MiB each).
//
// It prints the figures and fails only when a clone fails or its bytes
// differ; the ratios are for the reader. Each host-assisted clone's
// timeline (cloneTimeline: the DataVolume's phases, the claims, the worker
// pods' creation, start and readiness, their log lines) is logged too,
// to show where the time goes.
func TestCloneBenchmark(t *testing.T) {
	if os.Getenv("KUBEFILL_BENCH_CLONE") == "" {
		t.Skip("a benchmark: set KUBEFILL_BENCH_CLONE=1 (make bench-clone)")
	}
	s := shared
	copyClass := s.cloneClass(t, classOpts{strategy: cdiv1.CloneStrategyHostAssisted})
	snapClass := s.cloneClass(t, classOpts{strategy: cdiv1.CloneStrategySnapshot})
	csiClass := s.cloneClass(t, classOpts{strategy: cdiv1.CloneStrategyCsiClone})
	srcNs, dstNs := s.namespace(t, "bench-src"), s.namespace(t, "bench-dst")
	scratch := filepath.Join(cl.CSIDataDir(), "bench-"+randomSuffix())
	if err := os.MkdirAll(scratch, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(scratch) })
	var report []string
	say := func(format string, args ...any) {
		line := fmt.Sprintf(format, args...)
		report = append(report, line)
		t.Log(line)
	}
	defer func() {
		fmt.Println("\n=== make bench-clone")
		for _, l := range report {
			fmt.Println("  " + l)
		}
	}()

	// 1. Host-assisted: 2 GiB virtual, 1 GiB data; then 20 GiB virtual.
	small := s.benchSource(t, srcNs, "golden-2g", copyClass, "2Gi")
	script := "truncate -s 2G /data/disk.img && i=0; while [ $i -lt 32 ]; do " +
		"if [ $((i % 2)) -eq 0 ]; then dd if=/dev/urandom of=/data/disk.img bs=1M count=32 seek=$((i*64)) iflag=fullblock conv=notrunc 2>/dev/null; " +
		"else yes 'Kubefill streams virtual machine disk images into volumes, quickly and safely. 0123456789' | dd of=/data/disk.img bs=1M count=32 seek=$((i*64)) iflag=fullblock conv=notrunc 2>/dev/null; fi; " +
		"i=$((i+1)); done && sync"
	runToCompletion(t, srcNs, podWithClaim("write-golden-2g", "golden-2g", false, script))
	smallImg := filepath.Join(small, "disk.img")
	// Read on the host: the claim's directory is there, and a shell in the
	// pod may lack stat or print nothing into its termination message.
	say("host-assisted source: disk.img 2 GiB virtual, %d bytes allocated", allocated(t, smallImg))
	big := s.benchSource(t, srcNs, "golden-20g", copyClass, "21Gi")
	bigImg := filepath.Join(big, "disk.img")
	hostRun(t, "cp", "--sparse=always", smallImg, bigImg)
	hostRun(t, "truncate", "-s", "20G", bigImg)

	t.Run("host-assisted", func(t *testing.T) {
		var times [2]time.Duration
		for i, c := range []struct {
			name, size, img string
		}{{"2g", "2Gi", smallImg}, {"20g", "21Gi", bigImg}} {
			// Nothing written before (the sources, the last clone) is still
			// being flushed while cp runs: cp is timed on a quiet disk, as
			// the clone is.
			hostRun(t, "sync")
			cpTime := timeCp(t, c.img, filepath.Join(scratch, "cp-"+c.name+".img"))
			hostRun(t, "sync")
			dv := kit.DataVolume(dstNs, "copy-"+c.name, pvcSource(srcNs, "golden-"+c.name), kit.WithPVC(cloneSpec(copyClass, c.size, false)))
			mem := sampleRSS("cloner", "uploadserver")
			tl, stopTimeline := s.watchClone(t, dstNs, srcNs)
			took := s.timeClone(t, dv, srcNs, tl.setStart)
			peaks := mem()
			stopTimeline()
			t.Logf("timeline of the %s host-assisted clone (from the DataVolume's creation):\n  %s", c.name, strings.Join(tl.lines(), "\n  "))
			times[i] = took
			say("host-assisted clone, %s virtual, 1 GiB data: %s; cp --sparse=always + fsync of the same disk.img: %s; ratio cp/clone %.2f (goal ≥ 0.7)",
				strings.ToUpper(c.name[:len(c.name)-1])+" GiB", took.Round(time.Millisecond), cpTime.Round(time.Millisecond), cpTime.Seconds()/took.Seconds())
			say("  peak RSS: cloner %s, upload server %s (goal < 64 MiB each)", mib(peaks["cloner"]), mib(peaks["uploadserver"]))
			if i == 0 {
				got, want := hostSHA(t, filepath.Join(s.claimDir(t, dstNs, dv.Name), "disk.img")), hostSHA(t, c.img)
				if got != want {
					t.Errorf("the 2 GiB clone's disk.img has sha256 %s, the source %s", got, want)
				}
			}
			_ = os.Remove(filepath.Join(scratch, "cp-"+c.name+".img"))
		}
		say("host-assisted: 20 GiB-virtual time / 2 GiB-virtual time = %.2f (goal < 1.3: only data travels)", times[1].Seconds()/times[0].Seconds())
	})

	// 2. Snapshot and CSI clone at 1 GiB and 8 GiB, half of each data.
	t.Run("snapshot-and-csi-clone", func(t *testing.T) {
		for _, st := range []struct {
			strategy cdiv1.CDICloneStrategy
			class    string
		}{{cdiv1.CloneStrategySnapshot, snapClass}, {cdiv1.CloneStrategyCsiClone, csiClass}} {
			var own [2]time.Duration
			for i, gib := range []int{1, 8} {
				name := fmt.Sprintf("%s-%dg", st.strategy, gib)
				dir := s.benchSource(t, srcNs, name, st.class, fmt.Sprintf("%dGi", gib))
				img := filepath.Join(dir, "disk.img")
				// Half data: the host-assisted source's 1 GiB-of-2 pattern, repeated.
				for off := 0; off < gib; off += 2 {
					hostRun(t, "dd", "if="+smallImg, "of="+img, "bs=1M", fmt.Sprintf("seek=%d", off<<10), "count="+fmt.Sprint(min(2, gib-off)<<10), "conv=sparse,notrunc", "status=none")
				}
				hostRun(t, "truncate", "-s", fmt.Sprintf("%dG", gib), img)
				hostRun(t, "sync")
				offset := logSize(t)
				dv := kit.DataVolume(dstNs, name, pvcSource(srcNs, name), kit.WithPVC(cloneSpec(st.class, fmt.Sprintf("%dGi", gib), false)))
				total := s.timeClone(t, dv, srcNs)
				driver, calls := driverTime(t, offset)
				own[i] = total - driver
				say("%s clone, %d GiB (%d MiB data): total %s, CSI driver %s in %s, Kubefill's own %s",
					st.strategy, gib, gib*512, total.Round(time.Millisecond), driver.Round(time.Millisecond), calls, own[i].Round(time.Millisecond))
			}
			say("%s: Kubefill's own time 8 GiB / 1 GiB = %.2f (goal within 1.3)", st.strategy, own[1].Seconds()/own[0].Seconds())
		}
		// The bytes: the 8 GiB snapshot clone against its source.
		if got, want := hostSHA(t, filepath.Join(s.claimDir(t, dstNs, "snapshot-8g"), "disk.img")), hostSHA(t, filepath.Join(s.claimDir(t, srcNs, "snapshot-8g"), "disk.img")); got != want {
			t.Errorf("the 8 GiB snapshot clone's disk.img has sha256 %s, the source %s", got, want)
		}
	})
}

// benchSource creates a Filesystem claim, waits until it is Bound and
// returns the directory that holds its files on the host.
func (s *cloneStack) benchSource(t *testing.T, ns, name, class, size string) string {
	t.Helper()
	createPVC(t, ns, pvcSpec(name, class, size, corev1.PersistentVolumeFilesystem))
	waitPVCPhase(t, ns, name, corev1.ClaimBound, time.Minute)
	return s.claimDir(t, ns, name)
}

// claimDir is where the hostpath driver keeps a Filesystem claim's files.
func (s *cloneStack) claimDir(t *testing.T, ns, name string) string {
	t.Helper()
	pvc, err := cl.Client.CoreV1().PersistentVolumeClaims(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pv, err := cl.Client.CoreV1().PersistentVolumes().Get(context.Background(), pvc.Spec.VolumeName, metav1.GetOptions{})
	if err != nil || pv.Spec.CSI == nil {
		t.Fatalf("PV of %s/%s: %v", ns, name, err)
	}
	return filepath.Join(cl.CSIDataDir(), "volumes", pv.Spec.CSI.VolumeHandle)
}

// timeClone creates a clone DataVolume and returns how long it took to be
// Succeeded, polled every 50 ms.
func (s *cloneStack) timeClone(t *testing.T, dv *cdiv1.DataVolume, srcNs string, started ...func(time.Time)) time.Duration {
	t.Helper()
	start := time.Now()
	for _, f := range started {
		f(start)
	}
	s.create(t, dv)
	var took time.Duration
	kit.Eventually(t, 5*time.Minute, 50*time.Millisecond, "clone "+dv.Namespace+"/"+dv.Name+" to succeed", func() (bool, string, error) {
		got := &cdiv1.DataVolume{}
		if err := s.c.Get(context.Background(), types.NamespacedName{Namespace: dv.Namespace, Name: dv.Name}, got); err != nil {
			return false, "", err
		}
		took = time.Since(start)
		return got.Status.Phase == cdiv1.Succeeded, fmt.Sprintf("%s %s", got.Status.Phase, got.Status.Progress), nil
	})
	return took
}

// timeCp times `cp --sparse=always src dst` and an fsync of dst.
func timeCp(t *testing.T, src, dst string) time.Duration {
	t.Helper()
	_ = os.Remove(dst)
	start := time.Now()
	hostRun(t, "cp", "--sparse=always", src, dst)
	hostRun(t, "sync", dst)
	return time.Since(start)
}

func hostRun(t *testing.T, name string, args ...string) string {
	t.Helper()
	var out bytes.Buffer
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out.String())
	}
	return out.String()
}

// allocated is the bytes a file has on disk (st_blocks × 512).
func allocated(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		t.Fatalf("%s: no stat_t", path)
	}
	return st.Blocks * 512
}

func hostSHA(t *testing.T, path string) string {
	t.Helper()
	f := strings.Fields(hostRun(t, "sha256sum", path))
	if len(f) == 0 {
		t.Fatalf("sha256sum %s printed nothing", path)
	}
	return f[0]
}

// sampleRSS samples the peak RSS of the named `kubefill <subcommand>`
// processes every 50 ms until the returned function is called, which
// returns the peaks (bytes, 0 if never seen).
func sampleRSS(subcommands ...string) func() map[string]int64 {
	stop := make(chan struct{})
	var wg sync.WaitGroup
	peaks := map[string]int64{}
	var mu sync.Mutex
	wg.Add(1)
	pids := map[string]int{}
	go func() {
		defer wg.Done()
		for {
			for _, sc := range subcommands {
				// A pid once found is read until it is gone: scanning /proc
				// every 50 ms would take CPU from the clone being measured.
				v := processPeakRSS(pids[sc])
				if v == 0 {
					pids[sc] = findProcess(sc)
					v = processPeakRSS(pids[sc])
				}
				if v > 0 {
					mu.Lock()
					peaks[sc] = max(peaks[sc], v)
					mu.Unlock()
				}
			}
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	return func() map[string]int64 {
		close(stop)
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		return peaks
	}
}

func mib(b int64) string {
	if b == 0 {
		return "not seen"
	}
	return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
}

// logSize is the CSI driver's log's current length, where a measurement's
// calls start.
func logSize(t *testing.T) int64 {
	t.Helper()
	st, err := os.Stat(cl.Logs("csi-driver"))
	if err != nil {
		t.Fatal(err)
	}
	return st.Size()
}

// driverTime sums the CreateSnapshot and CreateVolume calls the driver
// logged after offset, and describes them.
func driverTime(t *testing.T, offset int64) (time.Duration, string) {
	t.Helper()
	f, err := os.Open(cl.Logs("csi-driver"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Seek(offset, 0); err != nil {
		t.Fatal(err)
	}
	calls, err := hostpath.ParseCallLog(f)
	if err != nil {
		t.Fatal(err)
	}
	var total time.Duration
	n := map[string]int{}
	for _, c := range calls {
		if c.Method == "CreateSnapshot" || c.Method == "CreateVolume" {
			total += c.Took
			n[c.Method]++
		}
	}
	return total, fmt.Sprintf("%d CreateSnapshot and %d CreateVolume calls", n["CreateSnapshot"], n["CreateVolume"])
}

// cloneTimeline records, relative to a clone's start, when each object of
// one clone changed state as seen through watches (the DataVolume's phase,
// the claims' creation, binding and clonePhase, the worker pods' creation,
// scheduling, address, phase and readiness, the kubelet's events on them),
// plus the workers' own log lines with their runtime timestamps: where a
// clone's time goes. The watches only read; the clone is not slowed.
type cloneTimeline struct {
	start time.Time
	mu    sync.Mutex
	marks []timelineMark
	seen  map[string]bool
}

type timelineMark struct {
	at   time.Time
	what string
}

func (tl *cloneTimeline) mark(at time.Time, key, what string) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	if key != "" {
		if tl.seen[key] {
			return
		}
		tl.seen[key] = true
	}
	tl.marks = append(tl.marks, timelineMark{at: at, what: what})
}

// setStart sets the instant the offsets count from.
func (tl *cloneTimeline) setStart(at time.Time) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	tl.start = at
}

// lines are the marks in time order.
func (tl *cloneTimeline) lines() []string {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	marks := slices.Clone(tl.marks)
	sort.SliceStable(marks, func(i, j int) bool { return marks[i].at.Before(marks[j].at) })
	out := make([]string, 0, len(marks))
	for _, m := range marks {
		out = append(out, fmt.Sprintf("%+8.3fs  %s", m.at.Sub(tl.start).Seconds(), m.what))
	}
	return out
}

// watchClone starts recording the timeline of the clone about to be made
// in dstNs from srcNs; stop ends it.
func (s *cloneStack) watchClone(t *testing.T, dstNs, srcNs string) (tl *cloneTimeline, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	tl = &cloneTimeline{start: time.Now(), seen: map[string]bool{}}
	wc, err := client.NewWithWatch(cl.Config, client.Options{Scheme: s.c.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	follow := func(list client.ObjectList, ns string, on func(obj client.Object, deleted bool)) {
		// From now on: the objects of earlier clones are not this one's.
		if err := wc.List(ctx, list, client.InNamespace(ns)); err != nil {
			t.Fatalf("listing %T in %s: %v", list, ns, err)
		}
		w, err := wc.Watch(ctx, list, client.InNamespace(ns), &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: list.(metav1.ListInterface).GetResourceVersion()}})
		if err != nil {
			t.Fatalf("watching %T in %s: %v", list, ns, err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer w.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case ev, ok := <-w.ResultChan():
					if !ok {
						return
					}
					if obj, isObj := ev.Object.(client.Object); isObj {
						on(obj, ev.Type == watch.Deleted)
					}
				}
			}
		}()
	}
	follow(&cdiv1.DataVolumeList{}, dstNs, func(obj client.Object, deleted bool) {
		dv := obj.(*cdiv1.DataVolume)
		now := time.Now()
		tl.mark(now, "dv "+string(dv.Status.Phase), fmt.Sprintf("DataVolume %s phase %q %s", dv.Name, dv.Status.Phase, dv.Status.Progress))
	})
	claim := func(obj client.Object, deleted bool) {
		pvc := obj.(*corev1.PersistentVolumeClaim)
		if pvc.Labels[cdiv1.LabelOwnedByUID] == "" && pvc.Namespace == srcNs {
			return // a source
		}
		now, n := time.Now(), pvc.Namespace+"/"+pvc.Name
		tl.mark(now, "pvc "+n, "claim "+n+" created")
		if pvc.Status.Phase == corev1.ClaimBound {
			tl.mark(now, "pvc bound "+n, "claim "+n+" Bound to "+pvc.Spec.VolumeName)
		}
		if p := pvc.Annotations[cdiv1.AnnClonePhase]; p != "" {
			tl.mark(now, "pvc phase "+n+p, "claim "+n+" clonePhase "+p)
		}
		if deleted {
			tl.mark(now, "pvc deleted "+n, "claim "+n+" deleted")
		}
	}
	follow(&corev1.PersistentVolumeClaimList{}, dstNs, claim)
	follow(&corev1.PersistentVolumeClaimList{}, srcNs, claim)
	follow(&corev1.PodList{}, srcNs, func(obj client.Object, deleted bool) {
		pod := obj.(*corev1.Pod)
		if pod.Labels[cdiv1.LabelOwnedByUID] == "" {
			return
		}
		now, n := time.Now(), "pod "+pod.Name
		tl.mark(now, n, n+" created")
		if pod.Spec.NodeName != "" {
			tl.mark(now, n+" scheduled", n+" scheduled")
		}
		if pod.Status.PodIP != "" {
			tl.mark(now, n+" ip", n+" has address "+pod.Status.PodIP)
		}
		if a := pod.Annotations["kubefill.io/upload-address"]; a != "" {
			tl.mark(now, n+" told "+a, n+" told the upload pod's address "+a)
		}
		tl.mark(now, n+" "+string(pod.Status.Phase), n+" "+string(pod.Status.Phase))
		for _, c := range pod.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
				tl.mark(now, n+" ready", n+" Ready")
			}
		}
		if pod.Status.Phase == corev1.PodRunning && tl.claimLogs(n) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				tl.followLogs(ctx, pod.Namespace, pod.Name)
			}()
		}
		if deleted {
			tl.mark(now, n+" deleted", n+" deleted")
		}
	})
	follow(&discoveryv1.EndpointSliceList{}, srcNs, func(obj client.Object, _ bool) {
		es := obj.(*discoveryv1.EndpointSlice)
		svc := es.Labels[discoveryv1.LabelServiceName]
		for _, ep := range es.Endpoints {
			for _, a := range ep.Addresses {
				tl.mark(time.Now(), "slice "+svc+a, fmt.Sprintf("EndpointSlice of Service %s lists %s", svc, a))
			}
		}
	})
	follow(&corev1.EventList{}, srcNs, func(obj client.Object, _ bool) {
		ev := obj.(*corev1.Event)
		if ev.InvolvedObject.Kind == "Pod" && ev.Source.Component != "" {
			tl.mark(time.Now(), "ev "+ev.InvolvedObject.Name+ev.Reason, fmt.Sprintf("event %s on pod %s (%s)", ev.Reason, ev.InvolvedObject.Name, ev.Source.Component))
		}
	})
	return tl, func() {
		cancel()
		wg.Wait()
	}
}

// claimLogs reports whether the logs of the named pod are not followed yet.
func (tl *cloneTimeline) claimLogs(name string) bool {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	if tl.seen["logs "+name] {
		return false
	}
	tl.seen["logs "+name] = true
	return true
}

// followLogs marks each log line of a worker with the time the runtime
// stamped it.
func (tl *cloneTimeline) followLogs(ctx context.Context, ns, name string) {
	rc, err := cl.Client.CoreV1().Pods(ns).GetLogs(name, &corev1.PodLogOptions{Follow: true, Timestamps: true}).Stream(ctx)
	if err != nil {
		return
	}
	defer rc.Close()
	sc := bufio.NewScanner(rc)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		stamp, line, ok := strings.Cut(sc.Text(), " ")
		at, err := time.Parse(time.RFC3339Nano, stamp)
		if !ok || err != nil {
			continue
		}
		if msg := logMessage(line); msg != "" {
			tl.mark(at, "", name+" log: "+msg)
		}
	}
}

// logMessage is a worker log line's message and its timing fields.
func logMessage(line string) string {
	var rec map[string]any
	if json.Unmarshal([]byte(line), &rec) != nil {
		return strings.TrimSpace(line)
	}
	msg := fmt.Sprint(rec["msg"])
	for _, k := range []string{"took", "seconds", "in", "error", "after", "attempts", "timedOut", "refused", "url"} {
		if v, ok := rec[k]; ok {
			msg += fmt.Sprintf(" %s=%v", k, v)
		}
	}
	return msg
}
