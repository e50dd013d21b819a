package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubefill/kubefill/tests/kit"
)

const pollInterval = 100 * time.Millisecond

func testContext(t *testing.T, timeout time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	return ctx
}

// newNamespace creates a namespace for one test and deletes it afterwards.
func newNamespace(t *testing.T) string {
	t.Helper()
	name := strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name()))
	if len(name) > 40 {
		name = name[:40]
	}
	return createNamespace(t, strings.TrimRight(name, "-")+"-", nil)
}

// createNamespace creates a namespace named from generateName with labels,
// waits for its default ServiceAccount, and deletes it after the test.
func createNamespace(t *testing.T, generateName string, labels map[string]string) string {
	t.Helper()
	ctx := testContext(t, time.Minute)
	ns, err := cl.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{GenerateName: generateName, Labels: labels},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	t.Cleanup(func() {
		err := cl.Client.CoreV1().Namespaces().Delete(context.Background(), ns.Name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete namespace %s: %v", ns.Name, err)
		}
	})
	if err := cl.WaitServiceAccount(ctx, ns.Name); err != nil {
		t.Fatalf("namespace %s: %v", ns.Name, err)
	}
	return ns.Name
}

// pvcSpec is a ReadWriteOnce claim of storageClass, size and mode.
func pvcSpec(name, storageClass string, size string, mode corev1.PersistentVolumeMode) *corev1.PersistentVolumeClaim {
	return kit.PVC("", name, size, kit.Class(storageClass), kit.Mode(mode))
}

func createPVC(t *testing.T, ns string, pvc *corev1.PersistentVolumeClaim) *corev1.PersistentVolumeClaim {
	t.Helper()
	out, err := cl.Client.CoreV1().PersistentVolumeClaims(ns).Create(context.Background(), pvc, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create PVC %s/%s: %v", ns, pvc.Name, err)
	}
	return out
}

// waitPVC polls a PVC until cond holds and returns it.
func waitPVC(t *testing.T, ns, name string, timeout time.Duration, what string, cond func(*corev1.PersistentVolumeClaim) bool) *corev1.PersistentVolumeClaim {
	t.Helper()
	return kit.Await(t, timeout, pollInterval, fmt.Sprintf("PVC %s/%s to become %s", ns, name, what),
		func() (*corev1.PersistentVolumeClaim, error) {
			return cl.Client.CoreV1().PersistentVolumeClaims(ns).Get(context.Background(), name, metav1.GetOptions{})
		}, cond,
		func(last *corev1.PersistentVolumeClaim) string {
			return fmt.Sprintf("last status %+v\nevents:\n%s", statusOf(last), eventsFor(ns, name))
		})
}

func waitPVCPhase(t *testing.T, ns, name string, phase corev1.PersistentVolumeClaimPhase, timeout time.Duration) *corev1.PersistentVolumeClaim {
	t.Helper()
	return waitPVC(t, ns, name, timeout, string(phase), func(p *corev1.PersistentVolumeClaim) bool { return p.Status.Phase == phase })
}

func statusOf(pvc *corev1.PersistentVolumeClaim) any {
	if pvc == nil {
		return nil
	}
	return pvc.Status
}

// eventsFor lists a namespace's events about one object, for failure messages.
func eventsFor(ns, name string) string {
	list, err := cl.Client.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{
		FieldSelector: "involvedObject.name=" + name,
	})
	if err != nil {
		return fmt.Sprintf("(list events: %v)", err)
	}
	return kit.FormatEvents(list.Items)
}

func waitPV(t *testing.T, name string, timeout time.Duration, what string, cond func(*corev1.PersistentVolume) bool) *corev1.PersistentVolume {
	t.Helper()
	return kit.Await(t, timeout, pollInterval, fmt.Sprintf("PV %s to become %s", name, what),
		func() (*corev1.PersistentVolume, error) {
			return cl.Client.CoreV1().PersistentVolumes().Get(context.Background(), name, metav1.GetOptions{})
		}, cond,
		func(last *corev1.PersistentVolume) string {
			if last == nil {
				return "last status <nil>"
			}
			return fmt.Sprintf("last status %+v", last.Status)
		})
}
