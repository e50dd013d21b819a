// Package cloner is the data path of a host-assisted clone: the source pod
// (`kubefill cloner`) reads a volume read-only and writes it as CDI's clone
// stream (WriteStream), and the target's upload server turns that stream
// back into a volume (ReceiveStream). It has no Kubernetes client.
//
// The stream is CDI's: the HTTP body is snappy-framed (the framing format
// with CRC-32C per chunk, chunks of at most 64 KiB, readable by golang/snappy
// and by klauspost's s2). By default only blocks that shrink 8× or more
// (zeros, mostly-empty blocks) are compressed and the others travel as raw
// snappy chunks, which every snappy reader accepts: see Compression. It
// holds, by content type:
//
//   - filesystem-clone: a tar of every top-level entry of the volume except
//     lost+found. Regular files with holes are PAX sparse entries, format
//     1.0 (the records GNU.sparse.major=1, GNU.sparse.minor=0,
//     GNU.sparse.name and GNU.sparse.realsize, then a sparse map at the start
//     of the entry's data), as `tar -S --format=posix` writes them: only the
//     data extents found by SEEK_DATA/SEEK_HOLE travel. GNU tar, Go's
//     archive/tar and CDI's upload server (which runs tar) read it.
//   - blockdevice-clone: the raw bytes of the device. The format has no way
//     to say "hole", so zeros travel too, but compressed (snappy turns a
//     64 KiB chunk of zeros into about 3 KiB); the receiver skips them again.
//     An extent-aware block format would need a content type of its own,
//     which a CDI upload server would refuse; ReceiveStream dispatches on the
//     content type so one can be added.
//
// On the receiving side every all-zero 4 KiB block becomes a hole again: on
// a fresh file by not writing it, on a device (or an existing file standing
// in for one) by punching it (FALLOC_FL_PUNCH_HOLE, which reads back as
// zeros), or by writing zeros where punching is not supported. A fresh
// file's large aligned runs are written with O_DIRECT, past the page cache
// (see holeWriter.writeDirect). The holes of a PAX sparse 1.0 entry are
// not even made: its data fragments are copied to their offsets (see
// tarfast.go), so a 20 GiB disk.img holding 1 GiB costs what a 2 GiB one
// does. Other tar formats (CDI's `tar -S` writes old GNU sparse headers)
// go through archive/tar, which reads holes as zeros.
package cloner

import (
	"fmt"
	"github.com/kubefill/kubefill/pkg/contract"
	"strings"
)

// Content types of the clone stream, the x-cdi-content-type header values.
const (
	ContentTypeFilesystem = "filesystem-clone"
	ContentTypeBlock      = "blockdevice-clone"
)

// The request that carries the stream.
const (
	// UploadPath is the upload server's path for a synchronous upload.
	UploadPath = contract.CloneUploadPath
	// HeaderContentType names the clone stream's content type.
	HeaderContentType = "x-cdi-content-type"
)

// Paths and names of the source pod, as CDI has them.
const (
	// SourceMountPoint is where a Filesystem source is mounted read-only.
	SourceMountPoint = contract.CloneSourceMountPoint
	// ImageName is a Filesystem volume's disk image.
	ImageName = "disk.img"
	// lostFound is left out of a filesystem-clone stream.
	lostFound = "lost+found"
)

// MessageCloneComplete is the source pod's termination message text on
// success, as CDI's cloner writes it.
const MessageCloneComplete = contract.MessageCloneComplete

// Environment of the source pod (pkg/contract; CDI's names, plus
// UPLOAD_SERVER_NAME).
const (
	EnvVolumeMode       = contract.EnvCloneVolumeMode
	EnvMountPoint       = contract.EnvCloneMountPoint
	EnvUploadURL        = contract.EnvCloneUploadURL
	EnvUploadServerName = contract.EnvCloneUploadServer
	// EnvUploadAddressFile names a file that may hold the upload pod's own
	// address (see contract.CloneUploadAddressFile).
	EnvUploadAddressFile = contract.EnvCloneUploadAddressFile
	EnvOwnerUID          = contract.EnvCloneOwnerUID
	EnvPreallocation     = contract.EnvClonePreallocation
	EnvServerCACert      = contract.EnvCloneServerCACert
	EnvClientCert        = contract.EnvCloneClientCert
	EnvClientKey         = contract.EnvCloneClientKey
)

// Mode is a volume mode.
type Mode string

// Volume modes.
const (
	Filesystem Mode = "Filesystem"
	Block      Mode = "Block"
)

// ParseMode reads a volume mode as CDI's controller writes VOLUME_MODE
// ("block", "filesystem") or as Kubernetes spells it; empty is Filesystem.
func ParseMode(s string) (Mode, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "filesystem":
		return Filesystem, nil
	case "block":
		return Block, nil
	}
	return "", fmt.Errorf("unknown volume mode %q (want block or filesystem)", s)
}

// ContentTypeFor is the stream's content type for a source of mode m.
func ContentTypeFor(m Mode) string {
	if m == Block {
		return ContentTypeBlock
	}
	return ContentTypeFilesystem
}
