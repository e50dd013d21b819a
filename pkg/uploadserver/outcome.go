package uploadserver

import (
	"errors"
	"net/http"
	"time"

	"github.com/kubefill/kubefill/pkg/contract"
)

// handleOutcome serves contract.UploadOutcomePath: the termination message
// of the server's successful upload, once there is one (the data fsynced),
// waiting up to ?wait= for it; 204 if there is none yet. It needs no
// client certificate, like /healthz: it tells only that the volume is
// filled. The controller reads it to finish a clone without waiting for the
// kubelet to report the pod's exit.
func (s *Server) handleOutcome(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		w.Header().Set("Allow", http.MethodGet)
		http.Error(w, "use GET", http.StatusMethodNotAllowed)
		return
	}
	wait, err := outcomeWait(r.URL.Query().Get("wait"))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		select {
		case <-s.done:
		case <-t.C:
		case <-r.Context().Done():
			return
		}
	}
	select {
	case <-s.done:
	default:
		w.WriteHeader(http.StatusNoContent)
		return
	}
	b, err := s.successMessage().Encode()
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}

// outcomeWait parses the wait parameter: a Go duration ("20s"), bounded
// by contract.UploadOutcomeMaxWait; empty is no wait.
func outcomeWait(v string) (time.Duration, error) {
	if v == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		return 0, errBadWait
	}
	return min(d, contract.UploadOutcomeMaxWait*time.Second), nil
}

var errBadWait = errors.New("wait must be a non-negative duration such as 20s")

// successMessage is the termination message of the server's successful
// upload (call once done is closed): what the pod's termination log says
// on exit, and what the outcome endpoint answers before.
func (s *Server) successMessage() contract.TerminationMessage {
	s.mu.Lock()
	text, prealloc := s.outcome.message, s.outcome.preallocated
	s.mu.Unlock()
	return contract.TerminationMessage{Outcome: contract.OutcomeSucceeded, Message: &text, PreallocationApplied: &prealloc}
}
