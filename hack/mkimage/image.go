package main

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"
)

// OCI media types and the annotations ctr reads an image's name from.
const (
	mediaTypeIndex    = "application/vnd.oci.image.index.v1+json"
	mediaTypeManifest = "application/vnd.oci.image.manifest.v1+json"
	mediaTypeConfig   = "application/vnd.oci.image.config.v1+json"
	mediaTypeLayer    = "application/vnd.oci.image.layer.v1.tar+gzip"

	annotationRefName    = "org.opencontainers.image.ref.name"
	annotationImageName  = "io.containerd.image.name"
	ociLayoutFileContent = `{"imageLayoutVersion":"1.0.0"}`
)

// Options describe one image.
type Options struct {
	Rootfs string
	// Names are full image names (NormalizeName's form); each gets its own
	// descriptor in index.json, all pointing at the one manifest.
	Names      []string
	Entrypoint []string
	Cmd        []string
	User       string
	WorkingDir string
	Env        []string
	// Owners gives paths (relative to Rootfs, slash-separated) an owner
	// other than 0:0; every other entry is root's, whoever built the rootfs.
	Owners map[string]Owner
	// Epoch is every file's mtime and the image's creation time (Unix seconds).
	Epoch int64
}

// Owner is a numeric uid and gid.
type Owner struct{ UID, GID int }

