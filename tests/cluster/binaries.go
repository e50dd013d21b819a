package cluster

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
)

const modulePath = "github.com/kubefill/kubefill"

// RepoRoot finds the checkout this code runs from: the first directory at or
// above the working directory whose go.mod declares the Kubefill module.
// KUBEFILL_REPO overrides it.
func RepoRoot() (string, error) {
	if r := os.Getenv("KUBEFILL_REPO"); r != "" {
		return r, nil
	}
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && strings.HasPrefix(strings.TrimSpace(string(data)), "module "+modulePath+"\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no checkout of %s at or above the working directory (set KUBEFILL_REPO)", modulePath)
		}
		dir = parent
	}
}

// CacheDir is where built binaries are kept between runs, outside the work tree.
func CacheDir() string {
	if d := os.Getenv("KUBEFILL_CACHE"); d != "" {
		return d
	}
	if d := os.Getenv("XDG_CACHE_HOME"); d != "" {
		return filepath.Join(d, "kubefill")
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return filepath.Join(os.TempDir(), "kubefill-cache")
	}
	return filepath.Join(home, ".cache", "kubefill")
}

// scriptDir runs one of the repo's build scripts (which print the directory
// holding their binaries, building them first when they are not cached), or
// returns the directory from env when that is set.
func scriptDir(repo, script, env string) (string, error) {
	if d := os.Getenv(env); d != "" {
		return d, nil
	}
	cmd := exec.Command("bash", filepath.Join(repo, "hack", script))
	cmd.Dir = repo
	var stdout, stderr bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("hack/%s: %w\n%s", script, err, tail(stderr.String(), 30))
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	dir := strings.TrimSpace(lines[len(lines)-1])
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return "", fmt.Errorf("hack/%s printed %q, which is not a directory", script, dir)
	}
	return dir, nil
}

// DevBinaryPath is where the harness builds a binary of this checkout
// ("kubefill", "kubefill-dev").
func DevBinaryPath(name string) string { return filepath.Join(CacheDir(), "dev", name) }

// goBuild builds a package of this checkout into the cache. `go build` skips
// the link when the existing output already has the build ID of the current
// sources, so this is cached by content; a lock keeps concurrent test
// packages from writing the same file at once.
func goBuild(repo, pkg, name string) (string, error) {
	dir := filepath.Join(CacheDir(), "dev")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("create %s: %w", dir, err)
	}
	lock, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", fmt.Errorf("open build lock: %w", err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", fmt.Errorf("take build lock: %w", err)
	}
	defer func() { _ = syscall.Flock(int(lock.Fd()), syscall.LOCK_UN) }()

	out := DevBinaryPath(name)
	cmd := exec.Command("go", "build", "-o", out, pkg)
	cmd.Dir = repo
	cmd.Env = append(os.Environ(), "GOTOOLCHAIN=local")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s: %w\n%s", pkg, err, tail(string(b), 40))
	}
	return out, nil
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// VirtctlBinary returns KubeVirt's own virtctl, to check that Kubefill works
// with it unchanged: the path in KUBEFILL_VIRTCTL when set (hack/test.sh sets
// it), else the one hack/virtctl.sh builds from the Go module proxy and
// caches by version (minutes the first time, instant afterwards).
func VirtctlBinary() (string, error) {
	path := os.Getenv("KUBEFILL_VIRTCTL")
	if path == "" {
		repo, err := RepoRoot()
		if err != nil {
			return "", err
		}
		dir, err := scriptDir(repo, "virtctl.sh", "")
		if err != nil {
			return "", fmt.Errorf("building virtctl (or set KUBEFILL_VIRTCTL=<path to virtctl>): %w", err)
		}
		path = filepath.Join(dir, "virtctl")
	}
	if st, err := os.Stat(path); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
		return "", fmt.Errorf("virtctl %q is not an executable file (KUBEFILL_VIRTCTL, or hack/virtctl.sh's output)", path)
	}
	return path, nil
}
