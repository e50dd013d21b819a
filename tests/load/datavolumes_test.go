package load

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/tests/cluster"
	"github.com/kubefill/kubefill/tests/kit"
)

const (
	// maxLoadRSS is the goal for the controller's peak RSS while it runs the
	// DataVolumes.
	maxLoadRSS = 150 << 20
	// loadNamespace holds the DataVolumes.
	loadNamespace = "load-dv"
	// dvSize is each DataVolume's size; the HTTP image is smaller.
	dvSize    = "64Mi"
	imageSize = 2 << 20
)

// TestDataVolumeLoad creates counts.DataVolumes DataVolumes at once on the
// real node: counts.Clones clones of one source claim, the rest blank and
// small HTTP imports, mixed. All must succeed; it prints the time to the
// last and the controller's peak RSS (goal < 150 MiB), then checks that the
// controller goes quiet once they are done.
func TestDataVolumeLoad(t *testing.T) {
	if !withNode {
		t.Skip("needs the real node (KUBEFILL_LOAD_NODE=0 runs without one)")
	}
	ctx := context.Background()
	kc := kubefillClient(t)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: loadNamespace}}
	if err := kc.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
	if err := cl.WaitServiceAccount(ctx, loadNamespace); err != nil {
		t.Fatal(err)
	}
	url := serveImage(t)
	ctrl := startController(t)

	// The clones' source: one import, done before the load starts.
	if err := kc.Create(ctx, kit.DataVolume(loadNamespace, "golden", kit.HTTP(url),
		kit.WithPVC(kit.ClaimSpec(dvSize, kit.Class(cluster.StorageClassImmediate))))); err != nil {
		t.Fatal(err)
	}
	goldenStart := time.Now()
	if dv, _ := kit.WaitDataVolumeTerminal(t, kc, loadNamespace, "golden", 5*time.Minute); dv.Status.Phase != cdiv1.Succeeded {
		t.Fatalf("the clones' source golden ended %s: %s", dv.Status.Phase, kit.Events(kc, loadNamespace, "golden"))
	}
	t.Logf("the clones' source imported in %s", time.Since(goldenStart).Round(time.Millisecond))
	_, idlePeak := ctrl.memory(t)

	kinds := map[string]string{}
	var dvs []*cdiv1.DataVolume
	// The clones spread among the imports, so that the kinds start mixed.
	step, clones := 1, 0
	if counts.Clones > 0 {
		step = counts.DataVolumes / counts.Clones
	}
	for i := range counts.DataVolumes {
		var dv *cdiv1.DataVolume
		spec := kit.WithPVC(kit.ClaimSpec(dvSize, kit.Class(cluster.StorageClassImmediate)))
		switch {
		case clones < counts.Clones && i%step == 0:
			clones++
			dv = kit.DataVolume(loadNamespace, fmt.Sprintf("clone-%03d", i),
				&cdiv1.DataVolumeSource{PVC: &cdiv1.DataVolumeSourcePVC{Namespace: loadNamespace, Name: "golden"}}, spec)
			kinds[dv.Name] = "clone"
		case i%2 == 0:
			dv = kit.DataVolume(loadNamespace, fmt.Sprintf("blank-%03d", i), kit.Blank(), spec)
			kinds[dv.Name] = "blank"
		default:
			dv = kit.DataVolume(loadNamespace, fmt.Sprintf("http-%03d", i), kit.HTTP(url), spec)
			kinds[dv.Name] = "http"
		}
		dvs = append(dvs, dv)
	}
	begin := time.Now()
	for _, dv := range dvs {
		if err := kc.Create(ctx, dv); err != nil {
			t.Fatalf("create DataVolume %s: %v", dv.Name, err)
		}
	}
	created := time.Since(begin)

	done := map[string]time.Duration{}
	var status string
	timeout := 5*time.Minute + time.Duration(counts.DataVolumes)*6*time.Second
	maxWorkers := 0
	for deadline := time.Now().Add(timeout); ; {
		ctrl.alive(t)
		list := &cdiv1.DataVolumeList{}
		if err := kc.List(ctx, list, client.InNamespace(loadNamespace)); err != nil {
			t.Fatal(err)
		}
		phases := map[cdiv1.DataVolumePhase]int{}
		var failed []string
		for i := range list.Items {
			dv := &list.Items[i]
			if _, ok := kinds[dv.Name]; !ok {
				continue
			}
			phases[dv.Status.Phase]++
			switch dv.Status.Phase {
			case cdiv1.Succeeded:
				if _, seen := done[dv.Name]; !seen {
					done[dv.Name] = time.Since(begin)
				}
			case cdiv1.Failed:
				failed = append(failed, fmt.Sprintf("%s (%s): %s", dv.Name, kinds[dv.Name], describeDV(dv)))
			}
		}
		if len(failed) > 0 {
			t.Fatalf("%d DataVolumes failed:\n%s", len(failed), strings.Join(failed, "\n"))
		}
		pods := &corev1.PodList{}
		if err := kc.List(ctx, pods, client.InNamespace(loadNamespace), client.HasLabels{cdiv1.LabelOwnedByUID}); err == nil {
			running := 0
			for _, p := range pods.Items {
				if p.Status.Phase == corev1.PodRunning || p.Status.Phase == corev1.PodPending {
					running++
				}
			}
			maxWorkers = max(maxWorkers, running)
		}
		status = fmt.Sprintf("%v", phases)
		if len(done) == len(dvs) {
			break
		}
		if time.Now().After(deadline) {
			var waiting []string
			for i := range list.Items {
				dv := &list.Items[i]
				if _, ok := kinds[dv.Name]; ok && dv.Status.Phase != cdiv1.Succeeded {
					waiting = append(waiting, fmt.Sprintf("%s (%s) %s: %s", dv.Name, kinds[dv.Name], dv.Status.Phase, describeDV(dv)))
				}
			}
			sort.Strings(waiting)
			if len(waiting) > 10 {
				waiting = append(waiting[:10], fmt.Sprintf("... and %d more", len(waiting)-10))
			}
			t.Fatalf("after %s, %d of %d DataVolumes Succeeded (%s); still waiting:\n%s",
				timeout, len(done), len(dvs), status, strings.Join(waiting, "\n"))
		}
		time.Sleep(time.Second)
	}
	last := time.Since(begin)
	lastDone := time.Now()
	byKind := map[string]time.Duration{}
	for name, d := range done {
		byKind[kinds[name]] = max(byKind[kinds[name]], d)
	}
	rss, peak := ctrl.memory(t)
	fmt.Printf("load: datavolumes: %d at once (%d clones of one source, %d blank and HTTP imports mixed) all Succeeded; created in %s, the last %s after the first was created (last clone %s, blank %s, HTTP %s); at most %d worker pods at a time\n",
		len(dvs), counts.Clones, len(dvs)-counts.Clones, created.Round(time.Millisecond), last.Round(time.Second),
		byKind["clone"].Round(time.Second), byKind["blank"].Round(time.Second), byKind["http"].Round(time.Second), maxWorkers)
	fmt.Printf("load: datavolumes: controller RSS %.1f MiB, peak %.1f MiB (goal < %d MiB; %.1f MiB before the load); Go %s\n",
		mib(rss), mib(peak), maxLoadRSS>>20, mib(idlePeak), ctrl.heap(t))
	if peak >= maxLoadRSS {
		t.Errorf("the controller's peak RSS is %.1f MiB running %d DataVolumes; want < %d MiB", mib(peak), len(dvs), maxLoadRSS>>20)
	}
	// The DataVolumes stay: TestScale's controller starts among them, and
	// its quiet check covers them too (a minute after it starts). With
	// KUBEFILL_LOAD_DV_IDLE=1 (make bench-load) this controller's own quiet
	// is checked as well, a minute after the last DataVolume succeeded.
	if os.Getenv("KUBEFILL_LOAD_DV_IDLE") == "1" {
		ctrl.assertQuiet(t, "datavolumes", lastDone)
	}
}

// serveImage serves a small raw image over HTTP where pods reach it (the
// pod network's gateway on the host) and returns its URL.
func serveImage(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	img := bytes.Repeat([]byte("kubefill load test image block\n"), imageSize/31+1)[:imageSize]
	if err := os.WriteFile(filepath.Join(dir, "small.img"), img, 0o644); err != nil {
		t.Fatal(err)
	}
	gw, err := cl.GatewayAddress()
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(gw, "0"))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.FileServer(http.Dir(dir)), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "http://" + ln.Addr().String() + "/small.img"
}

// describeDV is a DataVolume's phase, progress, restarts and conditions'
// messages, for failure messages.
func describeDV(dv *cdiv1.DataVolume) string {
	var conds []string
	for _, c := range dv.Status.Conditions {
		if c.Message != "" {
			conds = append(conds, fmt.Sprintf("%s=%s %s: %s", c.Type, c.Status, c.Reason, c.Message))
		}
	}
	return fmt.Sprintf("progress %s, restarts %d; %s", dv.Status.Progress, dv.Status.RestartCount, strings.Join(conds, "; "))
}
