package controller

import (
	"reflect"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

func pvcWith(phase corev1.PersistentVolumeClaimPhase, ann map[string]string) *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "disk", Annotations: ann}, Status: corev1.PersistentVolumeClaimStatus{Phase: phase}}
}

func TestComputeStatus(t *testing.T) {
	dv := &cdiv1.DataVolume{ObjectMeta: metav1.ObjectMeta{Name: "disk"}}
	cases := []struct {
		name     string
		view     ClaimView
		phase    cdiv1.DataVolumePhase
		progress cdiv1.DataVolumeProgress
		bound    string // reason of Bound
		running  corev1.ConditionStatus
		ready    corev1.ConditionStatus
	}{
		{"no claim yet", ClaimView{}, cdiv1.Pending, "N/A", cdiv1.ReasonNotFound, corev1.ConditionFalse, corev1.ConditionFalse},
		{"waiting for a consumer", ClaimView{Claim: pvcWith(corev1.ClaimPending, nil), WaitsForConsumer: true}, cdiv1.PendingPopulation, "N/A", cdiv1.ReasonPending, corev1.ConditionFalse, corev1.ConditionFalse},
		{"prime created", ClaimView{Claim: pvcWith(corev1.ClaimPending, map[string]string{cdiv1.AnnPVCPrimeName: "prime-1"})}, cdiv1.ImportScheduled, "N/A", cdiv1.ReasonPending, corev1.ConditionFalse, corev1.ConditionFalse},
		{"importing", ClaimView{Claim: pvcWith(corev1.ClaimPending, map[string]string{
			cdiv1.AnnPodPhase: "Running", cdiv1.AnnRunningCondition: "true", cdiv1.AnnRunningConditionReason: "TransferRunning",
			cdiv1.AnnPopulatorProgress: "45.20%", cdiv1.AnnPodRestarts: "2"})}, cdiv1.ImportInProgress, "45.20%", cdiv1.ReasonPending, corev1.ConditionTrue, corev1.ConditionFalse},
		{"pod done, rebind pending", ClaimView{Claim: pvcWith(corev1.ClaimPending, map[string]string{cdiv1.AnnPodPhase: "Succeeded", cdiv1.AnnPopulatorProgress: "99.99%"})}, cdiv1.ImportInProgress, "99.99%", cdiv1.ReasonPending, corev1.ConditionFalse, corev1.ConditionFalse},
		{"populated and bound", ClaimView{Claim: pvcWith(corev1.ClaimBound, map[string]string{cdiv1.AnnPopulatedFor: "disk", cdiv1.AnnPodPhase: "Succeeded"})}, cdiv1.Succeeded, "100.0%", cdiv1.ReasonBound, corev1.ConditionFalse, corev1.ConditionTrue},
		{"bound but not populated is not success", ClaimView{Claim: pvcWith(corev1.ClaimBound, map[string]string{cdiv1.AnnPodPhase: "Running"})}, cdiv1.ImportInProgress, "N/A", cdiv1.ReasonBound, corev1.ConditionFalse, corev1.ConditionFalse},
		{"permanent failure", ClaimView{Claim: pvcWith(corev1.ClaimPending, map[string]string{cdiv1.AnnPodPhase: "Failed", cdiv1.AnnRunningCondition: "false",
			cdiv1.AnnRunningConditionReason: "Error", cdiv1.AnnRunningConditionMessage: "checksum mismatch"})}, cdiv1.Failed, "N/A", cdiv1.ReasonPending, corev1.ConditionFalse, corev1.ConditionFalse},
		{"claim refused by a quota", ClaimView{Problem: "creating claim disk: exceeded quota: storage", ProblemReason: "ErrExceededQuota"}, cdiv1.Pending, "N/A", "ErrExceededQuota", corev1.ConditionFalse, corev1.ConditionFalse},
		{"prime refused by a quota", ClaimView{Claim: pvcWith(corev1.ClaimPending, map[string]string{cdiv1.AnnRunningCondition: "false",
			cdiv1.AnnRunningConditionReason: "ErrExceededQuota", cdiv1.AnnRunningConditionMessage: "exceeded quota: storage"})}, cdiv1.Pending, "N/A", "ErrExceededQuota", corev1.ConditionFalse, corev1.ConditionFalse},
		{"claim lost", ClaimView{Claim: pvcWith(corev1.ClaimLost, nil)}, cdiv1.Failed, "N/A", cdiv1.ReasonClaimLost, corev1.ConditionFalse, corev1.ConditionFalse},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			st := ComputeStatus(dv, c.view)
			if st.Phase != c.phase || st.Progress != c.progress {
				t.Errorf("phase %s progress %s, want %s %s", st.Phase, st.Progress, c.phase, c.progress)
			}
			got := map[cdiv1.DataVolumeConditionType]cdiv1.DataVolumeCondition{}
			for _, cond := range st.Conditions {
				got[cond.Type] = cond
			}
			if got[cdiv1.DataVolumeBound].Reason != c.bound || got[cdiv1.DataVolumeRunning].Status != c.running || got[cdiv1.DataVolumeReady].Status != c.ready {
				t.Errorf("conditions %+v", st.Conditions)
			}
		})
	}
	upload := &cdiv1.DataVolume{ObjectMeta: metav1.ObjectMeta{Name: "disk"}, Spec: cdiv1.DataVolumeSpec{Source: &cdiv1.DataVolumeSource{Upload: &cdiv1.DataVolumeSourceUpload{}}}}
	// The upload's progress is the share of its body the server received;
	// the claim's annotation shows through, 100% only once populated.
	for _, c := range []struct {
		name     string
		ann      map[string]string
		bound    corev1.PersistentVolumeClaimPhase
		phase    cdiv1.DataVolumePhase
		progress cdiv1.DataVolumeProgress
	}{
		{"claim only", nil, corev1.ClaimPending, cdiv1.Pending, "N/A"},
		{"prime made", map[string]string{cdiv1.AnnPVCPrimeName: "prime-1"}, corev1.ClaimPending, cdiv1.UploadScheduled, "N/A"},
		{"pod pending", map[string]string{cdiv1.AnnPVCPrimeName: "prime-1", cdiv1.AnnPodPhase: "Pending", cdiv1.AnnPodReady: "false"}, corev1.ClaimPending, cdiv1.UploadScheduled, "N/A"},
		{"pod running, not ready", map[string]string{cdiv1.AnnPodPhase: "Running", cdiv1.AnnPodReady: "false"}, corev1.ClaimPending, cdiv1.UploadScheduled, "N/A"},
		{"pod ready, progress not read yet", map[string]string{cdiv1.AnnPodPhase: "Running", cdiv1.AnnPodReady: "true"}, corev1.ClaimPending, cdiv1.UploadReady, "N/A"},
		{"pod ready, no upload yet", map[string]string{cdiv1.AnnPodPhase: "Running", cdiv1.AnnPodReady: "true", cdiv1.AnnPopulatorProgress: "0.00%"}, corev1.ClaimPending, cdiv1.UploadReady, "0.00%"},
		{"uploading", map[string]string{cdiv1.AnnPodPhase: "Running", cdiv1.AnnPodReady: "true", cdiv1.AnnPopulatorProgress: "37.50%"}, corev1.ClaimPending, cdiv1.UploadReady, "37.50%"},
		{"uploaded, rebind pending", map[string]string{cdiv1.AnnPodPhase: "Succeeded", cdiv1.AnnPodReady: "false", cdiv1.AnnPopulatorProgress: "99.99%"}, corev1.ClaimPending, cdiv1.UploadReady, "99.99%"},
		{"server failed", map[string]string{cdiv1.AnnPodPhase: "Failed"}, corev1.ClaimPending, cdiv1.Failed, "N/A"},
		{"populated", map[string]string{cdiv1.AnnPopulatedFor: "disk", cdiv1.AnnPodPhase: "Succeeded", cdiv1.AnnPopulatorProgress: "99.99%"}, corev1.ClaimBound, cdiv1.Succeeded, "100.0%"},
	} {
		st := ComputeStatus(upload, ClaimView{Claim: pvcWith(c.bound, c.ann)})
		if st.Phase != c.phase || st.Progress != c.progress {
			t.Errorf("upload, %s: phase %s progress %s, want %s %s", c.name, st.Phase, st.Progress, c.phase, c.progress)
		}
		if c.phase == cdiv1.Succeeded && st.Conditions[1].Message != "Upload Complete" {
			t.Errorf("upload, %s: Running %+v", c.name, st.Conditions[1])
		}
	}
	st := ComputeStatus(dv, ClaimView{Claim: pvcWith(corev1.ClaimPending, map[string]string{cdiv1.AnnPodRestarts: "3", cdiv1.AnnPodPhase: "Failed",
		cdiv1.AnnRunningConditionReason: "Error", cdiv1.AnnRunningConditionMessage: "checksum mismatch"})})
	if st.RestartCount != 3 || st.Conditions[1].Message != "checksum mismatch" {
		t.Errorf("restarts %d running %+v", st.RestartCount, st.Conditions[1])
	}
}

