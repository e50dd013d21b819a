package uploadserver

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/kubefill/kubefill/pkg/cloner"
	"github.com/kubefill/kubefill/pkg/contract"
)

// The target side of a host-assisted clone, as CDI's upload server has it:
// the clone source pod POSTs its stream to /v1beta1/upload (or the
// v1alpha1 alias) with x-cdi-content-type blockdevice-clone or
// filesystem-clone, over mutual TLS with the clone's client certificate,
// whose common name must be the server's ClientName
// (<srcNs>/<srcName>-<tgtNs>/<tgtName>). The stream goes through
// cloner.ReceiveStream into the volume: a Filesystem volume's directory
// (the directory of Paths.DataPath: a filesystem-clone is unpacked there, a
// blockdevice-clone becomes its disk.img) or the Block volume's device
// (Paths.BlockPath, when it is a device: a blockdevice-clone is copied raw,
// a filesystem-clone's disk.img is written to it). Once everything is
// fsynced the server answers 200 and exits with the termination message
// "Clone Complete" (", Preallocation applied" when preallocating).
//
// Refusals: 400 "async clone not supported" on the async paths, 400 for a
// clone content type on the form and archive paths or an unknown
// x-cdi-content-type, 401 for another client certificate, 403 when the
// server is not a clone target (its ClientName is not a clone's) and 403
// for an ordinary upload into a clone target, 413 for
// a stream larger than the destination, 400 for a hostile tar entry or a
// filesystem-clone without disk.img into a Block volume, 500 for a
// truncated or corrupt stream (the source pod may retry) or a failing
// volume. After a failure the server stays up for the next try.

// MessageCloneComplete is the termination message text of a successful
// clone, CDI's.
const MessageCloneComplete = cloner.MessageCloneComplete

// cloneTarget: the server's client is a clone (its name holds a "/", as
// <srcNs>/<srcName>-<tgtNs>/<tgtName> does and no other client name can).
func (s *Server) cloneTarget() bool { return strings.Contains(s.cfg.ClientName, "/") }

// cloneRequest returns the clone content type of a request ("" for an
// ordinary upload), or the reason and status of its refusal.
func (s *Server) cloneRequest(r *http.Request, m mode) (contentType, refusal string, code int) {
	ct := strings.TrimSpace(r.Header.Get(cloner.HeaderContentType))
	switch ct {
	case "":
		if s.cloneTarget() {
			return "", fmt.Sprintf("this upload server is the target of the clone %q: it takes only that clone's stream (%s %s or %s), not an upload",
				s.cfg.ClientName, cloner.HeaderContentType, cloner.ContentTypeBlock, cloner.ContentTypeFilesystem), http.StatusForbidden
		}
		return "", "", 0
	case cloner.ContentTypeBlock, cloner.ContentTypeFilesystem:
	default:
		return "", fmt.Sprintf("unknown %s %q (a clone stream is %s or %s)", cloner.HeaderContentType, ct, cloner.ContentTypeBlock, cloner.ContentTypeFilesystem), http.StatusBadRequest
	}
	switch {
	case m.async:
		return "", "async clone not supported", http.StatusBadRequest
	case m.form || m.archive:
		return "", fmt.Sprintf("a clone stream goes to %s, not %s", cloner.UploadPath, r.URL.Path), http.StatusBadRequest
	case !s.cloneTarget():
		return "", "this upload server is not the target of a clone (it was not started with the clone's --client-name <srcNs>/<srcName>-<tgtNs>/<tgtName>): the clone stream is refused", http.StatusForbidden
	}
	return ct, "", 0
}

