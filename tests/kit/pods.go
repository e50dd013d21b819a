package kit

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// The pieces below work on a local cluster with a node (tests/cluster):
// namespaces, claims and one-shot pods, through a clientset.

// ShellImage is the test shell image hack/images.sh builds (Debian's static
// busybox), imported into the node's containerd.
const ShellImage = "busybox:1.36"

// PollInterval is how often the pod and claim waits look.
const PollInterval = 100 * time.Millisecond

// Namespace creates a namespace named from generateName with labels, waits
// for its default ServiceAccount, and deletes it after the test.
func Namespace(t testing.TB, cs kubernetes.Interface, generateName string, labels map[string]string) string {
	t.Helper()
	return createNamespace(t, cs, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: generateName, Labels: labels}})
}

// NamedNamespace is Namespace with a fixed name.
func NamedNamespace(t testing.TB, cs kubernetes.Interface, name string, labels map[string]string) string {
	t.Helper()
	return createNamespace(t, cs, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}})
}

func createNamespace(t testing.TB, cs kubernetes.Interface, ns *corev1.Namespace) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ns, err := cs.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	t.Cleanup(func() {
		err := cs.CoreV1().Namespaces().Delete(context.Background(), ns.Name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete namespace %s: %v", ns.Name, err)
		}
	})
	// kube-controller-manager makes the default ServiceAccount; pods wait for it.
	Eventually(t, time.Minute, PollInterval, "the default ServiceAccount of namespace "+ns.Name, func() (bool, string, error) {
		_, err := cs.CoreV1().ServiceAccounts(ns.Name).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, fmt.Sprint(err), nil
	})
	return ns.Name
}

// TestNamespaceName is a namespace prefix from a test's name: lower case,
// at most 40 characters, ending in "-".
func TestNamespaceName(test string) string {
	// A DNS label: lower-case letters, digits and '-'; anything else in a
	// test's name (the '/' of a subtest, '_', '.', spaces) becomes '-'.
	name := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			return r
		}
		return '-'
	}, strings.ToLower(test))
	if len(name) > 40 {
		name = name[:40]
	}
	return strings.TrimRight(name, "-") + "-"
}