func TestMergeConditionsKeepsTimesWhenNothingChanged(t *testing.T) {
	then := metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	now := metav1.NewTime(then.Add(time.Hour))
	old := []cdiv1.DataVolumeCondition{
		{Type: cdiv1.DataVolumeBound, Status: corev1.ConditionFalse, Reason: "Pending", LastTransitionTime: then, LastHeartbeatTime: then},
		{Type: cdiv1.DataVolumeRunning, Status: corev1.ConditionTrue, Reason: "TransferRunning", LastTransitionTime: then, LastHeartbeatTime: then},
	}
	computed := []cdiv1.DataVolumeCondition{
		{Type: cdiv1.DataVolumeBound, Status: corev1.ConditionFalse, Reason: "Pending"},
		{Type: cdiv1.DataVolumeRunning, Status: corev1.ConditionFalse, Reason: "Completed"},
		{Type: cdiv1.DataVolumeReady, Status: corev1.ConditionTrue},
	}
	got := MergeConditions(old, computed, now)
	if !got[0].LastTransitionTime.Equal(&then) || !got[0].LastHeartbeatTime.Equal(&then) {
		t.Errorf("unchanged Bound got new times: %+v", got[0])
	}
	if !got[1].LastTransitionTime.Equal(&now) || !got[2].LastTransitionTime.Equal(&now) {
		t.Errorf("changed conditions kept old times: %+v %+v", got[1], got[2])
	}
}

