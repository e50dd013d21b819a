package populators

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

func terminated(code int32, msg string) *corev1.Pod {
	return &corev1.Pod{Status: corev1.PodStatus{
		Phase: corev1.PodFailed,
		ContainerStatuses: []corev1.ContainerStatus{{State: corev1.ContainerState{
			Terminated: &corev1.ContainerStateTerminated{ExitCode: code, Message: msg, Reason: "Error"}}}},
	}}
}

func TestPodState(t *testing.T) {
	cases := []struct {
		name      string
		pod       *corev1.Pod
		phase     corev1.PodPhase
		permanent bool
		message   string
	}{
		{"success marker", terminated(0, `{"outcome":"Succeeded","message":"Import Complete"}`), corev1.PodSucceeded, false, "Import Complete"},
		{"exit 0 without marker is not success", terminated(0, ``), corev1.PodFailed, false, "without reporting success"},
		{"exit 0 with a failure outcome is not success", terminated(0, `{"outcome":"Failed","message":"x"}`), corev1.PodFailed, false, "without reporting success"},
		{"permanent failure", terminated(1, `{"outcome":"Failed","message":"checksum mismatch: want sha256:aa","permanent":true}`), corev1.PodFailed, true, "checksum mismatch"},
		{"retryable failure", terminated(1, `{"outcome":"Failed","message":"connection reset"}`), corev1.PodFailed, false, "connection reset"},
		{"crash with plain text", terminated(2, "panic: boom"), corev1.PodFailed, false, "panic: boom"},
		{"crash with no message", terminated(137, ""), corev1.PodFailed, false, "exited with code 137"},
		{"image pull error", &corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodPending, ContainerStatuses: []corev1.ContainerStatus{{
			Image: "kubefill/kubefill:v9", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ErrImagePull", Message: "no such image"}}}}}}, corev1.PodPending, false, "failed to pull image kubefill/kubefill:v9 for the worker: no such image"},
		{"unschedulable", &corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodPending, Conditions: []corev1.PodCondition{{
			Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: "Unschedulable", Message: "0/1 nodes are available"}}}}, corev1.PodPending, false, "0/1 nodes"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := PodState(c.pod)
			if s.Pod.Phase != c.phase || s.Permanent != c.permanent || !strings.Contains(s.Message, c.message) {
				t.Errorf("PodState = phase %s permanent %v message %q; want %s %v containing %q", s.Pod.Phase, s.Permanent, s.Message, c.phase, c.permanent, c.message)
			}
		})
	}
}

// oomPod is an importer pod whose container was OOM-killed: now (state) or
// before a restart (lastState, the container now waiting in CrashLoopBackOff).
func oomPod(limit string, crashLoop bool) *corev1.Pod {
	pod := &corev1.Pod{Spec: corev1.PodSpec{NodeName: "node-1", Containers: []corev1.Container{{Name: "importer"}}}}
	pod.Labels = map[string]string{cdiv1.LabelComponent: "importer"}
	if limit != "" {
		pod.Spec.Containers[0].Resources.Limits = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse(limit)}
	}
	killed := &corev1.ContainerStateTerminated{ExitCode: 137, Reason: "OOMKilled"}
	cs := corev1.ContainerStatus{Name: "importer"}
	if crashLoop {
		pod.Status.Phase = corev1.PodRunning
		cs.RestartCount = 3
		cs.State.Waiting = &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff", Message: "back-off 40s restarting failed container"}
		cs.LastTerminationState.Terminated = killed
	} else {
		pod.Status.Phase = corev1.PodFailed
		cs.State.Terminated = killed
	}
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{cs}
	return pod
}

