package kit

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
)

// fixtureLocks serialises the builds of one fixture within a process
// (parallel tests); the lock file does it across processes.
var fixtureLocks sync.Map // dir → *sync.Mutex

// Fixture returns a directory under cacheRoot/fixtures holding what build
// wrote into it, built once and kept between runs as the binary caches
// are. The directory is named after name and a hash of recipe, which must
// describe everything the files depend on (sizes, patterns, the tools'
// versions): a changed recipe is a new directory, and the old one is left
// for whoever clears the cache. build writes into an empty directory; it
// is published whole (renamed into place, then marked complete) or not at
// all, so a reader never sees half of it. The files are shared: copy or
// link what a test changes.
func Fixture(t testing.TB, cacheRoot, name, recipe string, build func(dir string) error) string {
	t.Helper()
	sum := sha256.Sum256([]byte(recipe))
	dir := filepath.Join(cacheRoot, "fixtures", name+"-"+hex.EncodeToString(sum[:])[:12])
	complete := func() bool {
		_, err := os.Stat(filepath.Join(dir, ".complete"))
		return err == nil
	}
	if complete() {
		return dir
	}
	mu, _ := fixtureLocks.LoadOrStore(dir, &sync.Mutex{})
	mu.(*sync.Mutex).Lock()
	defer mu.(*sync.Mutex).Unlock()
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		t.Fatal(err)
	}
	lock, err := os.OpenFile(dir+".lock", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatalf("locking fixture %s: %v", dir, err)
	}
	defer func() { _ = syscall.Flock(int(lock.Fd()), syscall.LOCK_UN) }()
	if complete() {
		return dir
	}
	start := time.Now()
	tmp, err := os.MkdirTemp(filepath.Dir(dir), name+".tmp-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(tmp)
	if err := build(tmp); err != nil {
		t.Fatalf("building fixture %s: %v", name, err)
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, dir); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, ".complete"), []byte(recipe+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("fixture %s built in %s and kept in %s", name, time.Since(start).Round(time.Millisecond), dir)
	return dir
}

// CopyFile copies src to dst (mode 0644).
func CopyFile(t testing.TB, src, dst string) {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	_, err = io.Copy(out, in)
	if err = errors.Join(err, out.Close()); err != nil {
		t.Fatalf("copying %s to %s: %v", src, dst, err)
	}
}
