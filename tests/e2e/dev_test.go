package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kubefill/kubefill/tests/cluster"
	"github.com/kubefill/kubefill/tests/kit"
)

// TestDevUpDown runs the dev job's own commands: `kubefill-dev up` leaves a
// second cluster running after the command exits; with a pod running on a
// mounted PVC in it (a mount, a network namespace, a veth), `kubefill-dev
// down` removes every trace.
func TestDevUpDown(t *testing.T) {
	// The shared cluster's start built the helper binary into the cache.
	bin := filepath.Join(cluster.CacheDir(), "dev", "kubefill-dev")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("helper binary: %v", err)
	}
	dir := filepath.Join(t.TempDir(), "dev")
	start := time.Now()
	up := exec.Command(bin, "up", "--dir", dir)
	if out, err := up.CombinedOutput(); err != nil {
		t.Fatalf("kubefill-dev up: %v\n%s", err, out)
	}
	t.Logf("kubefill-dev up took %s", time.Since(start).Round(time.Millisecond))
	downDone := false
	t.Cleanup(func() {
		if !downDone {
			_ = cluster.Teardown(dir, true)
		}
	})
	state, err := cluster.LoadState(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !state.Running() {
		t.Fatal("the cluster's processes did not outlive `up`")
	}

	cfg, err := clientcmd.BuildConfigFromFlags("", state.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := testContext(t, 2*time.Minute)
	if _, err := client.CoreV1().PersistentVolumeClaims("default").Create(ctx,
		pvcSpec("held", cluster.StorageClassImmediate, "16Mi", corev1.PersistentVolumeFilesystem), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := podWithClaim("holder", "held", false, "echo held > /data/f && exec sleep 3600")
	pod.Spec.RestartPolicy = corev1.RestartPolicyAlways
	if _, err := client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	kit.Await(t, 2*time.Minute, pollInterval, "the holder pod to run",
		func() (*corev1.Pod, error) {
			return client.CoreV1().Pods("default").Get(ctx, "holder", metav1.GetOptions{})
		},
		func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning },
		func(p *corev1.Pod) string {
			if p == nil {
				return "no pod"
			}
			return fmt.Sprintf("last status %+v", p.Status)
		})
	// A running pod with a PVC means a CSI bind mount, a namespace and a veth.
	if mounts, _ := os.ReadFile("/proc/self/mountinfo"); !strings.Contains(string(mounts), dir) {
		t.Fatal("no CSI mount under the dev cluster's directory while its pod runs")
	}

	down := exec.Command(bin, "down", "--dir", dir)
	if out, err := down.CombinedOutput(); err != nil {
		t.Fatalf("kubefill-dev down: %v\n%s", err, out)
	}
	downDone = true
	if left := state.Leftovers(); len(left) > 0 {
		t.Fatalf("left behind after down: %v", left)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("%s still exists after down", dir)
	}
}