func TestPodStateOOMKilled(t *testing.T) {
	const raise = "raise spec.podResourceRequirements.limits.memory in CDIConfig config"
	cases := []struct {
		name     string
		pod      *corev1.Pod
		phase    corev1.PodPhase
		reason   string
		restarts int32
		message  string
	}{
		{"killed at its limit", oomPod("64Mi", false), corev1.PodFailed, "Error", 0,
			"the importer ran out of memory: it was killed at its 64Mi memory limit; " + raise},
		{"crash loop keeps the OOM explanation", oomPod("8Mi", true), corev1.PodRunning, "CrashLoopBackOff", 3,
			"the importer ran out of memory: it was killed at its 8Mi memory limit; " + raise},
		{"no limit: the node killed it", oomPod("", false), corev1.PodFailed, "Error", 0,
			"the importer ran out of memory: the node killed it (it has no memory limit); free memory on node node-1 or set spec.podResourceRequirements.limits.memory in CDIConfig config"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := PodState(c.pod)
			if s.Pod.Phase != c.phase || s.Reason != c.reason || s.Message != c.message || s.Pod.Restarts != c.restarts {
				t.Errorf("PodState = phase %s reason %q restarts %d message %q;\nwant phase %s reason %q restarts %d message %q",
					s.Pod.Phase, s.Reason, s.Pod.Restarts, s.Message, c.phase, c.reason, c.restarts, c.message)
			}
			if s.Permanent || s.Done {
				t.Errorf("an OOM kill is retryable and not done: permanent %v done %v", s.Permanent, s.Done)
			}
			if s.Event != corev1.EventTypeWarning {
				t.Errorf("an OOM kill raises a Warning event on the claim, got event %q", s.Event)
			}
		})
	}
	// runc's init killed at the limit before the worker started.
	start := oomPod("4Mi", false)
	start.Status.ContainerStatuses[0].State.Terminated = &corev1.ContainerStateTerminated{ExitCode: 128, Reason: "StartError",
		Message: "failed to create containerd task: failed to create shim task: OCI runtime create failed: runc create failed: unable to start container process: container init was OOM-killed (memory limit too low?)"}
	if s := PodState(start); s.Message != "the importer ran out of memory: it was killed at its 4Mi memory limit; "+raise || s.Pod.Phase != corev1.PodFailed {
		t.Errorf("a StartError from an OOM-killed init: phase %s message %q", s.Pod.Phase, s.Message)
	}
	// An exit 137 that is not an OOM kill (SIGKILL by hand) keeps the plain code.
	plain := PodState(terminated(137, ""))
	if strings.Contains(plain.Message, "memory") || plain.Event != "" {
		t.Errorf("a plain exit 137 is not an OOM kill: message %q event %q", plain.Message, plain.Event)
	}
}

// TestWorkerPodRefusedByQuota: a worker pod a ResourceQuota refuses says
// which quota, how much, and where to lower the workers' requests; nothing
// runs and the phase looks again.
func TestWorkerPodRefusedByQuota(t *testing.T) {
	f, _ := testFlow(t, corev1.PersistentVolumeFilesystem, &cdiv1.VolumeImportSource{Spec: cdiv1.VolumeImportSourceSpec{
		Source: &cdiv1.ImportSourceType{Blank: &cdiv1.DataVolumeBlankImage{}}}})
	base := f.Client
	refused := errors.New("exceeded quota: pods, requested: requests.memory=600M, used: requests.memory=1G, limited: requests.memory=1G")
	f.Client = interceptor.NewClient(base.(client.WithWatch), interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if _, ok := obj.(*corev1.Pod); ok {
				return apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, obj.GetName(), refused)
			}
			return c.Create(ctx, obj, opts...)
		}})
	kind := &ImportKind{Client: f.Client, MaxRetries: 3, Backoff: 10 * time.Second}
	w := kind.Plan()[1].(*WorkerPhase)
	res, err := w.Reconcile(context.Background(), f)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"exceeded quota: pods", "the ResourceQuota pods in namespace vms has no room for the importer pod importer-prime-u-1",
		"(requested requests.memory=600M, used requests.memory=1G, limited requests.memory=1G)", "Nothing was started", "lower spec.podResourceRequirements in CDIConfig config"} {
		if !strings.Contains(res.Message, want) {
			t.Errorf("message %q lacks %q", res.Message, want)
		}
	}
	if res.Reason != ReasonExceededQuota || res.Event != corev1.EventTypeWarning || res.RetryAfter <= 0 || res.Done || res.Permanent {
		t.Errorf("result %+v: want ErrExceededQuota, a Warning event, a retried wait", res)
	}
	if err := base.Get(context.Background(), client.ObjectKey{Namespace: "vms", Name: "importer-prime-u-1"}, &corev1.Pod{}); !apierrors.IsNotFound(err) {
		t.Errorf("a refused pod exists: %v", err)
	}
}

func TestBackoffMessageKeepsTheFailure(t *testing.T) {
	oom := "attempt 1 failed: the importer ran out of memory: it was killed at its 8Mi memory limit; raise spec.podResourceRequirements.limits.memory in CDIConfig config; retrying in 10s"
	cases := []struct {
		name, reason, message, want string
	}{
		{"right after the retry", ReasonRetrying, oom, oom},
		{"later in the backoff", ReasonBackoff, oom, oom},
		{"nothing retried yet", "Pending", "", "waiting before the next attempt"},
		{"another reason's message is not a failure", "ErrExceededQuota", "exceeded quota: q", "waiting before the next attempt"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			target := &corev1.PersistentVolumeClaim{}
			target.Annotations = map[string]string{cdiv1.AnnRunningConditionReason: c.reason, cdiv1.AnnRunningConditionMessage: c.message}
			if got := backoffMessage(target, "waiting before the next attempt"); got != c.want {
				t.Errorf("backoffMessage = %q, want %q", got, c.want)
			}
		})
	}
}
