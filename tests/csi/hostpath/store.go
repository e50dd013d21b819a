// Package hostpath is a small CSI driver for the local test cluster. It keeps
// each volume as a directory (Filesystem) or a sparse file (Block) under a
// data directory, snapshots as copies, and publishes volumes with bind mounts.
//
// It is test infrastructure: the product binary never links it.
package hostpath

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// volume is the metadata the driver keeps for a volume.
type volume struct {
	ID            string            `json:"id"`
	Name          string            `json:"name"`
	CapacityBytes int64             `json:"capacityBytes"`
	Block         bool              `json:"block"`
	FromSnapshot  string            `json:"fromSnapshot,omitempty"`
	FromVolume    string            `json:"fromVolume,omitempty"`
	Parameters    map[string]string `json:"parameters,omitempty"`
}

// publication is one NodePublishVolume the node side made.
type publication struct {
	ReadOnly bool `json:"readOnly"`
	// Device is the loop device a Block volume was published through ("" for
	// Filesystem volumes and for Block volumes published as a file).
	Device string `json:"device,omitempty"`
}

// snapshot is the metadata the driver keeps for a snapshot.
type snapshot struct {
	ID             string    `json:"id"`
	Name           string    `json:"name"`
	SourceVolumeID string    `json:"sourceVolumeId"`
	SizeBytes      int64     `json:"sizeBytes"`
	Block          bool      `json:"block"`
	CreationTime   time.Time `json:"creationTime"`
}

// store lays out volumes and snapshots under a data directory:
//
//	volumes/<id>.json      metadata
//	volumes/<id>/          a Filesystem volume's files
//	volumes/<id>.img       a Block volume's bytes
//	snapshots/<id>.json    metadata
//	snapshots/<id>/ or snapshots/<id>.img   the copied content
//	published/<volume id>.json   the node side's publications of a volume
//
// It does no locking; the driver serialises calls. A controller-mode and a
// node-mode process may share the directory: each file has one writer (the
// controller writes volumes/ and snapshots/, the node writes published/),
// every write is a rename of a complete file, and the other side only reads.
type store struct {
	dir string
}

func newStore(dir string) (*store, error) {
	for _, sub := range []string{"volumes", "snapshots", "published"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			return nil, fmt.Errorf("create %s dir: %w", sub, err)
		}
	}
	return &store{dir: dir}, nil
}

// idFor derives a stable id from a CO-chosen name, so that a retried create
// after a crash finds the same object.
func idFor(prefix, name string) string {
	sum := sha256.Sum256([]byte(name))
	return prefix + hex.EncodeToString(sum[:12])
}

func (s *store) volMeta(id string) string  { return filepath.Join(s.dir, "volumes", id+".json") }
func (s *store) snapMeta(id string) string { return filepath.Join(s.dir, "snapshots", id+".json") }
func (s *store) pubMeta(id string) string  { return filepath.Join(s.dir, "published", id+".json") }

// volData is where a volume's content lives.
func (s *store) volData(v *volume) string {
	if v.Block {
		return filepath.Join(s.dir, "volumes", v.ID+".img")
	}
	return filepath.Join(s.dir, "volumes", v.ID)
}

func (s *store) snapData(sn *snapshot) string {
	if sn.Block {
		return filepath.Join(s.dir, "snapshots", sn.ID+".img")
	}
	return filepath.Join(s.dir, "snapshots", sn.ID)
}

// validID keeps ids from naming paths outside the data directory.
func validID(id string) bool {
	return id != "" && !strings.ContainsAny(id, "/\\") && id != "." && id != ".."
}

func readJSON[T any](path string) (*T, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var v T
	if err := json.Unmarshal(data, &v); err != nil {
		return nil, fmt.Errorf("parse %s: %w", path, err)
	}
	return &v, nil
}

