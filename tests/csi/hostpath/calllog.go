package hostpath

import (
	"bufio"
	"io"
	"regexp"
	"strconv"
	"time"
)

// Call is one controller call the driver logged.
type Call struct {
	// Method is the short gRPC method name, such as CreateVolume.
	Method string
	// Name is the volume or snapshot name the call was for ("" for others).
	Name string
	// Took is how long the driver spent in the call.
	Took time.Duration
	// OK says whether it succeeded.
	OK bool
}

var callLine = regexp.MustCompile(`/csi\.v1\.[A-Za-z]+/([A-Za-z]+)(?: name=(\S+))?.* took=(\d+)ns: (.*)$`)

// ParseCallLog reads the calls in a driver log (the lines logCalls writes;
// other lines are skipped), for benchmarks that subtract the driver's own
// time from a total.
func ParseCallLog(r io.Reader) ([]Call, error) {
	var calls []Call
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		m := callLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		ns, err := strconv.ParseInt(m[3], 10, 64)
		if err != nil {
			continue
		}
		calls = append(calls, Call{Method: m[1], Name: m[2], Took: time.Duration(ns), OK: m[4] == "ok"})
	}
	return calls, sc.Err()
}
