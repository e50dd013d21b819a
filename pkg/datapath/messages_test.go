package datapath

import (
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"strings"
	"testing"

	"github.com/go-logr/logr/testr"

	"github.com/kubefill/kubefill/pkg/datapath/source"
	"github.com/kubefill/kubefill/pkg/datapath/testimg"
)

// Images that fail after they were spooled (qemu-img refusing a vmdk, our
// reader refusing a qcow2) are reported without the scratch file's path,
// for every caller of the data path (the importer, the upload server).
func TestSpooledFailuresHideTheScratchPath(t *testing.T) {
	testimg.RequireQemuImg(t)
	gz := func(b []byte) []byte {
		var buf bytes.Buffer
		w := gzip.NewWriter(&buf)
		w.Write(b)
		w.Close()
		return buf.Bytes()
	}
	for name, body := range map[string][]byte{
		"vmdk":       append([]byte("KDMV\x01\x00\x00\x00"), bytes.Repeat([]byte{0x11}, 1<<20)...),
		"qcow2 (gz)": gz(append([]byte("QFI\xfb\x00\x00\x00\x03"), bytes.Repeat([]byte{0xee}, 1<<20)...)),
	} {
		t.Run(name, func(t *testing.T) {
			scratch := t.TempDir()
			out := outPath(t)
			src := &source.Stream{Body: io.NopCloser(bytes.NewReader(body)), Name: "upload", Len: -1}
			_, err := Import(context.Background(), src, Options{Path: out, Size: 64 << 20, ScratchDir: scratch, Log: testr.New(t)})
			if err == nil {
				t.Fatal("imported")
			}
			if strings.Contains(err.Error(), scratch) || strings.Contains(err.Error(), "image-") {
				t.Fatalf("message shows the scratch path: %v", err)
			}
			if !strings.Contains(err.Error(), "downloaded copy") {
				t.Fatalf("message does not say what failed: %v", err)
			}
			t.Log(err)
		})
	}
}
