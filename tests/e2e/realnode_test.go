package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"

	"github.com/kubefill/kubefill/tests/cluster"
	"github.com/kubefill/kubefill/tests/kit"
)

// These tests need what only a real node has: kernel memory limits (the
// harness's own checks of the node are in tests/cluster/selftest).

func needRealNode(t *testing.T) {
	t.Helper()
	if cl.NodeIP() == "" {
		t.Skip("needs the real node (KUBEFILL_NODE_AGENT=1 runs the stand-in)")
	}
}

// TestImporterImportsUnder64MiLimit: with CDIConfig's podResourceRequirements
// limiting worker pods to 64Mi, the importer still imports a 2 GiB
// zlib-compressed qcow2 and a 2 GiB raw.gz: its memory does not grow with
// the image, and the kernel enforces the limit (CDI's importer is
// OOM-killed at 600Mi on such images: its issues #2110 and #3119).
func TestImporterImportsUnder64MiLimit(t *testing.T) {
	needRealNode(t)
	c := shared.c
	setPodLimits(t, c, "64Mi")
	begin := time.Now()
	dir, want := bigImages(t)
	t.Logf("2 GiB fixtures ready in %s (%s)", time.Since(begin).Round(time.Millisecond), dir)
	url := imageServer(t, dir)
	// Both at once, each in a namespace of its own: the limit is CDIConfig's,
	// the same for both, and each importer may use a core of its own.
	for _, name := range []string{"disk.qcow2", "disk.raw.gz"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ns := newNamespace(t)
			dvName := strings.ReplaceAll(name, ".", "-")
			dv := kit.DataVolume(ns, dvName, kit.HTTP(url+"/"+name), kit.WithPVC(filesystemClaim("2300Mi")))
			start := time.Now()
			if err := c.Create(context.Background(), dv); err != nil {
				t.Fatal(err)
			}
			var worker *corev1.Pod
			got, _ := kit.WaitDataVolume(t, c, ns, dvName, 10*time.Minute, func(dv *cdiv1.DataVolume) bool {
				pods, err := cl.Client.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: cdiv1.LabelComponent + "=importer"})
				if err == nil && len(pods.Items) > 0 {
					worker = &pods.Items[0]
				}
				return kit.Terminal(dv.Status.Phase)
			})
			if got.Status.Phase != cdiv1.Succeeded {
				t.Fatalf("%s ended %s: %+v\nevents:\n%s", name, got.Status.Phase, got.Status.Conditions, eventsFor(ns, dvName))
			}
			if worker == nil {
				t.Fatalf("%s: never saw the importer pod", name)
			}
			lim := worker.Spec.Containers[0].Resources.Limits[corev1.ResourceMemory]
			if lim.Cmp(resource.MustParse("64Mi")) != 0 {
				t.Fatalf("%s: the importer pod's memory limit is %s, want 64Mi from CDIConfig", name, lim.String())
			}
			t.Logf("%s: 2 GiB imported in %s under a 64Mi limit", name, time.Since(start).Round(time.Millisecond))
			if sum := claimSHA256(t, ns, dvName, 2<<30); sum != want {
				t.Errorf("%s: the claim holds sha256 %s, the image is %s", name, sum, want)
			}
		})
	}
}

// setPodLimits sets CDIConfig's podResourceRequirements (memory limit
// and request) for the test and restores it afterwards.
func setPodLimits(t *testing.T, c client.Client, memory string) {
	t.Helper()
	ctx := context.Background()
	cfg := &cdiv1.CDIConfig{}
	key := types.NamespacedName{Name: cdiv1.CDIConfigName}
	kit.Eventually(t, time.Minute, kit.Interval, "CDIConfig to exist", func() (bool, string, error) {
		err := c.Get(ctx, key, cfg)
		return err == nil, fmt.Sprint(err), nil
	})
	old := cfg.Spec.PodResourceRequirements.DeepCopy()
	q := resource.MustParse(memory)
	cfg.Spec.PodResourceRequirements = &corev1.ResourceRequirements{
		Limits:   corev1.ResourceList{corev1.ResourceMemory: q, corev1.ResourceCPU: resource.MustParse("1")},
		Requests: corev1.ResourceList{corev1.ResourceMemory: q, corev1.ResourceCPU: resource.MustParse("100m")},
	}
	if err := c.Update(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cur := &cdiv1.CDIConfig{}
		if err := c.Get(ctx, key, cur); err != nil {
			t.Errorf("restore CDIConfig: %v", err)
			return
		}
		cur.Spec.PodResourceRequirements = old
		if err := c.Update(ctx, cur); err != nil {
			t.Errorf("restore CDIConfig: %v", err)
		}
	})
	kit.Eventually(t, time.Minute, kit.Interval, "CDIConfig status to carry the pod limits", func() (bool, string, error) {
		cur := &cdiv1.CDIConfig{}
		if err := c.Get(ctx, key, cur); err != nil {
			return false, "", err
		}
		r := cur.Status.DefaultPodResourceRequirements
		ok := r != nil && r.Limits.Memory().Cmp(q) == 0
		return ok, fmt.Sprintf("status %+v", r), nil
	})
}

// patternedRaw writes a raw image of size bytes with data in every block:
// each 4 KiB block repeats one non-zero byte, so nothing of it is a hole
// (every byte must travel) and zlib and gzip shrink it quickly.
func patternedRaw(t *testing.T, dir string, size int64) string {
	t.Helper()
	path := filepath.Join(dir, "pattern.raw")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 4<<20)
	for b := 0; b < len(buf); b += 4096 {
		v := byte(b/4096%255 + 1)
		for i := b; i < b+4096; i++ {
			buf[i] = v
		}
	}
	for off := int64(0); off < size; off += int64(len(buf)) {
		if _, err := f.Write(buf); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestBlockDataVolumeReadFromDevice: a Block DataVolume's bytes, read back
// from the device node inside a pod, are the image's.
func TestBlockDataVolumeReadFromDevice(t *testing.T) {
	parallel(t)
	needRealNode(t)
	c := shared.c
	ns := newNamespace(t)
	dir := t.TempDir()
	name, virtualSize, want := testImage(t, dir)
	url := imageServer(t, dir) + "/" + name
	spec := kit.ClaimSpec("64Mi", kit.Class(cluster.StorageClassImmediate), kit.Mode(corev1.PersistentVolumeBlock))
	if err := c.Create(context.Background(), kit.DataVolume(ns, "blk", kit.HTTP(url), kit.WithPVC(spec))); err != nil {
		t.Fatal(err)
	}
	dv, _ := kit.WaitDataVolumeTerminal(t, c, ns, "blk", 4*time.Minute)
	if dv.Status.Phase != cdiv1.Succeeded {
		t.Fatalf("DataVolume ended %s: %+v\nevents:\n%s", dv.Status.Phase, dv.Status.Conditions, eventsFor(ns, "blk"))
	}
	pod := podWithClaim("read-blk", "blk", true, fmt.Sprintf(
		`test -b /dev/xvda || { echo "/dev/xvda is not a block device" > /dev/termination-log; exit 1; }; head -c %d /dev/xvda | sha256sum | cut -d' ' -f1 > /dev/termination-log`, virtualSize))
	if got := strings.TrimSpace(runToCompletion(t, ns, pod)); got != want {
		t.Fatalf("the device holds sha256 %s over %d bytes, qemu-img convert gives %s", got, virtualSize, want)
	}
}
