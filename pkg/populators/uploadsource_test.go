package populators

import (
	"errors"
	"testing"
	"time"
)

func TestUploadProgress(t *testing.T) {
	cases := []struct {
		name  string
		pct   float64
		err   error
		want  string
		retry time.Duration
	}{
		{"waiting for an upload", 0, nil, "0.00%", uploadIdlePoll},
		{"a quarter in", 25, nil, "25.00%", uploadBusyPoll},
		{"a few bytes in", 0.004, nil, "0.00%", uploadBusyPoll},
		{"all received, still converting", 100, nil, "99.99%", uploadBusyPoll},
		{"unreadable: the claim keeps what it shows", 0, errors.New("connection refused"), "", uploadIdlePoll},
	}
	for _, c := range cases {
		got, retry := UploadProgress(c.pct, c.err)
		if got != c.want || retry != c.retry {
			t.Errorf("%s: UploadProgress(%v, %v) = %q, %s; want %q, %s", c.name, c.pct, c.err, got, retry, c.want, c.retry)
		}
	}
}
