package hostpath

import (
	"strings"
	"testing"
	"time"
)

func TestParseCallLog(t *testing.T) {
	log := "2026/12/01 10:00:00 hostpath CSI driver serving\n" +
		"2026/12/01 10:00:01 /csi.v1.Controller/CreateVolume name=pvc-1 from-volume=vol-a (1.5ms) took=1500000ns: ok\n" +
		"2026/12/01 10:00:02 /csi.v1.Controller/CreateSnapshot name=snapshot-2 source=vol-a (2ms) took=2000000ns: ok\n" +
		"2026/12/01 10:00:03 /csi.v1.Identity/Probe (3µs) took=3000ns: ok\n" +
		"2026/12/01 10:00:04 /csi.v1.Controller/CreateVolume name=pvc-3 (1ms) took=1000000ns: rpc error: code = Internal\n"
	calls, err := ParseCallLog(strings.NewReader(log))
	if err != nil {
		t.Fatal(err)
	}
	want := []Call{
		{Method: "CreateVolume", Name: "pvc-1", Took: 1500 * time.Microsecond, OK: true},
		{Method: "CreateSnapshot", Name: "snapshot-2", Took: 2 * time.Millisecond, OK: true},
		{Method: "Probe", Took: 3 * time.Microsecond, OK: true},
		{Method: "CreateVolume", Name: "pvc-3", Took: time.Millisecond, OK: false},
	}
	if len(calls) != len(want) {
		t.Fatalf("parsed %+v", calls)
	}
	for i := range want {
		if calls[i] != want[i] {
			t.Errorf("call %d: %+v, want %+v", i, calls[i], want[i])
		}
	}
}
