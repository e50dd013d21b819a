package controller

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/contract"
	"github.com/kubefill/kubefill/pkg/populators"
)

// ClaimView is what the DataVolume controller learned about the claim it
// renders, for the pure status computation.
type ClaimView struct {
	// Claim is the DataVolume's PVC; nil when it does not exist yet.
	Claim *corev1.PersistentVolumeClaim
	// WaitsForConsumer: the claim's class binds on first consumer and no node is chosen yet.
	WaitsForConsumer bool
	// Problem explains why the claim cannot be rendered or used; empty when none.
	Problem, ProblemReason string
	// RetryAfter asks to look again after a while: the DataVolume waits for
	// something no watch follows (a clone's source, a DataSource).
	RetryAfter time.Duration
	// CloneSource is a clone's source once known, for its events.
	CloneSource *CloneSource
}

// ComputeStatus works out a DataVolume's phase, progress, restarts and
// conditions from its claim. Times in conditions are left to MergeConditions.
func ComputeStatus(dv *cdiv1.DataVolume, view ClaimView) cdiv1.DataVolumeStatus {
	st := cdiv1.DataVolumeStatus{ClaimName: dv.Name, Progress: cdiv1.ProgressNotAvailable, Phase: cdiv1.Pending}
	pvc := view.Claim
	bound := condition(cdiv1.DataVolumeBound, corev1.ConditionFalse, cdiv1.ReasonNotFound, "No PVC found")
	running := condition(cdiv1.DataVolumeRunning, corev1.ConditionFalse, "", "")
	ready := condition(cdiv1.DataVolumeReady, corev1.ConditionFalse, "", "")

	if view.Problem != "" {
		running.Reason, running.Message = view.ProblemReason, view.Problem
		if view.ProblemReason == populators.ReasonExceededQuota {
			bound.Reason, bound.Message = populators.ReasonExceededQuota, view.Problem
		}
	}
	if pvc != nil {
		ann := pvc.Annotations
		switch pvc.Status.Phase {
		case corev1.ClaimBound:
			bound = condition(cdiv1.DataVolumeBound, corev1.ConditionTrue, cdiv1.ReasonBound, fmt.Sprintf("PVC %s Bound", pvc.Name))
		case corev1.ClaimLost:
			bound = condition(cdiv1.DataVolumeBound, corev1.ConditionFalse, cdiv1.ReasonClaimLost, "Claim Lost")
		default:
			bound = condition(cdiv1.DataVolumeBound, corev1.ConditionFalse, cdiv1.ReasonPending, fmt.Sprintf("PVC %s Pending", pvc.Name))
		}
		if n, err := strconv.Atoi(ann[cdiv1.AnnPodRestarts]); err == nil {
			st.RestartCount = int32(n)
		}
		if p := ann[cdiv1.AnnPopulatorProgress]; p != "" {
			st.Progress = cdiv1.DataVolumeProgress(p)
		}
		if ann[cdiv1.AnnRunningCondition] != "" || ann[cdiv1.AnnRunningConditionReason] != "" {
			status := corev1.ConditionFalse
			if ann[cdiv1.AnnRunningCondition] == "true" {
				status = corev1.ConditionTrue
			}
			running = condition(cdiv1.DataVolumeRunning, status, RunningReason(ann[cdiv1.AnnRunningConditionReason], ann[cdiv1.AnnRunningConditionMessage]), ann[cdiv1.AnnRunningConditionMessage])
			if running.Reason == populators.ReasonExceededQuota && pvc.Status.Phase != corev1.ClaimBound {
				// KubeVirt reads a quota refusal in the Bound condition, as CDI reports it.
				bound.Reason, bound.Message = populators.ReasonExceededQuota, running.Message
			}
		}
		kind := reportingKindOf(dv)
		populated := ann[cdiv1.AnnPopulatedFor] == pvc.Name || ann[cdiv1.AnnPrePopulated] == dv.Name ||
			(kind.clone && ann[cdiv1.AnnClonePhase] == "Succeeded")
		worker := workerView{
			PodPhase:         corev1.PodPhase(ann[cdiv1.AnnPodPhase]),
			PodReady:         ann[cdiv1.AnnPodReady] == "true",
			PrimeExists:      ann[cdiv1.AnnPVCPrimeName] != "",
			WaitsForConsumer: view.WaitsForConsumer,
			ClonePhase:       ann[cdiv1.AnnClonePhase],
			Current:          dv.Status.Phase,
		}
		switch {
		case pvc.Status.Phase == corev1.ClaimLost:
			st.Phase = cdiv1.Failed
		case populated && pvc.Status.Phase == corev1.ClaimBound:
			st.Phase, st.Progress = cdiv1.Succeeded, "100.0%"
			running = condition(cdiv1.DataVolumeRunning, corev1.ConditionFalse, cdiv1.ReasonCompleted, kind.doneMessage)
		case worker.PodPhase == corev1.PodFailed && !kind.clone:
			st.Phase = cdiv1.Failed
		default:
			st.Phase = kind.phase(worker)
		}
	}
	if st.Phase == cdiv1.Succeeded {
		ready = condition(cdiv1.DataVolumeReady, corev1.ConditionTrue, "", "")
	} else if running.Status == corev1.ConditionTrue {
		ready.Reason = cdiv1.ReasonTransferRunning
	}
	st.Conditions = []cdiv1.DataVolumeCondition{bound, running, ready}
	return st
}

