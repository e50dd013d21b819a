package contract

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestTerminationMessageEncode(t *testing.T) {
	long := strings.Repeat("x", 10000)
	b, err := TerminationMessage{Outcome: OutcomeFailed, Message: &long}.Encode()
	if err != nil || len(b) > 4096 {
		t.Fatalf("len %d err %v", len(b), err)
	}
	var m TerminationMessage
	if err := json.Unmarshal(b, &m); err != nil || m.Outcome != OutcomeFailed || !strings.HasSuffix(*m.Message, "...") {
		t.Fatalf("%s", b)
	}
}

// TestTerminationMessageLabelsNeverCostTheOutcome: an image's labels too
// large for the kubelet's limit are left out, and the outcome and text stay.
func TestTerminationMessageLabelsNeverCostTheOutcome(t *testing.T) {
	text := MessageImportComplete
	huge := map[string]string{}
	for i := range 100 {
		huge[fmt.Sprintf("x%d.kubevirt.io/label", i)] = strings.Repeat("v", 60)
	}
	done := make(chan []byte, 1)
	go func() {
		b, err := TerminationMessage{Outcome: OutcomeSucceeded, Message: &text, Labels: huge}.Encode()
		if err != nil {
			t.Error(err)
		}
		done <- b
	}()
	var b []byte
	select {
	case b = <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Encode did not return with labels over the limit")
	}
	m, ok := DecodeTermination(string(b))
	if !ok || m.Outcome != OutcomeSucceeded || m.Message == nil || *m.Message != text || m.Labels != nil || len(b) > maxTerminationMessage {
		t.Errorf("encoded %d bytes: %+v", len(b), m)
	}
	small := map[string]string{"instancetype.kubevirt.io/default-preference": "fedora"}
	b, _ = TerminationMessage{Outcome: OutcomeSucceeded, Message: &text, Labels: small}.Encode()
	if m, _ := DecodeTermination(string(b)); m.Labels["instancetype.kubevirt.io/default-preference"] != "fedora" {
		t.Errorf("labels that fit were dropped: %s", b)
	}
}
