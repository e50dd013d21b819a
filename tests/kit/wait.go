// Package kit is what the integration and e2e tests share: one wait, the
// terminal-phase check and a DataVolume wait built on it, small PVC and
// DataVolume builders, and the tests' certificate authority on pkg/pki.
package kit

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// Interval is how often Until polls.
const Interval = 100 * time.Millisecond

// Eventually calls cond every interval until it reports done, and returns
// how long that took. If timeout passes first the test fails, naming what
// it waited for, cond's last status and its last error. An error does not
// end the wait (the object may not exist yet); a cond that meets an error
// worth stopping for calls t.Fatal itself.
func Eventually(t testing.TB, timeout, interval time.Duration, what string, cond func() (done bool, status string, err error)) time.Duration {
	t.Helper()
	return wait(t, timeout, interval, what, cond, nil)
}

// Until is Eventually for a condition with no status to report, polled
// every Interval.
func Until(t testing.TB, timeout time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	return wait(t, timeout, Interval, what, func() (bool, string, error) { return cond(), "", nil }, nil)
}

// Await polls get every interval until cond holds for what it returns, and
// returns that. If timeout passes first the test fails with what it waited
// for, describe of the last value got (describe runs only then, so it may
// list events or read logs; nil prints the value) and get's last error.
func Await[T any](t testing.TB, timeout, interval time.Duration, what string, get func() (T, error), cond func(T) bool, describe func(T) string) T {
	t.Helper()
	var last T
	wait(t, timeout, interval, what, func() (bool, string, error) {
		v, err := get()
		if err != nil {
			return false, "", err
		}
		last = v
		return cond(v), "", nil
	}, func() string {
		if describe == nil {
			return fmt.Sprintf("last %+v", last)
		}
		return describe(last)
	})
	return last
}

func wait(t testing.TB, timeout, interval time.Duration, what string, cond func() (bool, string, error), explain func() string) time.Duration {
	t.Helper()
	start := time.Now()
	deadline := start.Add(timeout)
	var status string
	var lastErr error
	for {
		done, s, err := cond()
		if done {
			return time.Since(start)
		}
		if s != "" {
			status = s
		}
		if err != nil {
			lastErr = err
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(interval)
	}
	msg := []string{fmt.Sprintf("timed out after %s waiting for %s", timeout, what)}
	if status != "" {
		msg = append(msg, "last status: "+status)
	}
	if lastErr != nil {
		msg = append(msg, fmt.Sprintf("last error: %v", lastErr))
	}
	if explain != nil {
		if e := explain(); e != "" {
			msg = append(msg, e)
		}
	}
	t.Fatal(strings.Join(msg, "\n"))
	return time.Since(start)
}
