package sink

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

func ioctlRange(fd int, req uint, r *[2]uint64) error {
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), uintptr(req), uintptr(unsafe.Pointer(r)))
	if errno != 0 {
		return errno
	}
	return nil
}
