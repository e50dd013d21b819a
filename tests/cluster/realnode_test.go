package cluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubefill/kubefill/tests/kit"
)

// hostTraces lists what a real node may leave on the host outside its
// directory, as sorted strings: network namespaces, links, CNI cache files,
// pod log directories, containerd's /run state, cgroups named after us,
// KUBE-* and KUBEFILL-* iptables chains, loop devices, ip_forward.
func hostTraces(t *testing.T) []string {
	t.Helper()
	var out []string
	add := func(kind string, names ...string) {
		for _, n := range names {
			out = append(out, kind+" "+n)
		}
	}
	glob := func(pattern string) []string {
		m, _ := filepath.Glob(pattern)
		return m
	}
	add("netns", glob("/var/run/netns/*")...)
	links, _ := listLinks()
	add("link", links...)
	_ = filepath.WalkDir("/var/lib/cni", func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			add("cni", p)
		}
		return nil
	})
	add("pod-logs", glob("/var/log/pods/*")...)
	add("containerd-run", glob("/run/containerd/*/*")...)
	add("cgroup", glob("/sys/fs/cgroup/*/kubefill-*")...)
	add("cgroup", glob("/sys/fs/cgroup/*/kubepods*")...)
	for _, table := range []string{"filter", "nat", "mangle"} {
		b, _ := exec.Command("iptables", "-w", "-t", table, "-S").Output()
		for _, line := range strings.Split(string(b), "\n") {
			if strings.Contains(line, "KUBE-") || strings.Contains(line, "KUBEFILL-") {
				add("iptables-"+table, line)
			}
		}
	}
	// A loop device by the file behind it, so that a device another
	// process attached (the CSI driver's own tests beside this one) is told
	// from one the node left.
	for _, f := range glob("/sys/block/loop*/loop/backing_file") {
		b, _ := os.ReadFile(f)
		add("loop", strings.TrimSpace(string(b)))
	}
	fwd, _ := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
	add("ip_forward", strings.TrimSpace(string(fwd)))
	sort.Strings(out)
	return out
}

// ownTrace says whether a host trace may be the node's (of the cluster
// with network prefix prefix and directory dir), not another process's:
// other clusters and the integration tests beside this one make links and
// network namespaces named kf… with a prefix of their own, and the CSI
// driver's tests attach loop devices to files outside dir.
func ownTrace(trace, prefix, dir string) bool {
	kind, name, _ := strings.Cut(trace, " ")
	switch kind {
	case "link":
		return !strings.HasPrefix(name, "kf") || strings.HasPrefix(name, prefix)
	case "netns":
		base := filepath.Base(name)
		return !strings.HasPrefix(base, "kf") || strings.HasPrefix(base, prefix)
	case "loop":
		return strings.HasPrefix(name, dir+"/")
	}
	return true
}

// TestRealNodeStartStop starts a real node with storage, runs a pod that
// writes a claim, and checks that Stop leaves the host as it found it.
func TestRealNodeStartStop(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root like the rest of the local cluster")
	}
	if _, err := os.Stat(realNodeLease); err == nil {
		t.Skip("another cluster runs this machine's real node")
	}
	before := hostTraces(t)
	c, err := Start(context.Background(), Options{Node: true, Storage: true, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = c.Stop()
		}
	})
	ctx := context.Background()
	if _, err := GuardDrops(c.GuardChain()); err != nil {
		t.Fatal(err)
	}
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "default"},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("16Mi")}},
		},
	}
	if _, err := c.Client.CoreV1().PersistentVolumeClaims("default").Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "writer", Namespace: "default"},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{Name: "main", Image: ShellImage, Command: []string{"sh", "-c", "echo hi > /data/f && cat /data/f > /dev/termination-log"},
				VolumeMounts: []corev1.VolumeMount{{Name: "v", MountPath: "/data"}}}},
			Volumes: []corev1.Volume{{Name: "v", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "c"}}}},
		},
	}
	if err := c.WaitServiceAccount(ctx, "default"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	done := kit.Await(t, 2*time.Minute, kit.Interval, "the writer pod to end", func() (*corev1.Pod, error) {
		return c.Client.CoreV1().Pods("default").Get(ctx, "writer", metav1.GetOptions{})
	}, func(p *corev1.Pod) bool { return kit.Terminal(p.Status.Phase) }, func(p *corev1.Pod) string {
		if p == nil {
			return "no pod"
		}
		return fmt.Sprintf("%s %+v", p.Status.Phase, p.Status.ContainerStatuses)
	})
	if done.Status.Phase != corev1.PodSucceeded || done.Status.ContainerStatuses[0].State.Terminated.Message != "hi\n" {
		t.Fatalf("writer ended %s: %+v", done.Status.Phase, done.Status.ContainerStatuses)
	}
	during := hostTraces(t)
	st := c.State()
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	stopped = true
	if left := st.Leftovers(); len(left) > 0 {
		t.Errorf("left behind after Stop: %v", left)
	}
	after := hostTraces(t)
	ours := func(s string) bool { return ownTrace(s, st.NetPrefix, st.Dir) }
	var added, removed []string
	for _, s := range after {
		if !slices.Contains(before, s) && ours(s) {
			added = append(added, s)
		}
	}
	for _, s := range before {
		if !slices.Contains(after, s) && ours(s) {
			removed = append(removed, s)
		}
	}
	if len(added) > 0 || len(removed) > 0 {
		t.Errorf("the host differs after Stop:\n added %v\n removed %v", added, removed)
	}
	var seen []string
	for _, s := range during {
		if !slices.Contains(before, s) {
			seen = append(seen, s)
		}
	}
	t.Logf("host traces while the node ran (all gone after Stop): %d, e.g. %v", len(seen), seen[:min(len(seen), 12)])
}

func TestOwnTrace(t *testing.T) {
	for _, tc := range []struct {
		trace string
		want  bool
	}{
		{"link kfab12node", true},
		{"link kfcd34node", false},
		{"link eth0", true},
		{"netns /var/run/netns/cni-1234", true},
		{"netns /var/run/netns/kfagg77-1", false},
		{"netns /var/run/netns/kfab12x", true},
		{"loop /tmp/kf-cluster-1/csi/vol-1/disk.img", true},
		{"loop /tmp/kf-cluster-1/csi/vol-1/disk.img (deleted)", true},
		{"loop /tmp/TestBlockVolumes123/disk.img", false},
		{"loop /tmp/kf-cluster-10/disk.img", false},
		{"iptables-nat -N KUBE-SERVICES", true},
	} {
		if got := ownTrace(tc.trace, "kfab12", "/tmp/kf-cluster-1"); got != tc.want {
			t.Errorf("ownTrace(%q) = %v, want %v", tc.trace, got, tc.want)
		}
	}
}
