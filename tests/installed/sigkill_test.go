package installed

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	snapshotv1 "github.com/kubernetes-csi/external-snapshotter/client/v6/apis/volumesnapshot/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	uploadv1 "github.com/kubefill/kubefill-api/upload/v1beta1"
	"github.com/kubefill/kubefill/pkg/certs"
	"github.com/kubefill/kubefill/tests/kit"
)

// TestInstalledSIGKILL kills the installed controller's process with
// SIGKILL, through containerd, in the middle of an HTTP import, of an
// upload streaming through the installed proxy, and of a clone by each
// strategy; kubelet runs the container again in the same pod (restartCount
// one more, a new container, the last run's exit 137) and the new process
// takes the leader lease once the dead one's expires. Each DataVolume then
// ends Succeeded with the right bytes, its phases never go back or fail,
// each worker pod, prime and temporary object is made once and never two at
// a time, and once it is deleted nothing is left in its namespaces.
func TestInstalledSIGKILL(t *testing.T) {
	c := snapClient(t)
	start := time.Now()
	t.Run("import", func(t *testing.T) { testSIGKILLMidImport(t, c) })
	t.Run("upload", func(t *testing.T) { testSIGKILLMidUpload(t, c) })
	for _, st := range []cdiv1.CDICloneStrategy{cdiv1.CloneStrategySnapshot, cdiv1.CloneStrategyCsiClone, cdiv1.CloneStrategyHostAssisted} {
		t.Run("clone/"+string(st), func(t *testing.T) { testSIGKILLMidClone(t, c, st) })
	}
	t.Logf("SIGKILL tests took %s", time.Since(start).Round(time.Millisecond))
}

// importerState says whether the importer pod of DataVolume ns/name runs.
func importerState(ctx context.Context, c client.Client, ns, name string) string {
	pvc := &corev1.PersistentVolumeClaim{}
	if err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, pvc); err != nil {
		return err.Error()
	}
	pod := &corev1.Pod{}
	podName := "importer-prime-" + string(pvc.UID)
	if err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: podName}, pod); err != nil {
		return "importer pod: " + err.Error()
	}
	return "importer pod " + string(pod.Status.Phase)
}

// percent parses a DataVolume progress such as "23.5%".
func percent(s string) (float64, bool) {
	v, err := strconv.ParseFloat(strings.TrimSuffix(s, "%"), 64)
	return v, err == nil && strings.HasSuffix(s, "%")
}

// testSIGKILLMidImport imports 64 MiB from a source throttled to 2 MiB/s
// and kills the controller once the DataVolume is ImportInProgress past a
// fifth of the data: the importer pod goes on alone, and the new controller
// follows it to the end.
func testSIGKILLMidImport(t *testing.T, c client.WithWatch) {
	ctx := context.Background()
	ns := testNamespace(t, "sigkill-import")
	const size = 64 << 20
	dir := t.TempDir()
	data, sum := randomData(size)
	if err := os.WriteFile(filepath.Join(dir, "disk.raw"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	url := throttledServer(t, dir, 2<<20) + "/disk.raw"
	tr := track(t, c, ns)
	freshController(t)
	name := "imported"
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("when the test failed:\n%s", describeDataVolume(c, ns, name))
		}
	})
	dv := &cdiv1.DataVolume{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: cdiv1.DataVolumeSpec{Source: &cdiv1.DataVolumeSource{HTTP: &cdiv1.DataVolumeSourceHTTP{URL: url}}, Storage: storageSpec("128Mi")}}
	created := time.Now()
	if err := c.Create(ctx, dv); err != nil {
		t.Fatal(err)
	}
	var inProgress time.Time
	kit.Eventually(t, 3*time.Minute, 100*time.Millisecond, "the import to be in progress past 20%", func() (bool, string, error) {
		if err := c.Get(ctx, client.ObjectKeyFromObject(dv), dv); err != nil {
			return false, err.Error(), nil
		}
		if kit.Terminal(dv.Status.Phase) {
			t.Fatalf("the import ended %s before the test saw it in flight", dv.Status.Phase)
		}
		if dv.Status.Phase != cdiv1.ImportInProgress {
			return false, string(dv.Status.Phase), nil
		}
		if inProgress.IsZero() {
			inProgress = time.Now()
		}
		// Past 20%, or 10 s in when no progress shows.
		p, ok := percent(string(dv.Status.Progress))
		return (ok && p >= 20) || time.Since(inProgress) > 10*time.Second, fmt.Sprintf("%s %s", dv.Status.Phase, dv.Status.Progress), nil
	})
	t.Logf("killing the controller mid-import (+%.1fs): DataVolume %s %s, %s after it was created", time.Since(tr.began).Seconds(), dv.Status.Phase, dv.Status.Progress, time.Since(created).Round(100*time.Millisecond))
	k := killController(t)
	k.waitBack(t)
	_ = c.Get(ctx, client.ObjectKeyFromObject(dv), dv)
	t.Logf("%s; DataVolume then %s %s, %s", k, dv.Status.Phase, dv.Status.Progress, importerState(ctx, c, ns, name))

	dv = waitSucceeded(t, ns, name, 4*time.Minute)
	t.Logf("import Succeeded %s after the SIGKILL, %s after creation", time.Since(k.at).Round(100*time.Millisecond), time.Since(created).Round(100*time.Millisecond))
	if got := readBack(t, ns, name, size); got != sum {
		t.Errorf("imported bytes hash %s, want %s", got, sum)
	} else {
		t.Logf("sha256 through a reader pod matches the source: %s", got)
	}
	if dv.Status.RestartCount != 0 {
		t.Errorf("the importer restarted %d times: the kill should not touch it", dv.Status.RestartCount)
	}
	finish(t, c, tr, dv, cdiv1.ImportInProgress, []string{ns}, nil)
}

