package cluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kubefill/kubefill/tests/kit"
)

// TestDevUpDown runs the dev job's own commands: `kubefill-dev up` leaves a
// cluster running after the command exits; with a pod running on a mounted
// PVC in it (a mount, a sandbox, a veth, cgroups), `kubefill-dev down`
// removes every trace.
func TestDevUpDown(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root like the rest of the local cluster")
	}
	if _, err := os.Stat(realNodeLease); err == nil {
		t.Skip("another cluster runs this machine's real node")
	}
	repo, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin, err := goBuild(repo, "./tests/cluster/cmd/kubefill-dev", "kubefill-dev")
	if err != nil {
		t.Fatal(err)
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
			_ = Teardown(dir, true)
		}
	})
	state, err := LoadState(dir)
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
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "held"},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("16Mi")}},
		},
	}
	if _, err := client.CoreV1().PersistentVolumeClaims("default").Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	kit.Await(t, time.Minute, kit.Interval, "the default service account", func() (*corev1.ServiceAccount, error) {
		return client.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
	}, func(*corev1.ServiceAccount) bool { return true }, nil)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "holder"},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{Name: "main", Image: ShellImage, Command: []string{"sh", "-c", "echo held > /data/f && exec sleep 3600"},
				VolumeMounts: []corev1.VolumeMount{{Name: "v", MountPath: "/data"}}}},
			Volumes: []corev1.Volume{{Name: "v", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "held"}}}},
		},
	}
	if _, err := client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	kit.Await(t, 2*time.Minute, kit.Interval, "the holder pod to run",
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
	// A running pod with a PVC means a CSI bind mount, a sandbox and a veth.
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
