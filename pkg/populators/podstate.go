package populators

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/contract"
)

// PodState reads a worker pod's state as a kubelet reports it: Pod is its
// status, and a terminated container's termination message (the worker
// contract's) gives the reason and message. A pod that exits 0 without the
// contract's Succeeded outcome has not succeeded, whichever worker it runs:
// only a worker that fsynced its data says so.
func PodState(pod *corev1.Pod) Result {
	st := &PodStatus{Phase: pod.Status.Phase}
	s := Result{Pod: st}
	worker := pod.Labels[cdiv1.LabelComponent]
	if worker == "" {
		worker = "worker"
	}
	for _, cond := range pod.Status.Conditions {
		switch {
		case cond.Type == corev1.PodReady:
			st.Ready = cond.Status == corev1.ConditionTrue
		case cond.Type == corev1.PodScheduled && cond.Status == corev1.ConditionFalse:
			s.Reason, s.Message = cond.Reason, cond.Message
		}
	}
	for _, cs := range pod.Status.ContainerStatuses {
		st.Restarts += cs.RestartCount
		switch {
		case cs.State.Waiting != nil && workerImagePull(cs.State.Waiting.Reason):
			// CDI's reason and text for it, which KubeVirt reads as DataVolumeError.
			s.Reason = cdiv1.ReasonImagePullFailed
			s.Message = fmt.Sprintf("%s %s for the %s: %s", contract.ImagePullFailureText, cs.Image, worker, cs.State.Waiting.Message)
		case cs.State.Waiting != nil && cs.State.Waiting.Reason != "":
			s.Reason, s.Message = cs.State.Waiting.Reason, cs.State.Waiting.Message
			if oomKilled(cs.LastTerminationState.Terminated) {
				// Restarted after an OOM kill (CrashLoopBackOff): the kill is the news.
				s.Message, s.Event = outOfMemory(pod, cs.Name, worker), corev1.EventTypeWarning
			}
		case cs.State.Running != nil:
			s.Reason = cdiv1.ReasonTransferRunning
		case cs.State.Terminated != nil && oomKilled(cs.State.Terminated):
			// The kernel killed it at its memory limit: it wrote no termination
			// message, and exit 137 alone tells the user nothing.
			st.Phase, s.Reason = corev1.PodFailed, cdiv1.ReasonError
			s.Message, s.Event = outOfMemory(pod, cs.Name, worker), corev1.EventTypeWarning
		case cs.State.Terminated != nil:
			term := cs.State.Terminated
			msg, parsed := contract.DecodeTermination(term.Message)
			if parsed && msg.Message != nil {
				s.Message = *msg.Message
			} else {
				s.Message = strings.TrimSpace(term.Message)
			}
			switch {
			case term.ExitCode == 0 && parsed && msg.Outcome == contract.OutcomeSucceeded:
				st.Phase, s.Reason = corev1.PodSucceeded, cdiv1.ReasonCompleted
			case term.ExitCode == 0:
				st.Phase, s.Reason = corev1.PodFailed, cdiv1.ReasonError
				s.Message = fmt.Sprintf("the %s exited without reporting success; its data is not trusted", worker)
			default:
				st.Phase, s.Reason = corev1.PodFailed, cdiv1.ReasonError
				s.Permanent = msg.Permanent != nil && *msg.Permanent
				if s.Message == "" {
					s.Message = fmt.Sprintf("the %s exited with code %d (%s)", worker, term.ExitCode, term.Reason)
				}
			}
		}
	}
	s.Done = st.Phase == corev1.PodSucceeded
	return s
}

// workerImagePull: the kubelet cannot pull the container's image (the
// reasons CDI reads as an image pull failure).
func workerImagePull(waitingReason string) bool {
	switch waitingReason {
	case "ErrImagePull", "ImagePullBackOff", "InvalidImageName":
		return true
	}
	return false
}

// ReportsScratchRequired says whether a worker pod stopped because its
// image needs scratch space and it had none: its termination message's
// scratchSpaceRequired, CDI's marker. Pure.
func ReportsScratchRequired(pod *corev1.Pod) bool {
	for _, cs := range pod.Status.ContainerStatuses {
		if term := cs.State.Terminated; term != nil && term.ExitCode != 0 {
			if msg, ok := contract.DecodeTermination(term.Message); ok && msg.ScratchSpaceRequired != nil && *msg.ScratchSpaceRequired {
				return true
			}
		}
	}
	return false
}

// reasonOOMKilled is the kubelet's reason for a container the kernel killed
// for memory (exit 137).
const reasonOOMKilled = "OOMKilled"

// oomKilled: the kernel killed the container for memory, or killed the
// runtime's init before the worker even started (runc's "container init
// was OOM-killed (memory limit too low?)", a StartError).
func oomKilled(term *corev1.ContainerStateTerminated) bool {
	if term == nil {
		return false
	}
	return term.Reason == reasonOOMKilled || (term.Reason == "StartError" && strings.Contains(term.Message, "OOM-killed"))
}

// outOfMemory explains an OOM-killed worker: the memory limit it was killed
// at, read from the pod's container, and where a cluster admin raises it.
func outOfMemory(pod *corev1.Pod, container, worker string) string {
	raise := fmt.Sprintf("spec.podResourceRequirements.limits.memory in CDIConfig %s", cdiv1.CDIConfigName)
	for _, c := range pod.Spec.Containers {
		if c.Name != container {
			continue
		}
		if limit, ok := c.Resources.Limits[corev1.ResourceMemory]; ok && !limit.IsZero() {
			return fmt.Sprintf("the %s ran out of memory: it was killed at its %s memory limit; raise %s", worker, limit.String(), raise)
		}
	}
	return fmt.Sprintf("the %s ran out of memory: the node killed it (it has no memory limit); free memory on node %s or set %s", worker, nodeOf(pod), raise)
}

func nodeOf(pod *corev1.Pod) string {
	if pod.Spec.NodeName == "" {
		return "(none yet)"
	}
	return pod.Spec.NodeName
}

// explainPod says which quota refused a worker pod, in the style of Explain.
func (q *QuotaExceeded) explainPod(noun string, pod *corev1.Pod, target *corev1.PersistentVolumeClaim) string {
	msg := q.Refused(pod.Namespace, fmt.Sprintf("%s %s that fills %s", noun, pod.Name, target.Name))
	if pod.Namespace != target.Namespace {
		msg += "; it runs next to the clone's source and counts against that namespace's quota"
	}
	hint := "raise it or free room"
	if strings.Contains(q.Requested, "memory") || strings.Contains(q.Requested, "cpu") {
		hint = "raise it, free room, or lower spec.podResourceRequirements in CDIConfig " + cdiv1.CDIConfigName
	}
	return msg + ". Nothing was started; this goes on by itself once the quota has room (" + hint + ")"
}