// RunningReason is the DataVolume's Running reason for the claim's: a
// failed worker that is being retried, or waits to be, is an Error, as CDI
// shows a worker restarting after a failure; an image that cannot be pulled
// (a registry source's, or the worker's own) is ImagePullFailed. Those two
// are what KubeVirt reads as DataVolumeError; a VM would otherwise show
// Provisioning for as long as the import keeps failing.
func RunningReason(claimReason, message string) string {
	switch claimReason {
	case populators.ReasonRetrying, populators.ReasonBackoff:
		claimReason = cdiv1.ReasonError
	}
	if claimReason == cdiv1.ReasonError && strings.Contains(message, contract.ImagePullFailureText) {
		return cdiv1.ReasonImagePullFailed
	}
	return claimReason
}

// workerFailureEvent is the Warning event for a failure or a refusal the
// DataVolume's phase does not show (a worker that failed and is retried, a
// temporary claim a quota refuses: the DataVolume stays in its phase): a
// Running condition that is False for such a reason, with a message the old
// conditions did not have. As CDI, each new message is told once.
func workerFailureEvent(old, computed []cdiv1.DataVolumeCondition) (reason, message string, ok bool) {
	var was, now *cdiv1.DataVolumeCondition
	for i := range old {
		if old[i].Type == cdiv1.DataVolumeRunning {
			was = &old[i]
		}
	}
	for i := range computed {
		if computed[i].Type == cdiv1.DataVolumeRunning {
			now = &computed[i]
		}
	}
	if now == nil || now.Status != corev1.ConditionFalse || now.Message == "" || (was != nil && was.Message == now.Message) {
		return "", "", false
	}
	switch now.Reason {
	case cdiv1.ReasonError, cdiv1.ReasonImagePullFailed, "CrashLoopBackOff", populators.ReasonExceededQuota:
		return now.Reason, now.Message, true
	}
	return "", "", false
}

func condition(t cdiv1.DataVolumeConditionType, s corev1.ConditionStatus, reason, message string) cdiv1.DataVolumeCondition {
	return cdiv1.DataVolumeCondition{Type: t, Status: s, Reason: reason, Message: message}
}

// MergeConditions stamps times on computed conditions: a condition whose
// status, reason and message are unchanged keeps its times, so that a
// reconcile that learns nothing new writes nothing.
func MergeConditions(old, computed []cdiv1.DataVolumeCondition, now metav1.Time) []cdiv1.DataVolumeCondition {
	out := make([]cdiv1.DataVolumeCondition, 0, len(computed))
	for _, c := range computed {
		c.LastTransitionTime, c.LastHeartbeatTime = now, now
		for _, o := range old {
			if o.Type != c.Type {
				continue
			}
			if o.Status == c.Status {
				c.LastTransitionTime = o.LastTransitionTime
				if o.Reason == c.Reason && o.Message == c.Message {
					c.LastHeartbeatTime = o.LastHeartbeatTime
				}
			}
		}
		out = append(out, c)
	}
	return out
}