// testSIGKILLMidUpload streams 64 MiB at 2 MiB/s through the installed
// upload proxy with a token from the aggregated API, and kills the
// controller once a quarter is sent: the stream (proxy to upload server)
// does not need the controller and ends 200, and the new controller takes
// the DataVolume to Succeeded.
func testSIGKILLMidUpload(t *testing.T, c client.WithWatch) {
	ctx := context.Background()
	ns := testNamespace(t, "sigkill-upload")
	const size = 64 << 20
	tr := track(t, c, ns)
	freshController(t)
	name := "uploaded"
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("when the test failed:\n%s", describeDataVolume(c, ns, name))
		}
	})
	dv := &cdiv1.DataVolume{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: cdiv1.DataVolumeSpec{Source: &cdiv1.DataVolumeSource{Upload: &cdiv1.DataVolumeSourceUpload{}}, Storage: storageSpec("128Mi")}}
	created := time.Now()
	if err := c.Create(ctx, dv); err != nil {
		t.Fatal(err)
	}
	if dv, _ = kit.WaitDataVolume(t, c, ns, name, 3*time.Minute, func(dv *cdiv1.DataVolume) bool {
		return dv.Status.Phase == cdiv1.UploadReady || kit.Terminal(dv.Status.Phase)
	}); dv.Status.Phase != cdiv1.UploadReady {
		t.Fatalf("the upload DataVolume is %s, not UploadReady", dv.Status.Phase)
	}
	tok := &uploadv1.UploadTokenRequest{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "sigkill"}, Spec: uploadv1.UploadTokenRequestSpec{PvcName: name}}
	if err := c.Create(ctx, tok); err != nil || tok.Status.Token == "" {
		t.Fatalf("UploadTokenRequest through the aggregator: %v (token %q)", err, tok.Status.Token)
	}
	proxyURL, hc := uploadProxy(t)

	data, sum := randomData(size)
	body := &slowReader{data: data, perTick: (2 << 20) / 20}
	type answer struct {
		code int
		text string
		err  error
		took time.Duration
	}
	answers := make(chan answer, 1)
	uctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	go func() {
		began := time.Now()
		req, err := http.NewRequestWithContext(uctx, http.MethodPost, proxyURL+"/v1beta1/upload", body)
		if err != nil {
			answers <- answer{err: err}
			return
		}
		req.ContentLength = size
		req.Header.Set("Content-Type", "application/octet-stream")
		req.Header.Set("Authorization", "Bearer "+tok.Status.Token)
		resp, err := hc.Do(req)
		if err != nil {
			answers <- answer{err: err, took: time.Since(began)}
			return
		}
		text, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		answers <- answer{code: resp.StatusCode, text: strings.TrimSpace(string(text)), took: time.Since(began)}
	}()
	kit.Eventually(t, 2*time.Minute, 50*time.Millisecond, "a quarter of the upload to be sent", func() (bool, string, error) {
		select {
		case a := <-answers:
			t.Fatalf("the upload ended before the test killed the controller: %d %s %v", a.code, a.text, a.err)
		default:
		}
		return body.sent.Load() >= size/4, fmt.Sprintf("%d bytes sent", body.sent.Load()), nil
	})
	if err := c.Get(ctx, client.ObjectKeyFromObject(dv), dv); err != nil {
		t.Fatal(err)
	}
	t.Logf("killing the controller mid-upload (+%.1fs): %d of %d bytes sent through the proxy, DataVolume %s %s", time.Since(tr.began).Seconds(), body.sent.Load(), size, dv.Status.Phase, dv.Status.Progress)
	k := killController(t)
	k.waitBack(t)
	_ = c.Get(ctx, client.ObjectKeyFromObject(dv), dv)
	t.Logf("%s; by then %d bytes sent, DataVolume %s %s", k, body.sent.Load(), dv.Status.Phase, dv.Status.Progress)

	a := <-answers
	if a.err != nil || a.code != http.StatusOK {
		t.Fatalf("the upload through the proxy: %d %s %v", a.code, a.text, a.err)
	}
	t.Logf("the upload stream ended 200 after %s", a.took.Round(100*time.Millisecond))
	dv = waitSucceeded(t, ns, name, 3*time.Minute)
	t.Logf("upload Succeeded %s after the SIGKILL, %s after creation", time.Since(k.at).Round(100*time.Millisecond), time.Since(created).Round(100*time.Millisecond))
	if got := readBack(t, ns, name, size); got != sum {
		t.Errorf("uploaded bytes hash %s, want %s", got, sum)
	} else {
		t.Logf("sha256 through a reader pod matches what was sent: %s", got)
	}
	finish(t, c, tr, dv, cdiv1.UploadReady, []string{ns}, nil)
}

