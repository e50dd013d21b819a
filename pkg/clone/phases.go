package clone

import (
	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

// PhaseName is a value of the target's cdi.kubevirt.io/clonePhase: the
// first phase of the plan not yet done, or one of the end states.
type PhaseName string

// CDI's phase names, on the wire.
const (
	PhasePending       PhaseName = "Pending"
	PhaseSnapshot      PhaseName = "Snapshot"
	PhaseSnapshotClone PhaseName = "SnapshotClone"
	PhaseCSIClone      PhaseName = "CSIClone"
	PhasePrepClaim     PhaseName = "PrepClaim"
	PhaseHostClone     PhaseName = "HostClone"
	PhaseRebind        PhaseName = "Rebind"
	PhaseSucceeded     PhaseName = "Succeeded"
	PhaseError         PhaseName = "Error"
)

var dataVolumePhases = map[PhaseName]cdiv1.DataVolumePhase{
	"":                 cdiv1.CloneScheduled,
	PhasePending:       cdiv1.CloneScheduled,
	PhaseSnapshot:      cdiv1.SnapshotForSmartCloneInProgress,
	PhaseSnapshotClone: cdiv1.CloneFromSnapshotSourceInProgress,
	PhaseCSIClone:      cdiv1.CSICloneInProgress,
	PhasePrepClaim:     cdiv1.PrepClaimInProgress,
	PhaseHostClone:     cdiv1.CloneInProgress,
	PhaseRebind:        cdiv1.RebindInProgress,
	PhaseSucceeded:     cdiv1.Succeeded,
}

// DataVolumePhaseFor is the DataVolume phase for the target's clonePhase.
// Error, and any value Kubefill does not know, leave current unchanged: CDI
// reports a clone error through the Running condition, never as Failed.
func DataVolumePhaseFor(clonePhase string, current cdiv1.DataVolumePhase) cdiv1.DataVolumePhase {
	if p, ok := dataVolumePhases[PhaseName(clonePhase)]; ok {
		return p
	}
	return current
}

// Running is the DataVolume's Running condition as the target's
// cdi.kubevirt.io/storage.condition.running(.message|.reason) carry it.
type Running struct {
	Status  string
	Message string
	Reason  string
}

// Running condition reasons and messages of a clone, CDI's.
const (
	runningReasonCompleted = "Completed"
	runningReasonPending   = "Pending"
	runningReasonError     = "Error"
	runningReasonRunning   = "Populator is running"
	runningMessageComplete = "Clone Complete"
	runningMessagePending  = "Clone Pending"
)

// RunningFor is the Running condition for the target's clonePhase.
// cloneError is the target's cdi.kubevirt.io/cloneError, the message of the
// Error phase. worker is the upload worker's condition, read from the
// host-assisted temporary claim; during HostClone it is reported instead,
// when known. ok is false for an empty phase: nothing to write yet.
func RunningFor(clonePhase string, cloneError string, worker *Running) (r Running, ok bool) {
	switch PhaseName(clonePhase) {
	case "":
		return Running{}, false
	case PhaseSucceeded:
		return Running{Status: "false", Message: runningMessageComplete, Reason: runningReasonCompleted}, true
	case PhasePending:
		return Running{Status: "false", Message: runningMessagePending, Reason: runningReasonPending}, true
	case PhaseError:
		return Running{Status: "false", Message: cloneError, Reason: runningReasonError}, true
	case PhaseHostClone:
		if worker != nil {
			return *worker, true
		}
	}
	return Running{Status: "true", Reason: runningReasonRunning}, true
}
