package datapath

import (
	"bytes"
	"os"
	"syscall"
	"testing"
)

type syscallStat = syscall.Stat_t

// allocated returns the bytes a file occupies on disk.
func allocated(t *testing.T, p string) int64 {
	t.Helper()
	st, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return st.Sys().(*syscall.Stat_t).Blocks * 512
}

type nopCloser struct{ *bytes.Reader }

func (nopCloser) Close() error { return nil }
