package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestNormalizeName(t *testing.T) {
	for _, tc := range []struct{ in, want, err string }{
		{in: "busybox:1.36", want: "docker.io/library/busybox:1.36"},
		{in: "busybox", want: "docker.io/library/busybox:latest"},
		{in: "kubefill/kubefill:dev", want: "docker.io/kubefill/kubefill:dev"},
		{in: "kubefill-test/dev:e2e", want: "docker.io/kubefill-test/dev:e2e"},
		{in: "docker.io/library/busybox:1.36", want: "docker.io/library/busybox:1.36"},
		{in: "index.docker.io/busybox:1", want: "docker.io/library/busybox:1"},
		{in: "registry.k8s.io/pause:3.10.2", want: "registry.k8s.io/pause:3.10.2"},
		{in: "localhost:5000/a/b:v1", want: "localhost:5000/a/b:v1"},
		{in: "localhost/a", want: "localhost/a:latest"},
		{in: "quay.io/org/img:v1.2_3-rc", want: "quay.io/org/img:v1.2_3-rc"},
		{in: "Busybox:1", err: "invalid path component"},
		{in: "busybox:", err: "invalid tag"},
		{in: "busybox@sha256:abcd", err: "digests"},
		{in: "a//b:1", err: "invalid path component"},
	} {
		got, err := NormalizeName(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("NormalizeName(%q) = %q, %v; want an error with %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("NormalizeName(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

// makeRootfs builds a small tree with every kind of entry mkimage keeps.
func makeRootfs(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(dir, "usr/bin"), 0o755))
	must(os.MkdirAll(filepath.Join(dir, "etc"), 0o755))
	must(os.Mkdir(filepath.Join(dir, "home"), 0o755))
	must(os.Mkdir(filepath.Join(dir, "home/app"), 0o700))
	must(os.WriteFile(filepath.Join(dir, "usr/bin/tool"), []byte("#!/bin/sh\necho hi\n"), 0o755))
	must(os.WriteFile(filepath.Join(dir, "etc/passwd"), []byte("root:x:0:0::/:/bin/sh\n"), 0o644))
	must(os.Symlink("usr/bin", filepath.Join(dir, "bin")))
	must(os.Mkdir(filepath.Join(dir, "tmp"), 0o755))
	must(os.Chmod(filepath.Join(dir, "tmp"), 0o777|os.ModeSticky)) // Mkdir's mode is masked by the umask
	// Modes as the test expects them, whatever the umask.
	for p, m := range map[string]os.FileMode{"usr": 0o755, "usr/bin": 0o755, "etc": 0o755, "home": 0o755, "home/app": 0o700,
		"usr/bin/tool": 0o755, "etc/passwd": 0o644} {
		must(os.Chmod(filepath.Join(dir, p), m))
	}
	// Mtimes of the source must not reach the image.
	must(os.Chtimes(filepath.Join(dir, "etc/passwd"), time.Now(), time.Unix(1234567890, 0)))
	return dir
}

type archive struct {
	files map[string][]byte
	order []string
}

func readArchive(t *testing.T, b []byte) archive {
	t.Helper()
	a := archive{files: map[string][]byte{}}
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return a
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		a.files[h.Name], a.order = data, append(a.order, h.Name)
	}
}

// blob reads a descriptor's blob and checks its size and digest.
func (a archive) blob(t *testing.T, d Descriptor) []byte {
	t.Helper()
	name := "blobs/sha256/" + strings.TrimPrefix(d.Digest, "sha256:")
	b, ok := a.files[name]
	if !ok {
		t.Fatalf("no blob %s", name)
	}
	if int64(len(b)) != d.Size {
		t.Errorf("%s: size %d, descriptor says %d", name, len(b), d.Size)
	}
	if got := sha256Hex(b); "sha256:"+got != d.Digest {
		t.Errorf("%s: digest sha256:%s, descriptor says %s", name, got, d.Digest)
	}
	return b
}

func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func build(t *testing.T, opts Options) ([]byte, Result) {
	t.Helper()
	var buf bytes.Buffer
	res, err := Write(&buf, t.TempDir(), opts)
	if err != nil {
		t.Fatal(err)
	}
	return buf.Bytes(), res
}

func TestWrite(t *testing.T) {
	rootfs := makeRootfs(t)
	opts := Options{
		Rootfs:     rootfs,
		Names:      []string{"docker.io/kubefill/kubefill:dev", "docker.io/kubefill/kubefill:e2e"},
		Entrypoint: []string{"/usr/bin/tool"},
		User:       "107:107",
		WorkingDir: "/",
		Env:        []string{"PATH=/usr/bin:/bin"},
		Owners:     map[string]Owner{"home/app": {107, 107}},
	}
	b, res := build(t, opts)
	a := readArchive(t, b)

	if got := string(a.files["oci-layout"]); got != ociLayoutFileContent {
		t.Errorf("oci-layout = %q", got)
	}
	var index Index
	if err := json.Unmarshal(a.files["index.json"], &index); err != nil {
		t.Fatalf("index.json: %v", err)
	}
	if index.SchemaVersion != 2 || index.MediaType != mediaTypeIndex || len(index.Manifests) != len(opts.Names) {
		t.Fatalf("index.json = %+v", index)
	}
	for i, d := range index.Manifests {
		name := opts.Names[i]
		if d.Annotations[annotationImageName] != name || d.Annotations[annotationRefName] != name {
			t.Errorf("descriptor %d annotations = %v, want both names %s", i, d.Annotations, name)
		}
		if d.Digest != res.Manifest.Digest || d.MediaType != mediaTypeManifest {
			t.Errorf("descriptor %d = %+v, want the manifest %s", i, d, res.Manifest.Digest)
		}
		if d.Platform == nil || d.Platform.OS != "linux" || d.Platform.Architecture != runtime.GOARCH {
			t.Errorf("descriptor %d platform = %+v", i, d.Platform)
		}
	}

	var m Manifest
	if err := json.Unmarshal(a.blob(t, index.Manifests[0]), &m); err != nil {
		t.Fatal(err)
	}
	if m.SchemaVersion != 2 || m.MediaType != mediaTypeManifest || m.Config.MediaType != mediaTypeConfig ||
		len(m.Layers) != 1 || m.Layers[0].MediaType != mediaTypeLayer {
		t.Fatalf("manifest = %+v", m)
	}
	var cfg ImageConfig
	if err := json.Unmarshal(a.blob(t, m.Config), &cfg); err != nil {
		t.Fatal(err)
	}
	layerGz := a.blob(t, m.Layers[0])
	if got := len(a.files); got != 2+2+3 {
		t.Errorf("archive has %d entries (%v), want oci-layout, index.json, 2 dirs and 3 blobs", got, a.order)
	}

	wantRun := RunConfig{User: "107:107", Env: []string{"PATH=/usr/bin:/bin"}, Entrypoint: []string{"/usr/bin/tool"}, WorkingDir: "/"}
	if cfg.OS != "linux" || cfg.Architecture != runtime.GOARCH || !reflect.DeepEqual(cfg.Config, wantRun) {
		t.Errorf("config = %+v, want linux/%s and %+v", cfg, runtime.GOARCH, wantRun)
	}
	if cfg.Created != "1970-01-01T00:00:00Z" {
		t.Errorf("created = %q", cfg.Created)
	}

	zr, err := gzip.NewReader(bytes.NewReader(layerGz))
	if err != nil {
		t.Fatal(err)
	}
	layer, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.RootFS.Type != "layers" || len(cfg.RootFS.DiffIDs) != 1 || cfg.RootFS.DiffIDs[0] != "sha256:"+sha256Hex(layer) {
		t.Errorf("rootfs = %+v, the layer's uncompressed digest is sha256:%s", cfg.RootFS, sha256Hex(layer))
	}
	if res.LayerUncompressed != int64(len(layer)) || res.DiffID != cfg.RootFS.DiffIDs[0] {
		t.Errorf("result = %+v, layer is %d bytes", res, len(layer))
	}

	type entry struct {
		typ      byte
		mode     int64
		uid, gid int
		link     string
		body     string
	}
	want := map[string]entry{
		"bin":          {typ: tar.TypeSymlink, mode: 0o777, link: "usr/bin"},
		"etc/":         {typ: tar.TypeDir, mode: 0o755},
		"etc/passwd":   {typ: tar.TypeReg, mode: 0o644, body: "root:x:0:0::/:/bin/sh\n"},
		"home/":        {typ: tar.TypeDir, mode: 0o755},
		"home/app/":    {typ: tar.TypeDir, mode: 0o700, uid: 107, gid: 107},
		"tmp/":         {typ: tar.TypeDir, mode: 0o1777},
		"usr/":         {typ: tar.TypeDir, mode: 0o755},
		"usr/bin/":     {typ: tar.TypeDir, mode: 0o755},
		"usr/bin/tool": {typ: tar.TypeReg, mode: 0o755, body: "#!/bin/sh\necho hi\n"},
	}
	wantOrder := []string{"bin", "etc/", "etc/passwd", "home/", "home/app/", "tmp/", "usr/", "usr/bin/", "usr/bin/tool"}
	var order []string
	tr := tar.NewReader(bytes.NewReader(layer))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(tr)
		order = append(order, h.Name)
		w, ok := want[h.Name]
		if !ok {
			t.Errorf("unexpected layer entry %q", h.Name)
			continue
		}
		if !h.ModTime.Equal(time.Unix(0, 0)) {
			t.Errorf("%s: mtime %v, want the epoch", h.Name, h.ModTime)
		}
		if w.typ == tar.TypeSymlink {
			w.mode = h.Mode // a symlink's mode is the platform's
		}
		got := entry{typ: h.Typeflag, mode: h.Mode, uid: h.Uid, gid: h.Gid, link: h.Linkname, body: string(body)}
		if got != w || h.Uname != "" || h.Gname != "" {
			t.Errorf("%s = %+v (uname %q gname %q), want %+v", h.Name, got, h.Uname, h.Gname, w)
		}
	}
	if !reflect.DeepEqual(order, wantOrder) {
		t.Errorf("layer order = %v, want %v", order, wantOrder)
	}
}

func TestDeterministic(t *testing.T) {
	rootfs := makeRootfs(t)
	opts := Options{Rootfs: rootfs, Names: []string{"docker.io/library/busybox:1.36"}, Cmd: []string{"sh"}}
	first, _ := build(t, opts)
	// Touching the files changes nothing the image records.
	now := time.Now().Add(time.Hour)
	if err := os.Chtimes(filepath.Join(rootfs, "usr/bin/tool"), now, now); err != nil {
		t.Fatal(err)
	}
	second, _ := build(t, opts)
	if !bytes.Equal(first, second) {
		t.Fatalf("two builds of one rootfs differ (%d and %d bytes)", len(first), len(second))
	}
	out := filepath.Join(t.TempDir(), "img.tar")
	if _, err := WriteFile(out, opts); err != nil {
		t.Fatal(err)
	}
	third, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(first, third) {
		t.Fatal("WriteFile's archive differs from Write's")
	}
	if left, _ := filepath.Glob(filepath.Join(filepath.Dir(out), ".mkimage-*")); len(left) > 0 {
		t.Errorf("temporary files left: %v", left)
	}
}

func TestWriteErrors(t *testing.T) {
	rootfs := makeRootfs(t)
	fifo := t.TempDir()
	if err := syscall.Mkfifo(filepath.Join(fifo, "pipe"), 0o644); err != nil {
		t.Fatal(err)
	}
	names := []string{"docker.io/library/x:1"}
	for _, tc := range []struct {
		name string
		opts Options
		err  string
	}{
		{"missing rootfs", Options{Rootfs: filepath.Join(rootfs, "nope"), Names: names}, "reading the rootfs"},
		{"rootfs is a file", Options{Rootfs: filepath.Join(rootfs, "etc/passwd"), Names: names}, "not a directory"},
		{"fifo", Options{Rootfs: fifo, Names: names}, "unsupported file type"},
		{"owner of a missing path", Options{Rootfs: rootfs, Names: names, Owners: map[string]Owner{"etc/shadow": {1, 1}}}, "not in the rootfs"},
		{"no names", Options{Rootfs: rootfs}, "no image names"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Write(io.Discard, t.TempDir(), tc.opts)
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("err = %v, want %q", err, tc.err)
			}
		})
	}
}

