package populators

import (
	"strings"
	"testing"
	"time"
)

func TestDecideRetry(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	importer := RetryPolicy{MaxRetries: 3, Backoff: 10 * time.Second}
	upload := RetryPolicy{MaxRetries: -1, RetryMessage: func(_ int, failure string, _ time.Duration) string {
		return "the upload server stopped: " + failure + "; starting a new one"
	}}
	failed := &workerFailure{Message: "connection reset"}
	cases := []struct {
		name    string
		policy  RetryPolicy
		state   primeState
		failure *workerFailure
		action  retryAction
		wait    time.Duration
		message string
	}{
		{"no pod yet: start one", importer, primeState{}, nil, startWorker, 0, ""},
		{"first failure backs off", importer, primeState{Attempts: 1}, failed, retryWorker, 10 * time.Second, "attempt 1 failed: connection reset; retrying in 10s"},
		{"the backoff doubles", importer, primeState{Attempts: 2}, failed, retryWorker, 20 * time.Second, "attempt 2 failed: connection reset; retrying in 20s"},
		{"and doubles again", importer, primeState{Attempts: 3}, failed, retryWorker, 40 * time.Second, "retrying in 40s"},
		{"growth stops at 64 times", RetryPolicy{MaxRetries: 20, Backoff: time.Second}, primeState{Attempts: 12}, failed, retryWorker, 64 * time.Second, "attempt 12 failed"},
		{"an uncounted pod backs off as a first failure", importer, primeState{}, failed, retryWorker, 10 * time.Second, "retrying in 10s"},
		{"the ceiling caps the doubling", WorkerRetry, primeState{Attempts: 6}, failed, retryWorker, 5 * time.Minute, "attempt 6 failed: connection reset; retrying in 5m0s"},
		{"no bound like CDI's workers", WorkerRetry, primeState{Attempts: 500}, failed, retryWorker, 5 * time.Minute, "attempt 500 failed"},
		{"below the ceiling it still doubles", WorkerRetry, primeState{Attempts: 5}, failed, retryWorker, 160 * time.Second, "retrying in 2m40s"},
		{"max retries reached", importer, primeState{Attempts: 4}, failed, giveUp, 0, "gave up after 4 attempts: connection reset"},
		{"permanent failure is not retried", importer, primeState{Attempts: 1}, &workerFailure{Message: "checksum mismatch", Permanent: true}, giveUp, 0, "checksum mismatch"},
		{"retry-not-before in the future holds off", importer, primeState{Attempts: 1, RetryNotBefore: now.Add(7 * time.Second)}, nil, holdOff, 7 * time.Second, "waiting before the next attempt"},
		{"retry-not-before passed: start", importer, primeState{Attempts: 1, RetryNotBefore: now.Add(-time.Second)}, nil, startWorker, 0, ""},
		{"no bound: the upload server is replaced at once", upload, primeState{Attempts: 40}, failed, retryWorker, 0, "the upload server stopped: connection reset; starting a new one"},
		{"no bound, permanent still gives up", upload, primeState{Attempts: 1}, &workerFailure{Message: "bad", Permanent: true}, giveUp, 0, "bad"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := decideRetry(c.policy, c.state, c.failure, now)
			if d.Action != c.action || d.Wait != c.wait || !strings.Contains(d.Message, c.message) {
				t.Errorf("decideRetry = %+v; want action %d, wait %s, message containing %q", d, c.action, c.wait, c.message)
			}
		})
	}
}

func TestPrimeStateRoundTrip(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	s := primeState{Attempts: 2, RetryNotBefore: at, CopiedEvents: []string{"a", "b"}}
	if got := parsePrimeState(s.annotations()); got.Attempts != 2 || !got.RetryNotBefore.Equal(at) || strings.Join(got.CopiedEvents, ",") != "a,b" {
		t.Errorf("round trip: %+v", got)
	}
	if got := parsePrimeState(map[string]string{annAttempts: "x", annRetryNotBefore: "soon"}); got.Attempts != 0 || !got.RetryNotBefore.IsZero() || got.CopiedEvents != nil {
		t.Errorf("unreadable state counts as zero: %+v", got)
	}
}
