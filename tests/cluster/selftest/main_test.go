// Package selftest holds the harness's own tests on one local cluster
// (tests/cluster: control plane, CSI sidecars and our hostpath driver, a
// real node): what a kubelet provides pods, storage binding, snapshots and
// clones, static and rebound volumes, kernel memory limits, Services and
// DNS, the guard on the host's routes. Kubefill is not in it; its own
// tests are tests/e2e.
//
// Each test works in namespaces of its own and calls t.Parallel() first,
// except TestGuardKeepsPodTrafficOnTheMachine, which counts the guard's
// drops for the whole node and so runs alone (go test runs the tests that
// do not call t.Parallel() first, one at a time).
package selftest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/kubefill/kubefill/tests/cluster"
	"github.com/kubefill/kubefill/tests/kit"
)

// cl is the cluster every test in this package shares.
var cl *cluster.Cluster

func TestMain(m *testing.M) {
	os.Exit(cluster.RunMain(m, "selftest", cluster.Options{Storage: true, Node: true},
		func(c *cluster.Cluster) (func() error, error) { cl = c; return nil, nil }))
}

const (
	pollInterval = kit.PollInterval
	shellImage   = kit.ShellImage
)

func needRealNode(t *testing.T) {
	t.Helper()
	if cl.NodeIP() == "" {
		t.Skip("needs the real node (KUBEFILL_NODE_AGENT=1 runs the stand-in)")
	}
}

func testContext(t *testing.T, timeout time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	return ctx
}

func randomSuffix() string {
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// newNamespace creates a namespace for one test and deletes it afterwards.
func newNamespace(t *testing.T) string {
	t.Helper()
	return kit.Namespace(t, cl.Client, kit.TestNamespaceName(t.Name()), nil)
}

// pvcSpec is a ReadWriteOnce claim of storageClass, size and mode.
func pvcSpec(name, storageClass string, size string, mode corev1.PersistentVolumeMode) *corev1.PersistentVolumeClaim {
	return kit.PVC("", name, size, kit.Class(storageClass), kit.Mode(mode))
}

func createPVC(t *testing.T, ns string, pvc *corev1.PersistentVolumeClaim) *corev1.PersistentVolumeClaim {
	t.Helper()
	return kit.CreatePVC(t, cl.Client, ns, pvc)
}

func waitPVC(t *testing.T, ns, name string, timeout time.Duration, what string, cond func(*corev1.PersistentVolumeClaim) bool) *corev1.PersistentVolumeClaim {
	t.Helper()
	return kit.WaitPVC(t, cl.Client, ns, name, timeout, what, cond)
}

func waitPVCPhase(t *testing.T, ns, name string, phase corev1.PersistentVolumeClaimPhase, timeout time.Duration) *corev1.PersistentVolumeClaim {
	t.Helper()
	return waitPVC(t, ns, name, timeout, string(phase), func(p *corev1.PersistentVolumeClaim) bool { return p.Status.Phase == phase })
}

func waitPV(t *testing.T, name string, timeout time.Duration, what string, cond func(*corev1.PersistentVolume) bool) *corev1.PersistentVolume {
	t.Helper()
	return kit.WaitPV(t, cl.Client, name, timeout, what, cond)
}

func eventsFor(ns, name string) string { return kit.EventsFor(cl.Client, ns, name) }

func podWithClaim(name, claim string, block bool, script string) *corev1.Pod {
	return kit.PodWithClaim(name, claim, block, script)
}

func createPod(t *testing.T, ns string, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	return kit.CreatePod(t, cl.Client, ns, pod)
}

func waitPod(t *testing.T, ns, name string, timeout time.Duration, what string, cond func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	return kit.WaitPod(t, cl.Client, ns, name, timeout, what, cond)
}

func runToCompletion(t *testing.T, ns string, pod *corev1.Pod) string {
	t.Helper()
	return kit.RunToCompletion(t, cl.Client, ns, pod)
}

func writeScript(block bool) string { return kit.WriteScript(block) }

func readScript(block bool) string { return kit.ReadScript(block) }