func TestReadOwners(t *testing.T) {
	f := filepath.Join(t.TempDir(), "owners")
	if err := os.WriteFile(f, []byte("# who owns what\n/home/kubefill 107:107\n\n./tmp/x 1:2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := readOwners(f)
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]Owner{"home/kubefill": {107, 107}, "tmp/x": {1, 2}}; !reflect.DeepEqual(got, want) {
		t.Errorf("readOwners = %v, want %v", got, want)
	}
	for _, bad := range []string{"etc 107\n", "etc a:b\n", "etc 1:2 extra\n", "etc -1:0\n"} {
		if err := os.WriteFile(f, []byte(bad), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := readOwners(f); err == nil {
			t.Errorf("readOwners(%q) succeeded", bad)
		}
	}
}

func TestRunFlags(t *testing.T) {
	rootfs := makeRootfs(t)
	out := filepath.Join(t.TempDir(), "x.tar")
	if err := run([]string{"--rootfs", rootfs, "--tag", "busybox:1.36,kubefill/kubefill:dev", "--tag", "registry.k8s.io/pause:3.10.2",
		"--entrypoint", `["/usr/bin/tool"]`, "--env", "A=1", "--env", "B=2", "--user", "65535", "--out", out}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var index Index
	if err := json.Unmarshal(readArchive(t, b).files["index.json"], &index); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, d := range index.Manifests {
		names = append(names, d.Annotations[annotationImageName])
	}
	if want := []string{"docker.io/library/busybox:1.36", "docker.io/kubefill/kubefill:dev", "registry.k8s.io/pause:3.10.2"}; !reflect.DeepEqual(names, want) {
		t.Errorf("names = %v, want %v", names, want)
	}
	for _, args := range [][]string{
		{"--rootfs", rootfs, "--tag", "x:1", "--out", out, "--entrypoint", "/bin/sh"},
		{"--rootfs", rootfs, "--tag", "x:1", "--out", out, "--env", "NOEQUALS"},
		{"--rootfs", rootfs, "--out", out},
		{"--rootfs", rootfs, "--tag", "X:1", "--out", out},
	} {
		if err := run(args); err == nil {
			t.Errorf("run(%q) succeeded", args)
		}
	}
}
