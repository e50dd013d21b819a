package datapath

import (
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
