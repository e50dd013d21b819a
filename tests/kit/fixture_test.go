package kit

import (
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
)

func TestFixtureBuiltOnce(t *testing.T) {
	root := t.TempDir()
	var builds atomic.Int32
	build := func(dir string) error {
		builds.Add(1)
		return os.WriteFile(filepath.Join(dir, "disk.img"), []byte("bytes"), 0o644)
	}
	var wg sync.WaitGroup
	dirs := make([]string, 8)
	for i := range dirs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dirs[i] = Fixture(t, root, "disk", "recipe v1", build)
		}()
	}
	wg.Wait()
	if n := builds.Load(); n != 1 {
		t.Fatalf("built %d times by 8 callers, want once", n)
	}
	for _, d := range dirs {
		if d != dirs[0] {
			t.Fatalf("callers got %s and %s", dirs[0], d)
		}
	}
	if b, err := os.ReadFile(filepath.Join(dirs[0], "disk.img")); err != nil || string(b) != "bytes" {
		t.Fatalf("fixture file: %q, %v", b, err)
	}
	// Kept between runs: a later call finds it.
	if again := Fixture(t, root, "disk", "recipe v1", build); again != dirs[0] || builds.Load() != 1 {
		t.Errorf("a second call built again or moved: %s, %d builds", again, builds.Load())
	}
	// A changed recipe is another fixture.
	if other := Fixture(t, root, "disk", "recipe v2", build); other == dirs[0] || builds.Load() != 2 {
		t.Errorf("a changed recipe gave %s after %d builds", other, builds.Load())
	}
	left, _ := filepath.Glob(filepath.Join(root, "fixtures", "*.tmp-*"))
	if len(left) > 0 {
		t.Errorf("build directories left: %v", left)
	}
}

func TestCopyFile(t *testing.T) {
	dir := t.TempDir()
	src, dst := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	if err := os.WriteFile(src, []byte("payload"), 0o600); err != nil {
		t.Fatal(err)
	}
	CopyFile(t, src, dst)
	if b, err := os.ReadFile(dst); err != nil || string(b) != "payload" {
		t.Fatalf("copy holds %q, %v", b, err)
	}
}
