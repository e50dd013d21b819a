package populators

import (
	"fmt"
	"time"
)

// RetryPolicy is how a kind's worker is started again after it failed.
type RetryPolicy struct {
	// MaxRetries bounds the retries of a retryable failure; negative means
	// no bound (an upload server is replaced as often as it stops).
	MaxRetries int
	// Backoff is the wait before the first retry; it doubles with each
	// failure, up to 64 times and up to MaxBackoff when that is set. Zero
	// starts the next worker at once.
	Backoff    time.Duration
	MaxBackoff time.Duration
	// RetryMessage tells the user a failure will be retried; nil says
	// "attempt N failed: <why>; retrying in <wait>".
	RetryMessage func(attempt int, failure string, wait time.Duration) string
}

// WorkerRetry is how CDI's workers are retried, which Kubefill's are: a
// transient failure is retried without a bound (CDI's worker pods restart
// on failure and never give up), 10 s first and doubling up to the
// kubelet's crash-loop ceiling of 5 minutes. Permanent failures (a
// checksum mismatch, a hostile image) still end at once.
var WorkerRetry = RetryPolicy{MaxRetries: -1, Backoff: 10 * time.Second, MaxBackoff: 5 * time.Minute}

// retryAction is what to do about a prime's worker.
type retryAction int

const (
	// startWorker: no worker runs and none is held off: start one.
	startWorker retryAction = iota
	// holdOff: no worker runs; the next waits until the backoff ends.
	holdOff
	// retryWorker: the worker failed and may run again: remove it, then
	// start the next once Wait has passed.
	retryWorker
	// giveUp: the failure is final; leave the worker for the user to read.
	giveUp
)

// retryDecision is the outcome of decideRetry.
type retryDecision struct {
	Action retryAction
	// Wait is how long until the next worker may start (holdOff, retryWorker).
	Wait time.Duration
	// Message is what the target shows.
	Message string
}

// workerFailure is a failed worker pod, as PodState read it.
type workerFailure struct {
	Message   string
	Permanent bool
}

// decideRetry decides what to do about a prime's worker, from the policy,
// the attempts so far, and either the failure of the current worker pod
// (failed != nil) or, with no pod, the retry-not-before time. It is pure.
func decideRetry(p RetryPolicy, st primeState, failed *workerFailure, now time.Time) retryDecision {
	if failed == nil {
		if now.Before(st.RetryNotBefore) {
			return retryDecision{Action: holdOff, Wait: st.RetryNotBefore.Sub(now), Message: "waiting before the next attempt"}
		}
		return retryDecision{Action: startWorker}
	}
	if failed.Permanent {
		return retryDecision{Action: giveUp, Message: failed.Message}
	}
	if p.MaxRetries >= 0 && st.Attempts > p.MaxRetries {
		return retryDecision{Action: giveUp, Message: fmt.Sprintf("gave up after %d attempts: %s", st.Attempts, failed.Message)}
	}
	// A pod whose attempt was never counted (made before the count existed)
	// backs off as a first failure.
	wait := p.Backoff << min(max(st.Attempts-1, 0), 6)
	if p.MaxBackoff > 0 {
		wait = min(wait, p.MaxBackoff)
	}
	msg := fmt.Sprintf("attempt %d failed: %s; retrying in %s", st.Attempts, failed.Message, wait)
	if p.RetryMessage != nil {
		msg = p.RetryMessage(st.Attempts, failed.Message, wait)
	}
	return retryDecision{Action: retryWorker, Wait: wait, Message: msg}
}
