package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
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
	ctx := testContext(t, time.Minute)
	name := strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name()))
	if len(name) > 40 {
		name = name[:40]
	}
	ns, err := cl.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{GenerateName: strings.TrimRight(name, "-") + "-"},
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

func pvcSpec(name, storageClass string, size string, mode corev1.PersistentVolumeMode) *corev1.PersistentVolumeClaim {
	sc := storageClass
	return &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: &sc,
			VolumeMode:       &mode,
			Resources: corev1.VolumeResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)},
			},
		},
	}
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
	ctx := testContext(t, timeout)
	var last *corev1.PersistentVolumeClaim
	err := wait.PollUntilContextCancel(ctx, pollInterval, true, func(ctx context.Context) (bool, error) {
		pvc, err := cl.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		last = pvc
		return cond(pvc), nil
	})
	if err != nil {
		t.Fatalf("PVC %s/%s never became %s: last status %+v\nevents:\n%s", ns, name, what, statusOf(last), eventsFor(ns, name))
	}
	return last
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
	var b strings.Builder
	for _, e := range list.Items {
		fmt.Fprintf(&b, "  %s %s %s: %s\n", e.Type, e.Reason, e.Source.Component, e.Message)
	}
	return b.String()
}

func waitPV(t *testing.T, name string, timeout time.Duration, what string, cond func(*corev1.PersistentVolume) bool) *corev1.PersistentVolume {
	t.Helper()
	ctx := testContext(t, timeout)
	var last *corev1.PersistentVolume
	err := wait.PollUntilContextCancel(ctx, pollInterval, true, func(ctx context.Context) (bool, error) {
		pv, err := cl.Client.CoreV1().PersistentVolumes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		last = pv
		return cond(pv), nil
	})
	if err != nil {
		var st any
		if last != nil {
			st = last.Status
		}
		t.Fatalf("PV %s never became %s: last status %+v", name, what, st)
	}
	return last
}
