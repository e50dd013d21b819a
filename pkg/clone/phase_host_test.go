package clone

import (
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/kubefill/kubefill/pkg/populators"
)

// A failed source pod that will run again stays visible until the next
// one runs.
func TestBetweenAttempts(t *testing.T) {
	failed := "attempt 1 failed: dial tcp 10.0.0.9:8443: connection refused; retrying in 10s"
	for _, tc := range []struct {
		name      string
		res       populators.Result
		last      string
		wantEvent string
		wantMsg   string
	}{
		{"a failure is a Warning event", populators.Result{Reason: reasonWorkerRetrying, Message: failed}, "", corev1.EventTypeWarning, failed},
		{"the hold-off keeps the failure", populators.Result{Reason: reasonWorkerBackoff, Message: "waiting before the next attempt"}, failed, "", failed},
		{"a hold-off with no failure recorded", populators.Result{Reason: reasonWorkerBackoff, Message: "waiting before the next attempt"},
			"", "", "waiting before the next attempt"},
		{"the next pod runs", populators.Result{Reason: "Pending"}, failed, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := betweenAttempts(tc.res, tc.last)
			if got.Event != tc.wantEvent || got.Message != tc.wantMsg {
				t.Errorf("event %q message %q, want %q %q", got.Event, got.Message, tc.wantEvent, tc.wantMsg)
			}
		})
	}
}
