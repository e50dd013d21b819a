package uploadcli

import (
	"fmt"
	"io"
	"os"
	"time"

	"github.com/schollz/progressbar/v3"
)

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
