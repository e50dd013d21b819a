package uploadcli

import (
	"fmt"
	"io"
	"os"
	"time"

	"github.com/schollz/progressbar/v3"
)

// NewProgress is a progress bar on a terminal, and elsewhere (a log file, a
// CI job) a plain line every few seconds, since a redrawn bar there becomes
// one endless line.
func NewProgress(w io.Writer) Progress {
	if IsTerminal(w) {
		return &Bar{W: w}
	}
	return &Lines{W: w, Every: 2 * time.Second}
}

// Lines is a Progress that prints one line per interval: bytes, percent,
// rate and the time left.
type Lines struct {
	W     io.Writer
	Every time.Duration
	// Now is the clock; time.Now if nil.
	Now func() time.Time

	total, sent  int64
	start, since time.Time
}

func (l *Lines) now() time.Time {
	if l.Now != nil {
		return l.Now()
	}
	return time.Now()
}

// Start implements Progress.
func (l *Lines) Start(total int64) {
	l.total, l.sent = total, 0
	l.start = l.now()
	l.since = l.start
}

// Wrap implements Progress.
func (l *Lines) Wrap(r io.Reader) io.Reader { return &linesReader{r: r, l: l} }

// Finish implements Progress.
func (l *Lines) Finish(ok bool) {
	if ok {
		l.print()
	}
}

func (l *Lines) add(n int) {
	l.sent += int64(n)
	if now := l.now(); now.Sub(l.since) >= l.Every {
		l.since = now
		l.print()
	}
}

func (l *Lines) print() {
	fmt.Fprintln(l.W, ProgressLine(l.sent, l.total, l.now().Sub(l.start)))
}

type linesReader struct {
	r io.Reader
	l *Lines
}

func (lr *linesReader) Read(p []byte) (int, error) {
	n, err := lr.r.Read(p)
	lr.l.add(n)
	return n, err
}

// ProgressLine says how far an upload is: "uploaded 512.0 MiB of 2.0 GiB
// (25%), 190.2 MiB/s, about 8s left".
func ProgressLine(sent, total int64, elapsed time.Duration) string {
	line := fmt.Sprintf("uploaded %s of %s", iec(sent), iec(total))
	if total > 0 {
		line += fmt.Sprintf(" (%d%%)", sent*100/total)
	}
	if secs := elapsed.Seconds(); secs > 0 && sent > 0 {
		rate := float64(sent) / secs
		line += fmt.Sprintf(", %s/s", iec(int64(rate)))
		if left := total - sent; left > 0 {
			line += fmt.Sprintf(", about %s left", time.Duration(float64(left)/rate*float64(time.Second)).Round(time.Second))
		}
	}
	return line
}

// iec renders a byte count in KiB, MiB or GiB with one decimal.
func iec(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	v, suffix := float64(n)/unit, "KiB"
	for _, s := range []string{"MiB", "GiB", "TiB"} {
		if v < unit {
			break
		}
		v, suffix = v/unit, s
	}
	return fmt.Sprintf("%.1f %s", v, suffix)
}

// Bar is a Progress drawn with progressbar: bytes, rate and ETA.
type Bar struct {
	W   io.Writer
	bar *progressbar.ProgressBar
}

// Start implements Progress.
func (b *Bar) Start(total int64) {
	b.bar = progressbar.NewOptions64(total,
		progressbar.OptionSetWriter(b.W),
		progressbar.OptionSetDescription("uploading"),
		progressbar.OptionShowBytes(true),
		progressbar.OptionShowTotalBytes(true),
		progressbar.OptionShowCount(),
		progressbar.OptionSetPredictTime(true),
		progressbar.OptionSetElapsedTime(true),
		progressbar.OptionSetWidth(30),
		progressbar.OptionThrottle(200*time.Millisecond),
		progressbar.OptionUseIECUnits(true),
		progressbar.OptionOnCompletion(func() { fmt.Fprintln(b.W) }),
	)
}

// Wrap implements Progress.
func (b *Bar) Wrap(r io.Reader) io.Reader {
	pr := progressbar.NewReader(r, b.bar)
	return &pr
}

// Finish implements Progress.
func (b *Bar) Finish(ok bool) {
	if b.bar == nil {
		return
	}
	if ok {
		_ = b.bar.Finish()
	} else {
		_ = b.bar.Exit()
		fmt.Fprintln(b.W)
	}
}

// Spinner shows that the command is waiting, with what it waits for. On a
// terminal it spins; elsewhere (a log, a CI job) it prints each new state once.
type Spinner struct {
	bar  *progressbar.ProgressBar
	w    io.Writer
	last string
}

// IsTerminal says whether w is a character device, such as a terminal.
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// NewSpinner starts a spinner on w.
func NewSpinner(w io.Writer, what string) *Spinner {
	s := &Spinner{w: w}
	if !IsTerminal(w) {
		s.Describe(what)
		return s
	}
	s.bar = progressbar.NewOptions(-1,
		progressbar.OptionSetWriter(w),
		progressbar.OptionSetDescription(what),
		progressbar.OptionSpinnerType(14),
		progressbar.OptionSetElapsedTime(true),
		progressbar.OptionClearOnFinish(),
	)
	return s
}

// Describe changes the text and redraws.
func (s *Spinner) Describe(what string) {
	if s.bar == nil {
		if what != s.last {
			fmt.Fprintln(s.w, what)
			s.last = what
		}
		return
	}
	s.bar.Describe(what)
	_ = s.bar.Add(1)
}

// Stop removes the spinner.
func (s *Spinner) Stop() {
	if s.bar != nil {
		_ = s.bar.Finish()
	}
}
