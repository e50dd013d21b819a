package clone

import (
	"testing"

	corev1 "k8s.io/api/core/v1"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

func TestPhaseNamesOnTheWire(t *testing.T) {
	got := []PhaseName{PhasePending, PhaseSnapshot, PhaseSnapshotClone, PhaseCSIClone, PhasePrepClaim, PhaseHostClone, PhaseRebind, PhaseSucceeded, PhaseError}
	want := []string{"Pending", "Snapshot", "SnapshotClone", "CSIClone", "PrepClaim", "HostClone", "Rebind", "Succeeded", "Error"}
	for i := range want {
		if string(got[i]) != want[i] {
			t.Errorf("phase %d is %q, want %q", i, got[i], want[i])
		}
	}
}

func TestDataVolumePhaseFor(t *testing.T) {
	const current = cdiv1.CloneInProgress
	cases := []struct {
		clonePhase string
		want       cdiv1.DataVolumePhase
	}{
		{"", "CloneScheduled"},
		{"Pending", "CloneScheduled"},
		{"Snapshot", "SnapshotForSmartCloneInProgress"},
		{"SnapshotClone", "CloneFromSnapshotSourceInProgress"},
		{"CSIClone", "CSICloneInProgress"},
		{"PrepClaim", "PrepClaimInProgress"},
		{"HostClone", "CloneInProgress"},
		{"Rebind", "RebindInProgress"},
		{"Succeeded", "Succeeded"},
		{"Error", current},     // never Failed: the Running condition carries the error
		{"Bogus", current},     // a value from a newer controller changes nothing
		{"succeeded", current}, // the wire is case-sensitive
	}
	for _, c := range cases {
		if got := DataVolumePhaseFor(c.clonePhase, current); got != c.want {
			t.Errorf("DataVolumePhaseFor(%q) = %q, want %q", c.clonePhase, got, c.want)
		}
	}
	if got := DataVolumePhaseFor("Error", cdiv1.SnapshotForSmartCloneInProgress); got != cdiv1.SnapshotForSmartCloneInProgress {
		t.Errorf("Error replaced the current phase with %q", got)
	}
}

func TestRunningFor(t *testing.T) {
	worker := &Running{Status: "false", Message: "Upload pod is pending", Reason: "Pending"}
	cases := []struct {
		name       string
		clonePhase string
		cloneError string
		worker     *Running
		want       Running
		ok         bool
	}{
		{"no phase yet: nothing to write", "", "", nil, Running{}, false},
		{"succeeded", "Succeeded", "", nil, Running{"false", "Clone Complete", "Completed"}, true},
		{"pending", "Pending", "", nil, Running{"false", "Clone Pending", "Pending"}, true},
		{"error carries cloneError", "Error", "source claim is gone", nil, Running{"false", "source claim is gone", "Error"}, true},
		{"snapshot", "Snapshot", "", nil, Running{"true", "", "Populator is running"}, true},
		{"snapshot clone", "SnapshotClone", "", nil, Running{"true", "", "Populator is running"}, true},
		{"csi clone", "CSIClone", "", nil, Running{"true", "", "Populator is running"}, true},
		{"prep claim", "PrepClaim", "", nil, Running{"true", "", "Populator is running"}, true},
		{"rebind ignores a worker", "Rebind", "", worker, Running{"true", "", "Populator is running"}, true},
		{"host clone reports the upload worker", "HostClone", "", worker, *worker, true},
		{"host clone before the worker reports", "HostClone", "", nil, Running{"true", "", "Populator is running"}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, ok := RunningFor(c.clonePhase, c.cloneError, c.worker)
			if got != c.want || ok != c.ok {
				t.Errorf("RunningFor = %+v, %v; want %+v, %v", got, ok, c.want, c.ok)
			}
		})
	}
}

func TestProvisioning(t *testing.T) {
	claim := func(source bool, phase corev1.PersistentVolumeClaimPhase) *corev1.PersistentVolumeClaim {
		pvc := &corev1.PersistentVolumeClaim{Status: corev1.PersistentVolumeClaimStatus{Phase: phase}}
		if source {
			pvc.Spec.DataSource = &corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: "golden"}
		}
		return pvc
	}
	for _, tc := range []struct {
		name  string
		prime *corev1.PersistentVolumeClaim
		want  bool
	}{
		{"no prime yet", nil, false},
		{"a CSI clone or restore being provisioned", claim(true, corev1.ClaimPending), true},
		{"the clone bound", claim(true, corev1.ClaimBound), false},
		{"an empty prime for a copy", claim(false, corev1.ClaimPending), false},
	} {
		if got := provisioning(tc.prime); got != tc.want {
			t.Errorf("%s: provisioning = %v, want %v", tc.name, got, tc.want)
		}
	}
}