// uploadProxy is the installed proxy's URL by its cluster IP, and a client
// trusting its signer's bundle.
func uploadProxy(t *testing.T) (string, *http.Client) {
	t.Helper()
	ctx := context.Background()
	svc := &corev1.Service{}
	if err := kc.Get(ctx, types.NamespacedName{Namespace: installNS, Name: certs.DefaultUploadProxyService}, svc); err != nil {
		t.Fatal(err)
	}
	ca := &corev1.ConfigMap{}
	if err := kc.Get(ctx, types.NamespacedName{Namespace: installNS, Name: certs.BundleName(certs.UploadProxySigner)}, ca); err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM([]byte(ca.Data[certs.BundleKey])) {
		t.Fatalf("no certificate in %s", certs.BundleName(certs.UploadProxySigner))
	}
	return "https://" + net.JoinHostPort(svc.Spec.ClusterIP, "443"),
		&http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
}

// cloneInFlight is the DataVolume phase of each strategy's slow step.
var cloneInFlight = map[cdiv1.CDICloneStrategy]cdiv1.DataVolumePhase{
	cdiv1.CloneStrategyHostAssisted: cdiv1.CloneInProgress,
	cdiv1.CloneStrategySnapshot:     cdiv1.SnapshotForSmartCloneInProgress,
	cdiv1.CloneStrategyCsiClone:     cdiv1.CSICloneInProgress,
}

