package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/kubefill/kubefill/tests/kit"
)

// shellImage is the test shell image hack/images.sh builds (Debian's static
// busybox), imported into the node's containerd.
const shellImage = "busybox:1.36"

// podWithClaim is a one-shot pod that runs script with a claim mounted at
// /data (Filesystem) or attached at /dev/xvda (Block).
func podWithClaim(name, claim string, block bool, script string) *corev1.Pod {
	c := corev1.Container{
		Name:    "main",
		Image:   shellImage,
		Command: []string{"sh", "-c", script},
	}
	if block {
		c.VolumeDevices = []corev1.VolumeDevice{{Name: "vol", DevicePath: "/dev/xvda"}}
	} else {
		c.VolumeMounts = []corev1.VolumeMount{{Name: "vol", MountPath: "/data"}}
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: ptr.To(int64(2)),
			Containers:                    []corev1.Container{c},
			Volumes: []corev1.Volume{{Name: "vol", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim},
			}}},
		},
	}
}

func createPod(t *testing.T, ns string, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	out, err := cl.Client.CoreV1().Pods(ns).Create(context.Background(), pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod %s: %v", pod.Name, err)
	}
	return out
}

// waitPod polls a pod until cond holds.
func waitPod(t *testing.T, ns, name string, timeout time.Duration, what string, cond func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	return kit.Await(t, timeout, pollInterval, fmt.Sprintf("pod %s/%s to become %s", ns, name, what),
		func() (*corev1.Pod, error) {
			return cl.Client.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
		},
		cond, func(last *corev1.Pod) string { return describePod(ns, last) })
}

func describePod(ns string, p *corev1.Pod) string {
	if p == nil {
		return "(no pod)"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "phase=%s node=%q ip=%s\n", p.Status.Phase, p.Spec.NodeName, p.Status.PodIP)
	for _, c := range p.Status.Conditions {
		fmt.Fprintf(&b, "  condition %s=%s %s %s\n", c.Type, c.Status, c.Reason, c.Message)
	}
	for _, cs := range append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...) {
		fmt.Fprintf(&b, "  container %s restarts=%d ready=%v state=%+v\n", cs.Name, cs.RestartCount, cs.Ready, cs.State)
		if logs, err := cl.PodLogs(context.Background(), ns, p.Name, cs.Name); err == nil {
			fmt.Fprintf(&b, "  logs:\n%s\n", logs)
		}
	}
	b.WriteString("events:\n" + eventsFor(ns, p.Name))
	return b.String()
}

// runToCompletion creates a pod and waits for it to succeed, returning the
// main container's termination message.
func runToCompletion(t *testing.T, ns string, pod *corev1.Pod) string {
	t.Helper()
	createPod(t, ns, pod)
	done := waitPod(t, ns, pod.Name, 2*time.Minute, "Succeeded", func(p *corev1.Pod) bool { return kit.Terminal(p.Status.Phase) })
	if done.Status.Phase != corev1.PodSucceeded {
		t.Fatalf("pod %s failed: %s", pod.Name, describePod(ns, done))
	}
	for _, cs := range done.Status.ContainerStatuses {
		if cs.Name == "main" && cs.State.Terminated != nil {
			return cs.State.Terminated.Message
		}
	}
	t.Fatalf("pod %s has no terminated main container: %s", pod.Name, describePod(ns, done))
	return ""
}

// writeScript writes a recognisable payload and reports its checksum;
// readScript reports the checksum of what it finds.
func writeScript(block bool) string {
	if block {
		return "head -c 1048576 /dev/urandom > /tmp/p && dd if=/tmp/p of=/dev/xvda bs=65536 conv=notrunc,fsync 2>/dev/null && sha256sum < /tmp/p | cut -d' ' -f1 > /dev/termination-log"
	}
	return "head -c 1048576 /dev/urandom > /data/payload && sync && sha256sum < /data/payload | cut -d' ' -f1 > /dev/termination-log"
}

func readScript(block bool) string {
	if block {
		return "head -c 1048576 /dev/xvda | sha256sum | cut -d' ' -f1 > /dev/termination-log"
	}
	return "sha256sum < /data/payload | cut -d' ' -f1 > /dev/termination-log"
}