func writeJSON(path string, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// getVolume returns the volume or nil when there is none.
func (s *store) getVolume(id string) (*volume, error) {
	if !validID(id) {
		return nil, nil
	}
	v, err := readJSON[volume](s.volMeta(id))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	return v, err
}

func (s *store) getSnapshot(id string) (*snapshot, error) {
	if !validID(id) {
		return nil, nil
	}
	sn, err := readJSON[snapshot](s.snapMeta(id))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	return sn, err
}

func (s *store) saveVolume(v *volume) error      { return writeJSON(s.volMeta(v.ID), v) }
func (s *store) saveSnapshot(sn *snapshot) error { return writeJSON(s.snapMeta(sn.ID), sn) }

// publications maps a volume's target paths to their publications.
func (s *store) publications(id string) (map[string]publication, error) {
	if !validID(id) {
		return nil, nil
	}
	p, err := readJSON[map[string]publication](s.pubMeta(id))
	if errors.Is(err, fs.ErrNotExist) {
		return map[string]publication{}, nil
	}
	if err != nil {
		return nil, err
	}
	if *p == nil {
		return map[string]publication{}, nil
	}
	return *p, nil
}

// savePublications writes a volume's publications, removing the file when
// there are none.
func (s *store) savePublications(id string, pubs map[string]publication) error {
	if len(pubs) == 0 {
		if err := os.Remove(s.pubMeta(id)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		return nil
	}
	return writeJSON(s.pubMeta(id), pubs)
}

func (s *store) listSnapshots() ([]*snapshot, error) {
	matches, err := filepath.Glob(filepath.Join(s.dir, "snapshots", "*.json"))
	if err != nil {
		return nil, err
	}
	var out []*snapshot
	for _, m := range matches {
		sn, err := readJSON[snapshot](m)
		if err != nil {
			return nil, err
		}
		out = append(out, sn)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// createVolumeData makes an empty volume: a directory, or a sparse file of
// the volume's size.
func (s *store) createVolumeData(v *volume) error {
	path := s.volData(v)
	if v.Block {
		f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
		if err != nil {
			return fmt.Errorf("create block file: %w", err)
		}
		defer f.Close()
		if err := f.Truncate(v.CapacityBytes); err != nil {
			return fmt.Errorf("size block file: %w", err)
		}
		return nil
	}
	if err := os.MkdirAll(path, 0o777); err != nil {
		return fmt.Errorf("create volume dir: %w", err)
	}
	// Pods of any user may write into a fresh volume, as with most
	// provisioners' fresh filesystems.
	return os.Chmod(path, 0o777)
}

// copyData copies a volume's or snapshot's content. A block copy then grows
// to size (a restored or cloned volume may be larger than its source).
func copyData(src, dst string, block bool, size int64) error {
	if block {
		if err := copyFile(src, dst); err != nil {
			return err
		}
		st, err := os.Stat(dst)
		if err != nil {
			return err
		}
		if st.Size() < size {
			return os.Truncate(dst, size)
		}
		return nil
	}
	if err := os.MkdirAll(dst, 0o777); err != nil {
		return err
	}
	// cp keeps owners, modes, links and sparse files; "src/." copies the
	// content, not the directory itself.
	out, err := exec.Command("cp", "-a", "--sparse=always", src+"/.", dst).CombinedOutput()
	if err != nil {
		return fmt.Errorf("cp -a %s %s: %v: %s", src, dst, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// copyFile copies a block volume's file keeping its holes, as real storage
// shares unwritten extents, so that a snapshot or clone of a large, mostly
// empty volume costs its data, not its size.
func copyFile(src, dst string) error {
	out, err := exec.Command("cp", "--sparse=always", src, dst).CombinedOutput()
	if err != nil {
		return fmt.Errorf("cp --sparse=always %s %s: %v: %s", src, dst, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// dataSize is the bytes a directory's files hold, or a file's size.
func dataSize(path string) (int64, error) {
	st, err := os.Stat(path)
	if err != nil {
		return 0, err
	}
	if !st.IsDir() {
		return st.Size(), nil
	}
	var total int64
	err = filepath.WalkDir(path, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			info, err := d.Info()
			if err != nil {
				return err
			}
			total += info.Size()
		}
		return nil
	})
	return total, err
}

func removeData(path string) error {
	if err := os.RemoveAll(path); err != nil {
		return fmt.Errorf("remove %s: %w", path, err)
	}
	return nil
}
