package nodeagent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
)

// InitSpec tells pod-init how to build a container's root and what to run.
// The agent writes it as JSON; pod-init runs inside the pod's network
// namespace (via `ip netns exec`, which also gives it a mount namespace of its
// own).
type InitSpec struct {
	// Root is an empty host directory; pod-init mounts a tmpfs on it in its
	// own mount namespace and builds the container's filesystem there.
	Root string `json:"root"`
	// Mounts are bind mounts into the root, in order.
	Mounts []InitMount `json:"mounts"`
	// Argv is the command line; Argv[0] is looked up in PATH when it has no
	// slash.
	Argv       []string `json:"argv"`
	Env        []string `json:"env"`
	WorkingDir string   `json:"workingDir,omitempty"`
	// Hostname is set in the container's UTS namespace (the agent starts
	// pod-init in a new one).
	Hostname string `json:"hostname,omitempty"`
	// Identity is the user and groups the command runs as.
	Identity identity `json:"identity"`
}

// InitMount is one bind mount into a container's root.
type InitMount struct {
	Source   string `json:"source"`
	Target   string `json:"target"`
	ReadOnly bool   `json:"readOnly,omitempty"`
	// File is set when Source is a file (block volume, termination log, a
	// generated /etc file, an image binary).
	File bool `json:"file,omitempty"`
}

// hostDirs are the host's top-level directories a container sees read-only:
// they provide the shell, coreutils and libraries. /etc is handled apart so
// that volumes can be mounted below it.
var hostDirs = []string{"bin", "sbin", "lib", "lib32", "lib64", "libx32", "usr", "opt"}

// defaultPath is the container's PATH when its env sets none.
const defaultPath = imageBinDir + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// RunPodInit reads a spec, builds the root and execs the container's
// command. It only returns on error.
func RunPodInit(specFile string) error {
	data, err := os.ReadFile(specFile)
	if err != nil {
		return fmt.Errorf("read spec: %w", err)
	}
	var spec InitSpec
	if err := json.Unmarshal(data, &spec); err != nil {
		return fmt.Errorf("parse spec: %w", err)
	}
	if spec.Hostname != "" {
		if err := syscall.Sethostname([]byte(spec.Hostname)); err != nil {
			return fmt.Errorf("set hostname: %w", err)
		}
	}
	if err := buildRoot(&spec); err != nil {
		return err
	}
	env := spec.Env
	if !hasEnv(env, "PATH") {
		env = append(env, "PATH="+defaultPath)
	}
	if !hasEnv(env, "HOME") {
		env = append(env, "HOME=/root")
	}
	argv0 := spec.Argv[0]
	if !strings.Contains(argv0, "/") {
		p, err := lookPath(argv0, envValue(env, "PATH"))
		if err != nil {
			return err
		}
		argv0 = p
	}
	id := spec.Identity
	groups := make([]int, 0, len(id.Groups))
	for _, g := range id.Groups {
		groups = append(groups, int(g))
	}
	if err := syscall.Setgroups(groups); err != nil {
		return fmt.Errorf("set supplementary groups %v: %w", groups, err)
	}
	if err := syscall.Setgid(int(id.GID)); err != nil {
		return fmt.Errorf("set gid %d: %w", id.GID, err)
	}
	if err := syscall.Setuid(int(id.UID)); err != nil {
		return fmt.Errorf("set uid %d: %w", id.UID, err)
	}
	if err := syscall.Exec(argv0, spec.Argv, env); err != nil {
		return fmt.Errorf("exec %s: %w", argv0, err)
	}
	return nil
}

func hasEnv(env []string, key string) bool {
	for _, kv := range env {
		if strings.HasPrefix(kv, key+"=") {
			return true
		}
	}
	return false
}

func envValue(env []string, key string) string {
	for i := len(env) - 1; i >= 0; i-- {
		if v, ok := strings.CutPrefix(env[i], key+"="); ok {
			return v
		}
	}
	return ""
}

