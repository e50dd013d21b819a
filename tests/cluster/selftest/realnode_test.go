package selftest

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/kubefill/kubefill/tests/cluster"
	"github.com/kubefill/kubefill/tests/kit"
)

// These tests need what only a real node has: kernel memory limits,
// kube-proxy Services, cluster DNS and the guard on the host's routes.

// TestGuardKeepsPodTrafficOnTheMachine: a pod sends to an address outside
// the machine (TEST-NET-1): the host would route it out through its own
// interface, and the guard drops it there, which its counters show.
func TestGuardKeepsPodTrafficOnTheMachine(t *testing.T) {
	needRealNode(t)
	before, err := cluster.GuardDrops(cl.GuardChain())
	if err != nil {
		t.Fatal(err)
	}
	ns := newNamespace(t)
	runToCompletion(t, ns, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "escape"},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{Name: "main", Image: shellImage, Command: []string{"sh", "-c",
				`nc -w 2 192.0.2.1 80 </dev/null; echo "nc exit $?" > /dev/termination-log; true`}}},
		},
	})
	after, err := cluster.GuardDrops(cl.GuardChain())
	if err != nil {
		t.Fatal(err)
	}
	if after <= before {
		t.Fatalf("the guard dropped %d packets before and %d after a pod dialled 192.0.2.1; its traffic was not stopped at the host's edge", before, after)
	}
	t.Logf("guard %s dropped %d packets of the pod's", cl.GuardChain(), after-before)
}

// TestMemoryLimitKillsPod: a container that allocates past its memory limit
// is killed by the kernel (OOMKilled, exit 137).
func TestMemoryLimitKillsPod(t *testing.T) {
	t.Parallel()
	needRealNode(t)
	ns := newNamespace(t)
	limit := corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("32Mi"), corev1.ResourceCPU: resource.MustParse("200m")}
	createPod(t, ns, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "hog"},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{
				Name: "main", Image: shellImage,
				// dd's buffer is one 200 MiB block, touched as it reads.
				Command:   []string{"dd", "if=/dev/zero", "of=/dev/null", "bs=200M", "count=1"},
				Resources: corev1.ResourceRequirements{Limits: limit, Requests: limit},
			}},
		},
	})
	p := waitPod(t, ns, "hog", time.Minute, "Failed", func(p *corev1.Pod) bool { return kit.Terminal(p.Status.Phase) })
	term := p.Status.ContainerStatuses[0].State.Terminated
	if p.Status.Phase != corev1.PodFailed || term == nil || term.Reason != "OOMKilled" || term.ExitCode != 137 {
		t.Fatalf("pod ended %s with %+v, want Failed, OOMKilled, exit 137", p.Status.Phase, term)
	}
}

// TestServicesAndClusterDNS: a Service in front of a pod answers at its
// ClusterIP and at its DNS name, from another pod and from the host; the
// kubernetes Service reaches kube-apiserver.
func TestServicesAndClusterDNS(t *testing.T) {
	t.Parallel()
	needRealNode(t)
	ns := newNamespace(t)
	server := serverPod("web")
	server.Labels = map[string]string{"app": "web"}
	createPod(t, ns, server)
	waitPod(t, ns, "web", time.Minute, "Ready", podReady)
	svc, err := cl.Client.CoreV1().Services(ns).Create(context.Background(), &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "web"}, Ports: []corev1.ServicePort{
			{Port: 80, TargetPort: intstr.FromInt32(8080)},
		}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// busybox's nc cannot resolve names (static glibc): nslookup does, then
	// nc dials the address. kube-apiserver answers plain HTTP with an
	// HTTP 400, which proves the kubernetes Service reaches it.
	script := fmt.Sprintf(`set -e
addr=$(nslookup web.%[1]s.svc.cluster.local | awk '/^Address: /{a=$2} END{print a}')
printf '%%s|' "$addr" > /dev/termination-log
printf 'GET / HTTP/1.0\r\n\r\n' | nc -w 5 "$addr" 80 | tail -n 1 >> /dev/termination-log
api=$(nslookup kubernetes.default.svc.cluster.local | awk '/^Address: /{a=$2} END{print a}')
printf '|%%s|' "$api" >> /dev/termination-log
printf 'GET / HTTP/1.0\r\n\r\n' | nc -w 5 "$api" 443 | head -n 1 >> /dev/termination-log`, ns)
	want := svc.Spec.ClusterIP + "|hello from web\n|10.96.0.1|HTTP/1.0 400 Bad Request\r\n"
	// Tried again until a pod gets the answer: the pod succeeds however nc
	// ends (the pipeline's status is tail's), and kube-proxy programs the
	// new Service's rules a moment after the Service is made.
	var msg string
	kit.Eventually(t, time.Minute, time.Second, "a pod to reach the Service by name", func() (bool, string, error) {
		name := "client-" + randomSuffix()
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{
				Name: "main", Image: shellImage, Command: []string{"sh", "-c", script},
			}}},
		}
		createPod(t, ns, pod)
		p := waitPod(t, ns, name, time.Minute, "ended", func(p *corev1.Pod) bool { return kit.Terminal(p.Status.Phase) })
		if cs := p.Status.ContainerStatuses[0].State.Terminated; cs != nil {
			msg = cs.Message
		}
		return p.Status.Phase == corev1.PodSucceeded && msg == want, fmt.Sprintf("last try: %s %q", p.Status.Phase, msg), nil
	})
	if msg != want {
		t.Fatalf("the client pod said %q, want %q", msg, want)
	}
	// From the host: kube-proxy's rules apply to the host's own traffic too.
	out, err := exec.Command("sh", "-c", fmt.Sprintf(`printf 'GET / HTTP/1.0\r\n\r\n' | busybox nc -w 5 %s 80 | tail -n 1`, svc.Spec.ClusterIP)).CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "hello from web" {
		t.Fatalf("host GET of ClusterIP %s: %v: %q", svc.Spec.ClusterIP, err, out)
	}
}
