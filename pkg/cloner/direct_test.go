package cloner

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// TestDirectWrites: a fresh file receives its large aligned runs through
// O_DIRECT (where the file system takes it) and the rest through the page
// cache, and reads back exactly, holes included; a stream whose runs are
// not aligned goes through the page cache alone, also exactly.
func TestDirectWrites(t *testing.T) {
	dir := tempDir(t)
	// 4 MiB: data, a 1 MiB hole, data ending in a short tail.
	want := make([]byte, 4<<20+1000)
	for i := range want {
		if i < 1<<20 || i >= 2<<20 {
			want[i] = byte(i*7 + 1)
		}
	}
	for _, c := range []struct {
		name   string
		shift  int64 // the data starts this far into the file
		direct bool
	}{{"aligned", 0, true}, {"unaligned", 1, false}} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(dir, c.name+".img")
			f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
			if err != nil {
				t.Fatal(err)
			}
			hw := newHoleWriter(f, path, true, 0)
			// The file: shift bytes of hole (so every write starts off a
			// 4 KiB boundary when shift is not a multiple of it), then want.
			body := append(make([]byte, c.shift), want...)
			if err := hw.hole(c.shift); err != nil {
				t.Fatal(err)
			}
			before := directBytes.Load()
			// 1 MiB writes, as the copier makes them.
			if _, err := newCopier().copy(hw, bytes.NewReader(want), int64(len(want))); err != nil {
				t.Fatal(err)
			}
			if err := closeSynced(f, hw, nil); err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, body) {
				t.Fatalf("%s reads back differently", path)
			}
			direct := directBytes.Load() - before
			if !c.direct && direct != 0 {
				t.Errorf("%d bytes of an unaligned stream went through O_DIRECT", direct)
			}
			if c.direct && !hw.noDirect && direct < 3<<20 {
				t.Errorf("only %d bytes of the aligned data went through O_DIRECT, want at least 3 MiB", direct)
			}
			t.Logf("%d bytes through O_DIRECT (file system refused it: %v), %d allocated", direct, hw.noDirect, allocated(t, path))
			if a := allocated(t, path); a > int64(len(body))-(1<<20)+64<<10 {
				t.Errorf("%d bytes allocated: the 1 MiB hole was written", a)
			}
		})
	}
}