// PodWithClaim is a one-shot pod that runs script with a claim mounted at
// /data (Filesystem) or attached at /dev/xvda (Block).
func PodWithClaim(name, claim string, block bool, script string) *corev1.Pod {
	c := corev1.Container{
		Name:    "main",
		Image:   ShellImage,
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

// CreatePod creates pod in ns.
func CreatePod(t testing.TB, cs kubernetes.Interface, ns string, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	out, err := cs.CoreV1().Pods(ns).Create(context.Background(), pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod %s: %v", pod.Name, err)
	}
	return out
}

// WaitPod polls a pod until cond holds; a timeout describes the pod.
func WaitPod(t testing.TB, cs kubernetes.Interface, ns, name string, timeout time.Duration, what string, cond func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	return Await(t, timeout, PollInterval, fmt.Sprintf("pod %s/%s to become %s", ns, name, what),
		func() (*corev1.Pod, error) {
			return cs.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
		},
		cond, func(last *corev1.Pod) string { return DescribePod(cs, ns, last) })
}

// DescribePod is what a failure shows of a pod: phase, node, conditions,
// each container's state and logs, and the pod's events.
func DescribePod(cs kubernetes.Interface, ns string, p *corev1.Pod) string {
	if p == nil {
		return "(no pod)"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "phase=%s node=%q ip=%s\n", p.Status.Phase, p.Spec.NodeName, p.Status.PodIP)
	for _, c := range p.Status.Conditions {
		fmt.Fprintf(&b, "  condition %s=%s %s %s\n", c.Type, c.Status, c.Reason, c.Message)
	}
	for _, cs2 := range append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...) {
		fmt.Fprintf(&b, "  container %s restarts=%d ready=%v state=%+v\n", cs2.Name, cs2.RestartCount, cs2.Ready, cs2.State)
		if logs, err := cs.CoreV1().Pods(ns).GetLogs(p.Name, &corev1.PodLogOptions{Container: cs2.Name}).DoRaw(context.Background()); err == nil {
			fmt.Fprintf(&b, "  logs:\n%s\n", logs)
		}
	}
	b.WriteString("events:\n" + EventsFor(cs, ns, p.Name))
	return b.String()
}

// RunToCompletion creates a pod and waits for it to succeed, returning the
// main container's termination message.
func RunToCompletion(t testing.TB, cs kubernetes.Interface, ns string, pod *corev1.Pod) string {
	t.Helper()
	CreatePod(t, cs, ns, pod)
	return AwaitCompletion(t, cs, ns, pod.Name)
}

// AwaitCompletion waits for a pod made earlier to succeed, returning the main
// container's termination message.
func AwaitCompletion(t testing.TB, cs kubernetes.Interface, ns, name string) string {
	t.Helper()
	done := WaitPod(t, cs, ns, name, 2*time.Minute, "Succeeded", func(p *corev1.Pod) bool { return Terminal(p.Status.Phase) })
	if done.Status.Phase != corev1.PodSucceeded {
		t.Fatalf("pod %s failed: %s", name, DescribePod(cs, ns, done))
	}
	for _, c := range done.Status.ContainerStatuses {
		if c.Name == "main" && c.State.Terminated != nil {
			return c.State.Terminated.Message
		}
	}
	t.Fatalf("pod %s has no terminated main container: %s", name, DescribePod(cs, ns, done))
	return ""
}

// WriteScript writes a recognisable payload (1 MiB) to a claim mounted by
// PodWithClaim and reports its checksum; ReadScript reports the checksum of
// what it finds there.
func WriteScript(block bool) string {
	if block {
		return "head -c 1048576 /dev/urandom > /tmp/p && dd if=/tmp/p of=/dev/xvda bs=65536 conv=notrunc,fsync 2>/dev/null && sha256sum < /tmp/p | cut -d' ' -f1 > /dev/termination-log"
	}
	return "head -c 1048576 /dev/urandom > /data/payload && sync && sha256sum < /data/payload | cut -d' ' -f1 > /dev/termination-log"
}

// ReadScript: see WriteScript.
func ReadScript(block bool) string {
	if block {
		return "head -c 1048576 /dev/xvda | sha256sum | cut -d' ' -f1 > /dev/termination-log"
	}
	return "sha256sum < /data/payload | cut -d' ' -f1 > /dev/termination-log"
}

// EventsFor lists a namespace's events about one object (all of them for
// name ""), for failure messages.
func EventsFor(cs kubernetes.Interface, ns, name string) string {
	opts := metav1.ListOptions{}
	if name != "" {
		opts.FieldSelector = "involvedObject.name=" + name
	}
	list, err := cs.CoreV1().Events(ns).List(context.Background(), opts)
	if err != nil {
		return fmt.Sprintf("(list events: %v)", err)
	}
	return FormatEvents(list.Items)
}

// CreatePVC creates a claim in ns.
func CreatePVC(t testing.TB, cs kubernetes.Interface, ns string, pvc *corev1.PersistentVolumeClaim) *corev1.PersistentVolumeClaim {
	t.Helper()
	out, err := cs.CoreV1().PersistentVolumeClaims(ns).Create(context.Background(), pvc, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create PVC %s/%s: %v", ns, pvc.Name, err)
	}
	return out
}

// WaitPVC polls a claim until cond holds and returns it; a timeout shows
// its status and events.
func WaitPVC(t testing.TB, cs kubernetes.Interface, ns, name string, timeout time.Duration, what string, cond func(*corev1.PersistentVolumeClaim) bool) *corev1.PersistentVolumeClaim {
	t.Helper()
	return Await(t, timeout, PollInterval, fmt.Sprintf("PVC %s/%s to become %s", ns, name, what),
		func() (*corev1.PersistentVolumeClaim, error) {
			return cs.CoreV1().PersistentVolumeClaims(ns).Get(context.Background(), name, metav1.GetOptions{})
		}, cond,
		func(last *corev1.PersistentVolumeClaim) string {
			var status any
			if last != nil {
				status = last.Status
			}
			return fmt.Sprintf("last status %+v\nevents:\n%s", status, EventsFor(cs, ns, name))
		})
}

// WaitPV polls a PV until cond holds and returns it.
func WaitPV(t testing.TB, cs kubernetes.Interface, name string, timeout time.Duration, what string, cond func(*corev1.PersistentVolume) bool) *corev1.PersistentVolume {
	t.Helper()
	return Await(t, timeout, PollInterval, fmt.Sprintf("PV %s to become %s", name, what),
		func() (*corev1.PersistentVolume, error) {
			return cs.CoreV1().PersistentVolumes().Get(context.Background(), name, metav1.GetOptions{})
		}, cond,
		func(last *corev1.PersistentVolume) string {
			if last == nil {
				return "last status <nil>"
			}
			return fmt.Sprintf("last status %+v", last.Status)
		})
}
