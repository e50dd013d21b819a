package nodeagent

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ctrView is what pod-level status needs to know of one container.
type ctrView struct {
	started     bool // has run at least once
	running     bool
	terminated  bool // its current state is terminated
	exitCode    int32
	willRestart bool // the restart policy will start it again
	ready       bool
}

// podPhase derives a pod's phase from its containers, as the kubelet does:
// Pending until every container has started; Succeeded or Failed when all
// have terminated for good; otherwise Running.
func podPhase(initDone bool, ctrs []ctrView) corev1.PodPhase {
	if !initDone {
		return corev1.PodPending
	}
	allDone, anyFailed := true, false
	for _, c := range ctrs {
		if !c.started {
			return corev1.PodPending
		}
		if !c.terminated || c.willRestart {
			allDone = false
			continue
		}
		if c.exitCode != 0 {
			anyFailed = true
		}
	}
	if !allDone {
		return corev1.PodRunning
	}
	if anyFailed {
		return corev1.PodFailed
	}
	return corev1.PodSucceeded
}

// restarts tells whether a container that exited with code restarts under the
// pod's policy. Init containers restart on failure under Always too.
func restarts(policy corev1.RestartPolicy, exitCode int32, init bool) bool {
	switch policy {
	case corev1.RestartPolicyNever:
		return false
	case corev1.RestartPolicyOnFailure:
		return exitCode != 0
	default:
		if init {
			return exitCode != 0
		}
		return true
	}
}

// podConditions computes the kubelet-owned conditions, keeping transition
// times of conditions that did not change and the scheduler's PodScheduled.
func podConditions(old []corev1.PodCondition, now metav1.Time, sandbox, initDone bool, phase corev1.PodPhase, ctrs []ctrView) []corev1.PodCondition {
	allReady := len(ctrs) > 0
	for _, c := range ctrs {
		if !c.ready {
			allReady = false
		}
	}
	terminal := phase == corev1.PodSucceeded || phase == corev1.PodFailed
	readyReason := ""
	if !allReady {
		readyReason = "ContainersNotReady"
	}
	if terminal {
		allReady, readyReason = false, "PodCompleted"
	}
	want := []corev1.PodCondition{
		{Type: corev1.PodReadyToStartContainers, Status: boolStatus(sandbox && !terminal)},
		{Type: corev1.PodInitialized, Status: boolStatus(initDone)},
		{Type: corev1.ContainersReady, Status: boolStatus(allReady), Reason: readyReason},
		{Type: corev1.PodReady, Status: boolStatus(allReady), Reason: readyReason},
	}
	var out []corev1.PodCondition
	for _, c := range old {
		if c.Type == corev1.PodScheduled {
			out = append(out, c)
		}
	}
	for _, c := range want {
		c.LastTransitionTime = now
		for _, o := range old {
			if o.Type == c.Type && o.Status == c.Status {
				c.LastTransitionTime = o.LastTransitionTime
			}
		}
		out = append(out, c)
	}
	return out
}

func boolStatus(b bool) corev1.ConditionStatus {
	if b {
		return corev1.ConditionTrue
	}
	return corev1.ConditionFalse
}
