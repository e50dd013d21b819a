package uploadcli

import (
	"fmt"
	"io"
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

// Spinner shows that the command is waiting, with what it waits for.
type Spinner struct {
	bar *progressbar.ProgressBar
}

// NewSpinner starts a spinner on w.
func NewSpinner(w io.Writer, what string) *Spinner {
	return &Spinner{bar: progressbar.NewOptions(-1,
		progressbar.OptionSetWriter(w),
		progressbar.OptionSetDescription(what),
		progressbar.OptionSpinnerType(14),
		progressbar.OptionSetElapsedTime(true),
		progressbar.OptionClearOnFinish(),
	)}
}

// Describe changes the text and redraws.
func (s *Spinner) Describe(what string) {
	s.bar.Describe(what)
	_ = s.bar.Add(1)
}

// Stop removes the spinner.
func (s *Spinner) Stop() { _ = s.bar.Finish() }
