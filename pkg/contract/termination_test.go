package contract

import (
	"encoding/json"
	"strings"
	"testing"
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
