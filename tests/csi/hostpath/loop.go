package hostpath

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Loop devices give a Block volume's backing file a device node, which is
// what kubelet and the container runtime need at a published block path
// (containerd passes the node's major:minor to the container). The driver's
// image has no losetup, so this talks to the loop driver with ioctls.

const loopMajor = 7

// attachLoop binds file to a free loop device and returns its /dev path.
// The device is not auto-cleared: nothing keeps it open between
// NodePublishVolume and the pod's start (kubelet opens it later for its
// own lock), and an auto-clearing device would vanish as soon as this
// function closed it. detachLoop releases it.
func attachLoop(file string, readOnly bool) (string, error) {
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR, 0)
	if err != nil {
		return "", fmt.Errorf("open loop control: %w", err)
	}
	defer ctl.Close()
	flag := os.O_RDWR
	var loFlags uint32
	if readOnly {
		flag = os.O_RDONLY
		loFlags = unix.LO_FLAGS_READ_ONLY
	}
	backing, err := os.OpenFile(file, flag, 0)
	if err != nil {
		return "", fmt.Errorf("open backing file: %w", err)
	}
	defer backing.Close()
	var lastErr error
	// Another process (kubelet's losetup, a second publish) may take the
	// free device between GET_FREE and CONFIGURE: then ask again.
	for attempt := 0; attempt < 20; attempt++ {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return "", fmt.Errorf("find a free loop device: %w", err)
		}
		dev := fmt.Sprintf("/dev/loop%d", n)
		lo, err := openLoop(dev)
		if err != nil {
			return "", err
		}
		err = configureLoop(lo, backing, file, loFlags)
		lo.Close()
		if err == nil {
			return dev, nil
		}
		if !errors.Is(err, unix.EBUSY) {
			return "", fmt.Errorf("attach %s to %s: %w", file, dev, err)
		}
		lastErr = err
		time.Sleep(time.Duration(attempt+1) * 5 * time.Millisecond)
	}
	return "", fmt.Errorf("attach %s to a loop device: %w", file, lastErr)
}

// openLoop opens a loop device node, waiting briefly for devtmpfs to create
// a node that LOOP_CTL_GET_FREE has just added.
func openLoop(dev string) (*os.File, error) {
	for i := 0; ; i++ {
		f, err := os.OpenFile(dev, os.O_RDWR, 0)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, os.ErrNotExist) || i == 50 {
			return nil, fmt.Errorf("open %s: %w", dev, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func configureLoop(lo, backing *os.File, name string, flags uint32) error {
	cfg := unix.LoopConfig{Fd: uint32(backing.Fd())}
	cfg.Info.Flags = flags
	copy(cfg.Info.File_name[:len(cfg.Info.File_name)-1], name)
	err := unix.IoctlLoopConfigure(int(lo.Fd()), &cfg)
	if !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOTTY) {
		return err
	}
	// Kernels before 5.8 lack LOOP_CONFIGURE.
	if err := unix.IoctlSetInt(int(lo.Fd()), unix.LOOP_SET_FD, int(backing.Fd())); err != nil {
		return err
	}
	if err := unix.IoctlLoopSetStatus64(int(lo.Fd()), &cfg.Info); err != nil {
		_ = unix.IoctlSetInt(int(lo.Fd()), unix.LOOP_CLR_FD, 0)
		return fmt.Errorf("set loop status: %w", err)
	}
	return nil
}

// detachLoop releases a loop device. If something still holds it open (a
// pod, kubelet's lock device), the kernel detaches it on the last close.
func detachLoop(dev string) error {
	f, err := os.OpenFile(dev, os.O_RDONLY, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("open %s: %w", dev, err)
	}
	defer f.Close()
	if err := unix.IoctlSetInt(int(f.Fd()), unix.LOOP_CLR_FD, 0); err != nil && !errors.Is(err, unix.ENXIO) {
		return fmt.Errorf("detach %s: %w", dev, err)
	}
	return nil
}

// loopBackingFile is the file a loop device (/dev/loopN) is bound to, or ""
// when it is not bound.
func loopBackingFile(dev string) (string, error) {
	data, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev), "loop", "backing_file"))
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read backing file of %s: %w", dev, err)
	}
	// A deleted backing file reads as "<path> (deleted)".
	return strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(string(data)), "(deleted)")), nil
}

// loopsBackedBy lists the loop devices bound to file.
func loopsBackedBy(file string) ([]string, error) {
	want := file
	if real, err := filepath.EvalSymlinks(file); err == nil {
		want = real
	}
	devs, err := filepath.Glob("/sys/block/loop*")
	if err != nil {
		return nil, fmt.Errorf("list loop devices: %w", err)
	}
	var out []string
	for _, d := range devs {
		dev := "/dev/" + filepath.Base(d)
		b, err := loopBackingFile(dev)
		if err != nil {
			continue // detached meanwhile
		}
		if b != "" && (b == want || b == file) {
			out = append(out, dev)
		}
	}
	return out, nil
}

// loopDeviceAt tells which loop device the block device node at path is
// ("" when path is not a loop device node).
func loopDeviceAt(path string) (string, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return "", fmt.Errorf("stat %s: %w", path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFBLK || unix.Major(st.Rdev) != loopMajor {
		return "", nil
	}
	// The minor is the device number unless the loop module's max_part
	// shifted it: the sysfs link says for certain.
	link, err := os.Readlink(fmt.Sprintf("/sys/dev/block/%d:%d", unix.Major(st.Rdev), unix.Minor(st.Rdev)))
	if err != nil {
		return "", fmt.Errorf("find device %d:%d: %w", unix.Major(st.Rdev), unix.Minor(st.Rdev), err)
	}
	return "/dev/" + filepath.Base(link), nil
}

// refreshLoopCapacity makes a loop device pick up its backing file's new
// size after an expansion.
func refreshLoopCapacity(dev string) error {
	f, err := os.OpenFile(dev, os.O_RDONLY, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", dev, err)
	}
	defer f.Close()
	if err := unix.IoctlSetInt(int(f.Fd()), unix.LOOP_SET_CAPACITY, 0); err != nil {
		return fmt.Errorf("refresh capacity of %s: %w", dev, err)
	}
	return nil
}

// flushLoop writes a loop device's dirty cached blocks through to its
// backing file, so that a copy of the file (snapshot, clone) sees what a
// pod wrote through the device.
func flushLoop(dev string) error {
	f, err := os.OpenFile(dev, os.O_RDONLY, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", dev, err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("flush %s: %w", dev, err)
	}
	return nil
}

// blockDeviceSize is a block device's size in bytes.
func blockDeviceSize(dev string) (int64, error) {
	f, err := os.Open(dev)
	if err != nil {
		return 0, fmt.Errorf("open %s: %w", dev, err)
	}
	defer f.Close()
	// Seeking to the end of a block device gives its size, as BLKGETSIZE64.
	size, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return 0, fmt.Errorf("size of %s: %w", dev, err)
	}
	return size, nil
}