// Descriptor is an OCI content descriptor.
type Descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Platform    *Platform         `json:"platform,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// Platform is a descriptor's platform.
type Platform struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
}

// Manifest is an OCI image manifest.
type Manifest struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Config        Descriptor   `json:"config"`
	Layers        []Descriptor `json:"layers"`
}

// Index is an OCI image index (index.json).
type Index struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Manifests     []Descriptor `json:"manifests"`
}

// ImageConfig is the OCI image configuration; the field order is fixed so
// that its digest is too.
type ImageConfig struct {
	Created      string    `json:"created"`
	Architecture string    `json:"architecture"`
	OS           string    `json:"os"`
	Config       RunConfig `json:"config"`
	RootFS       RootFS    `json:"rootfs"`
	History      []History `json:"history"`
}

// RunConfig is what a container started from the image runs.
type RunConfig struct {
	User       string   `json:"User,omitempty"`
	Env        []string `json:"Env,omitempty"`
	Entrypoint []string `json:"Entrypoint,omitempty"`
	Cmd        []string `json:"Cmd,omitempty"`
	WorkingDir string   `json:"WorkingDir,omitempty"`
}

// RootFS lists the uncompressed layers' digests.
type RootFS struct {
	Type    string   `json:"type"`
	DiffIDs []string `json:"diff_ids"`
}

// History is one layer's history entry.
type History struct {
	Created   string `json:"created"`
	CreatedBy string `json:"created_by"`
}

// Result is what was written.
type Result struct {
	Manifest, Config, Layer Descriptor
	DiffID                  string
	LayerUncompressed       int64
}

// Name grammar from the distribution reference spec, simplified: lowercase
// path components, an optional registry host[:port], a tag.
var (
	componentRE = regexp.MustCompile(`^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$`)
	domainRE    = regexp.MustCompile(`^(?:localhost|[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*)(?::[0-9]+)?$`)
	tagRE       = regexp.MustCompile(`^[\w][\w.-]{0,127}$`)
)

// NormalizeName expands a name the way containerd's CRI does when a pod
// names an image: "busybox:1.36" is docker.io/library/busybox:1.36,
// "kubefill/kubefill:dev" is docker.io/kubefill/kubefill:dev, and a first
// component with a dot, a port or "localhost" is a registry. No tag means
// "latest". Digests are refused: an archive's names are tags.
func NormalizeName(s string) (string, error) {
	if strings.Contains(s, "@") {
		return "", fmt.Errorf("image name %q: digests are not supported, give a tag", s)
	}
	repo, tag := s, "latest"
	if i := strings.LastIndexByte(s, ':'); i > strings.LastIndexByte(s, '/') {
		repo, tag = s[:i], s[i+1:]
	}
	if !tagRE.MatchString(tag) {
		return "", fmt.Errorf("image name %q: invalid tag %q", s, tag)
	}
	domain, rest := "docker.io", repo
	if i := strings.IndexByte(repo, '/'); i >= 0 {
		if first := repo[:i]; strings.ContainsAny(first, ".:") || first == "localhost" {
			domain, rest = first, repo[i+1:]
		}
	}
	if !domainRE.MatchString(domain) {
		return "", fmt.Errorf("image name %q: invalid registry %q", s, domain)
	}
	if domain == "index.docker.io" {
		domain = "docker.io"
	}
	if domain == "docker.io" && !strings.Contains(rest, "/") {
		rest = "library/" + rest
	}
	for _, c := range strings.Split(rest, "/") {
		if !componentRE.MatchString(c) {
			return "", fmt.Errorf("image name %q: invalid path component %q (lowercase letters, digits and separators)", s, c)
		}
	}
	return domain + "/" + rest + ":" + tag, nil
}

// parseArgv parses a JSON array of strings; "" is none.
func parseArgv(flagName, s string) ([]string, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var v []string
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		return nil, fmt.Errorf("%s %q: want a JSON array of strings: %w", flagName, s, err)
	}
	return v, nil
}

// readOwners reads `PATH UID:GID` lines; blank lines and # comments are skipped.
func readOwners(file string) (map[string]Owner, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, fmt.Errorf("reading owners: %w", err)
	}
	defer f.Close()
	owners := map[string]Owner{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) != 2 {
			return nil, fmt.Errorf("%s:%d: want PATH UID:GID, got %q", file, n, line)
		}
		o, err := parseOwner(fields[1])
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %w", file, n, err)
		}
		owners[cleanRel(fields[0])] = o
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading owners %s: %w", file, err)
	}
	return owners, nil
}

func parseOwner(s string) (Owner, error) {
	u, g, ok := strings.Cut(s, ":")
	if !ok {
		return Owner{}, fmt.Errorf("owner %q: want UID:GID", s)
	}
	uid, err1 := strconv.Atoi(u)
	gid, err2 := strconv.Atoi(g)
	if err1 != nil || err2 != nil || uid < 0 || gid < 0 {
		return Owner{}, fmt.Errorf("owner %q: want numeric UID:GID", s)
	}
	return Owner{uid, gid}, nil
}

// cleanRel turns "/etc/passwd", "./etc/passwd" or "etc/passwd" into "etc/passwd".
func cleanRel(p string) string {
	return strings.TrimPrefix(path.Clean("/"+filepath.ToSlash(p)), "/")
}

// WriteFile writes the archive to out through a temporary file in the same
// directory, so that a failed build never leaves a half archive behind.
func WriteFile(out string, opts Options) (Result, error) {
	tmp, err := os.CreateTemp(filepath.Dir(out), ".mkimage-*.tar")
	if err != nil {
		return Result{}, fmt.Errorf("creating the archive: %w", err)
	}
	defer os.Remove(tmp.Name()) // a no-op after the rename
	res, err := Write(tmp, filepath.Dir(out), opts)
	if cerr := tmp.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("writing %s: %w", out, cerr)
	}
	if err != nil {
		return Result{}, err
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return Result{}, fmt.Errorf("writing %s: %w", out, err)
	}
	if err := os.Rename(tmp.Name(), out); err != nil {
		return Result{}, fmt.Errorf("writing %s: %w", out, err)
	}
	return res, nil
}

// Write writes the image as an OCI layout tar to w. The compressed layer is
// staged in a temporary file under tmpDir ("" for the system's), because its
// digest must be known before index.json is written.
func Write(w io.Writer, tmpDir string, opts Options) (Result, error) {
	if len(opts.Names) == 0 {
		return Result{}, errors.New("no image names")
	}
	layerFile, err := os.CreateTemp(tmpDir, ".mkimage-layer-*")
	if err != nil {
		return Result{}, fmt.Errorf("staging the layer: %w", err)
	}
	defer func() {
		layerFile.Close()
		os.Remove(layerFile.Name())
	}()
	var res Result
	res.Layer, res.DiffID, res.LayerUncompressed, err = writeLayer(layerFile, opts)
	if err != nil {
		return Result{}, err
	}

	created := time.Unix(opts.Epoch, 0).UTC().Format(time.RFC3339)
	configJSON, err := json.Marshal(ImageConfig{
		Created:      created,
		Architecture: runtime.GOARCH,
		OS:           "linux",
		Config: RunConfig{User: opts.User, Env: opts.Env, Entrypoint: opts.Entrypoint, Cmd: opts.Cmd,
			WorkingDir: opts.WorkingDir},
		RootFS:  RootFS{Type: "layers", DiffIDs: []string{res.DiffID}},
		History: []History{{Created: created, CreatedBy: "hack/mkimage"}},
	})
	if err != nil {
		return Result{}, fmt.Errorf("encoding the image config: %w", err)
	}
	res.Config = descriptorOf(mediaTypeConfig, configJSON)
	manifestJSON, err := json.Marshal(Manifest{SchemaVersion: 2, MediaType: mediaTypeManifest,
		Config: res.Config, Layers: []Descriptor{res.Layer}})
	if err != nil {
		return Result{}, fmt.Errorf("encoding the manifest: %w", err)
	}
	res.Manifest = descriptorOf(mediaTypeManifest, manifestJSON)
	index := Index{SchemaVersion: 2, MediaType: mediaTypeIndex}
	for _, name := range opts.Names {
		d := res.Manifest
		d.Platform = &Platform{Architecture: runtime.GOARCH, OS: "linux"}
		// ctr takes io.containerd.image.name as the name; other tools read
		// the OCI ref name, so both carry the full name.
		d.Annotations = map[string]string{annotationImageName: name, annotationRefName: name}
		index.Manifests = append(index.Manifests, d)
	}
	indexJSON, err := json.Marshal(index)
	if err != nil {
		return Result{}, fmt.Errorf("encoding index.json: %w", err)
	}

	tw := tar.NewWriter(w)
	epoch := time.Unix(opts.Epoch, 0)
	file := func(name string, size int64, r io.Reader) error {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Size: size, Mode: 0o644, ModTime: epoch}); err != nil {
			return fmt.Errorf("archiving %s: %w", name, err)
		}
		if _, err := io.Copy(tw, r); err != nil {
			return fmt.Errorf("archiving %s: %w", name, err)
		}
		return nil
	}
	bytesFile := func(name string, b []byte) error { return file(name, int64(len(b)), bytes.NewReader(b)) }
	if err := bytesFile("oci-layout", []byte(ociLayoutFileContent)); err != nil {
		return Result{}, err
	}
	if err := bytesFile("index.json", indexJSON); err != nil {
		return Result{}, err
	}
	for _, dir := range []string{"blobs/", "blobs/sha256/"} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: dir, Mode: 0o755, ModTime: epoch}); err != nil {
			return Result{}, fmt.Errorf("archiving %s: %w", dir, err)
		}
	}
	// Blobs in digest order, so that the order does not depend on content kind.
	blobs := []struct {
		d    Descriptor
		data []byte
	}{{res.Config, configJSON}, {res.Manifest, manifestJSON}, {res.Layer, nil}}
	sort.Slice(blobs, func(i, j int) bool { return blobs[i].d.Digest < blobs[j].d.Digest })
	for _, b := range blobs {
		name := "blobs/sha256/" + strings.TrimPrefix(b.d.Digest, "sha256:")
		if b.data != nil {
			err = bytesFile(name, b.data)
		} else if _, err = layerFile.Seek(0, io.SeekStart); err == nil {
			err = file(name, b.d.Size, layerFile)
		}
		if err != nil {
			return Result{}, fmt.Errorf("archiving %s: %w", name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return Result{}, fmt.Errorf("finishing the archive: %w", err)
	}
	return res, nil
}

func descriptorOf(mediaType string, b []byte) Descriptor {
	sum := sha256.Sum256(b)
	return Descriptor{MediaType: mediaType, Digest: "sha256:" + hex.EncodeToString(sum[:]), Size: int64(len(b))}
}

// countingWriter counts and hashes what passes through it.
type countingWriter struct {
	w io.Writer
	h hash.Hash
	n int64
}

func newCountingWriter(w io.Writer) *countingWriter { return &countingWriter{w: w, h: sha256.New()} }

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.h.Write(p[:n])
	c.n += int64(n)
	return n, err
}

func (c *countingWriter) digest() string { return "sha256:" + hex.EncodeToString(c.h.Sum(nil)) }

// writeLayer writes the rootfs as a gzipped tar to w and returns its
// descriptor, its diff_id (the uncompressed tar's digest) and that tar's size.
func writeLayer(w io.Writer, opts Options) (Descriptor, string, int64, error) {
	info, err := os.Stat(opts.Rootfs)
	if err != nil {
		return Descriptor{}, "", 0, fmt.Errorf("reading the rootfs: %w", err)
	}
	if !info.IsDir() {
		return Descriptor{}, "", 0, fmt.Errorf("the rootfs %s is not a directory", opts.Rootfs)
	}
	compressed := newCountingWriter(w)
	// gzip's header carries no name or mtime, so the bytes depend only on the input.
	gz, err := gzip.NewWriterLevel(compressed, gzip.DefaultCompression)
	if err != nil {
		return Descriptor{}, "", 0, err
	}
	uncompressed := newCountingWriter(gz)
	tw := tar.NewWriter(uncompressed)
	epoch := time.Unix(opts.Epoch, 0)
	used := map[string]bool{}
	// WalkDir visits entries in lexical order: the layer's order is fixed.
	err = filepath.WalkDir(opts.Rootfs, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(opts.Rootfs, p)
		if err != nil {
			return err
		}
		if rel == "." {
			return nil // the root itself is the container's /, made by the runtime
		}
		rel = filepath.ToSlash(rel)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		hdr := &tar.Header{Name: rel, ModTime: epoch, Mode: tarMode(fi.Mode())}
		if o, ok := opts.Owners[rel]; ok {
			hdr.Uid, hdr.Gid = o.UID, o.GID
			used[rel] = true
		}
		switch m := fi.Mode(); {
		case m.IsRegular():
			hdr.Typeflag, hdr.Size = tar.TypeReg, fi.Size()
		case m.IsDir():
			hdr.Typeflag, hdr.Name = tar.TypeDir, rel+"/"
		case m&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, target
		default:
			// Device nodes, fifos and sockets come from the runtime, never an image.
			return fmt.Errorf("%s: unsupported file type %s", rel, m.Type())
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
		if hdr.Typeflag != tar.TypeReg {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		// A file that changes size under us would corrupt the tar: copy exactly Size bytes.
		if _, err := io.CopyN(tw, f, hdr.Size); err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
		return nil
	})
	if err != nil {
		return Descriptor{}, "", 0, fmt.Errorf("archiving the rootfs %s: %w", opts.Rootfs, err)
	}
	for p := range opts.Owners {
		if !used[p] {
			return Descriptor{}, "", 0, fmt.Errorf("owners: %s is not in the rootfs", p)
		}
	}
	if err := tw.Close(); err != nil {
		return Descriptor{}, "", 0, fmt.Errorf("finishing the layer: %w", err)
	}
	if err := gz.Close(); err != nil {
		return Descriptor{}, "", 0, fmt.Errorf("finishing the layer: %w", err)
	}
	d := Descriptor{MediaType: mediaTypeLayer, Digest: compressed.digest(), Size: compressed.n}
	return d, uncompressed.digest(), uncompressed.n, nil
}

// tarMode keeps the permission bits plus setuid, setgid and sticky (/tmp's 1777).
func tarMode(m fs.FileMode) int64 {
	mode := int64(m.Perm())
	if m&fs.ModeSetuid != 0 {
		mode |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		mode |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		mode |= 0o1000
	}
	return mode
}