func lookPath(name, path string) (string, error) {
	for _, dir := range filepath.SplitList(path) {
		p := filepath.Join(dir, name)
		if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("executable %q not found in PATH %q", name, path)
}

func mount(src, target, fstype string, flags uintptr, data string) error {
	if err := syscall.Mount(src, target, fstype, flags, data); err != nil {
		return fmt.Errorf("mount %s on %s (%s): %w", src, target, fstype, err)
	}
	return nil
}

func bind(src, target string, readOnly bool) error {
	if err := mount(src, target, "", syscall.MS_BIND|syscall.MS_REC, ""); err != nil {
		return err
	}
	if readOnly {
		return mount("", target, "", syscall.MS_BIND|syscall.MS_REMOUNT|syscall.MS_RDONLY, "")
	}
	return nil
}

// ensureTarget creates a mount point for a file or a directory.
func ensureTarget(path string, file bool) error {
	if file {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		f, err := os.OpenFile(path, os.O_CREATE|os.O_RDONLY, 0o644)
		if err != nil {
			return err
		}
		return f.Close()
	}
	return os.MkdirAll(path, 0o755)
}

// buildRoot makes the container's filesystem and pivots into it:
//
//	/            tmpfs (so mountPaths anywhere outside the host dirs can be made)
//	/bin /usr... the host's, read-only
//	/etc         tmpfs with each host entry bound read-only, plus the pod's
//	             hosts, hostname and resolv.conf
//	/proc /sys   fresh proc, the namespace's sysfs
//	/dev         tmpfs with null, zero, full, random, urandom, tty and shm
//	/tmp         world-writable
//	then the volumes, the image binaries and the termination log.
func buildRoot(spec *InitSpec) error {
	r := spec.Root
	// Nothing we mount may leak back to the host.
	if err := mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, ""); err != nil {
		return err
	}
	if err := mount("tmpfs", r, "tmpfs", 0, "mode=755"); err != nil {
		return err
	}
	for _, d := range hostDirs {
		host := "/" + d
		st, err := os.Lstat(host)
		if err != nil {
			continue
		}
		if st.Mode()&os.ModeSymlink != 0 {
			link, err := os.Readlink(host)
			if err != nil {
				return err
			}
			if err := os.Symlink(link, filepath.Join(r, d)); err != nil {
				return err
			}
			continue
		}
		if err := os.Mkdir(filepath.Join(r, d), 0o755); err != nil {
			return err
		}
		if err := bind(host, filepath.Join(r, d), true); err != nil {
			return err
		}
	}
	if err := buildEtc(r); err != nil {
		return err
	}
	for _, d := range []string{"proc", "sys", "dev", "tmp", "run", "var/tmp", "root", "home"} {
		if err := os.MkdirAll(filepath.Join(r, d), 0o755); err != nil {
			return err
		}
	}
	for _, d := range []string{"tmp", "var/tmp"} {
		if err := os.Chmod(filepath.Join(r, d), 0o1777); err != nil {
			return err
		}
	}
	if err := mount("proc", filepath.Join(r, "proc"), "proc", syscall.MS_NOSUID|syscall.MS_NODEV|syscall.MS_NOEXEC, ""); err != nil {
		return err
	}
	if err := bind("/sys", filepath.Join(r, "sys"), true); err != nil {
		return err
	}
	if err := buildDev(filepath.Join(r, "dev")); err != nil {
		return err
	}
	for _, m := range spec.Mounts {
		target := filepath.Join(r, filepath.Clean("/"+m.Target))
		if err := ensureTarget(target, m.File); err != nil {
			return fmt.Errorf("make mount point %s: %w (a mount below the host's read-only /bin, /lib, /usr or /opt cannot be made)", m.Target, err)
		}
		if err := bind(m.Source, target, m.ReadOnly); err != nil {
			return err
		}
	}
	old := filepath.Join(r, ".oldroot")
	if err := os.Mkdir(old, 0o700); err != nil {
		return err
	}
	if err := syscall.PivotRoot(r, old); err != nil {
		return fmt.Errorf("pivot_root to %s: %w", r, err)
	}
	if err := os.Chdir("/"); err != nil {
		return err
	}
	if err := syscall.Unmount("/.oldroot", syscall.MNT_DETACH); err != nil {
		return fmt.Errorf("detach old root: %w", err)
	}
	if err := os.Remove("/.oldroot"); err != nil {
		return err
	}
	wd := spec.WorkingDir
	if wd == "" {
		wd = "/"
	}
	if err := os.MkdirAll(wd, 0o755); err != nil {
		return fmt.Errorf("working dir %s: %w", wd, err)
	}
	return os.Chdir(wd)
}

// buildEtc mounts a tmpfs on /etc and binds each of the host's entries into
// it read-only, so that the container gets the host's users, certificates
// and so on, and volumes may still be mounted at new paths below /etc.
func buildEtc(root string) error {
	etc := filepath.Join(root, "etc")
	if err := os.Mkdir(etc, 0o755); err != nil {
		return err
	}
	entries, err := os.ReadDir("/etc")
	if err != nil {
		return err
	}
	for _, e := range entries {
		name := e.Name()
		if name == "hosts" || name == "hostname" || name == "resolv.conf" || name == "mtab" {
			continue
		}
		src := filepath.Join("/etc", name)
		dst := filepath.Join(etc, name)
		if e.Type()&os.ModeSymlink != 0 {
			link, err := os.Readlink(src)
			if err != nil {
				return err
			}
			if err := os.Symlink(link, dst); err != nil {
				return err
			}
			continue
		}
		isFile := !e.IsDir()
		if !e.IsDir() && !e.Type().IsRegular() {
			continue
		}
		if err := ensureTarget(dst, isFile); err != nil {
			return err
		}
		if err := bind(src, dst, true); err != nil {
			return err
		}
	}
	return os.Symlink("/proc/self/mounts", filepath.Join(etc, "mtab"))
}

// buildDev makes a minimal /dev.
func buildDev(dev string) error {
	if err := mount("tmpfs", dev, "tmpfs", syscall.MS_NOSUID, "mode=755"); err != nil {
		return err
	}
	for _, n := range []string{"null", "zero", "full", "random", "urandom", "tty"} {
		target := filepath.Join(dev, n)
		if err := ensureTarget(target, true); err != nil {
			return err
		}
		if err := bind("/dev/"+n, target, false); err != nil {
			return err
		}
	}
	shm := filepath.Join(dev, "shm")
	if err := os.Mkdir(shm, 0o1777); err != nil {
		return err
	}
	if err := mount("shm", shm, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, "mode=1777"); err != nil {
		return err
	}
	for name, target := range map[string]string{"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2"} {
		if err := os.Symlink(target, filepath.Join(dev, name)); err != nil && !errors.Is(err, os.ErrExist) {
			return err
		}
	}
	return nil
}

// execProbe runs a probe command inside a running container's namespaces
// and root (nsenter joins its mount and network namespaces).
func execProbe(ctx context.Context, pid int, argv []string, env []string) *exec.Cmd {
	args := []string{"--target", fmt.Sprint(pid), "--mount", "--net", "--root", "--wd", "--"}
	args = append(args, argv...)
	cmd := exec.CommandContext(ctx, "nsenter", args...)
	cmd.Env = env
	return cmd
}
