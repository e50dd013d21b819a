package populators

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
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
			State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ErrImagePull", Message: "no such image"}}}}}}, corev1.PodPending, false, "no such image"},
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
