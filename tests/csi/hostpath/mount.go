package hostpath

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"syscall"

	"github.com/kubefill/kubefill/tests/internal/mountinfo"
)

// isMountPoint reports whether path is a mount point in this process's mount
// namespace.
func isMountPoint(path string) (bool, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return false, err
	}
	if real, err := filepath.EvalSymlinks(abs); err == nil {
		abs = real
	}
	mounts, err := mountinfo.MountPoints()
	if err != nil {
		return false, err
	}
	return slices.Contains(mounts, abs), nil
}

// bindMount mounts src at target, read-only when asked, with extra
// per-mount flags (MS_NOSUID, ...). The kernel ignores flags on the first
// bind call: they need a second, remounting one.
func bindMount(src, target string, readOnly bool, flags uintptr) error {
	if err := syscall.Mount(src, target, "", syscall.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind-mount %s at %s: %w", src, target, err)
	}
	if readOnly {
		flags |= syscall.MS_RDONLY
	}
	if flags != 0 {
		if err := syscall.Mount("", target, "", syscall.MS_BIND|syscall.MS_REMOUNT|flags, ""); err != nil {
			_ = syscall.Unmount(target, syscall.MNT_DETACH)
			return fmt.Errorf("remount %s with flags %#x: %w", target, flags, err)
		}
	}
	return nil
}

// unmountAll unmounts target until it is no longer a mount point (a target
// may have been published twice over itself).
func unmountAll(target string) error {
	for i := 0; i < 10; i++ {
		mounted, err := isMountPoint(target)
		if err != nil {
			return err
		}
		if !mounted {
			return nil
		}
		if err := syscall.Unmount(target, 0); err != nil {
			if errors.Is(err, syscall.EBUSY) {
				err = syscall.Unmount(target, syscall.MNT_DETACH)
			}
			if err != nil && !errors.Is(err, syscall.EINVAL) {
				return fmt.Errorf("unmount %s: %w", target, err)
			}
		}
	}
	return fmt.Errorf("%s still mounted after 10 unmounts", target)
}
