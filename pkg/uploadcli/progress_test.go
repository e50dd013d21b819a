package uploadcli

import (
	"bytes"
	"io"
	"strings"
	"testing"
	"time"
)

func TestProgressLine(t *testing.T) {
	for _, tc := range []struct {
		sent, total int64
		elapsed     time.Duration
		want        string
	}{
		{0, 2 << 30, 0, "uploaded 0 B of 2.0 GiB (0%)"},
		{512 << 20, 2 << 30, 2 * time.Second, "uploaded 512.0 MiB of 2.0 GiB (25%), 256.0 MiB/s, about 6s left"},
		{2 << 30, 2 << 30, 8 * time.Second, "uploaded 2.0 GiB of 2.0 GiB (100%), 256.0 MiB/s"},
		{1536, 4096, time.Second, "uploaded 1.5 KiB of 4.0 KiB (37%), 1.5 KiB/s, about 2s left"},
	} {
		if got := ProgressLine(tc.sent, tc.total, tc.elapsed); got != tc.want {
			t.Errorf("ProgressLine(%d, %d, %s) = %q, want %q", tc.sent, tc.total, tc.elapsed, got, tc.want)
		}
	}
}

// Off a terminal the progress is a line every interval, not a redrawn bar.
func TestLinesProgressOffTerminal(t *testing.T) {
	var out bytes.Buffer
	p := NewProgress(&out)
	lines, ok := p.(*Lines)
	if !ok {
		t.Fatalf("NewProgress on a buffer gave %T, want *Lines", p)
	}
	now := time.Unix(1000, 0)
	lines.Now = func() time.Time { return now }
	p.Start(10 << 20)
	r := p.Wrap(io.LimitReader(zeroReader{}, 10<<20))
	buf := make([]byte, 1<<20)
	for {
		now = now.Add(time.Second)
		if _, err := r.Read(buf); err != nil {
			break
		}
	}
	p.Finish(true)
	got := strings.Split(strings.TrimSpace(out.String()), "\n")
	// 10 reads a second apart, a line every 2 s, then the final line.
	if len(got) != 6 || !strings.HasPrefix(got[0], "uploaded 2.0 MiB of 10.0 MiB (20%)") || !strings.HasPrefix(got[5], "uploaded 10.0 MiB of 10.0 MiB (100%)") {
		t.Errorf("progress lines:\n%s", out.String())
	}
	if strings.Contains(out.String(), "\r") {
		t.Errorf("carriage returns off a terminal: %q", out.String())
	}
}