func TestCountPending(t *testing.T) {
	class := "fast"
	named := &cdiv1.StorageSpec{StorageClassName: &class}
	dvs := []cdiv1.DataVolume{
		{Status: cdiv1.DataVolumeStatus{Phase: cdiv1.Pending}},
		{Status: cdiv1.DataVolumeStatus{Phase: cdiv1.ImportInProgress}},
		{Status: cdiv1.DataVolumeStatus{Phase: cdiv1.Pending}, Spec: cdiv1.DataVolumeSpec{Storage: &cdiv1.StorageSpec{}}},
		{},
		// Waiting on a class it names, not on the default: not counted, as in CDI.
		{Status: cdiv1.DataVolumeStatus{Phase: cdiv1.Pending}, Spec: cdiv1.DataVolumeSpec{Storage: named}},
		{Status: cdiv1.DataVolumeStatus{Phase: cdiv1.Pending}, Spec: cdiv1.DataVolumeSpec{PVC: &corev1.PersistentVolumeClaimSpec{StorageClassName: &class}}},
	}
	if n := CountPending(dvs); n != 3 {
		t.Errorf("CountPending = %d, want 3 (Pending or unset, on the default class)", n)
	}
}

func TestRunningReason(t *testing.T) {
	cases := []struct{ claimReason, message, want string }{
		{"Retrying", "attempt 1 failed: connection reset; retrying in 10s", cdiv1.ReasonError},
		{"Backoff", "attempt 2 failed: connection reset; retrying in 20s", cdiv1.ReasonError},
		{"Retrying", "attempt 1 failed: failed to pull image r/x:1: 503; retrying in 10s", cdiv1.ReasonImagePullFailed},
		{cdiv1.ReasonError, "failed to pull image r/x:1: manifest unknown", cdiv1.ReasonImagePullFailed},
		{cdiv1.ReasonImagePullFailed, "failed to pull image kubefill:v9 for the importer pod: not found", cdiv1.ReasonImagePullFailed},
		{cdiv1.ReasonError, "checksum mismatch", cdiv1.ReasonError},
		{cdiv1.ReasonTransferRunning, "", cdiv1.ReasonTransferRunning},
		{"Pending", "failed to pull image is only text here", "Pending"},
		{"ErrExceededQuota", "exceeded quota: q", "ErrExceededQuota"},
	}
	for _, c := range cases {
		if got := RunningReason(c.claimReason, c.message); got != c.want {
			t.Errorf("RunningReason(%q, %q) = %q, want %q", c.claimReason, c.message, got, c.want)
		}
	}
}