// testSIGKILLMidClone clones across namespaces by st and kills the
// controller while the strategy's slow step runs: a CreateSnapshot or a CSI
// clone the driver holds for 8 s, or a 512 MiB copy streaming from the
// source pod.
func testSIGKILLMidClone(t *testing.T, c client.WithWatch, st cdiv1.CDICloneStrategy) {
	ctx := context.Background()
	snapClass, delay, dataMiB, size := "", "", 32, "64Mi"
	switch st {
	case cdiv1.CloneStrategySnapshot:
		snapClass = slowSnapshotClass(t, c, "8s")
	case cdiv1.CloneStrategyCsiClone:
		delay = "8s"
	case cdiv1.CloneStrategyHostAssisted:
		dataMiB, size = 512, "600Mi"
	}
	class := cloneClass(t, c, st, snapClass, delay)
	srcNs, dstNs := testNamespace(t, "sigkill-src"), testNamespace(t, "sigkill-dst")
	sum := writeSource(t, c, srcNs, "golden", class, size, dataMiB)
	tr := track(t, c, srcNs, dstNs)
	freshController(t)
	name := "survivor"
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("when the test failed:\n%s", describeDataVolume(c, dstNs, name, srcNs))
		}
	})
	dv := &cdiv1.DataVolume{ObjectMeta: metav1.ObjectMeta{Namespace: dstNs, Name: name},
		Spec: cdiv1.DataVolumeSpec{Source: &cdiv1.DataVolumeSource{PVC: &cdiv1.DataVolumeSourcePVC{Namespace: srcNs, Name: "golden"}},
			Storage: &cdiv1.StorageSpec{StorageClassName: ptr.To(class),
				Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)}}}}}
	created := time.Now()
	if err := c.Create(ctx, dv); err != nil {
		t.Fatal(err)
	}
	target := &corev1.PersistentVolumeClaim{}
	var step string
	kit.Eventually(t, 3*time.Minute, 50*time.Millisecond, "the "+string(st)+" clone to be in "+string(cloneInFlight[st]), func() (bool, string, error) {
		if err := c.Get(ctx, client.ObjectKeyFromObject(dv), dv); err != nil {
			return false, err.Error(), nil
		}
		if kit.Terminal(dv.Status.Phase) {
			t.Fatalf("the clone ended %s before the test saw it in flight", dv.Status.Phase)
		}
		if dv.Status.Phase != cloneInFlight[st] {
			return false, string(dv.Status.Phase), nil
		}
		if err := c.Get(ctx, client.ObjectKeyFromObject(dv), target); err != nil {
			return false, err.Error(), nil
		}
		step = kit.CloneStepInFlight(ctx, c, st, srcNs, string(target.UID))
		return step != "", fmt.Sprintf("%s %s, slow step not seen", dv.Status.Phase, dv.Status.Progress), nil
	})
	t.Logf("killing the controller mid-clone (+%.1fs): DataVolume %s %s, %s, %s after creation", time.Since(tr.began).Seconds(), dv.Status.Phase, dv.Status.Progress, step, time.Since(created).Round(10*time.Millisecond))
	k := killController(t)
	right := kit.CloneStepInFlight(ctx, c, st, srcNs, string(target.UID))
	if right == "" {
		right = "the slow step done"
	}
	t.Logf("right after the kill (%s): %s", time.Since(k.at).Round(10*time.Millisecond), right)
	k.waitBack(t)
	_ = c.Get(ctx, client.ObjectKeyFromObject(dv), dv)
	now := kit.CloneStepInFlight(ctx, c, st, srcNs, string(target.UID))
	if now == "" {
		now = "the slow step done"
	}
	t.Logf("%s; DataVolume then %s %s, %s", k, dv.Status.Phase, dv.Status.Progress, now)

	dv = waitSucceeded(t, dstNs, name, 5*time.Minute)
	t.Logf("%s clone Succeeded %s after the SIGKILL, %s after creation", st, time.Since(k.at).Round(100*time.Millisecond), time.Since(created).Round(100*time.Millisecond))
	if got := dv.Annotations[cdiv1.AnnCloneType]; got != string(st) {
		t.Errorf("DataVolume %s=%q, want %q", cdiv1.AnnCloneType, got, st)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(dv), target); err != nil {
		t.Fatal(err)
	}
	src := &corev1.PersistentVolumeClaim{}
	if err := c.Get(ctx, types.NamespacedName{Namespace: srcNs, Name: "golden"}, src); err != nil {
		t.Fatal(err)
	}
	if target.Status.Phase != corev1.ClaimBound || target.Spec.VolumeName == "" || target.Spec.VolumeName == src.Spec.VolumeName {
		t.Errorf("the clone's claim is %s on volume %q (the source's is %s)", target.Status.Phase, target.Spec.VolumeName, src.Spec.VolumeName)
	}
	if got := readBack(t, dstNs, name, dataMiB<<20); got != sum {
		t.Errorf("cloned bytes hash %s, the source %s", got, sum)
	} else {
		t.Logf("sha256 through a reader pod matches the source: %s", got)
	}
	finish(t, c, tr, dv, cloneInFlight[st], []string{srcNs, dstNs}, map[string]string{srcNs: "golden"})
	if got := readBack(t, srcNs, "golden", dataMiB<<20); got != sum {
		t.Errorf("the source now hashes %s, it held %s", got, sum)
	}
}

