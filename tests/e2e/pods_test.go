package e2e

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/kubefill/kubefill/tests/kit"
)

// shellImage is the test shell image hack/images.sh builds.
const shellImage = kit.ShellImage

// podWithClaim is a one-shot pod that runs script with a claim mounted at
// /data (Filesystem) or attached at /dev/xvda (Block).
func podWithClaim(name, claim string, block bool, script string) *corev1.Pod {
	return kit.PodWithClaim(name, claim, block, script)
}

func createPod(t *testing.T, ns string, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	return kit.CreatePod(t, cl.Client, ns, pod)
}

// waitPod polls a pod until cond holds.
func waitPod(t *testing.T, ns, name string, timeout time.Duration, what string, cond func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	return kit.WaitPod(t, cl.Client, ns, name, timeout, what, cond)
}

// runToCompletion creates a pod and waits for it to succeed, returning the
// main container's termination message.
func runToCompletion(t *testing.T, ns string, pod *corev1.Pod) string {
	t.Helper()
	return kit.RunToCompletion(t, cl.Client, ns, pod)
}
