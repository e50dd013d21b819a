package importer

import (
	"bytes"
	"compress/gzip"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/kubefill/kubefill/pkg/contract"
	"github.com/kubefill/kubefill/pkg/datapath/testimg"
)

func TestFailureMessage(t *testing.T) {
	paths := internalPaths(DefaultPaths())
	const src = "https://images.example/data/disk.img"
	for _, c := range []struct{ in, want string }{
		{"opening /data/disk.img: permission denied", "importing " + src + ": opening the target image: permission denied"},
		{"qemu-img info -f vmdk: exit status 1: qemu-img: Could not open '/scratch/image-123.vmdk': Invalid footer",
			"importing " + src + ": qemu-img info -f vmdk: exit status 1: qemu-img: Could not open 'the downloaded copy of the image': Invalid footer"},
		{"qcow2 image file /scratch/image-9.qcow2: bad header", "importing " + src + ": qcow2 image file the downloaded copy of the image: bad header"},
		{"statfs /scratch: no such file", "importing " + src + ": statfs the scratch volume: no such file"},
		{"destination volume /data has no usable space", "importing " + src + ": destination volume the target volume has no usable space"},
		{"write /dev/cdi-block-volume: no space left on device", "importing " + src + ": write the target block device: no space left on device"},
		{"copy /data/disk.img /data/x failed", "importing " + src + ": copy the target image the target volume failed"},
		// The user's URL is never rewritten, though its path looks like ours.
		{"GET " + src + ": HTTP 404 Not Found", "GET " + src + ": HTTP 404 Not Found"},
		{"download of " + src + " broke at byte 5 (/data/disk.img)", "download of " + src + " broke at byte 5 (the target image)"},
		// Paths that merely start like ours are someone else's.
		{"GET /database/x: 500", "importing " + src + ": GET /database/x: 500"},
	} {
		if got := FailureMessage(c.in, src, paths); got != c.want {
			t.Errorf("FailureMessage(%q)\n got %q\nwant %q", c.in, got, c.want)
		}
	}
	if got := FailureMessage("blank /data/disk.img: no space", "", paths); got != "blank the target image: no space" {
		t.Errorf("blank: %q", got)
	}
	cfg := &Config{Source: contract.SourceHTTP, Endpoint: "https://user:secret@h/x.img"}
	if got := SourceName(cfg); strings.Contains(got, "secret") || !strings.Contains(got, "h/x.img") {
		t.Errorf("SourceName = %q", got)
	}
}

// Failed imports driven end to end: the termination message (what the
// DataVolume shows) names the URL and none of the pod's paths.
func TestFailuresNameTheURLNotThePodsPaths(t *testing.T) {
	testimg.RequireQemuImg(t)
	dir := t.TempDir()
	badQcow := append([]byte("QFI\xfb\x00\x00\x00\x03"), bytes.Repeat([]byte{0xee}, 1<<20)...)
	badVmdk := append([]byte("KDMV\x01\x00\x00\x00"), bytes.Repeat([]byte{0x11}, 1<<20)...)
	write := func(name string, b []byte) {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	gz := func(b []byte) []byte {
		var buf bytes.Buffer
		w := gzip.NewWriter(&buf)
		w.Write(b)
		w.Close()
		return buf.Bytes()
	}
	write("bad.qcow2", badQcow)
	write("bad.qcow2.gz", gz(badQcow))
	write("bad.vmdk", badVmdk)
	srv := testimg.NewServer(t, dir, false)
	// A server that cannot resume and cuts the body in half.
	truncated := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(4<<20))
		w.Write(make([]byte, 2<<20))
	}))
	t.Cleanup(truncated.Close)

	for _, c := range []struct {
		name, url, contentType, want string
	}{
		{"bad qcow2 over ranges", srv.FileURL("bad.qcow2"), "", "qcow2"},
		{"bad qcow2 in gzip, through scratch", srv.FileURL("bad.qcow2.gz"), "", "qcow2"},
		{"bad vmdk, through qemu-img", srv.FileURL("bad.vmdk"), "", "qemu-img"},
		{"truncated download", truncated.URL + "/disk.img", "", "broke at byte"},
		{"404", srv.FileURL("missing.img"), "", "404"},
		{"archive that is not a tar", srv.FileURL("bad.qcow2"), "archive", "needs a tar archive"},
	} {
		t.Run(c.name, func(t *testing.T) {
			vol := t.TempDir()
			scratch := filepath.Join(t.TempDir(), "scratch")
			os.Mkdir(scratch, 0o755)
			p := Paths{DataPath: filepath.Join(vol, "disk.img"), BlockPath: filepath.Join(vol, "no-block"), ScratchDir: scratch, TerminationLog: filepath.Join(t.TempDir(), "termination-log")}
			vars := map[string]string{contract.EnvEndpoint: c.url, contract.EnvImageSize: "64Mi"}
			if c.contentType != "" {
				vars[contract.EnvContentType] = c.contentType
			}
			m, err := runJob(t, vars, p)
			if err == nil || m.Outcome != contract.OutcomeFailed || m.Message == nil {
				t.Fatalf("%v %+v", err, m)
			}
			msg := *m.Message
			if !strings.Contains(msg, c.url) || !strings.Contains(msg, c.want) {
				t.Fatalf("message %q lacks the URL %s or %q", msg, c.url, c.want)
			}
			for _, internal := range []string{vol, scratch, "image-"} {
				if strings.Contains(msg, internal) {
					t.Fatalf("message %q shows the internal path %s", msg, internal)
				}
			}
			t.Logf("%s", msg)
		})
	}
}

func TestMemoryLimit(t *testing.T) {
	for in, want := range map[string]int64{
		"536870912\n":           512 << 20,
		"max\n":                 0,
		"9223372036854771712\n": 0, // cgroup v1 without a limit
		"":                      0,
		"-1":                    0,
	} {
		if got := ParseMemoryLimit(in); got != want {
			t.Errorf("ParseMemoryLimit(%q) = %d, want %d", in, got, want)
		}
	}
	v2 := t.TempDir()
	os.WriteFile(filepath.Join(v2, "memory.max"), []byte("1073741824\n"), 0o644)
	v1 := t.TempDir()
	os.Mkdir(filepath.Join(v1, "memory"), 0o755)
	os.WriteFile(filepath.Join(v1, "memory", "memory.limit_in_bytes"), []byte("268435456\n"), 0o644)
	if MemoryLimit(v2) != 1<<30 || MemoryLimit(v1) != 256<<20 || MemoryLimit(t.TempDir()) != 0 || MemoryLimit("") != 0 {
		t.Fatalf("MemoryLimit: v2 %d, v1 %d", MemoryLimit(v2), MemoryLimit(v1))
	}
}
