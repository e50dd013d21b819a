package e2e

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/kubefill/kubefill/tests/kit"
)

func testContext(t *testing.T, timeout time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	return ctx
}

// newNamespace creates a namespace for one test and deletes it afterwards.
func newNamespace(t *testing.T) string {
	t.Helper()
	return createNamespace(t, kit.TestNamespaceName(t.Name()), nil)
}

// createNamespace creates a namespace named from generateName with labels,
// waits for its default ServiceAccount, and deletes it after the test.
func createNamespace(t *testing.T, generateName string, labels map[string]string) string {
	t.Helper()
	return kit.Namespace(t, cl.Client, generateName, labels)
}

// pvcSpec is a ReadWriteOnce claim of storageClass, size and mode.
func pvcSpec(name, storageClass string, size string, mode corev1.PersistentVolumeMode) *corev1.PersistentVolumeClaim {
	return kit.PVC("", name, size, kit.Class(storageClass), kit.Mode(mode))
}

func createPVC(t *testing.T, ns string, pvc *corev1.PersistentVolumeClaim) *corev1.PersistentVolumeClaim {
	t.Helper()
	return kit.CreatePVC(t, cl.Client, ns, pvc)
}

// waitPVC polls a PVC until cond holds and returns it.
func waitPVC(t *testing.T, ns, name string, timeout time.Duration, what string, cond func(*corev1.PersistentVolumeClaim) bool) *corev1.PersistentVolumeClaim {
	t.Helper()
	return kit.WaitPVC(t, cl.Client, ns, name, timeout, what, cond)
}

func waitPVCPhase(t *testing.T, ns, name string, phase corev1.PersistentVolumeClaimPhase, timeout time.Duration) *corev1.PersistentVolumeClaim {
	t.Helper()
	return waitPVC(t, ns, name, timeout, string(phase), func(p *corev1.PersistentVolumeClaim) bool { return p.Status.Phase == phase })
}

// eventsFor lists a namespace's events about one object, for failure messages.
func eventsFor(ns, name string) string {
	return kit.EventsFor(cl.Client, ns, name)
}