// finish checks a Succeeded DataVolume's history (phases, temporaries made
// once, none left while it exists, no populator finalizer on its claim),
// then deletes it and checks that nothing is left in namespaces but keep.
func finish(t *testing.T, c client.WithWatch, tr *tempTracker, dv *cdiv1.DataVolume, inFlight cdiv1.DataVolumePhase, namespaces []string, keep map[string]string) {
	t.Helper()
	ctx := context.Background()
	pvc := &corev1.PersistentVolumeClaim{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(dv), pvc); err != nil {
		t.Fatal(err)
	}
	kit.Eventually(t, time.Minute, 250*time.Millisecond, "the DataVolume's temporary objects to go", func() (bool, string, error) {
		left, err := temporariesOf(ctx, c, pvc.UID, namespaces)
		return len(left) == 0 && err == nil, fmt.Sprintf("left %v %v", left, err), nil
	})
	if err := c.Get(ctx, client.ObjectKeyFromObject(dv), pvc); err != nil {
		t.Fatal(err)
	}
	for _, f := range pvc.Finalizers {
		if strings.Contains(f, "cdi.kubevirt.io") {
			t.Errorf("the Succeeded claim still has finalizer %s", f)
		}
	}
	switch inFlight {
	case cdiv1.ImportInProgress, cdiv1.UploadReady, cdiv1.CloneInProgress:
		// The worker's figure: the copy ended at all of it.
		if dv.Status.Progress != "100.0%" {
			t.Errorf("DataVolume %s/%s Succeeded with progress %q, want 100.0%%", dv.Namespace, dv.Name, dv.Status.Progress)
		}
	}
	tr.checkProgress(t, dv.Namespace, dv.Name)
	phases := tr.checkPhases(t, dv.Namespace, dv.Name, inFlight)
	t.Logf("phases %v; %s", phases, tr.CheckTemporaries(t, pvc.UID))
	t.Logf("DataVolume steps: %s", strings.Join(tr.stepsOf(dv.Namespace, dv.Name), ", "))
	deleteDataVolume(t, c, dv.Namespace, dv.Name)
	began := time.Now()
	assertNothingLeft(t, c, namespaces, keep)
	t.Logf("after the DataVolume was deleted nothing was left in %v within %s", namespaces, time.Since(began).Round(100*time.Millisecond))
}

// temporariesOf lists the claims, pods and snapshots of namespaces named
// after or labelled with the target claim's uid (a deleted snapshot held
// only by external-provisioner's finalizers does not count).
func temporariesOf(ctx context.Context, c client.Client, uid types.UID, namespaces []string) ([]string, error) {
	var left []string
	ours := func(o client.Object) bool {
		return o.GetLabels()[cdiv1.LabelOwnedByUID] == string(uid) || strings.Contains(o.GetName(), string(uid))
	}
	for _, ns := range namespaces {
		claims := &corev1.PersistentVolumeClaimList{}
		pods := &corev1.PodList{}
		snaps := &snapshotv1.VolumeSnapshotList{}
		for _, l := range []client.ObjectList{claims, pods, snaps} {
			if err := c.List(ctx, l, client.InNamespace(ns)); err != nil {
				return nil, err
			}
		}
		for i := range claims.Items {
			if ours(&claims.Items[i]) {
				left = append(left, "claim "+ns+"/"+claims.Items[i].Name)
			}
		}
		for i := range pods.Items {
			if ours(&pods.Items[i]) {
				left = append(left, "pod "+ns+"/"+pods.Items[i].Name)
			}
		}
		for i := range snaps.Items {
			sn := &snaps.Items[i]
			if ours(sn) && !(sn.DeletionTimestamp != nil && kit.OnlyProvisionerFinalizers(sn.Finalizers)) {
				left = append(left, "snapshot "+ns+"/"+sn.Name)
			}
		}
	}
	return left, nil
}