// cloneDestination is where a clone stream goes: the Block volume's device
// when Paths.BlockPath is one, else the directory of Paths.DataPath.
// Capacity is left to ReceiveStream: the device's size, or the file
// system's (a disk.img larger than the whole volume is refused; the data
// of a tree is bounded by the free space).
func (s *Server) cloneDestination() (cloner.Destination, error) {
	p := s.cfg.Paths
	dst := cloner.Destination{Mode: cloner.Filesystem, Path: filepath.Dir(p.DataPath), Preallocate: s.cfg.Preallocation}
	if fi, err := os.Stat(p.BlockPath); err == nil && (fi.Mode()&os.ModeDevice != 0 || (fi.Mode().IsRegular() && (s.cfg.blockFile || !dirExists(dst.Path)))) {
		// A device, or a regular file where a Block volume is mapped while no
		// Filesystem volume is mounted (a node that presents Block volumes
		// as files, as the local test node does).
		dst.Mode, dst.Path = cloner.Block, p.BlockPath
		return dst, nil
	}
	fi, err := os.Stat(dst.Path)
	if err != nil {
		return dst, fmt.Errorf("the destination volume: %w", err)
	}
	if !fi.IsDir() {
		return dst, fmt.Errorf("the destination volume %s is not a directory", dst.Path)
	}
	return dst, nil
}

// handleClone receives one clone stream; the state is busy on entry.
func (s *Server) handleClone(w http.ResponseWriter, r *http.Request, contentType string) {
	// Progress is the share of the body read when its length is known
	// (the cloner sends it chunked: then 0 until done; the source pod
	// reports the clone's progress), never 100 before the data is synced.
	counted := &bodyProgress{r: r.Body, total: r.ContentLength, report: s.received}
	fail := func(err error, code int) {
		counted.stop()
		s.finish(outcome{}, err)
		s.log.Error(err, "clone failed", "remote", r.RemoteAddr, "contentType", contentType)
		refuseAfterRead(w, r, "clone failed: "+err.Error(), code)
	}
	dst, err := s.cloneDestination()
	if err != nil {
		fail(err, http.StatusInternalServerError)
		return
	}
	s.log.Info("clone started", "remote", r.RemoteAddr, "client", s.cfg.ClientName, "contentType", contentType,
		"destination", dst.Path, "mode", dst.Mode, "preallocate", dst.Preallocate, "contentLength", r.ContentLength)
	start := time.Now()
	n, err := cloner.ReceiveStream(r.Context(), counted, contentType, dst)
	if err == nil {
		// ReceiveStream reads the stream to its end; anything after it, or
		// a body that then fails, is not a clean end.
		var one [1]byte
		if k, rerr := io.ReadFull(counted, one[:]); k > 0 {
			err = fmt.Errorf("%w: data follows the end of the stream", cloner.ErrTruncated)
		} else if rerr != nil && !errors.Is(rerr, io.EOF) {
			err = fmt.Errorf("%w: %w", cloner.ErrTruncated, rerr)
		}
	}
	if err != nil {
		fail(err, cloneStatus(err))
		return
	}
	counted.stop()
	out := outcome{message: MessageCloneComplete, preallocated: s.cfg.Preallocation}
	if out.preallocated {
		out.message += ", " + contract.MessagePreallocationApplied
	}
	s.log.Info("clone complete", "contentType", contentType, "destination", dst.Path, "mode", dst.Mode,
		"bytes", n, "bodyBytes", counted.n.Load(), "seconds", time.Since(start).Seconds())
	s.finish(out, nil)
	_, _ = io.WriteString(w, "clone complete\n")
}

// cloneStatus maps a clone failure to its status, as pkg/cloner asks: the
// stream is at fault and retrying cannot help (4xx, which the source pod
// takes as permanent), or the stream was cut or the volume failed (5xx).
func cloneStatus(err error) int {
	switch {
	case errors.Is(err, cloner.ErrTooBig):
		return http.StatusRequestEntityTooLarge
	case errors.Is(err, cloner.ErrContentType), errors.Is(err, cloner.ErrUnsafe), errors.Is(err, cloner.ErrNoImage):
		return http.StatusBadRequest
	}
	return http.StatusInternalServerError
}

func dirExists(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.IsDir()
}
