package importer

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kubefill/kubefill/pkg/datapath"
)

// DestinationOptions works out where a transfer writes and how much it may
// write: the block device when it exists, else the image file (for archives,
// its directory), bounded by the requested size less the filesystem overhead
// and by the space the volume really has. The importer and the upload server
// both start from it and add their own source, checksum and progress.
func DestinationOptions(p Paths, ct datapath.ContentType, imageSize int64, overhead float64) (datapath.Options, error) {
	st, statErr := os.Stat(p.BlockPath)
	var mode os.FileMode
	if statErr == nil {
		mode = st.Mode()
	}
	dst := ChooseDestination(p, mode, statErr == nil)
	opt := datapath.Options{ContentType: ct, Path: dst.Path, Block: dst.Block, MemoryLimit: MemoryLimit(p.CgroupRoot)}
	if fi, err := os.Stat(p.ScratchDir); err == nil && fi.IsDir() {
		opt.ScratchDir = p.ScratchDir
	}
	if dst.Block {
		if ct == datapath.ContentArchive {
			return opt, errors.New("content type archive needs a Filesystem volume, not a Block one")
		}
		n, err := deviceSize(dst.Path)
		if err != nil {
			return opt, err
		}
		opt.Size = n
		if imageSize > 0 && imageSize < n {
			opt.Size = imageSize
		}
		return opt, nil
	}
	dir := filepath.Dir(dst.Path)
	if ct == datapath.ContentArchive {
		opt.Path = dir
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		return opt, fmt.Errorf("destination volume %s: %w", dir, err)
	}
	avail := int64(fs.Bavail) * int64(fs.Bsize)
	if fi, err := os.Stat(dst.Path); err == nil && ct != datapath.ContentArchive {
		avail += fi.Size() // an old image here is replaced
	}
	opt.Size = UsableSize(imageSize, avail, overhead)
	if opt.Size <= 0 {
		return opt, fmt.Errorf("destination volume %s has no usable space", dir)
	}
	return opt, nil
}

func deviceSize(p string) (int64, error) {
	f, err := os.Open(p)
	if err != nil {
		return 0, fmt.Errorf("opening block device: %w", err)
	}
	defer f.Close()
	n, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return 0, fmt.Errorf("sizing block device: %w", err)
	}
	return n, nil
}

// MemoryLimit is the pod's memory limit in bytes from its cgroup (v2
// memory.max, else v1 memory.limit_in_bytes under root), or 0 when there
// is none or it cannot be read.
func MemoryLimit(root string) int64 {
	if root == "" {
		return 0
	}
	for _, f := range []string{"memory.max", "memory/memory.limit_in_bytes"} {
		if b, err := os.ReadFile(filepath.Join(root, f)); err == nil {
			return ParseMemoryLimit(string(b))
		}
	}
	return 0
}

// ParseMemoryLimit reads a cgroup memory limit file's content: a number of
// bytes, or "max" (v2) or a page-rounded 2^63 (v1) for none, which give 0.
// It is pure.
func ParseMemoryLimit(s string) int64 {
	n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil || n <= 0 || n >= 1<<62 {
		return 0
	}
	return n
}
