package contract

import (
	"encoding/json"
	"fmt"
	"os"
)

// Outcomes a worker reports in its termination message.
const (
	OutcomeSucceeded = "Succeeded"
	OutcomeFailed    = "Failed"
)

// Messages written to the termination log, as CDI's importer writes them.
const (
	MessageImportComplete = "Import Complete"
	// MessagePreallocationApplied is CDI's marker text for preallocation.
	MessagePreallocationApplied = "Preallocation applied"
	// MessageScratchSpaceRequired is CDI's marker text for scratch space.
	MessageScratchSpaceRequired = "scratch space required and none found"
)

// maxTerminationMessage is the kubelet's limit on a termination message.
const maxTerminationMessage = 4096

// TerminationMessage is the JSON a worker writes to its termination log.
// The field names follow CDI's importer; Outcome is Kubefill's explicit
// success marker (Succeeded only after the data is fsynced).
type TerminationMessage struct {
	Outcome              string  `json:"outcome"`
	Message              *string `json:"message,omitempty"`
	PreallocationApplied *bool   `json:"preallocationApplied,omitempty"`
	ScratchSpaceRequired *bool   `json:"scratchSpaceRequired,omitempty"`
	// Permanent marks a failure that retrying cannot fix (bad checksum,
	// hostile or oversized image, a 4xx from the server): the controller
	// stops retrying and tells the user.
	Permanent *bool             `json:"permanent,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
}

// Encode renders the message so the whole JSON fits the kubelet's
// 4096-byte limit: labels that do not fit are left out (they come from the
// image, and must never cost the outcome), then the text is shortened.
func (m TerminationMessage) Encode() ([]byte, error) {
	for {
		b, err := json.Marshal(m)
		if err != nil {
			return nil, err
		}
		switch {
		case len(b) <= maxTerminationMessage:
			return b, nil
		case len(m.Labels) > 0:
			m.Labels = nil
			continue
		case m.Message == nil || len(*m.Message) <= 3:
			return b, nil
		}
		s := *m.Message
		cut := max(len(s)-(len(b)-maxTerminationMessage)-3, 0)
		s = s[:cut] + "..."
		m.Message = &s
	}
}

// DecodeTermination parses a termination message; ok is false when text
// is not one (a crash's stderr, an empty file).
func DecodeTermination(text string) (m TerminationMessage, ok bool) {
	if err := json.Unmarshal([]byte(text), &m); err != nil || m.Outcome == "" {
		return TerminationMessage{}, false
	}
	return m, true
}

// WriteTermination writes m to path (the pod's termination log).
func WriteTermination(path string, m TerminationMessage) error {
	b, err := m.Encode()
	if err != nil {
		return fmt.Errorf("encoding termination message: %w", err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return fmt.Errorf("writing termination message to %s: %w", path, err)
	}
	return nil
}
