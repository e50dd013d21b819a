package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/kubefill/kubefill/pkg/datapath/testimg"
	"github.com/kubefill/kubefill/tests/cluster"
	"github.com/kubefill/kubefill/tests/kit"
)

// The images tests import are built once and kept in the cache directory
// (kit.Fixture), keyed by a hash of their recipe: what each build function
// does, with the version of qemu-img and gzip that does it. Change a
// build function and its recipe together (the recipe's v number at least).

var qemuImgVersion = sync.OnceValue(func() string { return toolVersion("qemu-img", "--version") })

var gzipVersion = sync.OnceValue(func() string { return toolVersion("gzip", "--version") })

// toolVersion is the first line a tool prints for its version.
func toolVersion(tool string, args ...string) string {
	out, err := exec.Command(tool, args...).CombinedOutput()
	if err != nil {
		return tool + " (unknown version)"
	}
	first, _, _ := strings.Cut(string(out), "\n")
	return first
}

// testImage writes a compressed qcow2 with scattered data into dir and
// returns its name, its virtual size and the sha256 of its raw contents as
// qemu-img converts them.
func testImage(t *testing.T, dir string) (name string, virtualSize int64, rawSHA string) {
	t.Helper()
	const size = 64 << 20
	recipe := fmt.Sprintf("testImage v1: raw %d bytes, 1 MiB at 0, 5, 17, 40 MiB and the end of byte((j*7+i*131)^(j>>9)); "+
		"qemu-img convert -f raw -O qcow2 -c; expected.sha256 of qemu-img convert -f qcow2 -O raw; %s", size, qemuImgVersion())
	cached := kit.Fixture(t, cluster.CacheDir(), "e2e-qcow2", recipe, func(dir string) error {
		raw := filepath.Join(dir, "src.raw")
		f, err := os.Create(raw)
		if err != nil {
			return err
		}
		if err := f.Truncate(size); err != nil {
			return err
		}
		chunk := make([]byte, 1<<20)
		for i, off := range []int64{0, 5 << 20, 17 << 20, 40 << 20, size - 1<<20} {
			for j := range chunk {
				chunk[j] = byte((j*7 + i*131) ^ (j >> 9))
			}
			if _, err := f.WriteAt(chunk, off); err != nil {
				return err
			}
		}
		if err := f.Close(); err != nil {
			return err
		}
		qcow := filepath.Join(dir, "disk.qcow2")
		testimg.QemuImg(t, "convert", "-f", "raw", "-O", "qcow2", "-c", raw, qcow)
		expected := filepath.Join(dir, "expected.raw")
		testimg.QemuImg(t, "convert", "-f", "qcow2", "-O", "raw", qcow, expected)
		if err := os.WriteFile(filepath.Join(dir, "expected.sha256"), []byte(testimg.FileSHA256(t, expected)), 0o644); err != nil {
			return err
		}
		return removeAll(raw, expected)
	})
	kit.CopyFile(t, filepath.Join(cached, "disk.qcow2"), filepath.Join(dir, "disk.qcow2"))
	return "disk.qcow2", size, readSHA(t, cached, "expected.sha256")
}

// bigImages is a directory holding disk.qcow2 (zlib-compressed) and
// disk.raw.gz, both of the same 2 GiB raw with data in every block
// (patternedRaw), and the sha256 of that raw. Shared: serve it, do not
// write into it.
func bigImages(t *testing.T) (dir, rawSHA string) {
	t.Helper()
	recipe := fmt.Sprintf("bigImages v1: patternedRaw 2 GiB (each 4 KiB block one byte, b/4096%%255+1); "+
		"qemu-img convert -W -m 4 -f raw -O qcow2 -c; gzip -1; raw.sha256; %s; %s", qemuImgVersion(), gzipVersion())
	dir = kit.Fixture(t, cluster.CacheDir(), "e2e-2gib", recipe, func(dir string) error {
		raw := patternedRaw(t, dir, 2<<30)
		if err := os.WriteFile(filepath.Join(dir, "raw.sha256"), []byte(testimg.FileSHA256(t, raw)), 0o644); err != nil {
			return err
		}
		// -W -m 4: the clusters compress on both cores.
		testimg.QemuImg(t, "convert", "-W", "-m", "4", "-f", "raw", "-O", "qcow2", "-c", raw, filepath.Join(dir, "disk.qcow2"))
		gz := exec.Command("sh", "-c", fmt.Sprintf("gzip -1 -c %s > %s", raw, filepath.Join(dir, "disk.raw.gz")))
		if out, err := gz.CombinedOutput(); err != nil {
			return fmt.Errorf("gzip: %v: %s", err, out)
		}
		return os.Remove(raw)
	})
	return dir, readSHA(t, dir, "raw.sha256")
}

func readSHA(t *testing.T, dir, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	if sum := strings.TrimSpace(string(b)); len(sum) == 64 {
		return sum
	}
	t.Fatalf("%s in %s holds %q, not a sha256", name, dir, b)
	return ""
}

func removeAll(paths ...string) error {
	for _, p := range paths {
		if err := os.Remove(p); err != nil {
			return err
		}
	}
	return nil
}