func TestWorkerFailureEvent(t *testing.T) {
	running := func(status corev1.ConditionStatus, reason, msg string) []cdiv1.DataVolumeCondition {
		return []cdiv1.DataVolumeCondition{{Type: cdiv1.DataVolumeBound, Status: corev1.ConditionTrue},
			{Type: cdiv1.DataVolumeRunning, Status: status, Reason: reason, Message: msg}}
	}
	oom := "attempt 1 failed: the importer ran out of memory: it was killed at its 8Mi memory limit; raise spec.podResourceRequirements.limits.memory in CDIConfig config; retrying in 10s"
	cases := []struct {
		name          string
		old, computed []cdiv1.DataVolumeCondition
		want          bool
	}{
		{"a retried failure is told", running(corev1.ConditionTrue, cdiv1.ReasonTransferRunning, ""), running(corev1.ConditionFalse, cdiv1.ReasonError, oom), true},
		{"from no conditions", nil, running(corev1.ConditionFalse, cdiv1.ReasonError, oom), true},
		{"the same message once", running(corev1.ConditionFalse, cdiv1.ReasonError, oom), running(corev1.ConditionFalse, cdiv1.ReasonError, oom), false},
		{"a temporary claim refused by a quota", running(corev1.ConditionTrue, cdiv1.ReasonTransferRunning, ""), running(corev1.ConditionFalse, "ErrExceededQuota", "exceeded quota: q"), true},
		{"the backoff after it, a new message", running(corev1.ConditionFalse, cdiv1.ReasonError, "x"), running(corev1.ConditionFalse, cdiv1.ReasonError, oom), true},
		{"an image that cannot be pulled", nil, running(corev1.ConditionFalse, cdiv1.ReasonImagePullFailed, "failed to pull image r/x:1: manifest unknown"), true},
		{"a crash loop", nil, running(corev1.ConditionFalse, "CrashLoopBackOff", "the importer ran out of memory"), true},
		{"running is no failure", nil, running(corev1.ConditionTrue, cdiv1.ReasonTransferRunning, "x"), false},
		{"a pending pod is no failure", nil, running(corev1.ConditionFalse, "Pending", "0/1 nodes are available"), false},
		{"no message, nothing to tell", nil, running(corev1.ConditionFalse, cdiv1.ReasonError, ""), false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			reason, msg, ok := workerFailureEvent(c.old, c.computed)
			if ok != c.want {
				t.Fatalf("workerFailureEvent = %q %q %v; want %v", reason, msg, ok, c.want)
			}
			if ok && (reason != c.computed[1].Reason || msg != c.computed[1].Message) {
				t.Errorf("event %q %q, want the running condition's %q %q", reason, msg, c.computed[1].Reason, c.computed[1].Message)
			}
		})
	}
}

func TestCountHighRestarts(t *testing.T) {
	dv := func(phase cdiv1.DataVolumePhase, restarts int32, src cdiv1.DataVolumeSource) cdiv1.DataVolume {
		return cdiv1.DataVolume{Spec: cdiv1.DataVolumeSpec{Source: &src}, Status: cdiv1.DataVolumeStatus{Phase: phase, RestartCount: restarts}}
	}
	http := cdiv1.DataVolumeSource{HTTP: &cdiv1.DataVolumeSourceHTTP{URL: "http://x/d.img"}}
	upload := cdiv1.DataVolumeSource{Upload: &cdiv1.DataVolumeSourceUpload{}}
	clone := cdiv1.DataVolumeSource{PVC: &cdiv1.DataVolumeSourcePVC{Namespace: "a", Name: "b"}}
	got := CountHighRestarts([]cdiv1.DataVolume{
		dv(cdiv1.ImportInProgress, 4, http),
		dv(cdiv1.ImportInProgress, 3, http), // at the threshold: not unusual
		dv(cdiv1.ImportInProgress, 9, http),
		dv(cdiv1.Succeeded, 9, http), // done: its restarts are history
		dv(cdiv1.Failed, 9, http),
		dv(cdiv1.UploadReady, 5, upload),
		dv(cdiv1.CloneInProgress, 4, clone),
	})
	if want := map[string]int{"import": 2, "upload": 1, "clone": 1}; !reflect.DeepEqual(got, want) {
		t.Errorf("CountHighRestarts = %v, want %v", got, want)
	}
}
